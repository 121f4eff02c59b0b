"""Deviceless performance-regression gate for Pallas kernels (``perfmodel baseline write|check``).

A baseline is a JSON file of :class:`BaselineRecord`, one per call and chip, read from the real TPU compiler's
report (:mod:`perfmodel.compiler.api`) of each call: the grid-step loop body's bundles (every step and
predicated), the compiler-backed time (:mod:`perfmodel.schedule.compiled`), Mosaic's scoped VMEM, spills and
fills, and DMA starts per step. :func:`compare` sets a fresh recording beside the stored one and marks what grew
past a tolerance; the report functions render the rows as a text table, a markdown table (for a pull-request
comment) or JSON records.

The calls are every bundled kernel at its production shapes on every generation the compiler targets
(:func:`default_calls`, from :mod:`perfmodel.harness.compile_matrix`) or a YAML file of anyone's calls
(:func:`load_calls`). Nothing here imports jax until :func:`record` runs.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import textwrap
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
    return write_text_atomic(path, json.dumps(doc, indent=1) + "\n")


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and os.replace, keeping the usual
    permissions: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a committed file is readable as any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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


# ----------------------------------------------------------------------------- reports


def _pct(rel: float) -> str:
    return "new" if math.isinf(rel) else f"{rel * 100:.1f}%"


def _fmt(name: str, value: Any) -> str:
    from perfmodel.units import binary, seconds

    if value is None:
        return "-"
    if name == "compiled_time_s":
        return seconds(value)
    if name == "scoped_vmem_bytes":
        return binary(value)
    return f"{value:,}"


def _cell(row: CompareRow, name: str) -> str:
    """The new figure, and the old one with the change where it changed."""
    rec = row.new or row.old
    value = _fmt(name, getattr(rec, name) if rec else None)
    rel = row.changes.get(name)
    if rel is None or row.old is None:
        return value
    sign = "+" if rel > 0 else ""
    return f"{_fmt(name, getattr(row.old, name))} -> {value} ({sign}{_pct(rel)})"


_COLUMNS = ["loop_bundles_per_step", "predicated_bundles_per_step", "compiled_time_s", "scoped_vmem_bytes",
            "spills_per_step", "fills_per_step", "dma_starts_per_step"]
_HEADERS = ["every-step bundles", "predicated bundles", "time", "scoped VMEM", "spills", "fills", "DMA starts"]


def _verdict(row: CompareRow) -> str:
    return ("FAIL " if row.failing else "") + row.verdict


def summary(rows: Sequence[CompareRow], tolerance: float) -> str:
    bad = regressions(rows)
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in ("grew", "shrank", "same", "new", "missing", "failed")}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    head = (f"{len(bad)} regression(s)" if bad else "no regression") + f" in {len(rows)} call(s) x chip(s)"
    return f"{head} ({tally}; tolerance {tolerance * 100:g}% on bundles and time, any new spill or fill, VMEM " \
           "past the chip's limit)"


def report_text(rows: Sequence[CompareRow], tolerance: float) -> str:
    """Plain-text table of a check (bundles and spills per grid step), the failing rows' reasons, a summary."""
    from perfmodel.units import table

    body = [[r.name, r.chip, *(_cell(r, c) for c in _COLUMNS), _verdict(r)] for r in rows]
    lines = [table(["call", "chip", *_HEADERS, "verdict"], body, align="ll" + "r" * len(_COLUMNS) + "l",
                   optional=["fills", "DMA starts", "predicated bundles"])]
    for r in regressions(rows):
        lines.append(f"FAIL {r.name} on {r.chip}: {'; '.join(r.reasons)}")
    lines.append(summary(rows, tolerance))
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def report_markdown(rows: Sequence[CompareRow], tolerance: float) -> str:
    """A markdown table for a pull-request comment: a summary line, the rows that fail or changed, and the
    unchanged ones folded in a <details> block."""
    head = "| call | chip | " + " | ".join(_HEADERS) + " | verdict |"
    rule = "|" + "---|" * (len(_HEADERS) + 3)

    def line(r: CompareRow) -> str:
        verdict = ("**FAIL** " if r.failing else "") + r.verdict
        if r.failing:
            verdict += ": " + "; ".join(r.reasons)
        return "| " + " | ".join(_md(x) for x in [r.name, r.chip, *(_cell(r, c) for c in _COLUMNS)]) + \
               f" | {_md(verdict)} |"

    bad = regressions(rows)
    mark = ":x:" if bad else ":white_check_mark:"
    out = [f"### perfmodel baseline check {mark}", "", summary(rows, tolerance), ""]
    changed = [r for r in rows if r.failing or r.verdict != "same"]
    same = [r for r in rows if not r.failing and r.verdict == "same"]
    if changed:
        out += [head, rule, *(line(r) for r in changed), ""]
    if same:
        out += [f"<details><summary>{len(same)} unchanged</summary>", "", head, rule, *(line(r) for r in same), "",
                "</details>", ""]
    out.append("Figures per grid step from the TPU compiler's schedule (deviceless libtpu); "
               "time: perfmodel's compiler-backed estimate.")
    return "\n".join(out)


def report_records(rows: Sequence[CompareRow], tolerance: float) -> dict[str, Any]:
    """JSON-ready: the tolerance, the regressions count and each row with its old and new records."""
    return {"tolerance": tolerance, "regressions": len(regressions(rows)),
            "rows": [{"name": r.name, "chip": r.chip, "verdict": r.verdict, "failing": r.failing,
                      "reasons": list(r.reasons), "changes": dict(r.changes),
                      "old": _record_json(r.old) if r.old else None,
                      "new": _record_json(r.new) if r.new else None} for r in rows]}


def records_text(records: Sequence[BaselineRecord]) -> str:
    """Plain-text table of recorded figures (what `baseline write` prints)."""
    from perfmodel.units import table

    body = [[r.name, r.chip, *(_fmt(c, getattr(r, c)) for c in _COLUMNS),
             "" if r.compiled else f"does not compile: {r.error}"] for r in records]
    return table(["call", "chip", *_HEADERS, "note"], body, align="ll" + "r" * len(_COLUMNS) + "l",
                 optional=["note", "fills", "DMA starts", "predicated bundles"])


def records_json(records: Sequence[BaselineRecord]) -> list[dict[str, Any]]:
    return [_record_json(r) for r in records]


# ----------------------------------------------------------------------------- README tables
#
# kernels/README.md shows each kernel's baseline figures as a markdown table between marker comments; the tables
# are rendered from the baseline file here (never edited by hand) and a fast test fails when they drift from it.

#: A README region: the opening marker names the kernel (a record's target), the closing marker ends the region.
README_OPEN = "<!-- baseline-table: {kernel} -->"
README_CLOSE = "<!-- /baseline-table -->"
_OPEN_PREFIX, _OPEN_SUFFIX = "<!-- baseline-table:", "-->"

#: A kernel table's columns, in order.
TABLE_HEADERS = ("chip", "call", "bundles / step (every / predicated)", "compiler-backed time", "scoped VMEM",
                 "spills / fills per step", "DMA starts / step")


def kernel_records(records: Sequence[BaselineRecord],
                   chip_order: Sequence[str] | None = None) -> dict[str, tuple[BaselineRecord, ...]]:
    """Records grouped by kernel (the record's target, e.g. ``rms_norm``; a YAML call's MODULE:FUNCTION), kernels
    and calls in order of first appearance, each call's chips in ``chip_order`` (chips it lacks after them, in
    the records' order; None: the records' order). A fixed chip order keeps a table's rows where they are when
    ``baseline write --chips`` appends a chip's records at the end of the file."""
    rank = {c: i for i, c in enumerate(chip_order or ())}
    calls: dict[str, dict[str, list[BaselineRecord]]] = {}
    for r in records:
        calls.setdefault(r.target or r.name, {}).setdefault(r.name, []).append(r)
    return {kernel: tuple(r for rows in by_call.values()
                          for r in sorted(rows, key=lambda x: rank.get(x.chip, len(rank))))  # stable: ties keep order
            for kernel, by_call in calls.items()}


def _pair(a: int | None, b: int | None) -> str:
    """Two counts in one cell, "every / predicated" or "spills / fills"."""
    return "-" if a is None and b is None else f"{_fmt('', a)} / {_fmt('', b)}"


def table_cells(r: BaselineRecord) -> list[str]:
    """One table row: chip, call, bundles (every step / predicated), compiler-backed time (SI), scoped VMEM
    (binary units), spills / fills and DMA starts per grid step; '-' where the record has no figure."""
    if not r.compiled:
        return [r.chip, f"{r.name} (does not compile)", *["-"] * (len(TABLE_HEADERS) - 2)]
    return [r.chip, r.name, _pair(r.loop_bundles_per_step, r.predicated_bundles_per_step),
            _fmt("compiled_time_s", r.compiled_time_s), _fmt("scoped_vmem_bytes", r.scoped_vmem_bytes),
            _pair(r.spills_per_step, r.fills_per_step), _fmt("dma_starts_per_step", r.dma_starts_per_step)]


def kernel_table(records: Sequence[BaselineRecord]) -> str:
    """A markdown table of one kernel's records, one row per call and chip in the given order."""
    head = "| " + " | ".join(TABLE_HEADERS) + " |"
    rule = "|" + "---|" * 2 + "---:|" * (len(TABLE_HEADERS) - 2)
    return "\n".join([head, rule, *("| " + " | ".join(_md(c) for c in table_cells(r)) + " |" for r in records)])


def kernel_tables(records: Sequence[BaselineRecord], chip_order: Sequence[str] | None = None,
                  kernel: str | None = None) -> dict[str, str]:
    """kernel -> its markdown table (:func:`kernel_records` order); ``kernel`` keeps that one only (an
    InputError listing the baseline's kernels when it has no records of it)."""
    return {k: kernel_table(rs) for k, rs in _chosen(kernel_records(records, chip_order), kernel).items()}


def _chosen(groups: dict[str, tuple[BaselineRecord, ...]],
            kernel: str | None) -> dict[str, tuple[BaselineRecord, ...]]:
    if kernel is None:
        return groups
    if kernel not in groups:
        raise InputError(f"`kernel` '{kernel}' has no records in the baseline; its kernels: "
                         f"{', '.join(groups) or 'none'}")
    return {kernel: groups[kernel]}


def tables_markdown(tables: Mapping[str, str]) -> str:
    """The tables for printing: one alone as is, several each under a ``### kernel`` heading."""
    if len(tables) == 1:
        return next(iter(tables.values()))
    return "\n\n".join(f"### {k}\n\n{t}" for k, t in tables.items())


def tables_json(records: Sequence[BaselineRecord], chip_order: Sequence[str] | None = None,
                kernel: str | None = None) -> list[dict[str, Any]]:
    """JSON-ready: per kernel, its records in table order (figures raw, units in the field names)."""
    return [{"kernel": k, "records": [_record_json(r) for r in rs]}
            for k, rs in _chosen(kernel_records(records, chip_order), kernel).items()]


def readme_caption(source: str, readme: str, libtpu_version: str | None) -> str:
    """The line above each README table: where it comes from and how to regenerate it."""
    # the command is one unbreakable word (no line starts inside it), restored after wrapping as the prose is
    command = f"`perfmodel baseline table {source} --write-readme {readme}`".replace(" ", "\0")
    text = (f"Generated from `{source}` (libtpu {libtpu_version or 'unknown'}) by {command}; do not edit by hand. "
            "Bundles, spills, fills and DMA starts per grid step of the compiled loop body; time: perfmodel's "
            "compiler-backed estimate of the whole call.")
    return textwrap.fill(text, 110, break_long_words=False, break_on_hyphens=False).replace("\0", " ")


def readme_regions(text: str, where: str = "README") -> list[tuple[str, int, int]]:
    """The marked regions of a README: (kernel, offset where the region's body starts (after the opening
    marker's line), offset of its closing marker). A marker without its partner, a region inside another or a
    kernel marked twice is an InputError naming the line."""
    out: list[tuple[str, int, int]] = []
    open_at: tuple[str, int, int] | None = None  # kernel, body start, line number
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped.startswith(_OPEN_PREFIX) and stripped.endswith(_OPEN_SUFFIX):
            kernel = stripped[len(_OPEN_PREFIX):-len(_OPEN_SUFFIX)].strip()
            if open_at is not None:
                raise InputError(f"{where}:{number}: a baseline-table marker inside the region opened on line "
                                 f"{open_at[2]}; close it first with {README_CLOSE}")
            if not kernel:
                raise InputError(f"{where}:{number}: the baseline-table marker names no kernel; write "
                                 f"{README_OPEN.format(kernel='rms_norm')}")
            if any(k == kernel for k, _, _ in out):
                raise InputError(f"{where}:{number}: kernel '{kernel}' already has a baseline-table region")
            open_at = (kernel, offset + len(line), number)
        elif stripped == README_CLOSE:
            if open_at is None:
                raise InputError(f"{where}:{number}: {README_CLOSE} without an opening baseline-table marker")
            out.append((open_at[0], open_at[1], offset))
            open_at = None
        offset += len(line)
    if open_at is not None:
        raise InputError(f"{where}:{open_at[2]}: the baseline-table region of '{open_at[0]}' is never closed; end "
                         f"it with {README_CLOSE}")
    return out


def region_body(table: str, caption: str) -> str:
    """What goes between a region's markers: the caption, the table, and a blank line so the closing marker is
    not read as part of the table."""
    return f"{caption}\n\n{table}\n\n"


def fill_readme(text: str, tables: Mapping[str, str], caption: str, *, where: str = "README",
                only: Sequence[str] | None = None) -> str:
    """``text`` with every marked region's body replaced by its kernel's table (``only``: just those kernels'
    regions; the rest are kept as they are). A region naming a kernel ``tables`` lacks is an InputError."""
    pieces, last = [], 0
    for kernel, start, end in readme_regions(text, where):
        if kernel not in tables:
            raise InputError(f"{where}: the baseline-table region '{kernel}' names no kernel of the baseline; its "
                             f"kernels: {', '.join(tables) or 'none'}")
        if only is not None and kernel not in only:
            continue
        pieces += [text[last:start], region_body(tables[kernel], caption)]
        last = end
    return "".join(pieces) + text[last:]


def stale_regions(text: str, tables: Mapping[str, str], caption: str, where: str = "README") -> list[str]:
    """The kernels whose marked region differs from what :func:`fill_readme` would write."""
    fresh = {k: region_body(t, caption) for k, t in tables.items()}
    return [k for k, start, end in readme_regions(text, where) if text[start:end] != fresh.get(k)]
