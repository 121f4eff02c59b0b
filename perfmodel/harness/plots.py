"""Figures from records and reports: pure functions returning matplotlib Figures (Agg canvas).

No pyplot and no global backend switch: each figure gets its own Agg canvas,
so plotting works headless and leaves the caller's matplotlib state alone.
matplotlib is imported when a function runs, not at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from perfmodel.errors import InputError
from perfmodel.harness.records import Located

#: Colour per bound (op-floor limiter), shared by the plots.
BOUND_COLOURS = {"mxu": "tab:blue", "hbm": "tab:orange", "vpu": "tab:green", "eup": "tab:purple",
                 "ici": "tab:brown", "none": "tab:gray"}
INTERPRET_COLOUR = "0.6"


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Any, path: str | Path, field: str = "plot") -> Path:
    """Write fig as PNG; InputError naming ``field`` (the keyword argument the path came in) when the path
    cannot be written."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise InputError(f"`{field}` '{p}': give a .png path", fields=(field,))
    try:
        fig.savefig(p, format="png", dpi=120)
    except OSError as exc:
        raise InputError(f"`{field}` '{p}': cannot write ({exc.strerror})", fields=(field,)) from None
    return p


def compare_figure(items: Sequence[Located]) -> Any:
    """Left: measured vs predicted time per record (log-log, y = x dashed; interpret-mode records grey and
    labelled as host wall time). Right: measured efficiency (op floor / measured) per real-TPU record,
    coloured by the predicted bound, with the model's own floor / expected marked."""
    from perfmodel.model.core import BOUND_NAMES

    fig = _figure(11.0, 4.6)
    left, right = fig.subplots(1, 2)
    real = [(n, i.record) for n, i in enumerate(items, start=1) if i.record.is_real]
    interp = [(n, i.record) for n, i in enumerate(items, start=1) if not i.record.is_real]

    for unit in dict.fromkeys(r.prediction.op_floor_limiter for _, r in real):
        pts = [(r.expected_wall_s, r.timing.measured_s) for _, r in real if r.prediction.op_floor_limiter == unit]
        left.scatter(*zip(*pts), color=BOUND_COLOURS.get(unit, "k"), label=f"{BOUND_NAMES.get(unit, unit)} (real TPU)",
                     zorder=3)
    if interp:
        pts = [(r.expected_wall_s, r.timing.measured_s) for _, r in interp]
        left.scatter(*zip(*pts), color=INTERPRET_COLOUR, marker="x",
                     label="interpret-mode wall time (not TPU performance)", zorder=2)
    for group, colour in ((real, "k"), (interp, INTERPRET_COLOUR)):
        spots = _grouped([(r.expected_wall_s, r.timing.measured_s, f"#{n}") for n, r in group])
        for (x, y), labels in spots.items():
            left.annotate(", ".join(labels), (x, y), fontsize=7, xytext=(4, -9), textcoords="offset points",
                          color=colour)
    values = [v for _, r in real + interp for v in (r.expected_wall_s, r.timing.measured_s) if v > 0]
    lo, hi = min(values) / 2, max(values) * 2
    left.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
    left.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
             xlabel="predicted: expected time (+dispatch) [s]",
             ylabel="measured time per call [s]", title="measured vs predicted")
    left.legend(fontsize=7, loc="upper left")

    if real:
        xs = range(len(real))
        effs = [r.efficiency if r.efficiency is not None else 0.0 for _, r in real]
        colours = [BOUND_COLOURS.get(r.prediction.op_floor_limiter, "k") for _, r in real]
        right.bar(xs, effs, color=colours, label="measured: op floor / measured")
        right.scatter(xs, [r.prediction.op_floor_s / r.expected_wall_s for _, r in real], color="k", marker="_",
                      s=200, zorder=3, label="model: op floor / expected (+dispatch)")
        right.set_xticks(list(xs), [f"#{n}" for n, _ in real], fontsize=7)
        right.set_ylim(0, 1.05)
        right.legend(fontsize=7, loc="upper left")
    else:
        right.text(0.5, 0.5, "no real-TPU records:\nno efficiency to show", ha="center", va="center",
                   transform=right.transAxes)
    if interp:
        right.text(0.99, 0.98, f"{len(interp)} interpret-mode record(s) left out", ha="right", va="top",
                   fontsize=7, color=INTERPRET_COLOUR, transform=right.transAxes)
    right.set(xlabel="record", ylabel="efficiency (share of the roofline floor)", title="efficiency per record")
    return fig


def roofline_figure(roofline: Any, title: str) -> Any:
    """Roofs (one per chip and MXU dtype) and the report's points on log-log axes."""
    import numpy as np

    fig = _figure(8.0, 5.5)
    ax = fig.subplots()
    pts = roofline.points
    xs = [p.intensity_flop_per_byte for p in pts] + [r.ridge_flop_per_byte for r in roofline.roofs]
    lo = min(xs) / 4 if xs else 0.1
    hi = max(xs) * 4 if xs else 1e4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for r in roofline.roofs:
        ax.plot(grid, np.minimum(r.peak_flops_per_s, grid * r.hbm_bytes_per_s), lw=1.5,
                label=f"{r.chip} {r.dtype} roof (ridge {r.ridge_flop_per_byte:.0f} FLOP/B)")
    styles = {"floor": dict(marker="o", facecolors="none", edgecolors="tab:blue", label="predicted (op floor)"),
              "expected": dict(marker="s", facecolors="none", edgecolors="tab:gray", label="predicted (expected)"),
              "measured": dict(marker="*", color="tab:red", s=90, label="measured (real TPU)")}
    for kind, style in styles.items():
        chosen = [p for p in pts if p.kind == kind]
        if chosen:
            ax.scatter([p.intensity_flop_per_byte for p in chosen], [p.flops_per_s for p in chosen], zorder=3, **style)
    for (x, y), labels in _label_positions(pts).items():
        ax.annotate(", ".join(labels), (x, y), fontsize=7, xytext=(4, -10), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [useful FLOP / HBM byte]",
           ylabel="useful FLOP/s", title=title)
    if roofline.left_out:
        ax.text(0.99, 0.02, f"not plotted (no matrix FLOPs): {len(roofline.left_out)}", ha="right", va="bottom",
                fontsize=7, transform=ax.transAxes)
    if not pts:
        ax.text(0.5, 0.5, "no point has matrix FLOPs to place on a FLOP/s roofline", ha="center", va="center",
                fontsize=8, transform=ax.transAxes)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", lw=0.3)
    return fig


def _label_positions(points: Sequence[Any]) -> dict[tuple[float, float], list[str]]:
    """Each label once, at its measured point if it has one, else at its floor; labels at (nearly) the same
    place are joined."""
    chosen: dict[str, Any] = {}
    for p in points:
        if p.kind == "measured" or (p.kind == "floor" and p.label not in chosen):
            chosen[p.label] = p
    return _grouped([(p.intensity_flop_per_byte, p.flops_per_s, label) for label, p in chosen.items()])


def _grouped(spots: Sequence[tuple[float, float, str]]) -> dict[tuple[float, float], list[str]]:
    """Labels of points within ~12% of each other on log axes, joined at the first one's position."""
    import math

    groups: dict[tuple[float, float], list[str]] = {}
    keys: dict[tuple[float, float], tuple[float, float]] = {}
    for x, y, label in spots:
        if x <= 0 or y <= 0:
            continue
        key = (round(math.log10(x) * 20), round(math.log10(y) * 20))
        where = keys.setdefault(key, (x, y))
        groups.setdefault(where, []).append(label)
    return groups
