"""Timing a catalog kernel on the JAX backend that is present, next to perfmodel's predictions.

Kernels, their array arguments and block fields come from the catalog
(:mod:`perfmodel.schedule.catalog`, the one `perfmodel tune` and `inspect`
use) and ``--shape`` texts from :mod:`perfmodel.schedule.shapes`. Arrays
given without a FILL are filled with seeded random values for the run.

On a TPU the kernel is compiled by Mosaic (mode "compiled"). Elsewhere a
Pallas TPU kernel can only run in TPU interpret mode (mode "interpret"): the
time is the host's wall time of an emulation, recorded and printed as such,
never as kernel performance, and its efficiency is null.

Timing: ``warmup`` untimed calls (the first compiles), then ``repeat`` timed
calls, by one of two timers (``timer``):

* "wall": each call timed with ``time.perf_counter`` around the call and
  ``jax.block_until_ready``: wall time per call, host dispatch included. On a
  TPU the round trip of a trivial jitted call is timed the same way and kept
  as the dispatch estimate.
* "device": the ``repeat`` calls run under ``jax.profiler.trace``, each in a
  trace annotation of its own, and the trace is read with xprof's converters
  (:func:`perfmodel.harness.profile_timeline.read_timeline`). Per call: the device span
  (first op start to last op end of the ops that start in the call's window),
  the kernel's own op events summed (those named like the call's kernel custom
  call; every op when the compiled module has none, e.g. on the CPU backend),
  the wall clock of the same call (the cross-check) and host dispatch = wall -
  span, reported apart. The record's measured time is the span's median.
* "auto" (the CLI's default): "device" where the trace can be taken and read,
  else "wall", with a note saying why; "device" asked for and not readable is
  a one-line InputError (exit 2).

Predictions: the schedule model
(:func:`perfmodel.schedule.analyze.analyze`) gives the op floor and the
expected device time.

jax is imported inside the functions that need it, never at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from perfmodel.errors import InputError, PerfmodelError
from perfmodel.harness.records import (
    DISPATCH_TIMER,
    INTERPRET_LABEL,
    SPAN_TIMER,
    ArraySpec,
    CallPrediction,
    DeviceTrace,
    Record,
    Timing,
    append_record,
    check_appendable,
    efficiency,
)
from perfmodel.hw.spec import ChipSpec

SOURCE = "perfmodel measure"
#: `timer` values: the two timers, and "auto" (device where a trace can be read, wall otherwise).
TIMER_CHOICES = ("device", "wall", "auto")
#: Name of the trace annotation around each timed call (its index appended): the call's window in the trace.
CALL_MARK = "perfmodel-measure-call-"
#: Custom-call targets that are host callbacks (io_callback, pure_callback), not a kernel.
_CALLBACK = re.compile(r"callback", re.IGNORECASE)
_LOWERED_CUSTOM_CALL = re.compile(r"custom_call\s*@([\w$.\-]+)")
_COMPILED_CUSTOM_CALL = re.compile(r'^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=.*\bcustom-call\(.*custom_call_target="([^"]+)"')
_KERNEL_NAME = re.compile(r'kernel_name\s*=\s*"?([\w.\-]+)')


class MeasurementError(PerfmodelError):
    """A kernel failed while being measured; the message says how many records were saved."""


class DeviceTimerError(InputError):
    """The device timer's trace could not be taken or read (exit 2 when `timer` device was asked for)."""


@dataclass(frozen=True, kw_only=True)
class Case:
    """One measurement: a catalog kernel, its --shape texts, block sizes (None: the kernel's default)."""

    kernel: str
    shapes: tuple[str, ...]
    blocks: Mapping[str, int] | None = None
    #: Extra static keyword arguments (--arg).
    static: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Backend:
    """The JAX backend and device the kernel runs on."""

    name: str
    device_kind: str
    jax_version: str

    @property
    def mode(self) -> str:
        return "compiled" if self.name == "tpu" else "interpret"


def current_backend() -> Backend:
    import jax

    return Backend(name=jax.default_backend(), device_kind=str(jax.devices()[0].device_kind),
                   jax_version=jax.__version__)


# --------------------------------------------------------------------------- chips


@dataclass(frozen=True, kw_only=True)
class ChipChoice:
    """The chip predictions are for, and the chip the device is (if perfmodel knows it)."""

    chip: ChipSpec
    device_chip: str | None
    notes: tuple[str, ...] = ()


def choose_chip(hw: str | None, backend: Backend) -> ChipChoice:
    """The chip ``hw`` names, else the TPU matching the device's device_kind; InputError asking for ``hw``
    otherwise."""
    from perfmodel.hw.registry import get_chip, normalize
    from perfmodel.schedule.analyze import resolve_chip

    try:
        device = get_chip(backend.device_kind)
    except PerfmodelError:  # unknown device kind (e.g. "cpu") or a broken user spec: no device chip
        device = None
    if hw is None:
        if device is None or device.kind != "tpu":
            what = f"'{backend.device_kind}'" + (f" ({device.name}, not a TPU)" if device is not None else "")
            raise InputError(f"`hw`: the {backend.name} device {what} is not a TPU perfmodel knows; "
                             "give `hw` CHIP for the TPU the predictions are for, e.g. `hw` v5e", fields=("hw",))
        return ChipChoice(chip=resolve_chip(device.name), device_chip=device.name)
    chip = resolve_chip(hw)
    names = {normalize(n) for n in [chip.name, *chip.aliases, *chip.jax_device_kinds]}
    if normalize(backend.device_kind) in names:
        return ChipChoice(chip=chip, device_chip=chip.name)
    notes: tuple[str, ...] = ()
    if backend.mode == "compiled":
        seen = device.name if device is not None else f"'{backend.device_kind}' (not in perfmodel's database)"
        notes = (f"predictions are for {chip.name} but the device is {seen}: efficiency left null",)
    return ChipChoice(chip=chip, device_chip=device.name if device is not None else None, notes=notes)


# --------------------------------------------------------------------------- timing


def time_calls(fn: Callable, args: Sequence[Any], *, warmup: int, repeat: int,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeat`` calls (after ``warmup`` untimed ones), each up to block_until_ready."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeat):
        start = clock()
        jax.block_until_ready(fn(*args))
        times.append(clock() - start)
    return times


def kernel_ops(fn: Callable, args: Sequence[Any]) -> tuple[frozenset[str], str]:
    """(op names that are the call's kernel, how they were chosen). The lowered module's custom calls that are
    not host callbacks are the kernel (a Pallas / Mosaic / Triton call); only then is the call compiled (cached
    by jax where it can) to read those instructions' names, and any kernel_name they carry, from the HLO the
    trace's op events are named by. No such custom call (an XLA-only function, the CPU backend's interpret
    mode): an empty set, meaning every op of the call."""
    lowered = fn.lower(*args)
    targets = sorted({t for t in _LOWERED_CUSTOM_CALL.findall(lowered.as_text()) if not _CALLBACK.search(t)})
    if not targets:
        return frozenset(), "every XLA op of the call: its module has no kernel custom call"
    names: set[str] = set()
    for line in lowered.compile().as_text().splitlines():
        m = _COMPILED_CUSTOM_CALL.match(line)
        if m and not _CALLBACK.search(m.group(2)):
            names.add(m.group(1))
            names.update(_KERNEL_NAME.findall(line))
    return frozenset(names), f"ops named as the call's custom call(s) ({', '.join(targets)}) or their kernel_name"


def device_times(fn: Callable, args: Sequence[Any], *, warmup: int, repeat: int,
                 clock: Callable[[], float] = time.perf_counter) -> DeviceTrace:
    """Per-call device span, kernel events, wall clock and host dispatch of ``repeat`` calls (after ``warmup``
    untimed ones) run under jax.profiler.trace; DeviceTimerError when the trace cannot be taken or read."""
    import jax

    from perfmodel.harness import profile_timeline as prof

    try:
        import xprof.convert.raw_to_tool_data  # noqa: F401  (the trace's reader: fail before running anything)
    except ImportError as exc:
        raise DeviceTimerError(f"`timer` device: xprof is not importable ({exc}); install it or give `timer` "
                               "wall", fields=("timer",)) from None
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    kernels, match = kernel_ops(fn, args)
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="perfmodel-measure-trace-") as tmp:
        try:
            with jax.profiler.trace(tmp):
                for i in range(repeat):
                    with jax.profiler.TraceAnnotation(f"{CALL_MARK}{i}"):
                        start = clock()
                        jax.block_until_ready(fn(*args))
                        walls.append(clock() - start)
        except RuntimeError as exc:  # e.g. another trace already running in this process
            raise DeviceTimerError(f"`timer` device: jax.profiler.trace failed: {_first_line(exc).rstrip('.')}; give `timer` "
                                   "wall", fields=("timer",)) from None
        try:
            timeline = prof.read_timeline(tmp)
        except PerfmodelError as exc:
            raise DeviceTimerError(f"`timer` device: the trace of the calls cannot be read: {_first_line(exc).rstrip('.')}; "
                                   "give `timer` wall", fields=("timer",)) from None
    return per_call_times(timeline, walls, kernels=kernels, kernel_match=match)


def per_call_times(timeline: Any, walls: Sequence[float], *, kernels: frozenset[str],
                   kernel_match: str) -> DeviceTrace:
    """The DeviceTrace of a timeline whose calls are marked by CALL_MARK annotations. A call's ops are those that
    start at or after its mark and before the next call's (each call blocks until ready inside its mark, so its
    device work cannot start later); its span runs from the first op's start to the last op's end; its kernel
    time is the time the kernel's own ops cover (``kernels`` empty: every op is the kernel's)."""
    import numpy as np

    marks = sorted((e for e in timeline.host if e.name.startswith(CALL_MARK)), key=lambda e: e.start_s)
    if len(marks) != len(walls):
        raise DeviceTimerError(f"`timer` device: the trace holds {len(marks)} of the {len(walls)} call marks "
                               f"({CALL_MARK}N); give `timer` wall", fields=("timer",))
    spans, kernel_times, counts = [], [], []
    matched = False
    for i, mark in enumerate(marks):
        end = marks[i + 1].start_s if i + 1 < len(marks) else float("inf")
        ops = [o for o in timeline.ops if mark.start_s <= o.start_s < end]
        if not ops:
            raise DeviceTimerError(f"`timer` device: no op event in call {i + 1}'s window of the trace "
                                   f"({timeline.op_source}); give `timer` wall", fields=("timer",))
        spans.append(max(o.end_s for o in ops) - min(o.start_s for o in ops))
        own = [o for o in ops if not kernels or o.name in kernels]
        matched = matched or bool(own)
        kernel_times.append(covered_s(own))
        counts.append(len(ops))
    dispatch = [w - s for w, s in zip(walls, spans)]
    med = lambda xs: float(np.median(np.asarray(xs, dtype=float)))  # noqa: E731
    return DeviceTrace(
        events=timeline.op_source, span_s=med(spans), span_times_s=tuple(float(x) for x in spans),
        kernel_s=med(kernel_times) if matched else None,
        kernel_times_s=tuple(float(x) for x in kernel_times) if matched else (),
        kernel_ops=tuple(sorted(kernels)), kernel_match=kernel_match if matched or not kernels else
        f"{kernel_match}: no op event of the trace matched {', '.join(sorted(kernels))}",
        wall_s=med(walls), wall_times_s=tuple(float(x) for x in walls), dispatch_s=med(dispatch),
        dispatch_times_s=tuple(float(x) for x in dispatch), ops_per_call=tuple(counts))


def covered_s(events: Sequence[Any]) -> float:
    """Seconds covered by the events (their durations summed, a stretch where several overlap counted once: ops
    on concurrent lines, e.g. GPU streams or a CPU callback's inner ops, are not double counted)."""
    total, end = 0.0, -float("inf")
    for e in sorted(events, key=lambda e: e.start_s):
        if e.end_s > end:
            total += e.end_s - max(e.start_s, end)
            end = e.end_s
    return total


def device_timing(trace: DeviceTrace, *, warmup: int) -> Timing:
    """The record's Timing of a device-timed run: the spans' median and spread, dispatch measured apart."""
    t = timing(trace.span_times_s, warmup=warmup, dispatch_s=None)
    return dataclasses.replace(t, includes_dispatch=False, dispatch_s=trace.dispatch_s,
                               dispatch_source=f"{DISPATCH_TIMER} of the same calls (median)", timer=SPAN_TIMER,
                               device_trace=trace)


def dispatch_round_trip(*, warmup: int, repeat: int) -> float:
    """Median seconds of a trivial jitted call on the default device (host dispatch + sync)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = jnp.zeros((), jnp.float32)
    return float(np.median(time_calls(jax.jit(lambda v: v + 1), (x,), warmup=max(1, warmup), repeat=max(3, repeat))))


def timing(times: Sequence[float], *, warmup: int, dispatch_s: float | None) -> Timing:
    """Median and spread of the timed repeats."""
    import numpy as np

    arr = np.asarray(times, dtype=float)
    q25, q75 = np.percentile(arr, [25, 75])
    return Timing(
        statistic="median", measured_s=float(np.median(arr)), min_s=float(arr.min()), max_s=float(arr.max()),
        iqr_s=float(q75 - q25), times_s=tuple(float(t) for t in arr), repeats=len(arr), warmup=warmup,
        includes_dispatch=True, dispatch_s=dispatch_s,
        dispatch_source=("median round trip of a trivial jitted call on the same device"
                         if dispatch_s is not None else None),
    )


# --------------------------------------------------------------------------- predictions


def predict_call(entry: Any, specs: Mapping[str, Any], blocks: Mapping[str, int] | None, chip: ChipSpec,
                 static: Mapping[str, Any], *, dispatch_s: float) -> CallPrediction:
    """Op floor and the schedule model's expected time of one catalog kernel call."""
    from perfmodel.model.efficiency import kernel_shares
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.timing import DISPATCH_DOMINATED_RATIO

    fn = entry.make_function(specs, blocks, chip, extra=static)
    try:
        analysis = analyze(fn, *entry.arguments(specs), chip=chip)
    except PerfmodelError:
        raise
    except ValueError as exc:  # the kernel's own argument checks, raised while tracing
        raise InputError(f"{entry.name}: {_first_line(exc)}") from None
    if not analysis.kernels:
        raise InputError(f"{entry.name}: runs no pallas_call; nothing to measure against the schedule model")
    main = max(analysis.kernels, key=lambda k: k.time.expected_s)
    floor_kernel = max(analysis.kernels, key=lambda k: k.time.op_floor_s)
    unit = limiting_unit(main, chip)
    expected = float(analysis.expected_s)
    return CallPrediction(
        chip=chip.name,
        op_floor_s=float(sum(k.time.op_floor_s for k in analysis.kernels)),
        op_floor_limiter=floor_kernel.time.op_floor_limiter,
        expected_s=expected,
        expected_source="schedule model",
        schedule_limiter=main.time.limiter,
        limiting_unit=unit,
        model_factor=kernel_shares(chip).get(unit),
        useful_flops=float(sum(k.work.mxu_useful_flops for k in analysis.kernels)),
        mxu_dtype=main.work.mxu_dtype,
        ideal_hbm_bytes=float(sum(k.ideal_hbm_bytes for k in analysis.kernels)),
        moved_hbm_bytes=float(sum(k.hbm_bytes for k in analysis.kernels)),
        grid=tuple(int(g) for g in main.grid),
        operand_blocks={o.name: tuple(int(d) for d in o.block_shape) for o in main.operands if o.pipelined},
        pallas_calls=len(analysis.kernels),
        dispatch_dominated=expected < DISPATCH_DOMINATED_RATIO * dispatch_s,
        notes=tuple(n for k in analysis.kernels for n in k.notes if not n.startswith("dispatch-dominated")),
    )


def limiting_unit(kernel: Any, chip: ChipSpec) -> str:
    """Unit whose achievable factor scales the kernel's expected time: the schedule limiter's unit.

    "dma" steps are HBM-limited; "compute" steps by whichever of MXU / VPU / EUP
    takes longest over the grid at the model's achievable per-core rates;
    "overhead" steps by the fixed per-step cost (no factor applies).
    """
    from perfmodel.schedule.timing import core_rates

    limiter = kernel.time.limiter
    if limiter == "dma":
        return "hbm"
    if limiter != "compute":
        return "overhead"
    rates = core_rates(chip)
    w = kernel.work
    mxu_rate = rates.mxu_flops_per_s.get(w.mxu_dtype) or min(rates.mxu_flops_per_s.values())
    seconds = {"mxu": w.mxu_issued_flops / mxu_rate, "vpu": w.vpu_ops / rates.vpu_ops_per_s,
               "eup": w.eup_ops / rates.eup_ops_per_s}
    return max(seconds, key=seconds.get)


def op_model_prediction(cost: Any, chip: ChipSpec, *, dispatch_s: float) -> CallPrediction:
    """The prediction of an XLA op from the op model alone (no kernel to analyze; no jax)."""
    from perfmodel.model.core import ACHIEVABLE, evaluate
    from perfmodel.schedule.timing import DISPATCH_DOMINATED_RATIO

    roof = evaluate(cost, chip)
    unit = str(roof.limiter)
    expected = float(roof.expected_s)
    return CallPrediction(
        chip=chip.name, op_floor_s=float(roof.floor_s), op_floor_limiter=unit, expected_s=expected,
        expected_source="op model", limiting_unit=unit,
        # the share the op model used for this chip and dtype (perfmodel.model.efficiency)
        model_factor=roof.achievable_share.get(unit, ACHIEVABLE[unit][0]) if unit in ACHIEVABLE else None,
        useful_flops=float(cost.useful_flops), mxu_dtype=cost.mxu_dtype, ideal_hbm_bytes=float(cost.hbm_bytes),
        dispatch_dominated=expected < DISPATCH_DOMINATED_RATIO * dispatch_s,
    )


# --------------------------------------------------------------------------- measuring


def block_sets(entry: Any, sweeps: Mapping[str, Sequence[int]] | None) -> list[dict[str, int] | None]:
    """Every block set of a sweep (cross product, in the order given); [None] for the kernel's default."""
    if not sweeps:
        return [None]
    fields = [ax.field for ax in entry.block_axes]
    if fields:
        unknown = [f for f in sweeps if f not in fields]
        if unknown:
            raise InputError(f"`blocks`: {', '.join(unknown)} not a block field of {entry.name}; "
                             f"fields: {', '.join(fields)}", fields=("blocks",))
        missing = [f for f in fields if f not in sweeps]
        if missing:
            raise InputError(f"`blocks`: give every block field of {entry.name} together; missing {', '.join(missing)}",
                             fields=("blocks",))
    names = list(sweeps)
    return [dict(zip(names, values)) for values in itertools.product(*(sweeps[n] for n in names))]


def measure_case(case: Case, *, chip: ChipChoice, backend: Backend, warmup: int, repeat: int,
                 dispatch_s: float | None, timer: str = "wall") -> Record:
    """Time one case and predict it; a finished Record."""
    import jax
    from jax.experimental.pallas import tpu as pltpu

    from perfmodel.schedule.catalog import get_entry
    from perfmodel.schedule.timing import DEFAULT_HOST_DISPATCH

    entry = get_entry(case.kernel)
    specs = entry.specs(case.shapes)
    run_specs = {n: dataclasses.replace(s, fill="random") if s.fill is None else s for n, s in specs.items()}
    static = dict(case.static)
    blocks = dict(case.blocks) if case.blocks is not None else None
    prediction = predict_call(entry, run_specs, blocks, chip.chip, static,
                              dispatch_s=dispatch_s if dispatch_s is not None else DEFAULT_HOST_DISPATCH.seconds)
    args = entry.arguments(run_specs)
    fn = jax.jit(entry.make_function(run_specs, blocks, chip.chip, extra=static))
    notes = list(chip.notes)
    with pltpu.force_tpu_interpret_mode() if backend.mode == "interpret" else contextlib.nullcontext():
        trace = None
        if timer in ("device", "auto"):
            try:
                trace = device_times(fn, args, warmup=warmup, repeat=repeat)
            except DeviceTimerError as exc:
                if timer == "device":
                    raise
                notes.append(f"timer: wall clock (the device timer could not be used: {exc})")
        if trace is not None:
            t = device_timing(trace, warmup=warmup)
        else:
            t = timing(time_calls(fn, args, warmup=warmup, repeat=repeat), warmup=warmup, dispatch_s=dispatch_s)
    if trace is not None and backend.name == "cpu":
        notes.append("device timer on the cpu backend: the op events are XLA:CPU's, so the times are the host's")
    if backend.mode == "interpret":
        notes.append(f"{INTERPRET_LABEL}: Pallas TPU interpret mode on the {backend.name} backend emulates the "
                     "kernel on the host; its time says nothing about TPU speed")
    if warmup == 0:
        notes.append("no warm-up: the first timed call includes compilation")
    return Record(
        kernel=entry.name, function=entry.function,
        arrays=tuple(ArraySpec(name=s.name, shape=tuple(s.shape), dtype=s.dtype, fill=s.fill)
                     for s in run_specs.values()),
        static={**entry.static, **static}, blocks=blocks, backend=backend.name, device_kind=backend.device_kind,
        device_chip=chip.device_chip, mode=backend.mode, jax_version=backend.jax_version,
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), source=SOURCE, timing=t,
        prediction=prediction,
        efficiency=efficiency(prediction, t.measured_s, mode=backend.mode, device_chip=chip.device_chip),
        notes=tuple(notes),
    )


def run_cases(cases: Sequence[Case], *, hw: str | None, warmup: int = 1, repeat: int = 5,
              out: str | Path | None = None, on_record: Callable[[Record], None] | None = None,
              timer: str = "wall") -> list[Record]:
    """Measure every case in order; each finished record is appended to ``out`` (fsynced) at once. ``timer``:
    "wall", "device" or "auto" (see the module docstring).

    A failure stops the run with a one-line MeasurementError saying how many
    records were saved; every record finished before it is in the file.
    """
    if warmup < 0 or repeat < 1:
        raise InputError(f"`repeat` {repeat} / `warmup` {warmup}: need repeat >= 1 and warmup >= 0",
                         fields=("repeat", "warmup"))
    if timer not in TIMER_CHOICES:
        raise InputError(f"`timer` {timer!r}: expected one of {', '.join(TIMER_CHOICES)}", fields=("timer",))
    backend = current_backend()
    if backend.mode == "interpret" and any(not c.shapes for c in cases):
        raise InputError(f"`shapes`: the {backend.name} backend runs the kernel in interpret mode on the host; "
                         "give small shapes explicitly (the catalog's example shapes are TPU-sized)",
                         fields=("shapes",))
    chip = choose_chip(hw, backend)
    if out is not None:
        check_appendable(out)
    dispatch_s = dispatch_round_trip(warmup=warmup, repeat=repeat) if backend.mode == "compiled" else None
    records: list[Record] = []
    for i, case in enumerate(cases):
        try:
            record = measure_case(case, chip=chip, backend=backend, warmup=warmup, repeat=repeat,
                                  dispatch_s=dispatch_s, timer=timer)
        except Exception as exc:
            if not records and isinstance(exc, PerfmodelError):
                raise
            saved = (f"{len(records)} finished record(s) are in {out}" if out is not None
                     else f"{len(records)} finished record(s) not saved (no --out)")
            blocks = ",".join(f"{k}={v}" for k, v in case.blocks.items()) if case.blocks else "default"
            error = MeasurementError(f"{case.kernel} case {i + 1} of {len(cases)} (blocks {blocks}) failed: "
                                     f"{type(exc).__name__}: {_first_line(exc)}; {saved}")
            error.exit_code = getattr(exc, "exit_code", 1)
            raise error from exc
        if out is not None:
            append_record(out, record)
        records.append(record)
        if on_record is not None:
            on_record(record)
    return records


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
