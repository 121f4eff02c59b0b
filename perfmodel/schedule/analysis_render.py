"""Text rendering of a schedule-model :class:`~perfmodel.schedule.results.Analysis` (what `perfmodel analyze`
prints); its JSON form is :meth:`Analysis.as_dict`."""

from __future__ import annotations

from perfmodel.schedule.results import Analysis, KernelAnalysis, OperandTraffic
from perfmodel.units import binary, nbytes, percent, seconds, si, table


def _block(o: OperandTraffic) -> str:
    return "x".join("-" if k == "squeezed" else str(b) for b, k in zip(o.block_shape, o.block_kinds))


def _moves(o: OperandTraffic) -> str:
    if not o.pipelined:
        return "manual"
    return f"{o.transfers:,}"


def operand_table(k: KernelAnalysis) -> str:
    rows = []
    for o in k.operands:
        rows.append([
            o.name,
            "in" if o.role == "input" else "out",
            o.array,
            _block(o),
            o.memory_space,
            _moves(o),
            nbytes(o.hbm_bytes) if o.pipelined else "-",
            nbytes(o.ideal_hbm_bytes),
            f"{o.reread_factor:.2f}x" if o.pipelined and o.ideal_hbm_bytes else "-",
            f"{o.buffer_count} x {binary(o.buffer_bytes / o.buffer_count)}" if o.buffer_count else "-",
        ])
    head = ["operand", "dir", "array", "block", "memory", "fetches/writes", "HBM bytes", "ideal", "re-read", "buffers"]
    return table(head, rows, align="llllrrrrrr")


def _vmem_line(k: KernelAnalysis) -> str:
    v = k.vmem
    parts = f"blocks {binary(v.blocks_bytes)} + scratch {binary(v.scratch_bytes)}"
    limit = ""
    if v.requested_limit_bytes is not None:
        limit = f" of vmem_limit_bytes {binary(v.requested_limit_bytes)}"
    elif v.default_scoped_limit_bytes is not None:
        limit = f" of {binary(v.default_scoped_limit_bytes)} default scoped limit"
    cap = f", {binary(v.capacity_bytes)} physical" if v.capacity_bytes is not None else ""
    smem = f"; SMEM {binary(v.smem_bytes)}" if v.smem_bytes else ""
    return f"VMEM   {binary(v.total_bytes)} ({parts}){limit}{cap}: {v.status}{smem}"


def _work_line(k: KernelAnalysis) -> str:
    w = k.work
    mxu = (f"MXU {si(w.mxu_issued_flops, 'FLOP')} issued ({si(w.mxu_useful_flops, 'FLOP')} useful, {w.mxu_dtype})"
           if w.dot_generals else "MXU none")
    text = f"Work   {mxu}, VPU {si(w.vpu_ops, 'op')}, EUP {si(w.eup_ops, 'op')}"
    if w.manual_dma_bytes:
        text += f", manual DMA {nbytes(w.manual_dma_bytes)}"
    text += (f"\n         per step (mean of {k.steps:,}): MXU {si(w.mean_step_mxu_issued_flops, 'FLOP')} issued, "
             f"VPU {si(w.mean_step_vpu_ops, 'op')}, EUP {si(w.mean_step_eup_ops, 'op')}")
    return text


def render_kernel(k: KernelAnalysis) -> str:
    t = k.time
    sem = ", ".join(k.dimension_semantics) if k.dimension_semantics else "no grid"
    cores = f"{k.cores_used} TensorCore{'s' if k.cores_used > 1 else ''}"
    lines = [
        f"pallas_call {k.name} on {k.chip}",
        f"  grid {k.grid} = {k.steps:,} steps [{sem}], {cores}"
        + (f", {k.num_scalar_prefetch} scalar-prefetch operand(s)" if k.num_scalar_prefetch else "")
        + (", MANUAL DMA" if k.manual_dma else ""),
        "",
        *("  " + line for line in operand_table(k).splitlines()),
        "",
        "  " + _vmem_line(k),
        "  " + _work_line(k),
        f"  Time   expected {seconds(t.expected_s)} = prologue {seconds(t.prologue_s)} + steps {seconds(t.steps_s)}"
        f" + epilogue {seconds(t.epilogue_s)}",
        f"         mean step: compute {seconds(t.mean_step_compute_s)}, DMA {seconds(t.mean_step_dma_s)}, "
        f"overhead {seconds(t.step_overhead_s)} -> {t.limiter}-limited "
        f"({t.steps_limited_by[t.limiter]:,}/{k.steps:,} steps)"
        + (f", + residual {seconds(t.step_residual_s)} per step" if t.step_residual_s else ""),
        f"         op floor {seconds(t.op_floor_s)} ({t.op_floor_limiter.upper()}-bound, each byte once) "
        f"-> efficiency {percent(t.efficiency)}; re-read {_reread(k)}",
    ]
    if k.cost_estimate:
        ce = k.cost_estimate
        lines.append(f"  Kernel's pl.CostEstimate: {si(ce['flops'], 'FLOP')}, {si(ce['transcendentals'], 'op')} "
                     f"transcendental, {nbytes(ce['bytes_accessed'])}")
    for note in k.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _reread(k: KernelAnalysis) -> str:
    ideal, moved = k.ideal_hbm_bytes, k.hbm_bytes
    return f"{moved / ideal:.2f}x ({nbytes(moved)} moved, {nbytes(ideal)} ideal)" if ideal else "n/a"


def render(a: Analysis) -> str:
    """The report `perfmodel analyze` prints."""
    blocks = [render_kernel(k) for k in a.kernels]
    if len(a.kernels) > 1:
        blocks.append(f"total expected {seconds(a.expected_s)} over {len(a.kernels)} pallas_calls")
    if a.xla is not None and a.xla.ops:
        blocks.append(render_xla(a))
    blocks.extend(f"note: {n}" for n in a.notes)
    return "\n\n".join(blocks)


def render_xla(a: Analysis) -> str:
    """The XLA ops around the pallas_calls and the function's total."""
    from perfmodel.model.core import BOUND_NAMES
    from perfmodel.units import flops

    rows = [[o.primitive, f"{o.count:,}", flops(o.flops) if o.flops else "-", nbytes(o.hbm_bytes),
             seconds(o.expected_s), BOUND_NAMES.get(o.limiter, o.limiter)] for o in a.xla.ops]
    lines = ["XLA ops around the pallas_calls (op model)",
             table(["op", "count", "FLOPs", "HBM bytes", "expected", "bound"], rows, align="lrrrrl"),
             f"total expected {seconds(a.total_s)} = pallas_calls {seconds(a.expected_s)} + XLA ops "
             f"{seconds(a.xla_s)}"]
    lines += [f"  {n}" for n in a.xla.notes]
    return "\n".join(lines)
