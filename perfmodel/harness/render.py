"""Text of the measurement harness's results: one record (`perfmodel measure`), a comparison
(`perfmodel compare`) and a calibration (`perfmodel calibrate`). Pure functions; no jax."""

from __future__ import annotations

from typing import Any

from perfmodel.harness.calibrate import Calibration
from perfmodel.harness.comparison import Comparison
from perfmodel.harness.records import INTERPRET_LABEL, SPAN_TIMER, bound_name
from perfmodel.units import percent, seconds, table


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
    d = t.device_trace if t.timer == SPAN_TIMER else None
    if r.is_real and d is not None:
        lines.append(f"  measured: {t.statistic} {seconds(t.measured_s)}{spread}; xprof device span per call, host "
                     "dispatch apart")
    elif r.is_real:
        dispatch = f"; trivial jitted call {seconds(t.dispatch_s)}" if t.dispatch_s is not None else ""
        lines.append(f"  measured: {t.statistic} {seconds(t.measured_s)}{spread}; wall per call, dispatch "
                     f"included{dispatch}")
    elif d is not None:
        lines.append(f"  interpret-mode xprof device span on the host (not TPU performance): {t.statistic} "
                     f"{seconds(t.measured_s)}{spread}")
    else:
        lines.append(f"  {INTERPRET_LABEL}: {t.statistic} {seconds(t.measured_s)}{spread}")
    if d is not None:
        kernel = f"{seconds(d.kernel_s)} ({d.kernel_match})" if d.kernel_s is not None else f"n/a ({d.kernel_match})"
        lines.append(f"  medians per call: {d.span_timer} {seconds(d.span_s)}; {d.kernel_timer} {kernel}; host "
                     f"dispatch ({d.dispatch_timer}) {seconds(d.dispatch_s)}; {d.wall_timer} {seconds(d.wall_s)} "
                     "(cross-check, profiler running)")
    lines.append(f"  predicted on {p.chip}: op floor {seconds(p.op_floor_s)} ({bound_name(p.op_floor_limiter)}), "
                 f"expected {seconds(p.expected_s)} ({p.expected_source}"
                 + (f", {p.schedule_limiter}-limited" if p.schedule_limiter else "") + ")"
                 + (f", {seconds(r.expected_wall_s)} with dispatch" if r.is_real else ""))
    if r.efficiency is not None:
        lines.append(f"  efficiency (op floor / measured): {percent(r.efficiency)}; measured / expected "
                     f"(+dispatch): {t.measured_s / r.expected_wall_s:.2f}x")
    elif not r.is_real:
        lines.append("  efficiency: n/a (interpret mode: the host's time, not TPU performance)")
    else:
        lines.append("  efficiency: n/a (prediction is for another chip than the device)")
    lines += [f"  note: {n}" for n in r.notes if not n.startswith(INTERPRET_LABEL)]
    return "\n".join(lines)


def _grid(grid: Any) -> str:
    return "x".join(str(g) for g in grid) if grid else "-"


#: Columns left out first when a table does not fit the output width (the record's file:line is in --json).
_LOW_PRIORITY = ("record", "spread", "floor bound", "less dispatch", "op floor", "efficiency")


def render_compare(c: Comparison) -> str:
    """The measured-vs-predicted tables, the statistics over real-TPU records and the notes."""
    lines: list[str] = []
    for s in c.real + c.interpret:
        lines += [s.heading + ":", table(list(s.headers), [list(r) for r in s.rows], align=s.align,
                                         optional=_LOW_PRIORITY), ""]
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


def render_calibration(cal: Calibration) -> str:
    """The fitted factor per chip and unit, then every record and whether it was used."""
    def pct(x: float | None) -> str:
        return percent(x) if x is not None else "-"

    rows = [[f.chip, f.unit.upper(), pct(f.factor), str(f.points),
             f"{pct(f.lowest)}..{pct(f.highest)}" if f.points else "-",
             pct(f.model_factor) + ("" if f.points else " (kept: no usable point)")] for f in cal.factors]
    lines = [f"method: {cal.method}", "",
             table(["chip", "unit", "fitted", "points", "range", "model now"], rows, align="llrrrl"), ""]
    prow = [[str(n), p.where, p.kernel, p.arrays, p.blocks, p.unit, seconds(p.measured_s),
             seconds(p.device_s) if p.device_s is not None else "-", seconds(p.expected_s),
             pct(p.implied_factor), "used" if p.used else p.reason]
            for n, p in enumerate(cal.points, start=1)]
    lines.append(table(["#", "record", "kernel", "arrays", "blocks", "unit", "measured", "less dispatch",
                        "expected", "implied", "used?"], prow, align="rllllrrrrrl", optional=_LOW_PRIORITY))
    if cal.interpret_records:
        lines.append(f"note: {cal.interpret_records} interpret-mode record(s) left out (host wall time, not TPU "
                     "performance)")
    return "\n".join(lines)
