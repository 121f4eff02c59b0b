"""A compiled TPU program op by op: work from the optimized HLO, bundles from the compiler's schedule, a time
per op on the chip's roofline (no jax).

For every instruction of the ENTRY computation and of the ``while`` bodies it
runs (times their trip counts) that does work (a program of its own in the
compiler's dumps, a collective, a DMA, a custom call):

* ``compute_s`` = stall x bundles / clock: the op's VLIW program
  (:mod:`perfmodel.compiler.bundles`: loops with a literal trip count
  weighted by it) at the chip's ``compute.clock_hz``, with the stall factor
  of :mod:`perfmodel.schedule.compiled` (fitted on published v5e timings);
  a Pallas kernel's grid-loop body counts once per grid step; for an XLA op
  on a chip whose XLA GEMMs were measured (efficiency.yaml's fitted bf16
  ``mxu_share``: TPU v5e, one TPU7x core), at least its FLOPs at that share
  of the bf16 peak;
* ``memory_s`` = HBM bytes / (peak HBM bandwidth x the chip's achievable
  share: efficiency.yaml's fitted ``hbm_share``, else
  :data:`perfmodel.model.core.ACHIEVABLE`): the operands and results in HBM
  (those the compiler keeps in VMEM move no HBM bytes);
* a collective's time is :mod:`perfmodel.model.collectives`' ring model of
  its bytes over its replica group (ICI, expected time);
* the op's time is the larger of compute and memory (its bound), or the
  collective's; a caller may give better times for Pallas kernels (the
  compiler-backed schedule model, :func:`perfmodel.schedule.compiled.compiled_time`).

The compiler runs one op at a time on a TensorCore, but its asynchronous
DMAs (``copy-start``/``slice-start`` ... ``-done``: weights and arrays
prefetched into VMEM) run beside the ops scheduled between their start and
their done. The step is the sum of the op times less the DMA time hidden that
way (:func:`hidden_dma_s`: one DMA queue, first in first out, that moves
while an op leaves HBM idle, i.e. for the op's time less its own HBM time,
and stalls the program at a ``-done`` whose copy is unfinished).
Collectives are not overlapped.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from perfmodel.xla import hlo

#: Units of a compiled op's bound.
BOUNDS = ("compute", "hbm", "ici")


@dataclass(frozen=True, kw_only=True)
class ProgramOp:
    """One op of the compiled program (per run; ``count`` runs per step)."""

    hlo_name: str
    opcode: str
    #: "matmul" (a fusion or op with a dot/convolution), "fusion", "pallas" (a Mosaic custom call),
    #: "custom-call", "collective", "dma" (async copy), "copy", "other".
    kind: str
    #: JAX's name stack of the op (its fusion root's), "" when the compiler kept none.
    op_name: str
    #: Every name stack of the instructions fused into it (several: XLA fused ops of several sources).
    fused_op_names: tuple[str, ...]
    count: int
    flops: float
    transcendentals: float
    bytes: float
    hbm_bytes: float
    ici_bytes: float
    #: Bundles of the op's program per run (loops weighted by their trips), None without a dump.
    bundles: float | None
    compute_s: float
    memory_s: float
    ici_s: float
    #: Seconds per run.
    time_s: float
    bound: str
    #: Where ``time_s`` comes from: "roofline" (bundles/bytes), "collective model", "schedule model".
    time_source: str
    #: Chips in the replica group (collectives), else 1.
    group_chips: int = 1

    @property
    def total_s(self) -> float:
        return self.count * self.time_s

    @property
    def total_flops(self) -> float:
        return self.count * self.flops

    @property
    def total_hbm_bytes(self) -> float:
        return self.count * self.hbm_bytes


@dataclass(frozen=True, kw_only=True)
class Program:
    """A compiled program on one chip of the topology."""

    chip: Any
    topology: str
    chips: int
    ops: tuple[ProgramOp, ...]
    #: The compiler's own totals (``compiled.cost_analysis()``): flops, bytes accessed, ...
    cost_analysis: dict[str, float]
    #: ``compiled.memory_analysis()`` fields, bytes.
    memory: dict[str, int]
    compile_s: float
    from_cache: bool
    notes: tuple[str, ...] = ()
    stall_factor: float = 1.0
    #: DMA seconds that run under other ops (see :func:`hidden_dma_s`).
    dma_hidden_s: float = 0.0

    @property
    def serial_s(self) -> float:
        """The sum of the op times (no overlap)."""
        return sum(op.total_s for op in self.ops)

    @property
    def step_s(self) -> float:
        return self.serial_s - self.dma_hidden_s

    @property
    def flops(self) -> float:
        return sum(op.total_flops for op in self.ops)

    @property
    def hbm_bytes(self) -> float:
        return sum(op.total_hbm_bytes for op in self.ops)

    @property
    def hbm_footprint_bytes(self) -> int:
        """HBM the program needs on one chip: arguments + outputs not aliased to them + temporaries + code."""
        m = self.memory
        return int(m.get("argument_size_in_bytes", 0) + m.get("output_size_in_bytes", 0)
                   - m.get("alias_size_in_bytes", 0) + m.get("temp_size_in_bytes", 0)
                   + m.get("generated_code_size_in_bytes", 0))

    def share(self, op: ProgramOp) -> float:
        """The op's part of the sum of op times."""
        return op.total_s / self.serial_s if self.serial_s > 0 else 0.0

    def bound_shares(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for op in self.ops:
            out[op.bound] = out.get(op.bound, 0.0) + self.share(op)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _kind(ins: hlo.Instruction, comps: Mapping[str, hlo.Computation], pallas: set[str]) -> str:
    if ins.name in pallas:
        return "pallas"
    op = ins.opcode
    if op.startswith(hlo.COLLECTIVES) or op.replace("-start", "") in hlo.COLLECTIVES:
        return "collective"
    if op in hlo.ASYNC_COPIES:
        return "dma"
    if op in ("dot", "convolution"):
        return "matmul"
    if op == "fusion":
        called = hlo._CALLS_ONLY.search(ins.attrs)
        if called and _has_matmul(comps, called.group(1)):
            return "matmul"
        return "fusion"
    if op == "custom-call":
        return "custom-call"
    if op == "copy":
        return "copy"
    return "other"


def _has_matmul(comps: Mapping[str, hlo.Computation], name: str, depth: int = 0) -> bool:
    comp = comps.get(name)
    if comp is None or depth > 8:
        return False
    for i in comp.instructions:
        if i.opcode in ("dot", "convolution"):
            return True
        if i.opcode == "fusion":
            called = hlo._CALLS_ONLY.search(i.attrs)
            if called and _has_matmul(comps, called.group(1), depth + 1):
                return True
    return False


def _fused_names(comps: Mapping[str, hlo.Computation], ins: hlo.Instruction, depth: int = 0) -> list[str]:
    names = [ins.op_name] if ins.op_name else []
    if ins.opcode == "fusion" and depth < 8:
        called = hlo._CALLS_ONLY.search(ins.attrs)
        comp = comps.get(called.group(1)) if called else None
        for i in comp.instructions if comp else ():
            names += _fused_names(comps, i, depth + 1)
    return names


def _walk(comps: Mapping[str, hlo.Computation], comp: hlo.Computation, count: int, notes: list[str],
          out: list[tuple[hlo.Instruction, hlo.Computation, int]], depth: int = 0) -> None:
    for ins in comp.instructions:
        if ins.opcode == "while":
            body = hlo._BODY.search(ins.attrs)
            trips = hlo.while_trip_count(comps, ins)
            if trips is None:
                notes.append(f"{ins.name}: a while loop whose trip count the HLO does not fix is counted once")
            if body and body.group(1) in comps and depth < 8:
                _walk(comps, comps[body.group(1)], count * (trips or 1), notes, out, depth + 1)
            continue
        if ins.opcode in ("call", "conditional") and depth < 8:
            if ins.opcode == "conditional":
                notes.append(f"{ins.name}: every branch of a conditional is counted")
            for c in ins.calls:
                if c in comps:
                    _walk(comps, comps[c], count, notes, out, depth + 1)
            continue
        out.append((ins, comp, count))


#: In an op's backend config: XLA's cost model gave up on the fusion's window config (seen on fusions whose
#: deviceless program runs several times the measured time; perfmodel/harness/README.md, the --compile section).
_NO_COST_ESTIMATE = '"estimated_cycles":"9223372036854775807"'
#: The program note on such a fusion (``--compile`` rows carry it as what to doubt in their time).
NO_ESTIMATE_NOTE = "XLA's cost model gave no estimate for this fusion"


def build_program(report: Any, chip: Any, *, kernel_times: Mapping[str, float] | None = None,
                  hlo_text: str | None = None) -> Program:
    """Per-op view of a CompileReport (compiled, with its HLO text kept). ``kernel_times``: HLO name of a
    Pallas custom call -> seconds from the schedule model, used instead of its bundles and bytes."""
    from perfmodel.errors import InputError
    from perfmodel.model import collectives
    from perfmodel.model.core import ACHIEVABLE, evaluate
    from perfmodel.model.efficiency import chip_efficiency
    from perfmodel.schedule.compiled import default_constants

    if not report.compiled:
        raise InputError(f"the compiler rejected {report.call}: {report.error}")
    if hlo_text is None:
        if not report.hlo_path:
            raise InputError(f"the compile report of {report.call} kept no HLO text; recompile it")
        hlo_text = Path(report.hlo_path).read_text()
    comps = hlo.parse_module(hlo_text)
    main = hlo.entry(comps)
    notes: list[str] = []
    listed: list[tuple[hlo.Instruction, hlo.Computation, int]] = []
    _walk(comps, main, 1, notes, listed)
    bundles: dict[str, tuple[float, int]] = {o["hlo_name"]: (float(o.get("weighted_bundles", o["program_bundles"])),
                                                             int(o.get("unknown_trip_loops", 0)))
                                             for o in report.other_ops}
    pallas = {k.hlo_name: k for k in report.kernels}
    clock = float(chip.compute.clock_hz or 0.0)
    stall = default_constants().stall_factor
    # The chip's achievable HBM share, as the op models use it (efficiency.yaml's fitted hbm_share where there
    # is one, e.g. one 7x TensorCore timed alone; else ACHIEVABLE).
    hbm_rate = chip.memory.hbm_bw_bytes_per_s_per_chip * chip_efficiency(chip.name).hbm_share
    # Where XLA's GEMMs on this chip were measured (efficiency.yaml's fitted bf16 mxu_share), an op's FLOPs take
    # at least that long: the schedule shows the MXU pushes a bundle issues, not how fast the MXU drains them.
    fitted_mxu = chip_efficiency(chip.name).mxu_share.get("bf16")
    mxu_rate = chip.compute.matmul_flops_per_s_per_chip.get("bf16", 0.0) * fitted_mxu if fitted_mxu else 0.0
    memo: dict = {}
    shapes_of: dict[str, dict[str, tuple[hlo.Array, ...]]] = {}
    users_of: dict[str, dict[str, list[hlo.Instruction]]] = {}
    ops: list[ProgramOp] = []
    unknown_loops = 0
    twins = _shared_programs(comps, listed, set(bundles) | {k.hlo_name for k in report.kernels
                                                             if k.program_bundles is not None})
    no_program = 0
    no_program_bytes = 0.0
    for ins, comp, count in listed:
        if ins.opcode in hlo.FREE or ins.opcode.endswith("-done"):
            continue
        kind = _kind(ins, comps, set(pallas))
        shapes = shapes_of.setdefault(comp.name, {i.name: i.arrays for i in comp.instructions})
        work = hlo.instruction_work(comps, ins, shapes, memo)
        nb: float | None = None
        if ins.name in pallas:
            k = pallas[ins.name] if pallas[ins.name].program_bundles is not None else pallas.get(
                twins.get(ins.name, ""), pallas[ins.name])
            lp = k.loop
            grid = ragged_dot_grid(ins, shapes)
            if grid is not None:  # XLA's own ragged-dot kernel: a dynamic grid the schedule cannot count
                work = dataclasses.replace(work, hbm_bytes=work.hbm_bytes + grid.extra_hbm_bytes)
            # The grid loop's iterations: its own trip count, else (a dynamic grid) the grid's steps plus the
            # iterations that only fill and drain its pipeline.
            if lp is not None and lp.trip_count:
                trips = lp.trip_count
            elif grid is not None:
                trips = grid.steps + (lp.stages if lp is not None else 0)
            else:
                trips = 1
            if lp is not None and k.program_bundles is not None:
                nb = float(lp.run_bundles(trips) + max(k.program_bundles - lp.bundles, 0))
            elif k.program_bundles is not None:  # no grid loop: the program runs once
                nb = float(k.program_bundles)
        elif ins.name in bundles or ins.name in twins:
            nb, unk = bundles[twins.get(ins.name, ins.name)]
            unknown_loops += unk
        elif kind not in ("collective", "dma", "custom-call"):
            if not work.hbm_bytes or all(not a.dims for a in ins.arrays):
                continue  # no program of its own and no HBM traffic (a bitcast-like op the compiler folded away)
                # or a scalar (loop counters: the scalar unit's registers, whatever their layout says)
            no_program += 1
            no_program_bytes += count * work.hbm_bytes
        compute = stall * nb / clock if nb and clock else 0.0
        if nb and _NO_COST_ESTIMATE in ins.attrs:
            notes.append(f"{ins.name}: {NO_ESTIMATE_NOTE} (estimated_cycles = "
                         f"INT64_MAX); its {nb:,.0f} bundles may not be the program a device compile emits")
        if mxu_rate and nb and kind != "pallas":
            compute = max(compute, work.flops / mxu_rate)
        memory = work.hbm_bytes / hbm_rate if hbm_rate else 0.0
        ici = ici_bytes = 0.0
        group = 1
        source = "roofline"
        if kind == "collective":
            group = hlo.collective_group_size(ins, report.chips)
            base = ins.opcode.replace("-start", "")
            size = float(sum(a.bytes for a in ins.arrays[-1:])) if base != "all-gather" else float(
                sum(a.bytes for o in ins.operands[:1] for a in shapes.get(o, ())))
            model = {"all-reduce": collectives.all_reduce, "all-gather": collectives.all_gather,
                     "reduce-scatter": collectives.reduce_scatter}.get(base)
            if group > 1 and model is not None:
                cost = model(bytes_per_chip=size, num_chips=group, chip=chip)
                roof = evaluate(cost, chip)
                ici_bytes = float(cost.ici_bytes)
                ici = float(roof.expected_s)
            elif group > 1 and chip.interconnect.ici_bw_bytes_per_s_per_chip:
                ici_bytes = size
                ici = size / (chip.interconnect.ici_bw_bytes_per_s_per_chip * ACHIEVABLE["ici"][0])
            source = "collective model"
        if kind == "pallas" and kernel_times and ins.name in kernel_times:
            time, bound, source = float(kernel_times[ins.name]), ("compute" if compute >= memory else "hbm"), \
                "schedule model"
        elif kind == "collective":
            time, bound = max(ici, memory), "ici" if ici >= memory else "hbm"
        else:
            time, bound = max(compute, memory), "compute" if compute >= memory else "hbm"
        op_name = ins.op_name
        if kind == "dma":  # a prefetch into VMEM is the work of the op that reads the prefetched copy
            op_name = _consumer_op_name(comps, comp, ins, users_of) or op_name
        if not op_name and kind == "collective":  # the partitioner's collectives may carry no metadata:
            producer = next((i for i in comp.instructions if ins.operands and i.name == ins.operands[0]), None)
            op_name = producer.op_name if producer is not None else ""  # take their operand's
        ops.append(ProgramOp(
            hlo_name=ins.name, opcode=ins.opcode, kind=kind, op_name=op_name,
            fused_op_names=tuple(dict.fromkeys(_fused_names(comps, ins))), count=count, flops=work.flops,
            transcendentals=work.transcendentals, bytes=work.bytes, hbm_bytes=work.hbm_bytes, ici_bytes=ici_bytes,
            bundles=nb, compute_s=compute, memory_s=memory, ici_s=ici, time_s=time, bound=bound,
            time_source=source, group_chips=group))
    if no_program:
        from perfmodel.units import nbytes

        notes.append(f"{no_program} op(s) with HBM traffic ({nbytes(no_program_bytes)} in all) have no schedule in the "
                     "compiler's dumps (nor an identical op with one): timed from their bytes alone")
    if unknown_loops:
        notes.append(f"{unknown_loops} loop(s) inside ops have a trip count the schedule does not fix; "
                     "their bundles count once")
    if not clock:
        notes.append(f"{chip.name} has no compute.clock_hz: bundles are not turned into time")
    hidden = hidden_dma_s(listed, ops)
    notes.append("op times add up (one op at a time per TensorCore), less the DMA time that runs while ops leave "
                 "HBM idle between a copy's start and its done; collectives are not overlapped")
    return Program(chip=chip, topology=report.topology, chips=report.chips, ops=tuple(ops),
                   cost_analysis=dict(report.cost_analysis), memory=dict(report.memory),
                   compile_s=report.compile_s, from_cache=report.from_cache, notes=tuple(dict.fromkeys(notes)),
                   stall_factor=stall, dma_hidden_s=hidden)


@dataclass(frozen=True, kw_only=True)
class RaggedDotGrid:
    """The grid of one XLA ragged-dot kernel (``ragged-dot-none``) in a compiled program."""

    steps: int
    #: HBM bytes past one read of each operand: every column tile reads all of lhs again.
    extra_hbm_bytes: float


_RAGGED_TILING = re.compile(r'ragged_dot_tiling="(\d+),(\d+),(\d+)"')


def ragged_dot_grid(ins: hlo.Instruction, shapes: Mapping[str, tuple[hlo.Array, ...]]) -> RaggedDotGrid | None:
    """Grid steps of XLA's ragged-dot kernel from its tiles (``ragged_dot_tiling``: rows, K, columns) and
    operands: column tiles x row-tile visits x K tiles, the visits bounded by the length of its group metadata
    (row tiles + groups - 1, the 1-D int32 operands); None for any other op. See
    :mod:`perfmodel.model.xla_ragged_dot` for how XLA picks the tiles."""
    found = _RAGGED_TILING.search(ins.attrs)
    if found is None or ins.opcode != "custom-call":
        return None
    _, tk, tn = (int(v) for v in found.groups())
    operands = [a for o in ins.operands for a in shapes.get(o, ())[:1]]
    visits = max((a.dims[0] for a in operands if len(a.dims) == 1 and a.dtype.startswith("s32")), default=0)
    arrays = [a for a in operands if len(a.dims) >= 2]
    if not visits or len(arrays) < 2 or not ins.arrays or len(ins.arrays[0].dims) != 2:
        return None
    lhs = arrays[0]
    n_tiles = -(-ins.arrays[0].dims[1] // tn)
    k_tiles = -(-lhs.dims[-1] // tk)
    return RaggedDotGrid(steps=n_tiles * visits * k_tiles, extra_hbm_bytes=float((n_tiles - 1) * lhs.bytes))


def hidden_dma_s(listed: Sequence[tuple[hlo.Instruction, hlo.Computation, int]], ops: Sequence[ProgramOp]) -> float:
    """Seconds of asynchronous DMA that run under other ops, walking the program in its scheduled order (loop
    bodies with their run counts, every time scaled by the runs): a DMA joins one first-in-first-out queue at its
    start; each other op drains the queue for its time less its own HBM time (an HBM-bound op leaves no room);
    a ``-done`` whose copy is still queued stalls until the queue has moved it. What is still queued at the end
    runs alone. Returns the DMA time less the stalls it caused."""
    by_name = {op.hlo_name: op for op in ops}
    queue: list[list] = []  # [start name, seconds left]
    dma_total = stalled = 0.0
    for ins, _comp, _count in listed:
        if ins.opcode.endswith("-done"):
            start = ins.operands[0] if ins.operands else ""
            names = [q[0] for q in queue]
            if start in names:  # wait for it (and everything queued before it)
                upto = names.index(start) + 1
                stalled += sum(q[1] for q in queue[:upto])
                del queue[:upto]
            continue
        op = by_name.get(ins.name)
        if op is None:
            continue
        if op.kind == "dma":
            queue.append([op.hlo_name, op.total_s])
            dma_total += op.total_s
            continue
        room = max(op.total_s - op.count * op.memory_s, 0.0)
        while queue and room > 0:
            step = min(room, queue[0][1])
            queue[0][1] -= step
            room -= step
            if queue[0][1] <= 0:
                queue.pop(0)
    stalled += sum(q[1] for q in queue)
    return max(dma_total - stalled, 0.0)


def _shared_programs(comps: Mapping[str, hlo.Computation], listed: Sequence[tuple[hlo.Instruction, hlo.Computation, int]],
                     bundles: Iterable[str]) -> dict[str, str]:
    """Op without a dumped schedule -> the HLO name of an identical op with one. The compiler dumps one schedule per distinct program: the second layer's attention, the V
    gather beside the K gather, reuse the first one's (without this they went uncounted); ``bundles``: the
    names of the ops with a schedule."""
    bundles = set(bundles)
    memo: dict[str, str] = {}
    types_of: dict[str, dict[str, str]] = {}
    by_sig: dict[str, str] = {}
    missing: list[tuple[hlo.Instruction, str]] = []
    for ins, comp, _count in listed:
        if ins.opcode in hlo.FREE or ins.opcode.endswith("-done") or ins.opcode in hlo.ASYNC_COPIES:
            continue
        types = types_of.setdefault(comp.name, {i.name: i.type_text for i in comp.instructions})
        sig = hlo.program_signature(comps, ins, types, memo)
        if ins.name in bundles:
            by_sig.setdefault(sig, ins.name)
        else:
            missing.append((ins, sig))
    return {ins.name: by_sig[sig] for ins, sig in missing if sig in by_sig}


#: Custom calls that only assemble buffers (the slices of a weight streamed into VMEM are concatenated by a
#: ConcatBitcast before their matmul reads them): a prefetch belongs to the op reading what they build.
_BUFFER_CALLS = frozenset({"ConcatBitcast", "AllocateBuffer"})


def _consumer_op_name(comps: Mapping[str, hlo.Computation], comp: hlo.Computation, start: hlo.Instruction,
                      users_of: dict[str, dict[str, list[hlo.Instruction]]]) -> str:
    """Name stack of the first op that reads the result of an async copy ``start`` (through its ``-done``,
    tuples and bitcasts, up to 6 steps); "" when none carries one or the first reader is a nameless op (the
    weight slices streamed into VMEM feed an AllocateBuffer custom call: their matmul is not named there)."""
    users = users_of.get(comp.name)
    if users is None:
        users = users_of[comp.name] = {}
        for i in comp.instructions:
            for o in dict.fromkeys(i.operands):
                users.setdefault(o, []).append(i)
    frontier = [start.name]
    for _ in range(6):
        nxt = []
        for i in (u for name in frontier for u in users.get(name, ())):
            target = hlo._TARGET.search(i.attrs) if i.opcode == "custom-call" else None
            if i.opcode.endswith("-done") or i.opcode in hlo.FREE or (
                    target is not None and target.group(1) in _BUFFER_CALLS):
                nxt.append(i.name)
                continue
            name = i.op_name or next(iter(_fused_names(comps, i)), "")  # a fusion's root may carry none
            if name:
                return name
        if not nxt:
            return ""
        frontier = nxt
    return ""


def scope_of(op_name: str, known: Iterable[str]) -> str | None:
    """The innermost component of a JAX name stack that is one of ``known`` (e.g. "qkv_proj")."""
    known = set(known)
    for part in reversed(op_name.split("/")):
        if part in known:
            return part
    return None


def source_label(op: ProgramOp, parts: int = 2) -> str:
    """Short source of an op: the last components of its name stack (without jit/while/body wrappers)."""
    skip = {"while", "body", "closed_call", "cond"}
    comps = [p for p in op.op_name.split("/") if p and p not in skip and not p.startswith("jit(")]
    return "/".join(comps[-parts:]) if comps else "-"


__all__ = ["Program", "ProgramOp", "build_program", "scope_of", "source_label"]


def function_program(target: str, shapes: Sequence[str], args: Sequence[str], chip: Any, *,
                     topology: str | None = None, shard: Sequence[str] = (),
                     progress: Callable[[str], None] | None = None) -> Program:
    """Compile MODULE:FUNCTION (arguments as for `perfmodel analyze`) for ``chip``'s slice and read it op by op.
    Its Pallas kernels get the compiler-backed schedule model's times where the function traces on this host
    (perfmodel.schedule.analyze + compiled.pair); otherwise their bundles and bytes."""
    from perfmodel.compiler.api import CompileCall, compile_report
    from perfmodel.errors import PerfmodelError

    if shard and topology is None:
        from perfmodel.errors import InputError

        raise InputError("`shard` places arrays on a slice: give `topology` too (e.g. v5e:2x2)")
    call = CompileCall(kind="function", target=target, shapes=tuple(shapes), args=tuple(args), topology=topology,
                       shard=tuple(shard))
    report = compile_report(call, chip, progress=progress)
    if not report.compiled:
        from perfmodel.errors import InputError

        raise InputError(f"the TPU compiler rejected {target}: {report.error}")
    if report.hlo_path is None:  # a cache entry made before the HLO text was kept
        report = compile_report(call, chip, use_cache=False, progress=progress)
    kernel_times: dict[str, float] = {}
    notes: list[str] = []
    if report.kernels:
        try:
            from perfmodel.schedule.analyze import analyze
            from perfmodel.schedule.binding import bind_function
            from perfmodel.schedule.compiled import pair

            fn, values = bind_function(target, shapes, args, chip)
            views = pair(analyze(fn, *values, chip=chip, keep_step_times=True), report, chip)
            kernel_times = {v.compile.hlo_name: v.time.expected_s for v in views if v.time is not None}
        except PerfmodelError as exc:
            notes.append(f"Pallas kernels timed from their bundles and bytes (the schedule model: {exc})")
    prog = build_program(report, chip, kernel_times=kernel_times)
    if notes:
        import dataclasses

        prog = dataclasses.replace(prog, notes=prog.notes + tuple(notes))
    return prog

