"""Deviceless performance-regression gate for Pallas kernels (``perfmodel baseline write|check``).

A baseline is a JSON file of :class:`BaselineRecord`, one per call and chip, read from the real TPU compiler's
report (:mod:`perfmodel.compiler.api`) of each call: the grid-step loop body's bundles (every step and
predicated), the compiler-backed time (:mod:`perfmodel.schedule.compiled`), Mosaic's scoped VMEM, spills and
fills, and DMA starts per step. :func:`compare` sets a fresh recording beside the stored one and marks what grew
past a tolerance; the report functions render the rows as a text table, a markdown table (for a pull-request
comment) or JSON records.

The calls are every bundled kernel at its production shapes on every generation the compiler targets
(:func:`default_calls`, from :mod:`perfmodel.harness.compile_matrix`) or a YAML file of anyone's calls
(:func:`load_calls`). Nothing here imports jax until :func:`record` runs. The text, markdown and JSON views of
a comparison and the kernels README's tables are :mod:`perfmodel.harness.baseline_report`'s.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from perfmodel.compiler.api import CompileCall
from perfmodel.errors import InputError

#: Bump when the baseline file's layout changes (an older file is then an error asking for a rewrite).
SCHEMA_VERSION = 1
#: Relative growth of bundles or time that fails a check.
DEFAULT_TOLERANCE = 0.02
#: Floating-point slack on the tolerance test: growth of exactly the tolerance passes.
_EPS = 1e-9

#: Fields of one YAML call: name -> what it is (the loader's error lists them).
_CALL_FIELDS = {
    "name": "a unique label (default: TARGET and its shapes)",
    "target": "a bundled kernel name (perfmodel tune --list) or MODULE:FUNCTION",
    "shapes": "NAME=DIMSxDTYPE texts as for --shape",
    "args": "NAME=VALUE texts as for --arg",
    "blocks": "a bundled kernel's block sizes, NAME: INT (default: its tuned defaults)",
    "chips": "chip names (default: every generation the compiler targets)",
}


@dataclass(frozen=True, kw_only=True)
class BaselineCall:
    """One call to compile and record: ``name`` (unique in a baseline), what to compile, and on which chips."""

    name: str
    call: CompileCall
    chips: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class BaselineRecord:
    """What the compiler says about one call on one chip. A call of several pallas_calls sums their bundles,
    spills, fills, DMA starts and times and keeps the largest scoped VMEM. ``compiled`` False: the compiler
    rejected the call (``error`` its message) and the figures are None.

    Per grid step means per iteration of the grid-step loop body as the compiler scheduled it (inner loops
    counted per trip; a kernel without a grid loop: the whole program), from ``KernelCompile.loop``
    (:class:`perfmodel.compiler.bundles.LoopStats`). Not recorded: DMA waits, bounds-check halts and slot
    utilization (in ``perfmodel inspect --compile``), and the kernel's own ``vmem_limit_bytes`` compiler
    parameter, which the compile report does not carry (``vmem_limit_bytes`` here is the chip's VMEM per core,
    the most any kernel may raise its limit to)."""

    name: str
    chip: str
    #: The call as compiled (CompileCall.label: the kernel or MODULE:FUNCTION).
    target: str
    compiled: bool
    error: str | None = None
    #: pallas_calls in the compiled program.
    pallas_calls: int = 0
    #: LoopStats.always_bundles: bundles every step runs (outside predicated regions).
    loop_bundles_per_step: int | None = None
    #: LoopStats.predicated_bundles: bundles in pl.when paths and masked blocks, run by some steps only.
    predicated_bundles_per_step: int | None = None
    #: CompiledTime.expected_s (perfmodel.schedule.compiled.pair); None where a kernel has no readable loop
    #: body or the call could not be traced for the analytic model (``notes`` says why).
    compiled_time_s: float | None = None
    #: KernelCompile.scoped_vmem_bytes (Mosaic's used_scoped_memory_configs), largest over the pallas_calls.
    scoped_vmem_bytes: int | None = None
    #: The chip's VMEM per core (hwspec memory.vmem_bytes_per_core).
    vmem_limit_bytes: int | None = None
    #: LoopStats.vector_spills + scalar_spills, per step.
    spills_per_step: int | None = None
    #: LoopStats.vector_fills + scalar_fills, per step.
    fills_per_step: int | None = None
    #: LoopStats.dma_starts, per step.
    dma_starts_per_step: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.chip)


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """A baseline file's contents."""

    schema_version: int
    libtpu_version: str | None
    jax_version: str | None
    records: tuple[BaselineRecord, ...]


#: Figures a check compares: field -> (label, kind). Kind "tolerance": fails past the relative tolerance;
#: "count": fails on any growth over the baseline; "vmem": fails past the chip's limit; "info": never fails.
FIGURES: dict[str, tuple[str, str]] = {
    "loop_bundles_per_step": ("every-step bundles", "tolerance"),
    "predicated_bundles_per_step": ("predicated bundles", "tolerance"),
    "compiled_time_s": ("compiler-backed time", "tolerance"),
    "scoped_vmem_bytes": ("scoped VMEM", "vmem"),
    "spills_per_step": ("spills/step", "count"),
    "fills_per_step": ("fills/step", "count"),
    "dma_starts_per_step": ("DMA starts/step", "info"),
}


@dataclass(frozen=True, kw_only=True)
class CompareRow:
    """One call and chip of a check. ``verdict``: grew / shrank / same (some figure larger / only smaller /
    none changed), new (not in the baseline), missing (in the baseline, not recorded now), failed (the
    compiler rejected it now). ``failing``: it fails the check; ``reasons`` say why."""

    name: str
    chip: str
    verdict: str
    failing: bool
    reasons: tuple[str, ...]
    old: BaselineRecord | None
    new: BaselineRecord | None
    #: field -> relative change (new / old - 1; inf from zero) of each figure that changed.
    changes: Mapping[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the calls


def default_calls() -> tuple[BaselineCall, ...]:
    """Every bundled kernel at its production shapes and tuned defaults, on every generation the compiler
    targets (compile_matrix.cases() x chips())."""
    from perfmodel.harness.compile_matrix import cases, chips

    targets = chips()
    return tuple(BaselineCall(name=c.name, call=c.call, chips=targets) for c in cases())


def _str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float, bool)) for v in value):
        raise InputError(f"{where}: `{key}` must be a list of texts, e.g. {key}: [x=1024x1024:bf16]")
    return tuple(str(v) for v in value)


def load_calls(yaml_path: str | Path) -> tuple[BaselineCall, ...]:
    """Calls from a YAML file: a list of mappings (or a mapping whose one key ``calls`` holds the list), each
    with ``target`` (a bundled kernel or MODULE:FUNCTION) and optional ``name``, ``shapes``, ``args``,
    ``blocks`` and ``chips``. Strict: an unknown field, a wrong type or a duplicate name is an InputError naming
    the file, the entry and the field."""
    import yaml

    from perfmodel.harness.compile_matrix import chips as compile_chips
    from perfmodel.hw.registry import get_chip

    path = Path(yaml_path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InputError(f"--calls {path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{at}: not valid YAML ({getattr(exc, 'problem', None) or exc}); "
                         "write a list of calls, e.g. - {target: rms_norm, shapes: [...], chips: [tpu-v5e]}") from None
    if isinstance(data, dict):
        extra = sorted(set(data) - {"calls"})
        if extra:
            raise InputError(f"{path}: unknown top-level field '{extra[0]}'; the file is a list of calls or "
                             "a mapping with one key, calls")
        data = data.get("calls")
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty list of calls, e.g. - {{target: rms_norm, "
                         "shapes: [x=8192x4096:bf16], chips: [tpu-v5e]}")
    targets = compile_chips()
    out: list[BaselineCall] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(data, 1):
        where = f"{path}: call {i}"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping with target, shapes, args, chips; "
                             f"got {type(entry).__name__}")
        unknown = [k for k in entry if k not in _CALL_FIELDS]
        if unknown:
            raise InputError(f"{where}: unknown field '{unknown[0]}'; known fields: {', '.join(_CALL_FIELDS)}")
        target = entry.get("target")
        if not isinstance(target, str) or not target.strip():
            raise InputError(f"{where}: `target` is required: {_CALL_FIELDS['target']}")
        target = target.strip()
        shapes = _str_list(entry.get("shapes", []), where, "shapes")
        args = _str_list(entry.get("args", []), where, "args")
        blocks = entry.get("blocks")
        if blocks is not None:
            if ":" in target:
                raise InputError(f"{where}: `blocks` applies to bundled kernels; pass MODULE:FUNCTION's block "
                                 "sizes in args")
            if not isinstance(blocks, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                       for v in blocks.values()):
                raise InputError(f"{where}: `blocks` must map block names to integers, e.g. blocks: {{bm: 512}}")
            blocks = {str(k): int(v) for k, v in blocks.items()}
        names = _str_list(entry.get("chips", list(targets)), where, "chips")
        chip_names = []
        for n in names:
            chip = get_chip(n).name
            if chip not in targets:
                raise InputError(f"{where}: chip '{n}' is not a compiler target; use one of {', '.join(targets)}")
            chip_names.append(chip)
        if ":" in target:
            call = CompileCall(kind="function", target=target, shapes=shapes, args=args)
        else:
            from perfmodel.schedule.binding import parse_arg

            call = CompileCall(kind="catalog", target=target, shapes=shapes, blocks=blocks,
                               extra=dict(parse_arg(a) for a in args) or None)
        name = entry.get("name", f"{target} {' '.join(shapes)}".strip())
        if not isinstance(name, str) or not name.strip():
            raise InputError(f"{where}: `name` must be a non-empty text")
        if name in seen:
            raise InputError(f"{where}: name '{name}' is already used by call {seen[name]}; give each call a "
                             "unique name")
        seen[name] = i
        out.append(BaselineCall(name=name, call=call, chips=tuple(dict.fromkeys(chip_names))))
    return tuple(out)


def select_chips(calls: Sequence[BaselineCall], chips: Sequence[str]) -> tuple[BaselineCall, ...]:
    """The calls restricted to ``chips`` (names or aliases); calls on none of them are dropped."""
    from perfmodel.hw.registry import get_chip

    wanted = [get_chip(c).name for c in chips]
    return tuple(BaselineCall(name=c.name, call=c.call, chips=tuple(x for x in c.chips if x in wanted))
                 for c in calls if any(x in wanted for x in c.chips))


# ----------------------------------------------------------------------------- recording


def _traced(call: CompileCall, chip: Any) -> Any:
    """The analytic model's Analysis of ``call`` with per-step times (what pair() needs for the compiled time)."""
    from perfmodel.schedule.analyze import analyze

    if call.kind == "function":
        from perfmodel.schedule.binding import bind_function

        fn, arrays = bind_function(call.target, call.shapes, call.args, chip)
    else:
        from perfmodel.schedule.catalog import get_entry

        entry = get_entry(call.target)
        specs = entry.specs(call.shapes)
        fn, arrays = entry.make_function(specs, call.blocks, chip, extra=call.extra), entry.arguments(specs)
    return analyze(fn, *arrays, chip=chip, keep_step_times=True)


def record_of(name: str, report: Any, chip: Any, call: CompileCall | None = None) -> BaselineRecord:
    """One record from a CompileReport (or the exception compiling raised) for ``chip`` (a ChipSpec); with
    ``call``, the call is traced for the analytic model and paired with the report for the compiler-backed
    time."""
    from perfmodel.schedule.compiled import pair

    limit = chip.memory.vmem_bytes_per_core
    if isinstance(report, Exception):
        return BaselineRecord(name=name, chip=chip.name, target=call.label if call else "", compiled=False,
                              error=str(report), vmem_limit_bytes=limit)
    if not report.compiled:
        return BaselineRecord(name=name, chip=chip.name, target=report.call, compiled=False, error=report.error,
                              vmem_limit_bytes=limit)
    loops = [k.loop for k in report.kernels if k.loop is not None]
    notes = []
    if len(loops) < len(report.kernels):
        notes.append(f"{len(report.kernels) - len(loops)} pallas_call(s) without a readable loop body")
    time_s: float | None = None
    if call is not None:
        try:
            views = pair(_traced(call, chip), report, chip)
            if views and all(v.time is not None for v in views):
                time_s = sum(v.time.expected_s for v in views)
            else:
                notes.append("no compiler-backed time: a pallas_call has no step times or loop body")
        except Exception as exc:  # a call the analytic model cannot trace still records the compiler's figures
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            notes.append(f"no compiler-backed time: {text}")
    vmem = [k.scoped_vmem_bytes for k in report.kernels if k.scoped_vmem_bytes is not None]
    return BaselineRecord(
        name=name, chip=chip.name, target=report.call, compiled=True, pallas_calls=len(report.kernels),
        loop_bundles_per_step=sum(lp.always_bundles for lp in loops) if loops else None,
        predicated_bundles_per_step=sum(lp.predicated_bundles for lp in loops) if loops else None,
        compiled_time_s=time_s,
        scoped_vmem_bytes=max(vmem) if vmem else None,
        vmem_limit_bytes=limit,
        spills_per_step=sum(lp.vector_spills + lp.scalar_spills for lp in loops) if loops else None,
        fills_per_step=sum(lp.vector_fills + lp.scalar_fills for lp in loops) if loops else None,
        dma_starts_per_step=sum(lp.dma_starts for lp in loops) if loops else None,
        notes=tuple(notes),
    )


def record(calls: Sequence[BaselineCall], *, workers: int | None = None,
           progress: Callable[..., None] | None = None) -> tuple[BaselineRecord, ...]:
    """Compile every call on each of its chips (``workers`` compiles at a time; cached ones take milliseconds)
    and record what the compiler says; ordered by call, then chip as the call lists them."""
    from perfmodel.compiler.api import compile_many
    from perfmodel.compiler.toolchain import toolchain
    from perfmodel.hw.registry import get_chip

    toolchain()  # fail fast, in one line, without libtpu
    by_key: dict[tuple[str, str], BaselineRecord] = {}
    done, total = 0, sum(len(c.chips) for c in calls)
    for chip_name in dict.fromkeys(ch for c in calls for ch in c.chips):
        chip = get_chip(chip_name)
        on_chip = [c for c in calls if chip_name in c.chips]
        reports = compile_many([c.call for c in on_chip], chip, jobs=workers)
        for c, rep in zip(on_chip, reports):
            by_key[(c.name, chip_name)] = record_of(c.name, rep, chip, c.call)
            done += 1
            if progress:
                progress(f"recorded {c.name} on {chip.name}", done=done, total=total)
    return tuple(by_key[(c.name, ch)] for c in calls for ch in c.chips)


def libtpu_versions() -> tuple[str | None, str | None]:
    """(libtpu, jax) versions of the installed toolchain, (None, None) without libtpu."""
    from perfmodel.compiler.toolchain import CompilerUnavailable, toolchain

    try:
        tools = toolchain()
    except CompilerUnavailable:
        return None, None
    return tools.libtpu_version, tools.jax_version


# ----------------------------------------------------------------------------- the file


def write(path: str | Path, records: Sequence[BaselineRecord], *, libtpu_version: str | None = None,
          jax_version: str | None = None) -> Path:
    """Write the baseline JSON atomically (a temporary file in the same folder, then os.replace): a crash
    never leaves half a file."""
    doc = {"schema_version": SCHEMA_VERSION, "libtpu_version": libtpu_version, "jax_version": jax_version,
           "records": [_record_json(r) for r in records]}
    from perfmodel.fileio import write_text_atomic

    return write_text_atomic(path, json.dumps(doc, indent=1) + "\n")



def _record_json(r: BaselineRecord) -> dict[str, Any]:
    d = asdict(r)
    d["notes"] = list(r.notes)
    return d


_RECORD_FIELDS = {f.name for f in fields(BaselineRecord)}


def read(path: str | Path) -> Baseline:
    """A baseline file; missing, unreadable or malformed is an InputError naming the file and the fix."""
    path = Path(path)
    fix = f"run `perfmodel baseline write {path}` to (re)create it"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"baseline {path} does not exist; {fix}") from None
    except OSError as exc:
        raise InputError(f"baseline {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"baseline {path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise InputError(f"baseline {path} has no list of records; {fix}")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"baseline {path} has schema version {doc.get('schema_version')!r}, this perfmodel "
                         f"reads {SCHEMA_VERSION}; {fix}")
    records = []
    for i, r in enumerate(doc["records"], 1):
        if not isinstance(r, dict) or not {"name", "chip", "compiled"} <= set(r) or set(r) - _RECORD_FIELDS:
            bad = sorted(set(r) - _RECORD_FIELDS) if isinstance(r, dict) else []
            what = f"unknown field '{bad[0]}'" if bad else "needs name, chip and compiled"
            raise InputError(f"baseline {path}: record {i} is malformed ({what}); {fix}")
        r = dict(r)
        r["notes"] = tuple(r.get("notes") or ())
        r.setdefault("target", "")
        records.append(BaselineRecord(**r))
    return Baseline(schema_version=SCHEMA_VERSION, libtpu_version=doc.get("libtpu_version"),
                    jax_version=doc.get("jax_version"), records=tuple(records))


# ----------------------------------------------------------------------------- the comparison


def _rel(old: float, new: float) -> float:
    if old == new:
        return 0.0
    return math.inf if old == 0 else new / old - 1


def compare(old: Sequence[BaselineRecord], new: Sequence[BaselineRecord],
            tolerance: float = DEFAULT_TOLERANCE) -> tuple[CompareRow, ...]:
    """Rows in the new recording's order, then the baseline's records it lacks (missing). Fails a row when
    every-step or predicated bundles or the compiler-backed time grew by more than ``tolerance`` (relative;
    exactly the tolerance passes), spills or fills per step rose above the baseline, the scoped VMEM is past the
    chip's limit, or the call no longer compiles."""
    if not tolerance >= 0:
        raise InputError(f"`tolerance` {tolerance}: give a relative growth of 0 or more, e.g. 0.02 for 2%")
    before = {r.key: r for r in old}
    rows = []
    for n in new:
        o = before.pop(n.key, None)
        rows.append(_row(o, n, tolerance))
    rows += [CompareRow(name=o.name, chip=o.chip, verdict="missing", failing=False,
                        reasons=("in the baseline, not recorded now",), old=o, new=None) for o in before.values()]
    return tuple(rows)


def _pct(rel: float) -> str:
    """A relative change as a percentage ("new" where the old figure was 0)."""
    return "new" if math.isinf(rel) else f"{rel * 100:.1f}%"


def _row(o: BaselineRecord | None, n: BaselineRecord, tol: float) -> CompareRow:
    reasons: list[str] = []
    if not n.compiled:
        failing = o is None or o.compiled
        return CompareRow(name=n.name, chip=n.chip, verdict="failed", failing=failing,
                          reasons=(f"does not compile: {n.error}",), old=o, new=n)
    vmem_over = (n.scoped_vmem_bytes is not None and n.vmem_limit_bytes is not None
                 and n.scoped_vmem_bytes > n.vmem_limit_bytes)
    if vmem_over:
        reasons.append(f"scoped VMEM {n.scoped_vmem_bytes:,} B past the chip's {n.vmem_limit_bytes:,} B")
    if o is None or not o.compiled:
        return CompareRow(name=n.name, chip=n.chip, verdict="new", failing=vmem_over,
                          reasons=tuple(reasons or ["not in the baseline"]), old=o, new=n)
    changes: dict[str, float] = {}
    grew = shrank = False
    for name, (label, kind) in FIGURES.items():
        a, b = getattr(o, name), getattr(n, name)
        if a is None or b is None:
            continue
        rel = _rel(a, b)
        if rel == 0:
            continue
        changes[name] = rel
        grew |= rel > 0
        shrank |= rel < 0
        if kind == "tolerance" and rel > tol + _EPS:
            reasons.append(f"{label} +{_pct(rel)} (past {_pct(tol)})")
        elif kind == "count" and b > a:
            reasons.append(f"{label} {a} -> {b}")
    verdict = "grew" if grew else "shrank" if shrank else "same"
    return CompareRow(name=n.name, chip=n.chip, verdict=verdict, failing=bool(reasons), reasons=tuple(reasons),
                      old=o, new=n, changes=changes)


def regressions(rows: Sequence[CompareRow]) -> tuple[CompareRow, ...]:
    return tuple(r for r in rows if r.failing)
