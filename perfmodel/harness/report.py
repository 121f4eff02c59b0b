"""Roofline reports as data and markdown: for a `predict model` step or for measured records.

:func:`step_report` takes what ``perfmodel predict model ... --json`` prints
(one record or a list); :func:`records_report` takes measurement records.
Both return a :class:`Report` (tables of strings plus the roofline's roofs
and points); :func:`to_markdown` renders it, :func:`perfmodel.harness.plots.roofline_figure`
draws its roofline. Pure functions of their inputs; no jax, no matplotlib.

Roofline axes: arithmetic intensity (useful matrix FLOPs per HBM byte) and
useful FLOP/s. A roof per (chip, MXU dtype): min(peak FLOP/s, intensity x
HBM bandwidth). Predicted points sit at the op floor (on or under the roof)
and at the expected time; measured points (real TPU only) at the measured
time. Ops without matrix FLOPs (norms, elementwise, sampling) have no place
on a FLOP/s roofline: they are listed in the tables and named in a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError
from perfmodel.harness.records import INTERPRET_LABEL, Located
from perfmodel.units import intensity, percent, seconds, si


@dataclass(frozen=True, kw_only=True)
class Roof:
    chip: str
    dtype: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.peak_flops_per_s / self.hbm_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class RooflinePoint:
    label: str
    chip: str
    intensity_flop_per_byte: float
    flops_per_s: float
    #: "floor" and "expected" (predictions) or "measured" (a real TPU).
    kind: str


@dataclass(frozen=True, kw_only=True)
class Roofline:
    roofs: tuple[Roof, ...]
    points: tuple[RooflinePoint, ...]
    #: Labels of rows that have no point (no matrix FLOPs or no HBM bytes).
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Section:
    heading: str
    headers: tuple[str, ...]
    #: Markdown alignment per column: "l" or "r".
    align: str
    rows: tuple[tuple[str, ...], ...]
    summary: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Report:
    title: str
    source: str
    sections: tuple[Section, ...]
    roofline: Roofline
    notes: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- shared helpers


def _chip(name: str, where: str) -> Any:
    from perfmodel.hw.registry import get_chip

    try:
        return get_chip(name)
    except InputError:
        raise
    except Exception as exc:  # UnknownChipError / SpecError: keep their one line, say where
        raise InputError(f"{where}: chip '{name}': {exc}") from None


def _roof(chip: Any, dtype: str) -> Roof | None:
    rate = chip.matmul_rate(dtype)
    if rate is None:
        return None
    return Roof(chip=chip.name, dtype=dtype, peak_flops_per_s=rate,
                hbm_bytes_per_s=chip.memory.hbm_bw_bytes_per_s_per_chip)


def _shares(chip: Any, dtype: str, useful_flops: float, hbm_bytes: float, time_s: float) -> tuple[str, str]:
    """MXU and HBM share of peak of work done in time_s."""
    rate = chip.matmul_rate(dtype)
    mxu = percent(useful_flops / (time_s * rate)) if rate and useful_flops and time_s > 0 else "-"
    hbm = percent(hbm_bytes / (time_s * chip.memory.hbm_bw_bytes_per_s_per_chip)) if hbm_bytes and time_s > 0 else "-"
    return mxu, hbm


def _intensity(useful_flops: float, hbm_bytes: float) -> float | None:
    return useful_flops / hbm_bytes if useful_flops > 0 and hbm_bytes > 0 else None


# --------------------------------------------------------------------------- predict model steps


_STEP_FIELDS = ("model", "chip", "step", "ops", "floor_s", "expected_s", "bound")
_OP_FIELDS = ("name", "count", "floor_s", "expected_s", "bound", "share", "hbm_bytes", "useful_flops", "mxu_dtype")


def step_report(data: Any, *, source: str) -> Report:
    """Report of `perfmodel predict model --json` output (a record or a list of them)."""
    steps = data if isinstance(data, list) else [data]
    if not steps:
        raise InputError(f"{source}: no step records")
    sections, roofs, points, left_out = [], {}, [], []
    for i, raw in enumerate(steps, start=1):
        where = f"{source}: record {i}"
        _require(raw, _STEP_FIELDS, where, "a `perfmodel predict model --json` record")
        chip = _chip(str(raw["chip"]), where)
        rows = []
        for j, op in enumerate(raw["ops"], start=1):
            _require(op, _OP_FIELDS, f"{where}, op {j}", "an op of `predict model --json`")
            floor, useful, hbm = float(op["floor_s"]), float(op["useful_flops"]), float(op["hbm_bytes"])
            ai = _intensity(useful, hbm)
            mxu, hbm_share = _shares(chip, str(op["mxu_dtype"]), useful, hbm, floor)
            rows.append((str(op["name"]), str(op["count"]), seconds(floor), seconds(float(op["expected_s"])),
                         str(op["bound"]), percent(float(op["share"])), intensity(ai) if ai else "-", mxu, hbm_share))
            label = op["name"] if len(steps) == 1 else f"{op['name']} [{chip.name}]"
            roof = _roof(chip, str(op["mxu_dtype"]))
            if ai is None or roof is None or floor <= 0:
                left_out.append(str(op["name"]))
                continue
            roofs[(roof.chip, roof.dtype)] = roof
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / floor, kind="floor"))
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / float(op["expected_s"]), kind="expected"))
        sections.append(Section(
            heading=f"{raw['model']} on {chip.name}: {_step_text(raw['step'])}",
            headers=("op", "x", "floor", "expected", "bound", "share of step", "FLOP/B", "MXU share at floor",
                     "HBM share at floor"),
            align="lrrrlrrrr", rows=tuple(rows),
            summary=_step_summary(raw),
        ))
    models = ", ".join(dict.fromkeys(str(s["model"]) for s in steps))
    chips = ", ".join(dict.fromkeys(str(s["chip"]) for s in steps))
    notes = ["times are per step on one chip; each op's floor is its roofline bound, `expected` applies the "
             "model's achievable-efficiency factors (perfmodel.model.core.ACHIEVABLE)"]
    if left_out:
        notes.append(f"not on the roofline (no matrix FLOPs): {', '.join(dict.fromkeys(left_out))}")
    return Report(title=f"Roofline report: {models} on {chips}", source=source, sections=tuple(sections),
                  roofline=Roofline(roofs=tuple(roofs.values()), points=tuple(points),
                                    left_out=tuple(dict.fromkeys(left_out))),
                  notes=tuple(notes))


def _require(obj: Any, fields: Sequence[str], where: str, what: str) -> None:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected {what} (a JSON object)")
    missing = [f for f in fields if f not in obj]
    if missing:
        raise InputError(f"{where}: field '{missing[0]}' missing; expected {what}")


def _step_text(step: Mapping[str, Any]) -> str:
    if not isinstance(step, dict):
        return str(step)
    parts = [str(step.get("phase", "?"))]
    if step.get("batch") is not None:
        parts.append(f"batch {step['batch']}")
    if step.get("phase") == "prefill":
        parts.append(f"{step.get('chunk_tokens')} new tokens after {step.get('context_tokens')}")
    else:
        parts.append(f"context {step.get('context_tokens')}")
    parts.append(f"weights {step.get('weight_dtype')}, KV {step.get('kv_dtype')}, TP {step.get('tp')}")
    return ", ".join(parts)


def _step_summary(raw: Mapping[str, Any]) -> tuple[str, ...]:
    out = [f"step floor {seconds(float(raw['floor_s']))}, expected {seconds(float(raw['expected_s']))}, "
           f"{raw['bound']}"]
    if "mbu_at_floor" in raw and "mfu_at_floor" in raw:
        out.append(f"MBU at floor {percent(float(raw['mbu_at_floor']))}, MFU at floor "
                   f"{percent(float(raw['mfu_at_floor']))}")
    if "tokens_per_s_per_chip" in raw:
        out.append(f"{si(float(raw['tokens_per_s_per_chip']), 'tok/s')} per chip at the floor")
    return tuple(out)


# --------------------------------------------------------------------------- measured records


def records_report(items: Sequence[Located], *, source: str) -> Report:
    """Report of measurement records: one row per record, predicted and (real TPU only) measured points."""
    if not items:
        raise InputError(f"{source}: no measurement records")
    rows, roofs, points, left_out = [], {}, [], []
    interpret = 0
    for n, item in enumerate(items, start=1):
        r = item.record
        p = r.prediction
        chip = _chip(p.chip, item.where)
        label = f"#{n}"
        if r.is_real:
            measured = seconds(r.timing.measured_s)
            eff = percent(r.efficiency) if r.efficiency is not None else "-"
            mxu, hbm = _shares(chip, p.mxu_dtype, p.useful_flops, p.ideal_hbm_bytes, r.timing.measured_s)
        else:
            interpret += 1
            measured = f"{seconds(r.timing.measured_s)} interpret wall (not TPU)"
            eff, mxu, hbm = "-", "-", "-"
        rows.append((str(n), r.kernel, r.arrays_text, r.blocks_text, p.chip, f"{r.backend}/{r.mode}", measured,
                     seconds(p.op_floor_s), seconds(r.expected_wall_s), _bound(p.op_floor_limiter), _limited_by(p),
                     eff, mxu, hbm))
        ai = _intensity(p.useful_flops, p.ideal_hbm_bytes)
        roof = _roof(chip, p.mxu_dtype) or _roof(chip, "bf16")
        if roof is not None:
            roofs[(roof.chip, roof.dtype)] = roof
        if ai is None or roof is None:
            left_out.append(label)
            continue
        points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                    flops_per_s=p.useful_flops / p.op_floor_s, kind="floor"))
        points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                    flops_per_s=p.useful_flops / p.expected_s, kind="expected"))
        if r.is_real:
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=p.useful_flops / r.timing.measured_s, kind="measured"))
    section = Section(
        heading="Measured kernels",
        headers=("#", "kernel", "arrays", "blocks", "chip", "backend/mode", "measured", "op floor",
                 "expected (+dispatch)", "floor bound", "limited by", "efficiency", "MXU share", "HBM share"),
        align="rllllllrrllrrr", rows=tuple(rows),
    )
    notes = ["efficiency = op floor / measured time (wall per call, dispatch included); MXU and HBM shares are "
             "useful FLOPs and each-byte-once HBM bytes over the measured time, against the chip's peaks; "
             "`expected (+dispatch)` adds the record's dispatch estimate where the timing includes dispatch; "
             "`limited by` is what sets the expected time (a unit, or the per-grid-step overhead)"]
    if interpret:
        notes.append(f"{interpret} interpret-mode record(s): their times are host wall times of Pallas TPU "
                     "interpret mode, not TPU performance; they have no efficiency and only their predictions are "
                     "plotted")
    if left_out:
        notes.append(f"not on the roofline (no matrix FLOPs): {', '.join(left_out)}")
    return Report(title="Roofline report: measured kernels", source=source, sections=(section,),
                  roofline=Roofline(roofs=tuple(roofs.values()), points=tuple(points), left_out=tuple(left_out)),
                  notes=tuple(notes))


def _limited_by(p: Any) -> str:
    """What limits the expected time: the unit (as its bound name) or the per-step overhead."""
    return "step overhead" if p.limiting_unit == "overhead" else _bound(p.limiting_unit)


def _bound(unit: str) -> str:
    from perfmodel.model.core import BOUND_NAMES

    return BOUND_NAMES.get(unit, unit)


# --------------------------------------------------------------------------- markdown


def to_markdown(report: Report, *, plot_name: str | None) -> str:
    """The report as markdown; the roofline image is linked as plot_name (relative to the markdown file)."""
    lines = [f"# {report.title}", "", f"Source: `{report.source}`.", ""]
    if plot_name:
        lines += [f"![roofline]({plot_name})", ""]
    for s in report.sections:
        lines += [f"## {s.heading}", "", _md_table(s.headers, s.rows, s.align), ""]
        lines += [f"- {line}" for line in s.summary]
        if s.summary:
            lines.append("")
    if report.notes:
        lines += ["Notes:", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([cells(headers), rule, *(cells(r) for r in rows)])


def as_dict(report: Report) -> dict[str, Any]:
    """JSON-ready form (tables as lists of dicts keyed by header)."""
    import dataclasses

    return {
        "title": report.title,
        "source": report.source,
        "sections": [{"heading": s.heading, "rows": [dict(zip(s.headers, r)) for r in s.rows],
                      "summary": list(s.summary)} for s in report.sections],
        "roofline": dataclasses.asdict(report.roofline),
        "notes": list(report.notes),
    }


# --------------------------------------------------------------------------- compare (text)


@dataclass(frozen=True, kw_only=True)
class Stats:
    count: int
    median: float | None
    lowest: float | None
    highest: float | None


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Measured vs predicted, real-TPU records and interpret-mode records apart."""

    real: tuple[Section, ...]
    interpret: tuple[Section, ...]
    #: Over real-TPU records with an efficiency: op floor / measured.
    efficiency: Stats
    #: Over real-TPU records: measured / expected (+dispatch).
    measured_over_expected: Stats
    notes: tuple[str, ...]


def _stats(values: Sequence[float]) -> Stats:
    import statistics

    if not values:
        return Stats(count=0, median=None, lowest=None, highest=None)
    return Stats(count=len(values), median=statistics.median(values), lowest=min(values), highest=max(values))


def compare(items: Sequence[Located]) -> Comparison:
    """Tables of measured vs predicted and statistics over the real-TPU records only."""
    real_rows, interp_rows = [], []
    for n, item in enumerate(items, start=1):
        r, p = item.record, item.record.prediction
        head = (str(n), r.kernel, r.arrays_text, r.blocks_text, p.chip)
        if r.is_real:
            t = r.timing
            spread = f"{seconds(t.min_s)}..{seconds(t.max_s)}" if t.min_s is not None and t.max_s is not None else "-"
            real_rows.append(head + (f"{seconds(t.measured_s)} ({t.statistic})", spread, seconds(p.op_floor_s),
                                     seconds(r.expected_wall_s), f"{t.measured_s / r.expected_wall_s:.2f}x",
                                     percent(r.efficiency) if r.efficiency is not None else "-",
                                     _bound(p.op_floor_limiter), _limited_by(p), item.where))
        else:
            interp_rows.append(head + (r.backend, seconds(r.timing.measured_s), seconds(p.op_floor_s),
                                       seconds(p.expected_s), item.where))
    real = [i.record for i in items if i.record.is_real]
    notes = []
    interp = len(items) - len(real)
    if interp:
        notes.append(f"{interp} interpret-mode record(s) shown apart and left out of the statistics: Pallas TPU "
                     "interpret mode runs on the host, so their wall times say nothing about TPU speed")
    if any(r.efficiency is None for r in real):
        notes.append("records predicted for another chip than the device have no efficiency and are left out of "
                     "the statistics")
    real_section = Section(
        heading="real TPU (compiled)",
        headers=("#", "kernel", "arrays", "blocks", "chip", "measured", "spread", "op floor", "expected (+dispatch)",
                 "measured/expected", "efficiency", "floor bound", "limited by", "record"),
        align="rllllrrrrrrlll", rows=tuple(real_rows))
    interp_section = Section(
        heading="interpret mode (host wall time of an emulation: not TPU performance)",
        headers=("#", "kernel", "arrays", "blocks", "predicted for", "backend", "interpret wall time",
                 "op floor (pred.)", "expected (pred.)", "record"),
        align="rllllrrrrl", rows=tuple(interp_rows))
    return Comparison(
        real=(real_section,) if real_rows else (), interpret=(interp_section,) if interp_rows else (),
        efficiency=_stats([r.efficiency for r in real if r.efficiency is not None]),
        measured_over_expected=_stats([r.timing.measured_s / r.expected_wall_s for r in real
                                       if r.device_chip == r.prediction.chip]),
        notes=tuple(notes),
    )


def render_compare(c: Comparison) -> str:
    from perfmodel.units import table

    lines: list[str] = []
    for s in c.real + c.interpret:
        lines += [s.heading + ":", table(list(s.headers), [list(r) for r in s.rows], align=s.align), ""]
    if c.efficiency.count:
        e, m = c.efficiency, c.measured_over_expected
        lines.append(f"efficiency (op floor / measured) over {e.count} real-TPU record(s): median {percent(e.median)}, "
                     f"range {percent(e.lowest)}..{percent(e.highest)}")
        lines.append(f"measured / expected (+dispatch) over {m.count}: median {m.median:.2f}x, "
                     f"range {m.lowest:.2f}x..{m.highest:.2f}x")
    else:
        lines.append("no real-TPU records: no efficiency statistics")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------- one record as text


def record_text(record: Any) -> str:
    """A few lines describing one measurement; interpret-mode times are labelled as not TPU performance."""
    r, p, t = record, record.prediction, record.timing
    spread = ""
    if t.min_s is not None and t.max_s is not None:
        spread = f" (min {seconds(t.min_s)}, max {seconds(t.max_s)}, IQR {seconds(t.iqr_s)}"
        after = f" after {t.warmup} warm-up" if t.warmup is not None else ""
        spread += f", {t.repeats} repeat{'s' if t.repeats != 1 else ''}{after})"
    lines = [f"{r.kernel}  {r.arrays_text}  blocks: {r.blocks_text}  (grid {_grid(p.grid)})",
             f"  backend {r.backend} ({r.device_kind}), mode {r.mode}, jax {r.jax_version or '?'}"]
    if r.is_real:
        dispatch = f"; trivial jitted call {seconds(t.dispatch_s)}" if t.dispatch_s is not None else ""
        lines.append(f"  measured: {t.statistic} {seconds(t.measured_s)}{spread}; wall per call, dispatch "
                     f"included{dispatch}")
    else:
        lines.append(f"  {INTERPRET_LABEL}: {t.statistic} {seconds(t.measured_s)}{spread}")
    lines.append(f"  predicted on {p.chip}: op floor {seconds(p.op_floor_s)} ({_bound(p.op_floor_limiter)}), "
                 f"expected {seconds(p.expected_s)} ({p.expected_source}"
                 + (f", {p.schedule_limiter}-limited" if p.schedule_limiter else "") + ")"
                 + (f", {seconds(r.expected_wall_s)} with dispatch" if r.is_real else ""))
    if r.efficiency is not None:
        lines.append(f"  efficiency (op floor / measured): {percent(r.efficiency)}; measured / expected "
                     f"(+dispatch): {t.measured_s / r.expected_wall_s:.2f}x")
    elif not r.is_real:
        lines.append("  efficiency: n/a (interpret mode: host wall time, not TPU performance)")
    else:
        lines.append("  efficiency: n/a (prediction is for another chip than the device)")
    lines += [f"  note: {n}" for n in r.notes if not n.startswith(INTERPRET_LABEL)]
    return "\n".join(lines)


def _grid(grid: Any) -> str:
    return "x".join(str(g) for g in grid) if grid else "-"
