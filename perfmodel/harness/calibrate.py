"""Fitting the expected-time model's achievable-efficiency factors from real-backend records.

The expected time of a kernel divides the limiting unit's work by its peak
rate times an achievable factor (:data:`perfmodel.model.core.ACHIEVABLE`:
92% MXU, 85% HBM, ...). A real-TPU record whose time is set by one unit
implies the factor that would have predicted it exactly::

    implied = model factor x expected_s / device time

where the device time is the measured time less the dispatch estimate (the
timings include host dispatch). That assumes the time scales as 1 / factor,
true when that unit limits every grid step; prologue and epilogue DMA make it
approximate. Method: **median ratio per limiting unit** (and chip): the
fitted factor is the median of the implied factors of the unit's points,
robust to an outlier where least squares is not.

Left out, each with its reason: interpret-mode records (host wall time, not
TPU performance), records predicted for another chip than the device,
dispatch-dominated points (expected time under 2x the dispatch estimate,
where the subtraction dominates), points limited by the per-grid-step
overhead (no unit factor applies) and points whose measured time does not
exceed the dispatch estimate. Pure functions of the records; no jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from perfmodel.errors import InputError
from perfmodel.harness.records import Located, Record

METHOD = ("median ratio per limiting unit: each usable point implies factor = model factor x expected / "
          "(measured - dispatch); the fitted factor is the median over the unit's points")

#: Units whose factors are always reported (the ones the expected-time model leans on most).
MAIN_UNITS = ("mxu", "hbm")


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    """One real-backend record as calibration sees it."""

    where: str
    kernel: str
    arrays: str
    blocks: str
    chip: str
    unit: str
    measured_s: float
    device_s: float | None
    expected_s: float
    #: model factor x expected / device time (None when the point is left out).
    implied_factor: float | None
    used: bool
    #: Why it is left out ("" when used).
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class FittedFactor:
    chip: str
    unit: str
    #: None when no point constrains the unit.
    factor: float | None
    points: int
    #: The factor the model uses today (perfmodel.model.core.ACHIEVABLE) and where it comes from.
    model_factor: float | None
    model_source: str
    lowest: float | None = None
    highest: float | None = None


@dataclass(frozen=True, kw_only=True)
class Calibration:
    method: str
    factors: tuple[FittedFactor, ...]
    points: tuple[CalibrationPoint, ...]
    #: Interpret-mode records seen and left out.
    interpret_records: int


def calibrate(items: Sequence[Located]) -> Calibration:
    """Fit the factors; InputError (one line naming the file) when only interpret-mode records are given."""
    from perfmodel.model.core import ACHIEVABLE

    real = [i for i in items if i.record.is_real]
    if not real:
        files = ", ".join(sorted({i.where.rsplit(":", 1)[0] for i in items}))
        raise InputError(f"{files}: only interpret-mode records ({len(items)}); calibration needs timings of "
                         "kernels compiled on a real TPU (mode 'compiled'), e.g. `perfmodel measure` on a TPU VM")
    points = tuple(_point(i) for i in real)
    chips = list(dict.fromkeys(p.chip for p in points))
    factors = []
    for chip in chips:
        units = list(MAIN_UNITS) + sorted({p.unit for p in points if p.chip == chip and p.used} - set(MAIN_UNITS))
        for unit in units:
            implied = [p.implied_factor for p in points if p.chip == chip and p.unit == unit and p.used]
            model = ACHIEVABLE.get(unit)
            factors.append(FittedFactor(
                chip=chip, unit=unit, factor=float(np.median(implied)) if implied else None, points=len(implied),
                model_factor=model[0] if model else None, model_source=model[1] if model else "",
                lowest=min(implied) if implied else None, highest=max(implied) if implied else None,
            ))
    return Calibration(method=METHOD, factors=tuple(factors), points=points,
                       interpret_records=len(items) - len(real))


def _point(item: Located) -> CalibrationPoint:
    r = item.record
    p = r.prediction
    reason = _exclusion(r)
    device = r.device_time_s
    implied = None
    if not reason:
        implied = p.model_factor * p.expected_s / device
    return CalibrationPoint(
        where=item.where, kernel=r.kernel, arrays=r.arrays_text, blocks=r.blocks_text, chip=p.chip,
        unit=p.limiting_unit, measured_s=r.timing.measured_s, device_s=device, expected_s=p.expected_s,
        implied_factor=implied, used=not reason, reason=reason,
    )


def _exclusion(r: Record) -> str:
    """Why a real-backend record cannot calibrate a factor ("" when it can)."""
    p = r.prediction
    if r.device_chip != p.chip:
        return f"predicted for {p.chip}, measured on {r.device_chip or r.device_kind}"
    if p.limiting_unit == "overhead":
        return "limited by the per-grid-step overhead, not by a unit's rate"
    if p.model_factor is None:
        return f"no achievable factor for unit '{p.limiting_unit}'"
    if p.dispatch_dominated:
        return "dispatch-dominated: expected time under 2x the dispatch estimate"
    if r.device_time_s is None:
        return "measured time does not exceed the dispatch estimate"
    return ""
