"""Published Pallas TPU kernel timings against the analytic and the compiler-backed expected time, and the
fit of the compiler-backed timing's constants.

``perfmodel/data/validation/kernel_timings.yaml`` lists each point with the
exact call that reproduces it (MODULE:FUNCTION, ``--shape``/``--arg`` texts,
chip) and its role: ``fit:<constant>`` or ``held-out``. :func:`evaluate_points`
runs the schedule model and the TPU compiler (cached) on every point;
:func:`fit_constants` solves each constant on its own fit point (the others
held at their values), so the held-out errors say how well the model carries
over.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Sequence

from perfmodel.schedule.compiled import CompiledTimingConstants, compiled_time, default_constants

VALIDATION_FILE = "validation/kernel_timings.yaml"


@dataclass(frozen=True, kw_only=True)
class TimingPoint:
    id: str
    chip: str
    #: Key of the file's ``sources`` (one per publication) and its citation.
    source_id: str
    source: str
    role: str
    measured_s: float
    includes_dispatch: bool
    target: str
    shapes: tuple[str, ...]
    args: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class PointResult:
    point: TimingPoint
    #: Device-side model times plus the host-dispatch estimate when the measurement includes dispatch.
    analytic_s: float
    compiled_s: float | None
    dispatch_s: float
    mean_step_bundles: float | None
    compile_error: str | None

    @property
    def analytic_error(self) -> float:
        return self.analytic_s / self.point.measured_s - 1

    @property
    def compiled_error(self) -> float | None:
        return None if self.compiled_s is None else self.compiled_s / self.point.measured_s - 1


def load_points(text: str | None = None) -> list[TimingPoint]:
    import yaml

    if text is None:
        text = resources.files("perfmodel.data").joinpath(VALIDATION_FILE).read_text()
    data = yaml.safe_load(text)
    return [TimingPoint(id=p["id"], chip=p["chip"], source_id=p["source"], source=data["sources"][p["source"]], role=p["role"],
                        measured_s=float(p["measured_ms"]) * 1e-3, includes_dispatch=bool(p["includes_dispatch"]),
                        target=p["target"], shapes=tuple(p["shapes"]), args=tuple(p["args"]))
            for p in data["points"]]


@dataclass
class _Prepared:
    point: TimingPoint
    kernels: list[tuple[Any, Any]]  # (KernelAnalysis, KernelCompile) pairs
    analytic_s: float
    dispatch_s: float
    error: str | None


def prepare(points: Sequence[TimingPoint], *, progress: Callable[[str], None] | None = None) -> list[_Prepared]:
    """Analyze and compile every point once (compiles are cached on disk)."""
    from perfmodel.compiler.api import CompileCall, compile_report
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.binding import bind_function
    from perfmodel.schedule.timing import DEFAULT_HOST_DISPATCH

    out = []
    for p in points:
        chip = get_chip(p.chip)
        fn, arrays = bind_function(p.target, p.shapes, p.args, chip)
        analysis = analyze(fn, *arrays, chip=chip, keep_step_times=True)
        dispatch = DEFAULT_HOST_DISPATCH.seconds if p.includes_dispatch else 0.0
        report = compile_report(CompileCall(kind="function", target=p.target, shapes=p.shapes, args=p.args), chip,
                                progress=progress)
        pairs, error = [], report.error
        if report.compiled and len(report.kernels) == len(analysis.kernels):
            pairs = list(zip(analysis.kernels, report.kernels))
        elif report.compiled:
            error = (f"{len(report.kernels)} compiled kernels vs {len(analysis.kernels)} pallas_calls traced; "
                     "cannot pair them")
        out.append(_Prepared(point=p, kernels=pairs, analytic_s=analysis.expected_s + dispatch, dispatch_s=dispatch,
                             error=error))
    return out


def evaluate(prepared: Sequence[_Prepared], constants: CompiledTimingConstants | None = None) -> list[PointResult]:
    from perfmodel.hw.registry import get_chip

    c = constants or default_constants()
    rows = []
    for pp in prepared:
        compiled_s = bundles = None
        if pp.kernels:
            chip = get_chip(pp.point.chip)
            times = [compiled_time(k, comp, chip, c) for k, comp in pp.kernels]
            compiled_s = sum(t.expected_s for t in times) + pp.dispatch_s
            bundles = sum(t.mean_step_bundles for t in times)
        rows.append(PointResult(point=pp.point, analytic_s=pp.analytic_s, compiled_s=compiled_s,
                                dispatch_s=pp.dispatch_s, mean_step_bundles=bundles, compile_error=pp.error))
    return rows


def _solve(f: Callable[[float], float], lo: float, hi: float, iters: int = 60) -> float:
    """x in [lo, hi] with f(x) = 0 for an increasing f (clamped to the bounds)."""
    if f(lo) >= 0:
        return lo
    if f(hi) <= 0:
        return hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


#: Search range of each constant.
BOUNDS = {"dma_latency_s": (0.0, 5e-6), "stall_factor": (1.0, 3.0)}


def fit_constants(prepared: Sequence[_Prepared], start: CompiledTimingConstants | None = None,
                  rounds: int = 4) -> CompiledTimingConstants:
    """Each constant solved on its fit point (role ``fit:<name>``), the others held; a few rounds."""
    c = start or default_constants()
    fits = {pp.point.role.split(":", 1)[1]: pp for pp in prepared if pp.point.role.startswith("fit:")}
    for _ in range(rounds):
        for name, pp in fits.items():
            def resid(x: float, name: str = name, pp: _Prepared = pp) -> float:
                trial = dataclasses.replace(c, **{name: x})
                r = evaluate([pp], trial)[0]
                return (r.compiled_s or 0.0) - pp.point.measured_s
            c = dataclasses.replace(c, **{name: _solve(resid, *BOUNDS[name])})
    prov = {"fitted_on": {name: pp.point.id for name, pp in fits.items()},
            "held_out": [pp.point.id for pp in prepared if not pp.point.role.startswith("fit:")]}
    return dataclasses.replace(c, provenance=prov)


def summary(rows: Sequence[PointResult]) -> dict[str, Any]:
    """Median absolute error of each model over the held-out and the fit points."""
    def med(values: list[float]) -> float | None:
        return statistics.median(abs(v) for v in values) if values else None

    held = [r for r in rows if r.point.role == "held-out"]
    by_source = {}
    for sid in dict.fromkeys(r.point.source_id for r in held):
        group = [r for r in held if r.point.source_id == sid]
        by_source[sid] = {"points": len(group),
                          "analytic": med([r.analytic_error for r in group]),
                          "compiled": med([r.compiled_error for r in group if r.compiled_error is not None])}
    return {
        "held_out_points": len(held),
        "analytic_median_abs_error_held_out": med([r.analytic_error for r in held]),
        "compiled_median_abs_error_held_out": med([r.compiled_error for r in held if r.compiled_error is not None]),
        "compiled_median_abs_error_fit": med([r.compiled_error for r in rows
                                             if r.point.role != "held-out" and r.compiled_error is not None]),
        "held_out_by_source": by_source,
    }


def render_table(rows: Sequence[PointResult]) -> str:
    from perfmodel.units import seconds, table

    def err(x: float | None) -> str:
        return "-" if x is None else f"{x:+.1%}"

    body = [[r.point.id, r.point.chip, seconds(r.point.measured_s), seconds(r.analytic_s), err(r.analytic_error),
             seconds(r.compiled_s) if r.compiled_s is not None else (r.compile_error or "-")[:40],
             err(r.compiled_error), f"{r.mean_step_bundles:,.0f}" if r.mean_step_bundles else "-", r.point.role]
            for r in rows]
    head = ["point", "chip", "published", "analytic", "err", "compiler-backed", "err", "bundles/step", "role"]
    s = summary(rows)
    def pct(x: Any) -> str:
        return "-" if x is None else f"{x:.1%}"
    lines = [table(head, body, align="llrrrrrrl"), "",
             f"median |error| on the {s['held_out_points']} held-out points: analytic {pct(s['analytic_median_abs_error_held_out'])}, "
             f"compiler-backed {pct(s['compiled_median_abs_error_held_out'])}; on the fit points (compiler-backed): "
             f"{pct(s['compiled_median_abs_error_fit'])}",
             *(f"  {sid}: {g['points']} held-out points, median |error| analytic {pct(g['analytic'])}, "
               f"compiler-backed {pct(g['compiled'])}" for sid, g in s["held_out_by_source"].items()),
             "(times include perfmodel's host-dispatch estimate where the published figure includes dispatch)"]
    return "\n".join(lines)
