"""A captured profile op by op on perfmodel's roofline (`perfmodel profile`).

Reads an xprof / TensorBoard profile (the ``plugins/profile/<run>/*.xplane.pb``
files that ``jax.profiler.trace(dir)`` or an xprof capture writes) through the
``xprof`` package's own converters
(``xprof.convert.raw_to_tool_data.xspace_to_tool_data``), never by parsing the
protobuf here:

* ``hlo_stats`` (a TPU or GPU profile): one row per HLO op with its self time,
  occurrences and the profiler's rates. FLOPs = ``model_flop_rate`` (GFLOP/s)
  x ``total_time``; bytes = ``hbm_bw`` (GiB/s; ``measured_memory_bw`` where the
  profile has no HBM figure) x ``total_time``: xprof computes both rates over
  the op's total time (children included), so rate x that time gives back its
  counts. The measured time is ``total_self_time``.
* ``trace_viewer@`` (the CPU backend, whose ``hlo_stats`` has no rows): the
  XLA op events (threads named ``tf_XLA...``), summed per op name. Their args
  hold no FLOPs or bytes, so these come from the op's HLO: the profile keeps
  each compiled module's HLO, which ``graph_viewer`` prints as text, and
  :func:`perfmodel.xla.hlo.instruction_work` counts the op's work as for
  `perfmodel xla`. An op found in no module (or in several with different
  work) keeps its time with FLOPs and bytes unknown.

The floor of an op is :func:`perfmodel.model.core.evaluate`'s ``floor_s`` of an
:class:`~perfmodel.model.core.OpCost` of its counts on the chip: FLOPs on the
MXU for a matmul / convolution op (at the fastest rate its dtypes allow), on
the VPU otherwise, transcendentals on the EUP, bytes over HBM. The converters
write caches beside the xplane files they read, so they run on links to them
in a temporary folder: the profile folder is left as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from perfmodel.errors import InputError, ToolFailure
from perfmodel.inputcheck import short

#: How to capture a profile, for error messages.
CAPTURE_HINT = ("capture one with `with jax.profiler.trace(DIR): ...` around the code to profile (or an xprof "
                "capture), then give DIR")
#: Trace threads whose events are XLA ops on the CPU backend (tf_XLAEigen/..., tf_XLAPjRtCpuClient/...).
XLA_THREAD_PREFIX = "tf_XLA"
#: hlo_stats categories (and HLO opcodes) whose FLOPs run on the MXU.
_MATMUL_WORDS = ("convolution", "dot", "matmul", "gemm")
_PJIT = re.compile(r"PjitFunction\((.+)\)$")
_DTYPES = re.compile(r"\b(s4|u4|s8|u8|f8e4m3fn|f8e5m2|fp8|int8|f16|bf16|f32|f64)\[")


@dataclass(frozen=True, kw_only=True)
class ProfileOp:
    """One op of the profile, its occurrences summed."""

    name: str
    #: hlo_stats' category ("convolution fusion", ...) or, from HLO text, perfmodel's kind ("matmul", "fusion").
    category: str
    #: The HLO module (or hlo_stats' program id) the op is in; "" when unknown.
    module: str
    occurrences: int
    #: Measured seconds, all occurrences together (hlo_stats: self time; trace: event durations).
    measured_s: float
    #: FLOPs, transcendentals and bytes of all occurrences; None when the profile does not say.
    flops: float | None
    transcendentals: float | None
    bytes: float | None
    #: Whether the FLOPs are matrix FLOPs (MXU) rather than vector work.
    matmul: bool
    #: Dtype whose matmul rate prices the FLOPs ("" for vector work).
    mxu_dtype: str
    #: Where the FLOPs and bytes come from: "hlo_stats rates x time", "HLO text", "unknown: ...".
    work_source: str
    #: The op's HLO (hlo_stats' expression or the instruction's line), "" when unknown.
    expression: str = ""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What :func:`read_profile` read."""

    path: str
    xplanes: tuple[str, ...]
    #: "hlo_stats" or "trace_viewer@" (the xprof tool the ops come from).
    source: str
    #: The profile's device type (xprof overview_page's run environment: "TPU v5 lite", "CPU", ...), "" if none.
    device_type: str
    ops: tuple[ProfileOp, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class OpRoofline:
    """A profiled op beside its floor on the chip."""

    op: ProfileOp
    floor_s: float | None
    #: The unit that sets the floor ("MXU-bound", "HBM-bound", ...), "unknown" without FLOPs or bytes.
    bound: str

    JSON_DERIVED = ("ratio", "lost_s", "achieved_flops_per_s", "intensity_flop_per_byte")

    @property
    def ratio(self) -> float | None:
        """Measured / floor (>= 1 unless the op beat the model's floor)."""
        return self.op.measured_s / self.floor_s if self.floor_s else None

    @property
    def lost_s(self) -> float | None:
        """Seconds measured above the floor: what the op could gain at most."""
        return self.op.measured_s - self.floor_s if self.floor_s is not None else None

    @property
    def achieved_flops_per_s(self) -> float | None:
        return self.op.flops / self.op.measured_s if self.op.flops is not None and self.op.measured_s > 0 else None

    @property
    def intensity_flop_per_byte(self) -> float | None:
        return self.op.flops / self.op.bytes if self.op.flops is not None and self.op.bytes else None


@dataclass(frozen=True, kw_only=True)
class ProfileReport:
    source: str
    chip: str
    device_type: str
    path: str
    #: Every op, by time lost against its floor (most first); ops without a floor last, by measured time.
    ops: tuple[OpRoofline, ...]
    #: Rows the text and JSON list (0: all).
    top: int
    total_measured_s: float
    #: Sum of the floors / of the time lost, over the ops that have a floor.
    total_floor_s: float
    total_lost_s: float
    #: The chip's peak matmul rate (the ops' fastest dtype) and HBM bandwidth: the plot's roof.
    peak_flops_per_s: float
    hbm_bytes_per_s: float
    notes: tuple[str, ...] = ()

    @property
    def shown(self) -> tuple[OpRoofline, ...]:
        return self.ops[: self.top] if self.top else self.ops


# --------------------------------------------------------------------------- reading


def find_xplanes(path: str | os.PathLike) -> tuple[Path, ...]:
    """The xplane files of the newest run under ``path`` (a log dir holding ``plugins/profile/<run>/``, a run
    folder, or one ``.xplane.pb`` file); InputError naming the path and how to capture one when there is none."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"profile '{short(p)}' does not exist; {CAPTURE_HINT}")
    if p.is_file():
        if p.name.endswith(".xplane.pb"):
            return (p,)
        raise InputError(f"profile '{short(p)}' is not an .xplane.pb file nor a folder; {CAPTURE_HINT}")
    direct = sorted(p.glob("*.xplane.pb"))
    if direct:
        return tuple(direct)
    runs: dict[Path, list[Path]] = {}
    for f in sorted(p.glob("**/*.xplane.pb")):
        runs.setdefault(f.parent, []).append(f)
    if not runs:
        raise InputError(f"profile folder '{short(p)}' has no *.xplane.pb file; {CAPTURE_HINT}")
    # run folders are named by capture time (2026_12_05_00_12_49): the newest sorts last
    return tuple(runs[max(runs, key=lambda r: (r.name, str(r)))])


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The converters' C++ logging (absl warnings written to fd 2, e.g. "No ProfileProcessor registered for
    tool") kept off the terminal: a failure reaches the caller as the converter's exception instead."""
    try:
        saved = os.dup(2)
    except OSError:  # no real fd 2 (an embedding host): nothing to silence
        yield
        return
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _tool(paths: Sequence[str], tool: str, params: Mapping[str, Any] | None = None) -> bytes | None:
    """One xprof tool's data for the xplane files (None when the converter has none)."""
    from xprof.convert import raw_to_tool_data

    with _quiet_stderr():
        try:
            data, _content_type = raw_to_tool_data.xspace_to_tool_data(list(paths), tool, dict(params or {}))
        except Exception as exc:  # the converter raises ValueError and others with its C++ message
            raise ToolFailure(f"xprof's {tool} converter failed on {short(paths[0])}: "
                              f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}") \
                from None
    if data is None:
        return None
    return data if isinstance(data, bytes) else str(data).encode()


def _table_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Google-charts DataTable ({cols, rows: [{c: [{v}]}]}) as dicts keyed by column id."""
    ids = [c.get("id") for c in table.get("cols", [])]
    return [{k: (cell or {}).get("v") for k, cell in zip(ids, row.get("c", []))} for row in table.get("rows", [])]


def _device_type(paths: Sequence[str]) -> str:
    """overview_page's run environment device type ("TPU v5 lite", "CPU", ...), "" when it names none."""
    raw = _tool(paths, "overview_page")
    try:
        tables = json.loads(raw) if raw else []
    except ValueError:
        return ""
    for t in tables if isinstance(tables, list) else [tables]:
        p = t.get("p", {}) if isinstance(t, dict) else {}
        if p.get("device_type"):
            return str(p["device_type"])
    return ""


def _fastest_dtype(text: str) -> str:
    """The narrowest dtype named in an HLO text that a matmul could run in (its rate is the highest, so the
    floor stays a lower bound); bf16 when none is named."""
    order = ["s4", "u4", "f8e4m3fn", "f8e5m2", "s8", "u8", "bf16", "f16", "f32", "f64"]
    found = set(_DTYPES.findall(text))
    names = {"s4": "int4", "u4": "int4", "s8": "int8", "u8": "int8", "f8e4m3fn": "fp8", "f8e5m2": "fp8"}
    for d in order:
        if d in found:
            return names.get(d, d)
    return "bf16"


def _from_hlo_stats(rows: Sequence[Mapping[str, Any]]) -> list[ProfileOp]:
    use_hbm = any(float(r.get("hbm_bw") or 0) > 0 for r in rows)
    ops = []
    for r in rows:
        total_s = float(r.get("total_time") or 0) * 1e-6
        flop_rate = r.get("model_flop_rate")
        bw = r.get("hbm_bw") if use_hbm else r.get("measured_memory_bw")
        expr = str(r.get("hlo_op_expression") or "")
        category = str(r.get("category") or "")
        matmul = any(w in category.lower() for w in _MATMUL_WORDS) or bool(re.search(r"\b(dot|convolution)\(", expr))
        ops.append(ProfileOp(
            name=str(r.get("hlo_op_name") or "?"), category=category, module=str(r.get("program_id") or ""),
            occurrences=int(r.get("occurrences") or 0), measured_s=float(r.get("total_self_time") or 0) * 1e-6,
            flops=None if flop_rate is None else float(flop_rate) * 1e9 * total_s,
            transcendentals=None,
            bytes=None if bw is None else float(bw) * 2**30 * total_s,
            matmul=matmul, mxu_dtype=_fastest_dtype(expr) if matmul else "",
            work_source=f"hlo_stats model_flop_rate, {'hbm_bw' if use_hbm else 'measured_memory_bw'} x total_time",
            expression=expr))
    return ops


@dataclass(frozen=True, kw_only=True)
class _HloOp:
    module: str
    kind: str
    work: Any  # perfmodel.xla.hlo.Work
    dtype: str
    line: str


def _module_ops(run_dir: Path, paths: Sequence[str]) -> dict[str, list[_HloOp]]:
    """Instruction name -> the ops of that name that run at the top level of the profile's HLO modules (entry,
    loop bodies, calls), with their work. xprof lists modules as it does for its graph viewer: the tool-names
    call writes one ``<module>.hlo_proto.pb`` per module beside the xplane files; graph_viewer prints each."""
    from perfmodel.xla import hlo, program

    from xprof.convert import raw_to_tool_data

    with _quiet_stderr():
        raw_to_tool_data.xspace_to_tool_names(list(paths))
    out: dict[str, list[_HloOp]] = {}
    for proto in sorted(run_dir.glob("*.hlo_proto.pb")):
        module = proto.name[: -len(".hlo_proto.pb")]
        try:
            text = _tool(paths, "graph_viewer", {"graph_viewer_options": {"module_name": module, "type": "long_txt"}})
        except ToolFailure:
            continue  # a module the viewer cannot print: its ops keep their times, work unknown
        if not text:
            continue
        comps = hlo.parse_module(text.decode(errors="replace"))
        try:
            main = hlo.entry(comps)
        except ValueError:
            continue
        listed: list = []
        program._walk(comps, main, 1, [], listed)
        memo: dict = {}
        for ins, comp, _count in listed:
            if ins.opcode in hlo.FREE:
                continue
            shapes = {i.name: i.arrays for i in comp.instructions}
            kind = program._kind(ins, comps, set())
            operand_types = " ".join(f"{a.dtype}[" for o in ins.operands for a in shapes.get(o, ()))
            out.setdefault(ins.name, []).append(_HloOp(
                module=module, kind=kind, work=hlo.instruction_work(comps, ins, shapes, memo),
                dtype=_fastest_dtype(operand_types) if kind == "matmul" else "",
                line=f"%{ins.name} = {ins.type_text} {ins.opcode}({ins.args_text})"))
    return out


def _is_runtime_event(name: str) -> bool:
    """Events on XLA's threads that are the runtime's, not ops: thread-pool regions, "end: <op>" markers, the
    executor's waits, Python frames."""
    return "::" in name or name.startswith(("end: ", "$")) or not name.strip()


def _from_trace(raw: bytes, hlo_ops: Mapping[str, list[_HloOp]]) -> tuple[list[ProfileOp], list[str]]:
    trace = json.loads(raw)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") != "X" or not threads.get((e.get("pid"), e.get("tid")), "").startswith(XLA_THREAD_PREFIX):
            continue
        name = str(e.get("name", ""))
        if _is_runtime_event(name):
            continue
        per_op.setdefault(name, []).append(float(e.get("dur") or 0.0) * 1e-6)
    # The profile keeps the HLO of every module alive in the process, not only of those that ran: where an op
    # name is in several modules, those of the jitted functions called during the trace (PjitFunction(f) on
    # the Python thread runs module jit_f) are taken first.
    called = {"jit_" + m.group(1) for e in events if e.get("ph") == "X"
              for m in [_PJIT.match(str(e.get("name", "")))] if m}
    ops, unknown = [], []
    for name, durs in per_op.items():
        cands = hlo_ops.get(name, [])
        ran = [c for c in cands if re.sub(r"\(\d+\)$", "", c.module) in called]
        cands = ran or cands
        works = {(c.work.flops, c.work.transcendentals, c.work.hbm_bytes) for c in cands}
        n = len(durs)
        if len(works) == 1:
            c = cands[0]
            w = c.work.scaled(n)
            ops.append(ProfileOp(
                name=name, category=c.kind, module=", ".join(dict.fromkeys(x.module for x in cands)), occurrences=n,
                measured_s=sum(durs), flops=w.flops, transcendentals=w.transcendentals, bytes=w.hbm_bytes,
                matmul=c.kind == "matmul", mxu_dtype=c.dtype, work_source="HLO text (graph_viewer)",
                expression=c.line))
            continue
        why = "in several HLO modules with different work" if cands else "in no HLO module of the profile"
        unknown.append(name)
        ops.append(ProfileOp(name=name, category="?", module="", occurrences=n, measured_s=sum(durs), flops=None,
                             transcendentals=None, bytes=None, matmul=False, mxu_dtype="",
                             work_source=f"unknown: {why}"))
    notes = []
    if unknown:
        notes.append(f"FLOPs and bytes unknown for {len(unknown)} op(s) ({', '.join(unknown[:5])}"
                     f"{', ...' if len(unknown) > 5 else ''}): their times are listed, without a floor")
    return ops, notes


def read_profile(path: str | os.PathLike) -> Profile:
    """The device ops of the profile at ``path`` (see the module docstring for what each number comes from)."""
    xplanes = find_xplanes(path)
    notes: list[str] = []
    runs = {x.parent for x in Path(path).glob("**/*.xplane.pb")} if Path(path).is_dir() else set()
    if len(runs) > 1:
        notes.append(f"{len(runs)} profile runs under {short(path)}: read the newest, {xplanes[0].parent.name}")
    with _linked(xplanes) as links:
        device_type = _device_type(links)
        raw = _tool(links, "hlo_stats")
        rows = _table_rows(json.loads(raw)) if raw else []
        if rows:
            source = "hlo_stats"
            ops = _from_hlo_stats(rows)
        else:
            source = "trace_viewer@"
            raw = _tool(links, "trace_viewer@")
            if not raw:
                raise ToolFailure(f"xprof's converters found no op in {short(path)} (hlo_stats has no rows, "
                                  "trace_viewer@ no data)")
            ops, more = _from_trace(raw, _module_ops(Path(links[0]).parent, links))
            notes += more
            notes.append("hlo_stats has no rows (the CPU backend): ops are the XLA op events of the trace "
                         f"(threads {XLA_THREAD_PREFIX}*), their FLOPs and bytes from each module's HLO")
    if not ops:
        raise InputError(f"profile '{short(path)}' holds no device op ({source}); profile code that runs "
                         "jitted work on the device inside the trace")
    return Profile(path=str(path), xplanes=tuple(str(x) for x in xplanes), source=source, device_type=device_type,
                   ops=tuple(ops), notes=tuple(notes))


@contextlib.contextmanager
def _linked(xplanes: Sequence[Path]) -> Iterator[list[str]]:
    """Links to the xplane files in a temporary folder: the converters write their caches (and the modules' HLO
    protos) beside the files they are given, never into the user's profile."""
    with tempfile.TemporaryDirectory(prefix="perfmodel-profile-") as tmp:
        links = []
        for x in xplanes:
            link = Path(tmp) / x.name
            link.symlink_to(x.resolve())
            links.append(str(link))
        yield links



# --------------------------------------------------------------------------- on the roofline


def chip_for(profile: Profile, hw: str | None) -> Any:
    """The chip given, else the one the profile's device type names; InputError asking for `hw` when it names
    none perfmodel knows (a CPU profile)."""
    from perfmodel.errors import UnknownChipError
    from perfmodel.hw.registry import get_chip

    if hw:
        return get_chip(hw)
    device = profile.device_type
    if device and not device.upper().startswith("CPU"):
        try:
            return get_chip(device)
        except UnknownChipError:
            pass
    what = f"device type '{device}'" if device else "no device type"
    raise InputError(f"the profile has {what}, which names no chip perfmodel knows: give `hw` (e.g. --hw tpu-v5e)")


def op_floor(op: ProfileOp, chip: Any) -> tuple[float | None, str]:
    """(floor seconds, bound name) of an op's counts on the chip; (None, "unknown") without them."""
    from perfmodel.model.core import BOUND_NAMES, OpCost, evaluate

    if op.flops is None and op.bytes is None:
        return None, "unknown"
    flops = op.flops or 0.0
    dtype = op.mxu_dtype if op.matmul and chip.matmul_rate(op.mxu_dtype) else "bf16"
    cost = OpCost(name=op.name, mxu_flops=flops if op.matmul else 0.0, useful_flops=flops if op.matmul else 0.0,
                  mxu_dtype=dtype, vpu_ops=0.0 if op.matmul else flops, eup_ops=op.transcendentals or 0.0,
                  hbm_read_bytes=op.bytes or 0.0)
    roof = evaluate(cost, chip)
    return float(roof.floor_s), BOUND_NAMES[roof.limiter]


def profile_report(profile: Profile, chip: Any, top: int = 10) -> ProfileReport:
    """Every op of the profile beside its floor on ``chip``, by time lost against it; ``top`` rows shown (0: all)."""
    if top < 0:
        raise InputError(f"`top` {top}: give 0 (every op) or more")
    rows = []
    for op in profile.ops:
        floor, bound = op_floor(op, chip)
        rows.append(OpRoofline(op=op, floor_s=floor, bound=bound))
    known = sorted((r for r in rows if r.lost_s is not None), key=lambda r: -(r.lost_s or 0.0))
    rest = sorted((r for r in rows if r.lost_s is None), key=lambda r: -r.op.measured_s)
    dtypes = [r.op.mxu_dtype for r in rows if r.op.matmul and chip.matmul_rate(r.op.mxu_dtype)]
    peak = max([chip.matmul_rate(d) for d in dtypes] or [chip.matmul_rate("bf16") or 0.0])
    notes = list(profile.notes)
    faster = [r.op.name for r in known if r.ratio is not None and r.ratio < 1]
    if faster:
        notes.append(f"measured faster than the floor on {chip.name} (a profile of another chip?): "
                     f"{', '.join(faster[:5])}")
    if profile.device_type and profile.device_type.upper().startswith("CPU"):
        notes.append(f"measured on the CPU backend: the times are the host's, the floors {chip.name}'s")
    return ProfileReport(
        source=profile.source, chip=chip.name, device_type=profile.device_type, path=profile.path,
        ops=tuple(known + rest), top=top, total_measured_s=sum(r.op.measured_s for r in rows),
        total_floor_s=sum(r.floor_s for r in known if r.floor_s is not None),
        total_lost_s=sum(r.lost_s for r in known if r.lost_s is not None), peak_flops_per_s=float(peak),
        hbm_bytes_per_s=float(chip.memory.hbm_bw_bytes_per_s_per_chip), notes=tuple(dict.fromkeys(notes)))


# --------------------------------------------------------------------------- rendering (pure)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}x" if x < 1000 else f"{x:,.0f}x"


def report_text(r: ProfileReport) -> str:
    from perfmodel.units import nbytes, seconds, si, table

    source = {"hlo_stats": "xprof hlo_stats (device ops)",
              "trace_viewer@": "xprof trace_viewer@ (XLA:CPU op events) + the modules' HLO"}.get(r.source, r.source)
    head = (f"profile {r.path}: {len(r.ops)} op(s) from {source}; device {r.device_type or 'not named'}; "
            f"floors on {r.chip}")
    rows = [[x.op.name, x.op.category, f"{x.op.occurrences}", seconds(x.op.measured_s), si(x.op.flops, "FLOP"),
             nbytes(x.op.bytes), si(x.achieved_flops_per_s, "FLOP/s"), seconds(x.floor_s), _ratio(x.ratio), x.bound,
             seconds(x.lost_s) if x.lost_s is not None else "-"] for x in r.shown]
    lines = [head, "", table(["op", "category", "runs", "measured", "FLOPs", "bytes", "achieved", "floor",
                              "x floor", "bound", "lost"], rows, align="llrrrrrrrlr",
                             optional=("category", "achieved", "bytes"))]
    if len(r.shown) < len(r.ops):
        more = r.ops[len(r.shown):]
        lines.append(f"... {len(more)} more op(s), {seconds(sum(x.op.measured_s for x in more))} measured together "
                     "(--top 0 lists all)")
    share = r.total_lost_s / r.total_measured_s if r.total_measured_s else 0.0
    lines += ["", f"measured {seconds(r.total_measured_s)} in all; the floors {seconds(r.total_floor_s)}; "
              f"{seconds(r.total_lost_s)} ({100 * share:.1f}%) lost against them"]
    lost = [x for x in r.ops if x.lost_s]
    if lost:
        lines.append("why not faster (most time lost first): " + "; ".join(
            f"{x.op.name} {seconds(x.lost_s)} over its floor ({x.bound}, {_ratio(x.ratio)})" for x in lost[:3]))
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def report_record(r: ProfileReport) -> dict[str, Any]:
    from perfmodel.jsonable import to_jsonable

    return {"source": r.source, "chip": r.chip, "device_type": r.device_type, "path": r.path, "top": r.top,
            "op_count": len(r.ops), "total_measured_s": r.total_measured_s, "total_floor_s": r.total_floor_s,
            "total_lost_s": r.total_lost_s, "peak_flops_per_s": r.peak_flops_per_s,
            "hbm_bytes_per_s": r.hbm_bytes_per_s, "notes": list(r.notes),
            "ops": [to_jsonable(x) for x in r.shown]}


def roofline_figure(r: ProfileReport, *, title: str) -> Any:
    """Each op with FLOPs and bytes at (FLOPs per byte, FLOPs / measured time), with the chip's roofline
    (peak matmul rate, HBM slope) and each op's floor point on it; colour by the floor's bound."""
    import numpy as np

    from perfmodel.harness.plots import BOUND_COLOURS, _figure
    from perfmodel.model.core import BOUND_NAMES

    fig = _figure(7.5, 5.0)
    ax = fig.subplots()
    pts = [x for x in r.ops if x.intensity_flop_per_byte and x.achieved_flops_per_s and x.floor_s]
    ridge = r.peak_flops_per_s / r.hbm_bytes_per_s if r.hbm_bytes_per_s else 1.0
    xs = [x.intensity_flop_per_byte for x in pts] + [ridge]
    grid = np.logspace(np.log10(min(xs) / 4), np.log10(max(xs) * 4), 200)
    ax.plot(grid, np.minimum(r.peak_flops_per_s, grid * r.hbm_bytes_per_s), "k-", lw=1,
            label=f"{r.chip} roofline (peak matmul, HBM)")
    unit_of = {name: unit for unit, name in BOUND_NAMES.items()}
    for bound in dict.fromkeys(x.bound for x in pts):
        sel = [x for x in pts if x.bound == bound]
        colour = BOUND_COLOURS.get(unit_of.get(bound, ""), "k")
        ax.scatter([x.intensity_flop_per_byte for x in sel], [x.achieved_flops_per_s for x in sel], color=colour,
                   marker="*", s=80, zorder=3, label=f"measured ({bound} at the floor)")
        ax.scatter([x.intensity_flop_per_byte for x in sel], [x.op.flops / x.floor_s for x in sel],
                   facecolors="none", edgecolors=colour, zorder=3)
    for x in pts[:6]:
        ax.annotate(x.op.name, (x.intensity_flop_per_byte, x.achieved_flops_per_s), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    if not pts:
        ax.text(0.5, 0.5, "no op has both FLOPs and bytes to place", ha="center", va="center",
                transform=ax.transAxes, fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP / byte]",
           ylabel="FLOP/s (stars: measured; circles: at the floor)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def save_plot(r: ProfileReport, path: str | os.PathLike, *, title: str) -> str:
    from perfmodel.harness.plots import save

    return str(save(roofline_figure(r, title=title), path, field="plot"))
