"""``analyze(fn, *args)``: the schedule model of every pallas_call a function runs.

Steps for each pallas_call: read it (:mod:`.extract`), evaluate its index
maps at every grid step (:mod:`.indexmaps`), simulate the pipeline's fetches
and write-backs (:mod:`.pipeline`), count the body's work per step
(:mod:`.body`), size its VMEM (:mod:`.vmem`) and time it (:mod:`.timing`),
next to the op floor of the same work with every byte moved once
(:func:`perfmodel.model.core.evaluate`).

All of it works on numpy arrays over the steps. A grid that repeats one
period per index of its leading dimensions (batch, heads, a matmul's row
blocks; see :class:`.pipeline.Traversal`) is evaluated on each TensorCore's
first, one middle and last period only, which stand for all of them exactly.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from perfmodel.errors import InputError
from perfmodel.hw.registry import DEFAULT_CHIP
from perfmodel.hw.spec import ChipSpec
from perfmodel.model.core import OpCost, combine, evaluate
from perfmodel.schedule import pipeline as pl_sim
from perfmodel.schedule.body import WorkCounter, count_body_work
from perfmodel.schedule.extract import PallasCall, find_pallas_calls, trace
from perfmodel.schedule.xla_ops import xla_ops
from perfmodel.schedule.indexmaps import block_indices, grid_points, periodic_leading_dims
from perfmodel.schedule.loops import LoopOptions
from perfmodel.schedule.results import (
    Analysis,
    BodyWork,
    KernelAnalysis,
    OperandTraffic,
    ScratchBuffer,
    StepTimes,
    TimeEstimate,
    VmemUsage,
    ideal_bytes,
)
from perfmodel.schedule.timing import (
    DEFAULT_HOST_DISPATCH,
    DISPATCH_DOMINATED_RATIO,
    StepWork,
    core_rates,
    pipeline_time,
)
from perfmodel.schedule.vmem import buffer_bytes, vmem_status


def resolve_chip(chip: str | ChipSpec) -> ChipSpec:
    if isinstance(chip, ChipSpec):
        return chip
    from perfmodel.hw.registry import get_chip

    spec = get_chip(chip)
    if spec.kind != "tpu":
        raise InputError(f"--hw: {spec.name} is not a TPU; the schedule model describes Pallas TPU kernels")
    return spec


def analyze(fn: Callable, *args: Any, chip: str | ChipSpec = DEFAULT_CHIP, host_dispatch_s: float | None = None,
            keep_step_times: bool = False, loop_trips: int | None = None, **kwargs: Any) -> Analysis:
    """Trace ``fn(*args, **kwargs)`` and model every pallas_call it runs on ``chip``.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``; scalar-prefetch
    operands that index maps read must be concrete arrays. The function is
    traced as if on ``chip`` (its JAX device kind, see
    :mod:`perfmodel.schedule.device_kind`), so kernels that call
    ``pltpu.get_tpu_info()`` trace on a CPU. ``loop_trips``: iterations assumed for an in-kernel while loop
    whose trip count is read from data given only as a shape (default: one, with a note). Returns an
    :class:`~perfmodel.schedule.results.Analysis`.
    """
    from perfmodel.schedule.device_kind import as_device

    spec = resolve_chip(chip)
    check_loop_trips(loop_trips)
    with as_device(spec):
        closed = trace(fn, *args, **kwargs)
    calls = find_pallas_calls(closed, args)
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or repr(fn)
    notes: tuple[str, ...] = ()
    if not calls:
        notes = (f"{name} runs no pallas_call; nothing to model (use `perfmodel predict` for XLA ops)",)
    kernels = tuple(
        analyze_call(c, spec, host_dispatch_s=host_dispatch_s, keep_step_times=keep_step_times, loop_trips=loop_trips)
        for c in calls
    )
    return Analysis(function=str(name), chip=spec.name, kernels=kernels, notes=notes, xla=xla_ops(closed, spec))


def check_loop_trips(loop_trips: int | None) -> None:
    """``loop_trips`` is None or a positive integer."""
    if loop_trips is not None and (isinstance(loop_trips, bool) or not isinstance(loop_trips, (int, np.integer))
                                   or loop_trips < 1):
        raise InputError(f"`loop_trips` must be a positive whole number of iterations, got {loop_trips!r}")


def cores_for(call: PallasCall, chip: ChipSpec) -> int:
    """TensorCores the grid runs on: all of a megacore chip's when the grid has a leading parallel dimension."""
    if chip.cores.megacore and call.dimension_semantics and "parallel" in call.dimension_semantics[0]:
        return chip.cores.cores_per_chip
    return 1


def analyze_call(call: PallasCall, chip: ChipSpec, *, order: np.ndarray | None = None, cores: int | None = None,
                 host_dispatch_s: float | None = None, keep_step_times: bool = False,
                 loop_trips: int | None = None, loop_options: LoopOptions = LoopOptions()) -> KernelAnalysis:
    """Model one pallas_call. ``order``: an explicit traversal (``(n, ndim)`` grid points), e.g.
    the one a TPU-interpret run recorded; by default Pallas' row-major order. ``loop_options``: the
    interpreter's fast paths (default: all; the reference implementation with them off)."""
    notes: list[str] = []
    if any(int(g) <= 0 for g in call.grid):
        raise InputError(
            f"pallas_call {call.name}: grid {tuple(call.grid)} has an empty dimension, so the kernel runs no step; "
            "a block is probably larger than its array (e.g. JAX's matmul needs blocks that divide the shape)"
        )
    ncores = cores_for(call, chip) if cores is None else cores
    trav, per_period = _traversal(call, order, ncores, keep_step_times)
    points, seg = trav.points, trav.seg
    n = points.shape[0]  # steps evaluated; trav.steps of the whole grid
    if ncores > 1 and seg.cores > 1:
        notes.append(f"grid split over {seg.cores} TensorCores along its leading parallel dimension(s) (megacore)")

    operands, fetch, wb = _operand_traffic(call, chip, trav, per_period, notes, loop_options)
    counter = count_body_work(call.body, chip, call.grid, points, call.body_values, loop_trips=loop_trips,
                              starts=seg.starts, loop_options=loop_options, axes=call.body_axes)
    notes.extend(counter.notes)
    manual = any(not o.pipelined for o in operands) or bool(counter.dma_directions)
    if manual:
        notes.append(
            "manual DMA: operands left in HBM (memory_space ANY) are copied by the body's own async copies; "
            "their traffic is estimated from its dma_start ops, not simulated as a pipeline"
        )

    scratch, scratch_vmem, scratch_smem = _scratch(call, chip, counter)
    vmem = _vmem(call, chip, operands, scratch_vmem, scratch_smem)
    if vmem.status != "fits":
        notes.append(_vmem_note(vmem))

    dma = pl_sim.dma_schedule(fetch, wb, seg)
    work = StepWork(mxu_issued_flops=counter.issued, vpu_ops=counter.vpu, eup_ops=counter.eup,
                    manual_dma_bytes=counter.dma, dma_waves=counter.waves)
    prefetch_bytes = sum(int(np.asarray(v).nbytes) for v in call.prefetch_values if v is not None)
    pt = pipeline_time(work, dma, seg, core_rates(chip), n, extra_prologue_bytes=prefetch_bytes, mult=trav.mult)

    floor = _op_floor(call, chip, counter, operands, prefetch_bytes, ncores, trav)
    dispatch = DEFAULT_HOST_DISPATCH.seconds if host_dispatch_s is None else host_dispatch_s
    limiter = max(pt.steps_limited_by, key=pt.steps_limited_by.get)
    time = TimeEstimate(
        expected_s=pt.expected_s,
        prologue_s=float(pt.prologue_s[pt.slowest_core]),
        steps_s=float(pt.steps_s[pt.slowest_core]),
        epilogue_s=float(pt.epilogue_s[pt.slowest_core]),
        mean_step_compute_s=trav.total(pt.compute_s) / trav.steps if n else 0.0,
        mean_step_dma_s=trav.total(pt.dma_s) / trav.steps if n else 0.0,
        step_overhead_s=pt.overhead_s,
        step_residual_s=pt.residual_s,
        steps_limited_by=pt.steps_limited_by,
        limiter=limiter,
        op_floor_s=floor[0],
        op_floor_limiter=floor[1],
        efficiency=floor[0] / pt.expected_s if pt.expected_s > 0 else float("nan"),
        host_dispatch_s=dispatch,
        dispatch_dominated=pt.expected_s < DISPATCH_DOMINATED_RATIO * dispatch,
    )
    if time.dispatch_dominated:
        notes.append(
            f"dispatch-dominated: the kernel's expected time is under {DISPATCH_DOMINATED_RATIO:g}x the "
            f"~{dispatch * 1e6:.0f} us host dispatch of one call; a wall-clock timing of a single call measures "
            "mostly dispatch"
        )
    steps_total = trav.steps
    issued_total = float(sum(trav.total(v) for v in counter.issued.values()))
    body = BodyWork(
        mxu_useful_flops=trav.total(counter.useful),
        mxu_issued_flops=issued_total,
        mxu_dtype=_dominant_key(counter, n),
        vpu_ops=trav.total(counter.vpu),
        eup_ops=trav.total(counter.eup),
        manual_dma_read_bytes=trav.total(counter.dma_read),
        manual_dma_write_bytes=trav.total(counter.dma_write),
        dot_generals=counter.dots,
        mean_step_mxu_issued_flops=issued_total / steps_total if n else 0.0,
        mean_step_vpu_ops=trav.total(counter.vpu) / steps_total if n else 0.0,
        mean_step_eup_ops=trav.total(counter.eup) / steps_total if n else 0.0,
    )
    unpadded_total = sum(trav.total(v) for v in counter.unpadded.values())
    waste = 1 - unpadded_total / issued_total if issued_total else 0.0
    if waste > 0.01:
        notes.append(f"MXU padding: {waste:.0%} of issued MXU FLOPs pad dot_generals to the {chip.cores.mxu_dim}-wide MXU")
    steps = StepTimes(compute_s=pt.compute_s, dma_s=pt.dma_s, overhead_s=pt.overhead_s, work_s=pt.work_s,
                      core=seg.core, prologue_s=pt.prologue_s, epilogue_s=pt.epilogue_s,
                      dma_waves=pt.dma_waves, mxu_s=pt.mxu_s) if keep_step_times else None
    return KernelAnalysis(
        name=call.name,
        chip=chip.name,
        grid=call.grid,
        dimension_semantics=call.dimension_semantics,
        steps=trav.steps,
        cores_used=seg.cores,
        manual_dma=bool(manual),
        num_scalar_prefetch=call.num_scalar_prefetch,
        operands=tuple(operands),
        scratch=tuple(scratch),
        vmem=vmem,
        work=body,
        time=time,
        cost_estimate=call.cost_estimate,
        notes=tuple(dict.fromkeys(notes)),
        step_times=steps,
    )


#: Evaluate periodic grids on their representative periods (see pipeline.Traversal); False: every step.
COMPRESS_PERIODIC_GRIDS = True


def _traversal(call: PallasCall, order: np.ndarray | None, ncores: int,
               keep_step_times: bool) -> tuple[pl_sim.Traversal, list[bool | None]]:
    """The steps to evaluate (every step, or each core's representative periods of a periodic grid) and,
    per block, whether its windows follow the periodic dimensions."""
    if order is not None:
        points = np.asarray(order, dtype=np.int32).reshape(len(order), len(call.grid))  # a grid-less call: (1, 0)
        return pl_sim.full_traversal(points, pl_sim.single_segment(points.shape[0])), [False] * len(call.blocks)
    if COMPRESS_PERIODIC_GRIDS and not keep_step_times:
        leading, flags = periodic_leading_dims(call)
        trav = pl_sim.periodic_traversal(call.grid, call.dimension_semantics, ncores, leading) if leading else None
        if trav is not None:
            return trav, flags
    points = grid_points(call.grid)
    seg = pl_sim.split_over_cores(call.grid, call.dimension_semantics, ncores)
    return pl_sim.full_traversal(points, seg), [False] * len(call.blocks)


def _dominant_key(counter: WorkCounter, n: int) -> str:
    if not counter.issued:
        return "none"
    return next(iter(counter.issued)) if len(counter.issued) == 1 else "mixed"


def _operand_traffic(call: PallasCall, chip: ChipSpec, trav: pl_sim.Traversal, per_period: Sequence[bool | None],
                     notes: list[str],
                     loop_options: LoopOptions) -> tuple[list[OperandTraffic], np.ndarray, np.ndarray]:
    points, seg = trav.points, trav.seg
    n = points.shape[0]
    fetch = np.zeros(n)
    wb = np.zeros(n)
    out: list[OperandTraffic] = []
    for b, follows in zip(call.blocks, per_period):
        approx = {k for k in b.block_kinds if k in ("bounded_slice", "indirect")}
        if approx:
            notes.append(f"operand '{b.name}' uses {', '.join(sorted(approx))} block dimensions; "
                         "its windows are approximated by their full block size")
        array_bytes = int(math.prod(b.array_shape)) * b.itemsize_bytes
        per_buffer = buffer_bytes(b.ref_shape, b.itemsize_bytes, b.memory_space, chip)
        if not b.pipelined:
            out.append(OperandTraffic(
                name=b.name, role=b.role, array=b.array_label, dtype=b.dtype.name, array_shape=b.array_shape,
                block_shape=b.block_shape, block_kinds=b.block_kinds, memory_space=b.memory_space, pipelined=False,
                buffer_count=0, transfers=0, hbm_bytes=0, ideal_hbm_bytes=array_bytes, buffer_bytes=0,
            ))
            continue
        idx = block_indices(call, b, points, loop_options=loop_options)
        t = pl_sim.simulate_block(idx, role=b.role, block_shape=b.block_shape, block_kinds=b.block_kinds,
                                  array_shape=b.array_shape, itemsize_bytes=b.itemsize_bytes, seg=seg,
                                  traversal=trav, per_period=bool(follows))
        if b.role == "input":
            fetch += t.step_bytes
        else:
            wb += t.step_bytes
        out.append(OperandTraffic(
            name=b.name, role=b.role, array=b.array_label, dtype=b.dtype.name, array_shape=b.array_shape,
            block_shape=b.block_shape, block_kinds=b.block_kinds, memory_space=b.memory_space, pipelined=True,
            buffer_count=b.buffer_count, transfers=t.transfers, hbm_bytes=t.total_bytes,
            ideal_hbm_bytes=t.ideal_bytes, buffer_bytes=b.buffer_count * per_buffer,
        ))
    return out, fetch, wb


def _scratch(call: PallasCall, chip: ChipSpec, counter: WorkCounter) -> tuple[list[ScratchBuffer], int, int]:
    out = []
    vmem = smem = 0
    for name, aval in call.scratch:
        ms = str(getattr(aval, "memory_space", "vmem")).lower().rsplit(".", 1)[-1]
        dtype = getattr(aval, "dtype", None)
        shape = tuple(getattr(aval, "shape", ()))
        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            np_dtype = None
        if np_dtype is None or "sem" in ms:
            label = f"{getattr(dtype, 'name', str(dtype))}[{','.join(map(str, shape))}]"
            out.append(ScratchBuffer(name=name, shape=label, memory_space="semaphore" if "sem" in ms else ms, padded_bytes=0))
            continue
        space = ms if ms in ("vmem", "smem") else "vmem"
        nbytes = buffer_bytes(shape, np_dtype.itemsize, space, chip)
        if space == "vmem":
            vmem += nbytes
        else:
            smem += nbytes
        out.append(ScratchBuffer(name=name, shape=f"{np_dtype.name}[{','.join(map(str, shape))}]", memory_space=space,
                                 padded_bytes=nbytes))
    for space, nbytes in counter.scoped_bytes.items():
        out.append(ScratchBuffer(name="run_scoped", shape="(allocated in the body)", memory_space=space, padded_bytes=nbytes))
        if space == "vmem":
            vmem += nbytes
        else:
            smem += nbytes
    return out, vmem, smem


def _vmem(call: PallasCall, chip: ChipSpec, operands: Sequence[OperandTraffic], scratch_vmem: int,
          scratch_smem: int) -> VmemUsage:
    blocks = sum(o.buffer_bytes for o in operands if o.memory_space == "vmem")
    smem_blocks = sum(o.buffer_bytes for o in operands if o.memory_space == "smem")
    prefetch_smem = sum(int(math.prod(getattr(v.aval, "shape", ()))) * 4
                        for v in call.body.invars[: call.num_scalar_prefetch])
    total = blocks + scratch_vmem
    return VmemUsage(
        blocks_bytes=blocks,
        scratch_bytes=scratch_vmem,
        total_bytes=total,
        smem_bytes=smem_blocks + scratch_smem + prefetch_smem,
        default_scoped_limit_bytes=chip.memory.vmem_default_scoped_limit_bytes_per_core,
        capacity_bytes=chip.memory.vmem_bytes_per_core,
        requested_limit_bytes=call.vmem_limit_bytes,
        status=vmem_status(total, chip, call.vmem_limit_bytes),
    )


def _vmem_note(v: VmemUsage) -> str:
    from perfmodel.units import binary

    if v.status == "does not fit":
        return f"VMEM: {binary(v.total_bytes)} of buffers exceed the {binary(v.capacity_bytes)} of VMEM per core"
    limit = v.requested_limit_bytes if v.requested_limit_bytes is not None else v.default_scoped_limit_bytes
    which = "its vmem_limit_bytes" if v.requested_limit_bytes is not None else "the default scoped limit"
    return (f"VMEM: {binary(v.total_bytes)} of buffers exceed {which} ({binary(limit)}); "
            f"set pltpu.CompilerParams(vmem_limit_bytes>={v.total_bytes})")


def _op_floor(call: PallasCall, chip: ChipSpec, counter: WorkCounter, operands: Sequence[OperandTraffic],
              prefetch_bytes: int, cores_used: int, trav: pl_sim.Traversal) -> tuple[float, str]:
    """Roofline floor of the same work with each byte moved once and no MXU padding, on the cores used.

    On chips whose JAX device is one of several TensorCores (cores_used <
    cores_per_chip), the chip-wide floor is scaled up accordingly.
    """
    tot = trav.total
    reads = ideal_bytes(operands, tot(counter.dma_read), "input") + prefetch_bytes
    writes = ideal_bytes(operands, tot(counter.dma_write), "output")
    useful = tot(counter.useful)
    unpadded = {k: tot(v) for k, v in counter.unpadded.items()} or {_default_key(chip): 0.0}
    total = sum(unpadded.values())
    parts = []
    for i, (key, flops) in enumerate(unpadded.items()):
        share = flops / total if total else 1.0
        extra = dict(vpu_ops=tot(counter.vpu), eup_ops=tot(counter.eup),
                     hbm_read_bytes=reads, hbm_write_bytes=writes) if i == 0 else {}
        parts.append(OpCost(name=f"{call.name}:{key}", mxu_flops=flops, useful_flops=useful * share, mxu_dtype=key,
                            **extra))
    cost = parts[0] if len(parts) == 1 else combine(call.name, parts)
    roof = evaluate(cost, chip)
    scale = chip.cores.cores_per_chip / max(1, cores_used)
    return float(roof.floor_s) * scale, str(roof.limiter)


def _default_key(chip: ChipSpec) -> str:
    rates = chip.compute.matmul_flops_per_s_per_chip
    return "bf16" if "bf16" in rates else next(iter(rates))
