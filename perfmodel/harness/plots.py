"""Figures from records and reports: pure functions returning matplotlib Figures (Agg canvas).

No pyplot and no global backend switch: each figure gets its own Agg canvas,
so plotting works headless and leaves the caller's matplotlib state alone.
matplotlib is imported when a function runs, not at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from perfmodel.errors import InputError
from perfmodel.harness.records import Located, limited_by
from perfmodel.units import intensity, si

#: Colour per bound (op-floor limiter), shared by the plots.
BOUND_COLOURS = {"mxu": "tab:blue", "hbm": "tab:orange", "vpu": "tab:green", "eup": "tab:purple", "xlu": "tab:olive",
                 "ici": "tab:brown", "none": "tab:gray"}
INTERPRET_COLOUR = "0.6"
#: Colour of records whose expected time is set by the per-grid-step overhead.
OVERHEAD_COLOUR = "tab:pink"


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
    labelled as host wall time). Right: measured efficiency (op floor / measured) per real-TPU record, with the
    model's own floor / expected marked. Real-TPU records are coloured by what limits their expected time, named
    as the tables' `limited by` column names it (:func:`perfmodel.harness.records.limited_by`)."""
    from matplotlib.patches import Patch

    fig = _figure(11.0, 5.2)
    left, right = fig.subplots(1, 2)
    real = [(n, i.record) for n, i in enumerate(items, start=1) if i.record.is_real]
    interp = [(n, i.record) for n, i in enumerate(items, start=1) if not i.record.is_real]
    units = {n: limited_by(r.prediction) for n, r in real}

    for unit in dict.fromkeys(units.values()):
        pts = [(r.expected_wall_s, r.timing.measured_s) for n, r in real if units[n] == unit]
        left.scatter(*zip(*pts), color=_unit_colour(unit), label=f"limited by: {unit} (real TPU)", zorder=3)
    if interp:
        pts = [(r.expected_wall_s, r.timing.measured_s) for _, r in interp]
        left.scatter(*zip(*pts), color=INTERPRET_COLOUR, marker="x",
                     label="interpret-mode wall time (not TPU performance)", zorder=2)
    values = [v for _, r in real + interp for v in (r.expected_wall_s, r.timing.measured_s) if v > 0]
    lo, hi = min(values) / 2, max(values) * 2
    left.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
    left.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
             xlabel="predicted: expected time (+dispatch) [s]",
             ylabel="measured time per call [s]", title="measured vs predicted")

    if real:
        xs = range(len(real))
        effs = [r.efficiency if r.efficiency is not None else 0.0 for _, r in real]
        right.bar(xs, effs, color=[_unit_colour(units[n]) for n, _ in real])
        right.scatter(xs, [r.prediction.op_floor_s / r.expected_wall_s for _, r in real], color="k", marker="_",
                      s=200, zorder=3, label="model: op floor / expected (+dispatch)")
        right.set_xticks(list(xs), [f"#{n}" for n, _ in real], fontsize=7)
        right.set_ylim(0, 1.05)
        handles = [Patch(color=_unit_colour(u), label=f"measured, limited by: {u}") for u in dict.fromkeys(units.values())]
        right.legend(handles=handles + right.get_legend_handles_labels()[0], fontsize=7, loc="upper left")
    else:
        right.text(0.5, 0.5, "no real-TPU records:\nno efficiency to show", ha="center", va="center",
                   transform=right.transAxes)
    if interp:
        right.text(0.99, 0.98, f"{len(interp)} interpret-mode record(s) left out", ha="right", va="top",
                   fontsize=7, color=INTERPRET_COLOUR, transform=right.transAxes)
    right.set(xlabel="record", ylabel="efficiency (share of the roofline floor)", title="efficiency per record")
    fig.legend(*left.get_legend_handles_labels(), loc="outside lower left", fontsize=7, ncols=2)
    spots = [(x, y, text, colour)
             for group, colour in ((real, "k"), (interp, INTERPRET_COLOUR))
             for (x, y), text in _grouped([(r.expected_wall_s, r.timing.measured_s, f"#{n}")
                                           for n, r in group]).items()]
    place_labels(fig, left, spots)
    return fig


#: Terra: the roofline's y axis is in TFLOP/s.
_TERA = 1e12


def roofline_figure(roofline: Any, title: str) -> Any:
    """Roofs (one per chip and MXU dtype, each ridge point marked) and the report's points on log-log axes, in
    TFLOP/s; every point labeled (labels at one place joined), the legend below the axes so that it covers
    neither a roof nor a point, the axes wide and tall enough for every roof and ridge."""
    import numpy as np

    fig = _figure(8.0, 6.0)
    ax = fig.subplots()
    pts = roofline.points
    xs = [p.intensity_flop_per_byte for p in pts] + [r.ridge_flop_per_byte for r in roofline.roofs]
    lo = min(xs) / 4 if xs else 0.1
    hi = max(xs) * 4 if xs else 1e4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    colours = [f"C{i}" for i in range(len(roofline.roofs))]
    for r, colour in zip(roofline.roofs, colours):
        ax.plot(grid, np.minimum(r.peak_flops_per_s, grid * r.hbm_bytes_per_s) / _TERA, lw=1.5, color=colour,
                label=f"{r.chip} {r.dtype} roof: {si(r.peak_flops_per_s, 'FLOP/s')}, "
                      f"{si(r.hbm_bytes_per_s, 'B/s')} HBM")
    ys = [p.flops_per_s / _TERA for p in pts] + [min(r.peak_flops_per_s, lo * r.hbm_bytes_per_s) / _TERA
                                                 for r in roofline.roofs]
    y_lo = min(ys) / 3 if ys else 1e-3
    y_hi = max((r.peak_flops_per_s / _TERA for r in roofline.roofs), default=max(ys, default=1.0)) * 3
    for r, colour in zip(roofline.roofs, colours):
        ax.plot([r.ridge_flop_per_byte] * 2, [y_lo, r.peak_flops_per_s / _TERA], ls=":", lw=1, color=colour)
        ax.scatter([r.ridge_flop_per_byte], [r.peak_flops_per_s / _TERA], marker="D", s=30, color=colour, zorder=4)
    styles = {"floor": dict(marker="o", facecolors="none", edgecolors="tab:blue", label="predicted (op floor)"),
              "expected": dict(marker="s", facecolors="none", edgecolors="tab:gray", label="predicted (expected)"),
              "measured": dict(marker="*", color="tab:red", s=90, label="measured (real TPU)")}
    for kind, style in styles.items():
        chosen = [p for p in pts if p.kind == kind]
        if chosen:
            ax.scatter([p.intensity_flop_per_byte for p in chosen], [p.flops_per_s / _TERA for p in chosen],
                       zorder=3, **style)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(y_lo, y_hi),
           xlabel="arithmetic intensity [useful FLOP / HBM byte]", ylabel="useful TFLOP/s", title=title)
    if roofline.left_out:
        ax.text(0.99, 0.02, f"not plotted (no matrix FLOPs): {len(roofline.left_out)}", ha="right", va="bottom",
                fontsize=7, transform=ax.transAxes)
    if not pts:
        ax.text(0.5, 0.5, "no point has matrix FLOPs to place on a FLOP/s roofline", ha="center", va="center",
                fontsize=8, transform=ax.transAxes)
    if ax.get_legend_handles_labels()[0]:
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=7, ncols=2)
    ax.grid(True, which="both", lw=0.3)
    ridges = [(r.ridge_flop_per_byte, r.peak_flops_per_s / _TERA, f"ridge {intensity(r.ridge_flop_per_byte)}",
               colour) for r, colour in zip(roofline.roofs, colours)]
    points = [(x, y / _TERA, text, "k") for (x, y), text in _label_positions(pts).items()]
    place_labels(fig, ax, ridges + points)
    return fig


def _unit_colour(unit: str) -> str:
    """Colour of a bound name ("MXU-bound") or "step overhead"."""
    from perfmodel.model.core import BOUND_NAMES

    names = {name: unit_key for unit_key, name in BOUND_NAMES.items()}
    return BOUND_COLOURS.get(names.get(unit, unit), OVERHEAD_COLOUR if unit == "step overhead" else "k")


#: Where a label may go around its point (offsets in points), nearest first; the first that overlaps no other
#: label and stays inside the axes is taken.
_OFFSETS = [(5, -10), (5, 5), (-5, -10), (-5, 5), (5, -20), (5, 15), (-5, -20), (-5, 15), (14, -3), (-14, -3),
            (5, -32), (5, 27), (-5, -32), (-5, 27), (24, -15), (24, 10), (-24, -15), (-24, 10), (5, -45), (5, 40),
            (-5, -45), (-5, 40)]


def place_labels(fig: Any, ax: Any, spots: Sequence[tuple[float, float, str, str]]) -> list[Any]:
    """Annotate each (x, y, text, colour) in data coordinates of ax, each label at the first offset of
    :data:`_OFFSETS` where it overlaps no label placed before it and stays inside the axes (else where it
    overlaps least), with a thin leader line when it sits away from its point. Runs the figure's layout first
    and then fixes it, so the positions checked are the ones drawn."""
    fig.draw_without_rendering()
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    boxes: list[Any] = []
    for x, y, text, colour in spots:
        best = None
        for dx, dy in _OFFSETS:
            far = abs(dx) > 5 or abs(dy) > 10
            ann = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7, color=colour,
                              ha="left" if dx > 0 else "right", va="center",
                              arrowprops=dict(arrowstyle="-", lw=0.4, color=colour, shrinkA=0, shrinkB=2)
                              if far else None)
            box = ann.get_window_extent(renderer)
            inside = (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1)
            cost = sum(box.overlaps(b) for b in boxes) + (0 if inside else 0.5)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        placed.append(best[1])
        boxes.append(best[2])
    return placed


def _label_positions(points: Sequence[Any]) -> dict[tuple[float, float], str]:
    """Each label once, at its measured point if it has one, else at its floor; labels at (nearly) the same
    place are joined."""
    chosen: dict[str, Any] = {}
    for p in points:
        if p.kind == "measured" or (p.kind == "floor" and p.label not in chosen):
            chosen[p.label] = p
    return _grouped([(p.intensity_flop_per_byte, p.flops_per_s, label) for label, p in chosen.items()])


def _grouped(spots: Sequence[tuple[float, float, str]]) -> dict[tuple[float, float], str]:
    """Labels of points within ~12% of each other on log axes, joined at the first one's position ("a, b");
    a bracketed tag all of them share is said once ("a, b [batch 32]")."""
    import math
    import re

    groups: dict[tuple[float, float], list[str]] = {}
    keys: dict[tuple[float, float], tuple[float, float]] = {}
    for x, y, label in spots:
        if x <= 0 or y <= 0:
            continue
        key = (round(math.log10(x) * 20), round(math.log10(y) * 20))
        where = keys.setdefault(key, (x, y))
        groups.setdefault(where, []).append(label)
    out = {}
    for where, labels in groups.items():
        tags = {m.group(2) if (m := re.fullmatch(r"(.*) (\[[^\]]*\])", label)) else None for label in labels}
        if len(labels) > 1 and len(tags) == 1 and None not in tags:
            [tag] = tags
            out[where] = ", ".join(label[: -len(tag) - 1] for label in labels) + f" {tag}"
        else:
            out[where] = ", ".join(labels)
    return out
