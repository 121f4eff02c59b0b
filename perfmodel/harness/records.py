"""The results file: JSON Lines, one self-describing record per measurement.

Every line is one :class:`Record`: what ran (kernel, arrays with shapes and
dtypes, static arguments, block sizes), where (JAX backend, device_kind,
mode, jax version, time stamp), the timing in seconds and perfmodel's
predictions for the same call in seconds. ``mode`` is ``"compiled"`` for a
kernel compiled by Mosaic on a TPU and ``"interpret"`` for Pallas TPU
interpret mode (CPU or GPU backends): an interpret-mode time is the host's
wall time of an emulation and never a TPU figure, so its ``efficiency`` is
null.

Crash safety: :func:`append_record` writes a whole line (newline included)
with one ``os.write`` on a file opened with ``O_APPEND`` and fsyncs it before
returning, so a crash leaves every finished record and at most one truncated
last line, which :func:`read_records` skips with a warning naming
``file:line``. No jax here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from perfmodel.errors import InputError
from perfmodel.inputcheck import finite, short
from perfmodel.jsonable import to_jsonable

#: Written into every record; the reader rejects other schemas.
SCHEMA = "perfmodel.measurement/1"

#: "compiled": Mosaic-compiled on a TPU. "interpret": Pallas TPU interpret mode (not TPU performance).
MODES = ("compiled", "interpret")

#: Label for interpret-mode times wherever they are shown.
INTERPRET_LABEL = "interpret-mode wall time (not TPU performance)"


@dataclass(frozen=True, kw_only=True)
class ArraySpec:
    """One array argument of the call (the ``--shape`` that reproduces it is :attr:`text`)."""

    name: str
    shape: tuple[int, ...]
    #: numpy / ml_dtypes name, e.g. "bfloat16".
    dtype: str
    #: How the values were made: a number, "arange", "arange*N", "random" (seeded), or null (abstract).
    fill: float | str | None = None

    @property
    def text(self) -> str:
        dims = "x".join(str(d) for d in self.shape) if self.shape else "scalar"
        if self.fill is None:
            return f"{self.name}={dims}:{self.dtype}"
        fill = f"{self.fill:g}" if isinstance(self.fill, (int, float)) else self.fill
        return f"{self.name}={dims}:{self.dtype}={fill}"

    @property
    def dims(self) -> str:
        return "x".join(str(d) for d in self.shape) if self.shape else "scalar"


#: The timers a record's numbers come from (each number's record field names its timer).
WALL_TIMER = "wall clock"
SPAN_TIMER = "xprof device span"
KERNEL_TIMER = "xprof kernel events"
DISPATCH_TIMER = "wall clock - xprof device span"
#: What ``Timing.measured_s`` (and its spread) can come from.
TIMERS = (SPAN_TIMER, WALL_TIMER)


@dataclass(frozen=True, kw_only=True)
class DeviceTrace:
    """Per-call times of the timed calls read from a profiler trace of them (jax.profiler.trace, read with xprof's
    trace_viewer@ converter), each list one entry per call in call order, each median beside it; every number's
    timer is named in the field beside it."""

    #: Where the op events come from (the devices' "XLA Ops" lines, or the CPU backend's tf_XLA* threads).
    events: str
    #: First op start to last op end of each call's ops.
    span_timer: str = SPAN_TIMER
    span_s: float
    span_times_s: tuple[float, ...]
    #: The time the kernel's own op events of each call cover (durations summed, overlaps counted once); null when
    #: no event matched the kernel's ops.
    kernel_timer: str = KERNEL_TIMER
    kernel_s: float | None = None
    kernel_times_s: tuple[float, ...] = ()
    #: The op names that count as the kernel's own (empty: every op of the call) and how they were chosen.
    kernel_ops: tuple[str, ...] = ()
    kernel_match: str
    #: Wall clock of the same calls (the profiler running), up to block_until_ready: the cross-check.
    wall_timer: str = WALL_TIMER
    wall_s: float
    wall_times_s: tuple[float, ...]
    #: Wall clock - device span of each call: host dispatch (and the profiler's own cost), reported apart.
    dispatch_timer: str = DISPATCH_TIMER
    dispatch_s: float
    dispatch_times_s: tuple[float, ...]
    #: Op events of each call (nested events left out).
    ops_per_call: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Timing:
    """What was measured, in seconds."""

    #: Which statistic ``measured_s`` is: "median" of the repeats, or "mean" (published timeit figures).
    statistic: str
    measured_s: float
    min_s: float | None = None
    max_s: float | None = None
    #: Interquartile range of the repeats (75th - 25th percentile).
    iqr_s: float | None = None
    #: Every timed repeat (empty for published figures).
    times_s: tuple[float, ...] = ()
    repeats: int
    #: Untimed calls before the timed ones (null when a source does not say).
    warmup: int | None = None
    #: True when each timed call includes host dispatch (wall clock around one call + block_until_ready).
    includes_dispatch: bool
    #: Estimate of that dispatch: the round trip of a trivial jitted call on the same device, or a published figure.
    dispatch_s: float | None = None
    dispatch_source: str | None = None
    #: The timer of measured_s, min/max/IQR and times_s: "wall clock" (perf_counter around each call) or
    #: "xprof device span" (from a profiler trace of the calls; then includes_dispatch is false).
    timer: str = WALL_TIMER
    #: The trace's per-call numbers (device span, kernel events, wall clock, dispatch); null for the wall timer.
    device_trace: DeviceTrace | None = None


@dataclass(frozen=True, kw_only=True)
class CallPrediction:
    """perfmodel's predictions for the same call on ``chip``, in seconds."""

    chip: str
    #: Roofline floor of the kernel's useful work with each byte moved once (perfmodel.model.evaluate).
    op_floor_s: float
    #: Unit that sets that floor: "mxu", "hbm", "vpu", "eup".
    op_floor_limiter: str
    #: Expected device time: the schedule model's (Pallas kernels) or the op model's (XLA ops).
    expected_s: float
    #: "schedule model" or "op model".
    expected_source: str
    #: Schedule model only: what limits most grid steps ("compute", "dma" or "overhead").
    schedule_limiter: str | None = None
    #: Unit whose achievable-efficiency factor scales expected_s ("mxu", "hbm", "vpu", "eup"),
    #: or "overhead" when the per-step overhead dominates (no factor applies).
    limiting_unit: str
    #: The achievable-efficiency factor of limiting_unit the expected time used (perfmodel.model.core.ACHIEVABLE).
    model_factor: float | None = None
    #: Useful matrix FLOPs (2*M*N*K summed), MXU operand dtype, HBM bytes with each byte once / as moved.
    useful_flops: float
    mxu_dtype: str
    ideal_hbm_bytes: float
    moved_hbm_bytes: float | None = None
    #: Schedule model: grid of the (slowest) pallas_call and each operand's block shape.
    grid: tuple[int, ...] | None = None
    operand_blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    pallas_calls: int = 0
    #: True when expected_s is under 2x the host dispatch of one call (a single-call timing is mostly dispatch).
    dispatch_dominated: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Record:
    """One measurement and its predictions (one line of a results file)."""

    schema: str = SCHEMA
    kernel: str
    #: "module:function" that ran (null for published XLA points).
    function: str | None = None
    arrays: tuple[ArraySpec, ...]
    #: Static keyword arguments (e.g. causal), block sizes excluded.
    static: dict[str, Any] = field(default_factory=dict)
    #: Block sizes asked for (null: the kernel's default; CallPrediction.operand_blocks has the effective ones).
    blocks: dict[str, int] | None = None
    #: jax.default_backend() ("tpu", "cpu", "gpu") and the device's device_kind.
    backend: str
    device_kind: str
    #: The chip perfmodel's database matches to device_kind (null: none, e.g. a CPU).
    device_chip: str | None = None
    mode: str
    jax_version: str | None = None
    #: ISO 8601 UTC time the measurement finished (null for published figures).
    timestamp: str | None = None
    #: "perfmodel measure" or the citation of published figures.
    source: str
    timing: Timing
    prediction: CallPrediction
    #: op floor / measured time; null in interpret mode or when the prediction is for another chip than
    #: device_chip.
    efficiency: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_real(self) -> bool:
        """A timing of the kernel compiled for a real TPU (not interpret mode)."""
        return self.mode == "compiled"

    @property
    def device_time_s(self) -> float | None:
        """Measured time less the dispatch estimate when the timing includes dispatch (None if not positive)."""
        t = self.timing
        dispatch = t.dispatch_s if (t.includes_dispatch and t.dispatch_s is not None) else 0.0
        value = t.measured_s - dispatch
        return value if value > 0 else None

    @property
    def expected_wall_s(self) -> float:
        """The prediction on the measurement's footing: expected device time plus dispatch where timed."""
        t = self.timing
        dispatch = t.dispatch_s if (t.includes_dispatch and t.dispatch_s is not None) else 0.0
        return self.prediction.expected_s + dispatch

    @property
    def arrays_text(self) -> str:
        """e.g. "x=1024x1024:bf16 y=1024x1024:bf16" (fill left out)."""
        return " ".join(f"{a.name}={a.dims}:{short_dtype(a.dtype)}" for a in self.arrays)

    @property
    def blocks_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.blocks.items()) if self.blocks else "default"


def efficiency(prediction: CallPrediction, measured_s: float, *, mode: str, device_chip: str | None) -> float | None:
    """Op floor over the measured time, only where that means something (a real TPU of the predicted chip)."""
    if mode != "compiled" or device_chip != prediction.chip or measured_s <= 0:
        return None
    return prediction.op_floor_s / measured_s


def bound_name(unit: str) -> str:
    """"MXU-bound", "HBM-bound", ... for a unit name ("mxu", "hbm", ...); other names as they are."""
    from perfmodel.model.core import BOUND_NAMES

    return BOUND_NAMES.get(unit, unit)


def limited_by(prediction: CallPrediction) -> str:
    """What limits the expected time: the unit (as its bound name) or the per-step overhead."""
    return "step overhead" if prediction.limiting_unit == "overhead" else bound_name(prediction.limiting_unit)


_SHORT_DTYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "float8_e4m3fn": "fp8",
                 "float8_e5m2": "e5m2"}


def short_dtype(name: str) -> str:
    return _SHORT_DTYPES.get(name, name)


# --------------------------------------------------------------------------- JSON


def to_json(record: Record) -> dict[str, Any]:
    """The record as plain JSON values (tuples as lists, NaN/inf as null)."""
    return to_jsonable(record)


def from_json(obj: Any, where: str) -> Record:
    """Build a Record from a parsed line; InputError naming ``where`` (file:line) and the field on any mistake."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: a record must be a JSON object, got {type(obj).__name__}")
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise InputError(f"{where}: field 'schema' is {short(repr(schema), 40)}, expected {SCHEMA!r} "
                         "(not a `perfmodel measure` results line)")
    values = _fields(Record, obj, where, "")
    values["arrays"] = tuple(ArraySpec(**_fields(ArraySpec, a, where, f"arrays[{i}]"))
                             for i, a in enumerate(_list(obj, "arrays", where)))
    timing = _fields(Timing, obj["timing"], where, "timing")
    if timing.get("device_trace") is not None:
        timing["device_trace"] = DeviceTrace(**_fields(DeviceTrace, timing["device_trace"], where,
                                                        "timing.device_trace"))
    values["timing"] = Timing(**timing)
    values["prediction"] = CallPrediction(**_fields(CallPrediction, obj["prediction"], where, "prediction"))
    record = Record(**values)
    _check_numbers(record, where)
    if record.timing.timer not in TIMERS:
        raise InputError(f"{where}: field 'timing.timer' is {short(repr(record.timing.timer), 40)}; expected one "
                         f"of {', '.join(TIMERS)}")
    if record.mode not in MODES:
        raise InputError(f"{where}: field 'mode' is {short(repr(record.mode), 40)}; expected one of {', '.join(MODES)}")
    if record.mode == "interpret" and record.efficiency is not None:
        raise InputError(f"{where}: field 'efficiency' must be null for an interpret-mode record "
                         "(interpret-mode wall time is not TPU performance)")
    return record


def _check_numbers(record: Record, where: str) -> None:
    """Times and counts of a record are finite; times positive (a measured or predicted time of zero or less is
    not physical), counts and spreads >= 0."""
    t, p = record.timing, record.prediction
    for key, value in (("timing.measured_s", t.measured_s), ("prediction.op_floor_s", p.op_floor_s),
                       ("prediction.expected_s", p.expected_s)):
        finite(value, f"{where}: field '{key}'", positive=True)
    optional = (("timing.min_s", t.min_s), ("timing.max_s", t.max_s), ("timing.iqr_s", t.iqr_s),
                ("timing.dispatch_s", t.dispatch_s), ("prediction.useful_flops", p.useful_flops),
                ("prediction.ideal_hbm_bytes", p.ideal_hbm_bytes), ("prediction.moved_hbm_bytes", p.moved_hbm_bytes),
                ("prediction.model_factor", p.model_factor), ("efficiency", record.efficiency),
                *((f"timing.times_s[{i}]", v) for i, v in enumerate(t.times_s)))
    d = t.device_trace
    if d is not None:  # dispatch (wall - span) may come out below zero by clock noise: finite only
        optional += (("timing.device_trace.span_s", d.span_s), ("timing.device_trace.kernel_s", d.kernel_s),
                     ("timing.device_trace.wall_s", d.wall_s),
                     *((f"timing.device_trace.span_times_s[{i}]", v) for i, v in enumerate(d.span_times_s)),
                     *((f"timing.device_trace.kernel_times_s[{i}]", v) for i, v in enumerate(d.kernel_times_s)),
                     *((f"timing.device_trace.wall_times_s[{i}]", v) for i, v in enumerate(d.wall_times_s)))
        for key, value in (("dispatch_s", d.dispatch_s), *((f"dispatch_times_s[{i}]", v)
                                                             for i, v in enumerate(d.dispatch_times_s))):
            finite(value, f"{where}: field 'timing.device_trace.{key}'")
    for key, value in optional:
        if value is not None:
            finite(value, f"{where}: field '{key}'", nonnegative=True)


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise InputError(f"{where}: field '{key}' must be a list")
    return value


#: JSON types accepted for each annotation word.
_TYPES: dict[str, tuple[type, ...]] = {
    "float": (int, float), "int": (int,), "str": (str,), "bool": (bool,),
    "tuple": (list,), "dict": (dict,), "Any": (object,),
}


def _fields(cls: type, obj: Any, where: str, prefix: str) -> dict[str, Any]:
    """Keyword arguments of cls from obj, checking presence and JSON type of every field."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: field '{prefix}' must be a JSON object")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if f.name not in obj:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            raise InputError(f"{where}: field '{key}' is missing")
        value = obj[f.name]
        if f.name in ("timing", "prediction", "arrays") and not prefix:
            out[f.name] = value
            continue
        annotation = str(f.type)
        words = re.sub(r"[|\[\],]", " ", annotation).split()
        if value is None:
            if "None" not in words:
                raise InputError(f"{where}: field '{key}' must not be null")
        else:
            accepted = _TYPES.get(words[0], (object,))
            if "str" in words:
                accepted = accepted + (str,)
            if isinstance(value, bool) and bool not in accepted:
                accepted = ()
            if not isinstance(value, accepted):
                raise InputError(f"{where}: field '{key}' must be {annotation}, got {short(json.dumps(value), 40)}")
        if isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif isinstance(value, dict) and f.name == "operand_blocks":
            value = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
        out[f.name] = value
    return out


# --------------------------------------------------------------------------- writing


def check_appendable(path: str | os.PathLike, field: str = "out") -> None:
    """Refuse to append to a file whose last line is truncated (it would glue the next record onto it); errors name
    ``field``, the keyword argument the path came in."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"`{field}` '{p}': is a directory; give a results file, e.g. results.jsonl", fields=(field,))
    if not p.exists():
        if not p.parent.is_dir():
            raise InputError(f"`{field}` '{p}': directory '{p.parent}' does not exist", fields=(field,))
        return
    if p.stat().st_size == 0:
        return
    with open(p, "rb") as fh:
        first = fh.readline()
    try:
        is_results = json.loads(first.decode("utf-8")).get("schema") == SCHEMA
    except (UnicodeDecodeError, ValueError, AttributeError):
        is_results = False
    if not is_results:
        raise InputError(f"`{field}` '{p}': exists and is not a results file of `perfmodel measure` (its first "
                         "line is not a record); give a new .jsonl path or an existing results file",
                         fields=(field,))
    with open(p, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
    if last != b"\n":
        line = p.read_bytes().count(b"\n") + 1
        raise InputError(f"`{field}` {p}:{line}: the last line is truncated (an interrupted write); "
                         f"delete that line before appending records", fields=(field,))


def append_record(path: str | os.PathLike, record: Record, field: str = "out") -> None:
    """Append one record as one line: a single os.write of the encoded line on an O_APPEND file, then fsync."""
    data = (json.dumps(to_json(record), allow_nan=False, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    try:
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(f"`{field}` '{path}': cannot open for appending ({exc.strerror})",
                         fields=(field,)) from None
    try:
        written = os.write(fd, data)
        while written < len(data):  # only on a short write (a full disk); a regular file writes all at once
            written += os.write(fd, data[written:])
        os.fsync(fd)
    except OSError as exc:
        raise InputError(f"`{field}` '{path}': write failed ({exc.strerror})", fields=(field,)) from None
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, kw_only=True)
class Located:
    """A record and where it came from ("results.jsonl:3")."""

    where: str
    record: Record


@dataclass(frozen=True, kw_only=True)
class Loaded:
    items: tuple[Located, ...]
    #: One line each, e.g. "results.jsonl:7: truncated last line skipped (an interrupted write?)".
    warnings: tuple[str, ...] = ()

    @property
    def records(self) -> tuple[Record, ...]:
        return tuple(i.record for i in self.items)


def read_records(path: str | os.PathLike) -> Loaded:
    """Every record of a results file. A truncated last line (no newline, not valid JSON) is skipped with a
    warning naming file:line; any other bad line is an InputError naming file:line."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{p}: no such results file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    items: list[Located] = []
    warnings: list[str] = []
    for i, line in enumerate(lines, start=1):
        last = i == len(lines)
        if not line.strip():
            continue
        where = f"{p}:{i}"
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if last and not complete:
                warnings.append(f"{where}: truncated last line skipped (an interrupted write?)")
                continue
            detail = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise InputError(f"{where}: not a valid JSON line ({detail})") from None
        items.append(Located(where=where, record=from_json(obj, where)))
    return Loaded(items=tuple(items), warnings=tuple(warnings))
