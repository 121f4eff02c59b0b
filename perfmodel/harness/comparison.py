"""Measured vs predicted over measurement records (`perfmodel compare`): tables and statistics.

Real-TPU records and interpret-mode records are kept apart; only real-TPU
records enter the statistics (interpret-mode times are host wall times of an
emulation). :mod:`perfmodel.harness.render` prints a :class:`Comparison`.
No jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from perfmodel.harness.records import Located, bound_name, limited_by
from perfmodel.harness.roofline_report import Section
from perfmodel.units import percent, seconds


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
                                     bound_name(p.op_floor_limiter), limited_by(p), item.where))
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
