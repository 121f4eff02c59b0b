"""The shipped validation set: every published measurement of ``perfmodel/data/validation/`` run through the
library calls the public commands use, against its floor and expected time (``perfmodel validate``).

* ``published.yaml``: XLA ops, memory ops, GPU GEMMs and collectives, each a ``perfmodel predict`` op and its
  parameters (:func:`perfmodel.predict.ops.predict_op`), and end-to-end serving points, each one or more model
  steps (``perfmodel predict model``, :func:`perfmodel.predict.steps.step_sweep`) whose times add up to what was
  timed (a decode step; a request's prefill plus its decode steps);
* ``kernel_timings.yaml``: Pallas TPU kernels with the call that reproduces them, run through
  ``perfmodel analyze`` (:func:`perfmodel.schedule.analyze.analyze`; needs jax, so ``kernels=False`` skips them).

A measurement that includes host dispatch is compared with expected + the chip's ``host_dispatch_s`` (once per
model step for serving points); the floor is always the pure roofline. ``pairs`` in published.yaml compare two
points' measured speedup with the predicted one (e.g. int8 vs bf16 serving). Points whose role is ``fit:<constant>`` fixed a constant; the held-out error is
reported apart. A point measured faster than its floor is a model error (``beats_floor``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Sequence

PUBLISHED_FILE = "validation/published.yaml"
#: Group of the kernel_timings.yaml points.
KERNEL_GROUP = "pallas-kernel"
#: An op whose floor is under this many seconds is "small" (the issue's within-2x target).
SMALL_OP_FLOOR_S = 50e-6


#: Ops that `perfmodel predict collective KIND` runs.
COLLECTIVE_OPS = ("all-gather", "reduce-scatter", "all-reduce")


def _flags(params: dict[str, Any], skip: tuple[str, ...] = ()) -> str:
    return " ".join(f"--{k.replace('_', '-')} {v}" if v is not True else f"--{k.replace('_', '-')}"
                    for k, v in params.items() if k not in skip)


def _predict_command(op: str, params: dict[str, Any], chip: str) -> str:
    group = "collective " if op in COLLECTIVE_OPS else ""
    return f"perfmodel predict {group}{op} --hw {chip} {_flags(params)}".strip()


@dataclass(frozen=True, kw_only=True)
class ValidationPoint:
    id: str
    group: str
    chip: str
    #: The citation (URL / file at a commit).
    source: str
    #: "held-out" or "fit:<constant>".
    role: str
    measured_s: float
    includes_dispatch: bool
    #: What exactly was timed, as the source says.
    timed: str
    #: A predict op and its parameters, or (for a kernel) the target, shapes and args of `perfmodel analyze`.
    op: str | None = None
    #: Serving points: a preset name, or a Hugging Face config (dict) written to ``<model>/config.json``.
    model: str | None = None
    hf_config: dict[str, Any] | None = None
    #: Serving points: the steps whose times add up to the measurement, each `predict model` options plus
    #: ``count`` (how many such steps were timed).
    steps: tuple[dict[str, Any], ...] = ()
    #: What the published setup has that the model lacks, and how the measurement was turned into a time.
    note: str = ""
    params: dict[str, Any] | None = None
    target: str | None = None
    shapes: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    #: Ops whose floors and expected times add up to the measurement, each (predict op, its parameters).
    parts: tuple[tuple[str, dict[str, Any]], ...] = ()
    #: The recorded call as its source gives it (tokamax points: op, pass, implementation, args), for the
    #: compiler-backed path (:mod:`perfmodel.harness.tokamax_compiled`).
    call: dict[str, Any] | None = None
    #: A tokamax Pallas point modelled by perfmodel.analyze on tokamax's own kernel (``call`` holds the op,
    #: arguments and config; :mod:`perfmodel.harness.tokamax_analyze`).
    tokamax_kernel: bool = False

    @property
    def is_fit(self) -> bool:
        return self.role.startswith("fit")

    @property
    def command(self) -> str:
        """The public command that reproduces the prediction (serving points: one per kind of step, `; `-joined)."""
        if self.steps:
            name = f"--config {self.model}/config.json" if self.hf_config else self.model
            return "; ".join(f"perfmodel predict model {name} --hw {self.chip} {_flags(s, skip=('count',))}"
                             + (f" (x{s['count']})" if s.get("count", 1) != 1 else "") for s in self.steps)
        if self.tokamax_kernel:
            return f"perfmodel validate --group {self.group} --pallas analyze (perfmodel.analyze on {self.call['tokamax_op']})"
        if self.op is not None or self.parts:
            return "; ".join(_predict_command(op, params, self.chip)
                             for op, params in (self.parts or ((self.op, self.params or {}),)))
        return (f"perfmodel analyze {self.target} --hw {self.chip} "
                + " ".join(f"--shape {s}" for s in self.shapes) + " " + " ".join(f"--arg {a}" for a in self.args))


@dataclass(frozen=True, kw_only=True)
class ValidationRow:
    point: ValidationPoint
    floor_s: float
    #: On the measurement's footing: expected device time plus host dispatch where the timing includes it.
    expected_s: float
    dispatch_s: float
    #: ``--compile`` (tokamax XLA points): the compiled program's time (perfmodel.harness.tokamax_compiled),
    #: None without one; ``compiled_note`` says why there is none (with one: what to doubt in it, or "").
    compiled_expected_s: float | None = None
    compiled_note: str = ""

    @property
    def error(self) -> float:
        """expected / measured - 1 (positive: the model is slower than the measurement)."""
        return self.expected_s / self.point.measured_s - 1

    @property
    def compiled_error(self) -> float | None:
        """compiled expected / measured - 1; None without a compiled time."""
        return None if self.compiled_expected_s is None else self.compiled_expected_s / self.point.measured_s - 1

    @property
    def measured_over_floor(self) -> float:
        return self.point.measured_s / self.floor_s if self.floor_s > 0 else float("inf")

    @property
    def beats_floor(self) -> bool:
        """The measurement is faster than the roofline floor: the model (or the spec) is wrong."""
        return self.point.measured_s < self.floor_s * (1 - 1e-9)

    @property
    def small(self) -> bool:
        return self.floor_s < SMALL_OP_FLOOR_S


@dataclass(frozen=True, kw_only=True)
class PairRow:
    """Two points of one setup that differ in one thing (e.g. int8 vs bf16 weights and KV): the measured speedup
    of ``fast`` over ``base`` against the predicted one (expected times, on the measurements' footing)."""

    id: str
    what: str
    base: ValidationRow
    fast: ValidationRow

    @property
    def measured_speedup(self) -> float:
        return self.base.point.measured_s / self.fast.point.measured_s

    @property
    def predicted_speedup(self) -> float:
        return self.base.expected_s / self.fast.expected_s

    @property
    def error(self) -> float:
        """predicted / measured speedup - 1 (positive: the model promises more gain than was measured)."""
        return self.predicted_speedup / self.measured_speedup - 1


@dataclass(frozen=True, kw_only=True)
class ErrorSummary:
    count: int
    #: Median of |error|; None with no points.
    median_abs_error: float | None
    #: The error of largest magnitude (signed) and its point.
    worst_error: float | None
    worst_id: str | None
    #: Median of measured / expected (above 1: the model is optimistic); None with no points.
    median_measured_over_expected: float | None = None


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    group: str
    chips: tuple[str, ...]
    all: ErrorSummary
    held_out: ErrorSummary
    fit: ErrorSummary
    #: ``--compile``: the rows with a compiled time, held-out and fit apart (None without ``--compile``).
    compiled_held_out: CompiledSummary | None = None
    compiled_fit: CompiledSummary | None = None


@dataclass(frozen=True, kw_only=True)
class CompiledSummary:
    """The rows that have a compiler-backed time: its errors next to the analytic errors of the same rows."""

    compiled: ErrorSummary
    analytic: ErrorSummary


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    rows: tuple[ValidationRow, ...]
    groups: tuple[GroupSummary, ...]
    overall: ErrorSummary
    held_out: ErrorSummary
    fit: ErrorSummary
    #: Small ops (floor under SMALL_OP_FLOOR_S) whose expected time is within 2x of the measurement, of all small ops.
    small_within_2x: int
    small_count: int
    chips: tuple[str, ...]
    pairs: tuple[PairRow, ...] = ()
    #: Points of the selected groups with no op model yet (id, group, reason).
    not_modelled: tuple[Any, ...] = ()
    #: Whether compiled times were asked for (``--compile``), and the per-group sample size (None: all).
    compiled: bool = False
    sample: int | None = None

    @property
    def beats_floor(self) -> tuple[str, ...]:
        return tuple(r.point.id for r in self.rows if r.beats_floor)


def summarize(rows: Sequence[ValidationRow], *, compiled: bool = False) -> ErrorSummary:
    """Median |error| and the worst (signed) error of rows (``compiled``: of their compiled times)."""
    if not rows:
        return ErrorSummary(count=0, median_abs_error=None, worst_error=None, worst_id=None)
    error = (lambda r: r.compiled_error) if compiled else (lambda r: r.error)
    expected = (lambda r: r.compiled_expected_s) if compiled else (lambda r: r.expected_s)
    worst = max(rows, key=lambda r: abs(error(r)))
    return ErrorSummary(count=len(rows), median_abs_error=statistics.median(abs(error(r)) for r in rows),
                        worst_error=error(worst), worst_id=worst.point.id,
                        median_measured_over_expected=statistics.median(r.point.measured_s / expected(r)
                                                                        for r in rows))


def summarize_compiled(rows: Sequence[ValidationRow]) -> CompiledSummary:
    """The rows with a compiled time: compiled and analytic errors of those same rows."""
    done = [r for r in rows if r.compiled_expected_s is not None]
    return CompiledSummary(compiled=summarize(done, compiled=True), analytic=summarize(done))


def _published(text: str | None) -> dict[str, Any]:
    import yaml

    if text is None:
        text = resources.files("perfmodel.data").joinpath(PUBLISHED_FILE).read_text()
    return yaml.safe_load(text)


def load_pairs(text: str | None = None) -> list[dict[str, str]]:
    """The ``pairs`` of published.yaml (or ``text``): id, what, base and fast point ids."""
    return [dict(p) for p in _published(text).get("pairs", ())]


def load_points(*, kernels: bool = True, text: str | None = None) -> list[ValidationPoint]:
    """Every point of published.yaml (or ``text``) and, with ``kernels``, of kernel_timings.yaml."""
    data = _published(text)
    points = [ValidationPoint(id=p["id"], group=p["group"], chip=p["chip"], source=data["sources"][p["source"]],
                              role=p["role"], measured_s=float(p["measured_ms"]) * 1e-3,
                              includes_dispatch=bool(p["includes_dispatch"]), timed=p["timed"], op=p.get("op"),
                              params=dict(p["params"]) if "params" in p else None, model=p.get("model"),
                              hf_config=data.get("hf_configs", {}).get(p["model"]) if "model" in p else None,
                              steps=tuple(dict(st) for st in p.get("steps", ())), note=p.get("note", ""))
              for p in data["points"]]
    if kernels:
        from perfmodel.harness.kernel_validation import load_points as kernel_points

        points += [ValidationPoint(id=k.id, group=KERNEL_GROUP, chip=k.chip, source=k.source, role=k.role,
                                   measured_s=k.measured_s, includes_dispatch=k.includes_dispatch,
                                   timed=k.source, target=k.target, shapes=k.shapes, args=k.args)
                   for k in kernel_points()]
    return points


def evaluate_point(p: ValidationPoint) -> ValidationRow:
    """Floor and expected time of one point through the public library calls."""
    from perfmodel.hw.registry import get_chip

    chip = get_chip(p.chip)
    dispatch = (chip.overheads.host_dispatch_s or 0.0) if p.includes_dispatch else 0.0
    if p.steps:
        from perfmodel.predict.steps import step_sweep

        model = model_config_from_hf(p.model, p.hf_config) if p.hf_config else p.model
        floor = expected = 0.0
        calls = 0
        for st in p.steps:
            count = int(st.get("count", 1))
            opts = {k: v for k, v in st.items() if k != "count"}
            (pred,) = step_sweep(model, chips=[chip], **opts).predictions
            floor += count * float(pred.floor_s)
            expected += count * float(pred.expected_s)
            calls += count
        return ValidationRow(point=p, floor_s=floor, expected_s=expected + calls * dispatch, dispatch_s=calls * dispatch)
    if p.tokamax_kernel:
        from perfmodel.harness.tokamax_analyze import analyze_call

        t = analyze_call(p.call or {}, chip)
        # The floor is the op's: the kernel's extra work for the assumed inputs (a grouped matmul's row tiles
        # straddling groups, visited once per group, for representative group sizes) is in its expected time;
        # where the op has an op model, the lower of the two floors.
        floor = min(t.floor_s, _parts_times(p.parts, chip)[0]) if p.parts else t.floor_s
        return ValidationRow(point=p, floor_s=floor, expected_s=t.expected_s + dispatch, dispatch_s=dispatch)
    if p.op is not None or p.parts:
        floor, expected = _parts_times(p.parts or ((p.op, p.params or {}),), chip)
        return ValidationRow(point=p, floor_s=floor, expected_s=expected + dispatch, dispatch_s=dispatch)
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.binding import bind_function

    fn, arrays = bind_function(p.target, p.shapes, p.args, chip)
    analysis = analyze(fn, *arrays, chip=chip, host_dispatch_s=dispatch)
    floor = sum(k.time.op_floor_s for k in analysis.kernels)
    return ValidationRow(point=p, floor_s=float(floor), expected_s=float(analysis.expected_s) + dispatch,
                         dispatch_s=dispatch)


def _parts_times(parts: Any, chip: Any) -> tuple[float, float]:
    """(floor, expected) seconds of predict ops summed."""
    from perfmodel.predict.ops import predict_op

    floor = expected = 0.0
    for op, params in parts:
        (pred,) = predict_op(op, params, chips=[chip]).predictions
        floor += float(pred.roofline.floor_s)
        expected += float(pred.roofline.expected_s)
    return floor, expected


_MODEL_DIRS: dict[str, Any] = {}


def model_config_from_hf(name: str, hf_config: dict[str, Any]) -> Any:
    """The ModelConfig of a Hugging Face config given inline in published.yaml, read the way `--config` reads a
    file (it is written once per process to a temporary ``<name>/config.json``)."""
    import json
    import tempfile
    from pathlib import Path

    from perfmodel.model.hf_config import load_hf_config

    if name not in _MODEL_DIRS:
        _MODEL_DIRS[name] = tempfile.TemporaryDirectory(prefix="perfmodel-validate-")
    file = Path(_MODEL_DIRS[name].name) / name / "config.json"
    file.parent.mkdir(exist_ok=True)
    file.write_text(json.dumps(hf_config))
    return load_hf_config(file)


def run_validation(points: Sequence[ValidationPoint] | None = None, *, groups: Sequence[str] = (),
                   kernels: bool = True, progress: Callable[[str], None] | None = None, with_compile: bool = False,
                   sample: int | None = None, jobs: int = 1, pallas: str = "op-model",
                   tokamax_file: str | None = None) -> ValidationReport:
    """Evaluate every point (of ``groups`` when given) and summarize the errors per group and overall.
    ``with_compile``: also a compiler-backed time for each tokamax XLA point (``sample``: at most that many per group,
    evenly spaced; ``jobs`` compiles at a time), see :mod:`perfmodel.harness.tokamax_compiled`. ``pallas``: how
    the tokamax Pallas points are modelled (:data:`perfmodel.harness.tokamax_validation.PALLAS_PATHS`; "analyze"
    needs tokamax importable). ``tokamax_file``: the tokamax groups' timings from this file (the subset's format,
    every point held out) instead of the shipped subset."""
    from perfmodel.errors import InputError
    from perfmodel.harness import tokamax_validation as tokamax

    wants_tokamax = any(g == tokamax.GROUP_PREFIX or g.startswith(tokamax.GROUP_PREFIX + "-") for g in groups)
    if tokamax_file is not None and points is None and not wants_tokamax:
        raise InputError("`tokamax-file`: the file holds timings for the tokamax groups; add --group tokamax (or "
                         "one tokamax-... group)", fields=("tokamax_file",))
    if (with_compile or sample is not None) and points is None and not wants_tokamax:
        flag = "--compile" if with_compile else "--sample"
        raise InputError(f"`{flag.lstrip('-')}`: compiled times are for the tokamax groups only; add "
                         f"--group tokamax (or one tokamax-... group)", fields=(flag.lstrip("-"),))
    if pallas not in tokamax.PALLAS_PATHS:
        raise InputError(f"`pallas` '{pallas}': use one of {', '.join(tokamax.PALLAS_PATHS)}", fields=("pallas",))
    if pallas != "op-model" and points is None and not wants_tokamax:
        raise InputError("`pallas`: it says how the tokamax Pallas points are modelled; add --group tokamax (or "
                         "one tokamax-... group)", fields=("pallas",))
    if pallas == "analyze":
        from perfmodel.harness.tokamax_analyze import require_tokamax

        require_tokamax()
    if sample is not None and (not with_compile or sample < 1):
        raise InputError("`sample`: N >= 1 points per group, with --compile", fields=("sample",))

    skipped: list[Any] = []
    if points is not None:
        pts = list(points)
    else:
        pts = load_points(kernels=kernels)
        if any(g.startswith(tokamax.GROUP_PREFIX) for g in groups):
            more, skipped = tokamax.load_points(pallas=pallas, path=tokamax_file)
            pts += more
    known = sorted({p.group for p in pts} | {tokamax.GROUP_PREFIX})
    for g in groups:
        if g not in known:
            raise InputError(f"`group` '{g}': no such group; one of {', '.join(known)}", fields=("group",))
    if groups:
        # "tokamax" selects every tokamax group.
        pts = [p for p in pts if p.group in groups
               or (tokamax.GROUP_PREFIX in groups and p.group.startswith(tokamax.GROUP_PREFIX + "-"))]
        skipped = [s for s in skipped if s.group in groups or tokamax.GROUP_PREFIX in groups]
    rows = []
    for p in pts:
        if progress is not None:
            progress(p.id)
        rows.append(evaluate_point(p))
    if with_compile:
        rows = _with_compiled_times(rows, sample=sample, jobs=jobs, progress=progress)
    summaries = []
    for g in dict.fromkeys(r.point.group for r in rows):
        rs = [r for r in rows if r.point.group == g]
        summaries.append(GroupSummary(group=g, chips=tuple(dict.fromkeys(r.point.chip for r in rs)), all=summarize(rs),
                                      held_out=summarize([r for r in rs if not r.point.is_fit]),
                                      fit=summarize([r for r in rs if r.point.is_fit]),
                                      compiled_held_out=summarize_compiled([r for r in rs if not r.point.is_fit])
                                      if with_compile else None,
                                      compiled_fit=summarize_compiled([r for r in rs if r.point.is_fit])
                                      if with_compile else None))
    small = [r for r in rows if r.small]
    by_id = {r.point.id: r for r in rows}
    pairs = tuple(PairRow(id=q["id"], what=q["what"], base=by_id[q["base"]], fast=by_id[q["fast"]])
                  for q in (load_pairs() if points is None else ()) if q["base"] in by_id and q["fast"] in by_id)
    return ValidationReport(
        pairs=pairs, not_modelled=tuple(skipped),
        rows=tuple(rows), groups=tuple(summaries), overall=summarize(rows),
        held_out=summarize([r for r in rows if not r.point.is_fit]), fit=summarize([r for r in rows if r.point.is_fit]),
        small_within_2x=sum(1 for r in small if 0.5 <= r.expected_s / r.point.measured_s <= 2.0),
        small_count=len(small), chips=tuple(dict.fromkeys(r.point.chip for r in rows)), compiled=with_compile,
        sample=sample)


def _with_compiled_times(rows: Sequence[ValidationRow], *, sample: int | None, jobs: int,
                         progress: Callable[[str], None] | None) -> list[ValidationRow]:
    """Rows with the compiled time of each sampled tokamax XLA point (the others say why they have none)."""
    import dataclasses

    from perfmodel.harness import tokamax_compiled as tc

    xla = [r for r in rows if r.point.call is not None and not r.point.call["implementation"].startswith("pallas")]
    kernels = [r for r in rows if r.point.tokamax_kernel]
    by_group: dict[str, list[str]] = {}
    for r in xla + kernels:
        by_group.setdefault(r.point.group, []).append(r.point.id)
    chosen = tc.sample(by_group, sample)
    times = tc.compile_points([r.point for r in xla if r.point.id in chosen], jobs=jobs, progress=progress)
    if kernels:  # --pallas analyze: tokamax's own kernels, compiled one at a time
        from perfmodel.harness.tokamax_pallas_compiled import compiled_time

        for r in kernels:
            if r.point.id in chosen:
                if progress is not None:
                    progress(f"compile {r.point.id}")
                t, why = compiled_time(r.point)
                times[r.point.id] = tc.CompiledTime(id=r.point.id, expected_s=t, reason=why)
    out = []
    for r in rows:
        if r.point.call is None:
            out.append(r)
        elif r.point.call["implementation"].startswith("pallas") and not r.point.tokamax_kernel:
            out.append(dataclasses.replace(r, compiled_note=tc.PALLAS_REASON))
        elif r.point.id not in times:
            out.append(dataclasses.replace(r, compiled_note=tc.NOT_SAMPLED))
        else:
            t = times[r.point.id]
            out.append(dataclasses.replace(r, compiled_expected_s=t.expected_s, compiled_note=t.reason))
    return out


# ----------------------------------------------------------------------------- rendering


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _summary_cells(s: ErrorSummary) -> list[str]:
    if not s.count:
        return ["0", "-", "-", "-"]
    return [str(s.count), f"{s.median_abs_error * 100:.1f}%", f"{s.median_measured_over_expected:.2f}",
            f"{_pct(s.worst_error)} ({s.worst_id})"]


def report_text(report: ValidationReport) -> str:
    """The per-point table, the per-group summary (held-out apart from fit points) and the verdict."""
    from perfmodel.units import seconds, table

    rows = [[r.point.id, r.point.group, r.point.chip, "fit" if r.point.is_fit else "held-out",
             "yes" if r.point.includes_dispatch else "no", seconds(r.point.measured_s), seconds(r.floor_s),
             seconds(r.expected_s), f"{r.measured_over_floor:.2f}x", _pct(r.error) + (" BEATS FLOOR" if r.beats_floor
                                                                                     else "")]
            for r in report.rows]
    out = [table(["point", "group", "chip", "role", "dispatch", "measured", "floor", "expected", "meas/floor",
                  "error"], rows, align="llllrrrrrr"), ""]
    groups = [[g.group, ", ".join(g.chips), *_summary_cells(g.held_out), *_summary_cells(g.fit)[:2]]
              for g in report.groups]
    groups.append(["all", f"{len(report.chips)} chips", *_summary_cells(report.held_out),
                   *_summary_cells(report.fit)[:2]])
    out.append(table(["group", "chips", "held-out n", "median |err|", "meas/exp", "worst", "fit n",
                      "fit median |err|"], groups, align="llrrrlrr"))
    out.append("")
    out.append(f"expected = device model + host dispatch where the timing includes it; error = expected / measured - 1; "
               "meas/exp = the held-out points' median measured / expected; "
               f"small ops (floor < {seconds(SMALL_OP_FLOOR_S)}) within 2x: {report.small_within_2x} of "
               f"{report.small_count}")
    if report.compiled:
        out.append("")
        out.append(compiled_text(report))
    if report.pairs:
        out.append("")
        out.append(table(["pair", "what", "measured speedup", "predicted speedup", "error"],
                         [[q.id, q.what, f"{q.measured_speedup:.2f}x", f"{q.predicted_speedup:.2f}x", _pct(q.error)]
                          for q in report.pairs], align="llrrr"))
    if report.not_modelled:
        reasons = Counter(s.reason for s in report.not_modelled)
        out.append("")
        out.append(f"not modelled ({len(report.not_modelled)} points): "
                   + "; ".join(f"{n} x {why}" for why, n in reasons.items()))
    beats = report.beats_floor
    out.append(f"measurements faster than their floor: {', '.join(beats)}" if beats
               else "no measurement is faster than its floor")
    return "\n".join(out)


def _ratio(s: ErrorSummary) -> str:
    return "-" if s.median_measured_over_expected is None else f"{s.median_measured_over_expected:.2f}"


def _abs(s: ErrorSummary) -> str:
    return "-" if s.median_abs_error is None else f"{s.median_abs_error * 100:.1f}%"


def compiled_text(report: ValidationReport) -> str:
    """``--compile``: per group and half, the compiled errors next to the analytic ones of the same points, each
    compiled point's time, and why the others have none."""
    from perfmodel.units import seconds, table

    done = [r for r in report.rows if r.compiled_expected_s is not None]
    points = table(["point", "role", "measured", "analytic", "error", "compiled", "compiled error"],
                   [[r.point.id, "fit" if r.point.is_fit else "held-out", seconds(r.point.measured_s),
                     seconds(r.expected_s), _pct(r.error), seconds(r.compiled_expected_s), _pct(r.compiled_error)]
                    for r in done], align="llrrrrr") if done else "no point has a compiled time"
    rows = []
    for g in report.groups:
        for half, c in (("held-out", g.compiled_held_out), ("fit", g.compiled_fit)):
            if c is not None and c.compiled.count:
                rows.append([g.group, half, str(c.compiled.count), _abs(c.analytic), _ratio(c.analytic),
                             _abs(c.compiled), _ratio(c.compiled)])
    out = [points, ""]
    if rows:
        out.append(table(["group", "half", "compiled n", "analytic median |err|", "analytic meas/exp",
                          "compiled median |err|", "compiled meas/exp"], rows, align="llrrrrr"))
    sample = "every point" if report.sample is None else f"at most {report.sample} points per group"
    out.append(f"compiled = the TPU compiler's program for the recorded XLA call (perfmodel xla: bundles at the clock, "
               f"HBM bytes at the achievable rate; tpu-7x/core: compiled for tpu-7x, timed on one core), or, for a "
               f"Pallas point with --pallas analyze, each of its kernels' compiler-backed time plus the XLA ops "
               f"around them; {sample}")
    notes = Counter(r.compiled_note for r in report.rows
                    if r.compiled_expected_s is None and r.compiled_note and r.point.call is not None)
    if notes:
        out.append("no compiled time: " + "; ".join(f"{n} x {why}" for why, n in notes.items()))
    doubted = [r.point.id for r in done if r.compiled_note]
    if doubted:
        out.append(f"compiled times to doubt (a fusion XLA's cost model gave no estimate for; --json: compiled_note): "
                   f"{', '.join(doubted)}")
    return "\n".join(out)


def report_records(report: ValidationReport) -> dict[str, Any]:
    """JSON-ready report: every point with its command, and the summaries."""
    from perfmodel.jsonable import to_jsonable

    points = [{"id": r.point.id, "group": r.point.group, "chip": r.point.chip, "role": r.point.role,
               "fit": r.point.is_fit, "source": r.point.source, "timed": r.point.timed,
               "includes_dispatch": r.point.includes_dispatch, "command": r.point.command,
               "measured_s": r.point.measured_s, "floor_s": r.floor_s, "expected_s": r.expected_s,
               "host_dispatch_s": r.dispatch_s, "measured_over_floor": r.measured_over_floor, "error": r.error,
               "beats_floor": r.beats_floor, "small": r.small, "note": r.point.note,
               **({"compiled_expected_s": r.compiled_expected_s, "compiled_error": r.compiled_error,
                   "compiled_note": r.compiled_note} if report.compiled else {})} for r in report.rows]
    pairs = [{"id": q.id, "what": q.what, "base": q.base.point.id, "fast": q.fast.point.id,
              "measured_speedup": q.measured_speedup, "predicted_speedup": q.predicted_speedup, "error": q.error}
             for q in report.pairs]
    groups = to_jsonable(list(report.groups))
    if not report.compiled:  # the output without --compile stays as it was
        for g in groups:
            g.pop("compiled_held_out", None)
            g.pop("compiled_fit", None)
    extra = {"compiled": True, "sample": report.sample} if report.compiled else {}
    return {**extra, "points": points, "groups": groups, "overall": to_jsonable(report.overall),
            "held_out": to_jsonable(report.held_out), "fit": to_jsonable(report.fit),
            "small_within_2x": report.small_within_2x, "small_count": report.small_count,
            "chips": list(report.chips), "beats_floor": list(report.beats_floor), "pairs": pairs,
            "not_modelled": to_jsonable(list(report.not_modelled))}
