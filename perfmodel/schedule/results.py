"""What the schedule model reports: plain frozen dataclasses (no jax, JSON-able).

A :class:`KernelAnalysis` describes one ``pallas_call``; an :class:`Analysis`
every ``pallas_call`` a traced function runs. Per-step arrays that the
block-size advisor needs live in :class:`StepTimes`, which the JSON output
leaves out: :meth:`Analysis.as_dict` is :func:`perfmodel.jsonable.to_jsonable`,
which honours each class's ``JSON_OMIT`` and ``JSON_DERIVED``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from perfmodel.errors import InputError
from perfmodel.jsonable import to_jsonable


@dataclass(frozen=True, kw_only=True)
class OperandTraffic:
    """HBM traffic of one blocked operand over the whole grid.

    For inputs ``transfers`` counts block fetches (HBM -> VMEM); for outputs,
    write-backs (VMEM -> HBM). ``hbm_bytes`` counts only the in-bounds part
    of each block (a partial edge block moves fewer bytes).
    """

    name: str
    #: "input" or "output".
    role: str
    #: e.g. "bfloat16[4096,4096]".
    array: str
    dtype: str
    array_shape: tuple[int, ...]
    #: Window size per array dimension (1 for squeezed dimensions).
    block_shape: tuple[int, ...]
    #: Per dimension: "blocked", "squeezed", "element", "bounded_slice" or "indirect".
    block_kinds: tuple[str, ...]
    #: "vmem" (pipelined by Pallas), "smem", or "any" / "hbm" (left in HBM: manual DMA).
    memory_space: str
    #: Whether Pallas pipelines this operand (fetches / writes back blocks itself).
    pipelined: bool
    #: Buffers Pallas allocates for it (2 = double buffering; pl.Buffered(n) changes it).
    buffer_count: int
    transfers: int
    hbm_bytes: int
    #: Bytes of the distinct blocks touched: each byte moved once.
    ideal_hbm_bytes: int
    #: VMEM (or SMEM) bytes of its buffers, padded to the chip's tiling.
    buffer_bytes: int

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("reread_factor",)

    @property
    def reread_factor(self) -> float:
        return self.hbm_bytes / self.ideal_hbm_bytes if self.ideal_hbm_bytes else float("nan")


@dataclass(frozen=True, kw_only=True)
class ScratchBuffer:
    """One scratch operand (``scratch_shapes``) or scoped allocation."""

    name: str
    #: e.g. "float32[512,1024]" or "dma_sem[2]".
    shape: str
    memory_space: str
    #: Bytes it occupies, padded to the chip's tiling (0 for semaphores).
    padded_bytes: int


@dataclass(frozen=True, kw_only=True)
class VmemUsage:
    """VMEM footprint against the chip's limits.

    ``status`` is "fits" (within the default scoped limit, or within the
    kernel's own ``vmem_limit_bytes``), "needs vmem_limit_bytes" (over the
    limit that applies but within the physical VMEM) or "does not fit".
    """

    blocks_bytes: int
    scratch_bytes: int
    total_bytes: int
    smem_bytes: int
    default_scoped_limit_bytes: int | None
    capacity_bytes: int | None
    #: The kernel's compiler_params vmem_limit_bytes, if it sets one.
    requested_limit_bytes: int | None
    status: str


@dataclass(frozen=True, kw_only=True)
class BodyWork:
    """Work of the kernel body, totals over the grid and the mean per step.

    ``mxu_issued_flops`` includes the padding of every dot_general to the MXU
    tile (M to the sublane count, K and N to the MXU dimension);
    ``mxu_useful_flops`` is 2*M*N*K summed. Steps where a ``pl.when`` skips the
    work count zero for it when the predicate depends only on program ids and
    scalar prefetch.
    """

    mxu_useful_flops: float
    mxu_issued_flops: float
    #: Operand dtype whose MXU rate applies ("bf16", "int8", ... or "mixed").
    mxu_dtype: str
    vpu_ops: float
    eup_ops: float
    #: Bytes the body's own async copies move (manual DMA), from its dma_start ops: HBM -> on-chip and back.
    manual_dma_read_bytes: float
    manual_dma_write_bytes: float
    dot_generals: int
    mean_step_mxu_issued_flops: float
    mean_step_vpu_ops: float
    mean_step_eup_ops: float

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("manual_dma_bytes",)

    @property
    def manual_dma_bytes(self) -> float:
        return self.manual_dma_read_bytes + self.manual_dma_write_bytes


@dataclass(frozen=True, kw_only=True)
class TimeEstimate:
    """Expected time of the pipelined grid and where it goes.

    ``expected_s`` = prologue (first blocks' fetch) + sum over steps of
    max(step compute, step DMA, per-step overhead) + the step residual + epilogue (last
    write-backs), for the slowest core. ``op_floor_s`` is the roofline floor of
    the same work with every byte moved once (perfmodel.model); efficiency =
    op_floor_s / expected_s.
    """

    expected_s: float
    prologue_s: float
    steps_s: float
    epilogue_s: float
    #: Means over the grid steps of the three terms of the per-step max.
    mean_step_compute_s: float
    mean_step_dma_s: float
    step_overhead_s: float
    #: What every step adds after the largest of the three (the chip's fitted ``pallas_step_residual_s``; 0 if none).
    step_residual_s: float
    #: How many steps each term limits ("compute", "dma", "overhead").
    steps_limited_by: dict[str, int]
    #: The term that limits the most steps.
    limiter: str
    op_floor_s: float
    op_floor_limiter: str
    efficiency: float
    #: Host dispatch time of one call (what a timed call adds to expected_s).
    host_dispatch_s: float
    #: True when a timed single call would be dominated by dispatch (expected_s < 2 x host_dispatch_s).
    dispatch_dominated: bool

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("expected_wall_s",)

    @property
    def expected_wall_s(self) -> float:
        """What a wall-clock timing of one call (dispatch included) should read."""
        return self.expected_s + self.host_dispatch_s


@dataclass(frozen=True, kw_only=True)
class KernelAnalysis:
    """Everything the schedule model says about one pallas_call."""

    name: str
    chip: str
    grid: tuple[int, ...]
    dimension_semantics: tuple[str, ...]
    steps: int
    #: TensorCores the grid is split over (2 on megacore chips with a "parallel" dimension).
    cores_used: int
    #: True when an operand stays in HBM (memory_space ANY) and the body copies it itself.
    manual_dma: bool
    num_scalar_prefetch: int
    operands: tuple[OperandTraffic, ...]
    scratch: tuple[ScratchBuffer, ...]
    vmem: VmemUsage
    work: BodyWork
    time: TimeEstimate
    #: The kernel's own pl.CostEstimate (flops, transcendentals, bytes_accessed), if it has one.
    cost_estimate: dict[str, int] | None
    notes: tuple[str, ...]
    #: Per-step arrays (not serialized); None when dropped.
    step_times: "StepTimes | None" = field(default=None, repr=False, compare=False)

    JSON_OMIT: ClassVar[tuple[str, ...]] = ("step_times",)
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("hbm_bytes", "ideal_hbm_bytes")

    @property
    def hbm_bytes(self) -> int:
        """Bytes the kernel moves: pipelined fetches and write-backs plus the body's own DMAs."""
        return sum(o.hbm_bytes for o in self.operands) + int(self.work.manual_dma_bytes)

    @property
    def ideal_hbm_bytes(self) -> int:
        """Each byte once: pipelined operands' distinct blocks; operands left in HBM count what the
        body's DMAs move, at most their whole arrays (the model cannot tell which parts they touch)."""
        w = self.work
        return ideal_bytes(self.operands, w.manual_dma_read_bytes, "input") + \
            ideal_bytes(self.operands, w.manual_dma_write_bytes, "output")

    @property
    def vmem_bytes(self) -> int:
        return self.vmem.total_bytes


def ideal_bytes(operands: "tuple[OperandTraffic, ...] | list[OperandTraffic]", manual_dma_bytes: float,
                role: str | None = None) -> int:
    """Ideal HBM bytes of a kernel's operands (optionally of one role); see KernelAnalysis.ideal_hbm_bytes."""
    ops = [o for o in operands if role is None or o.role == role]
    pipelined = sum(o.ideal_hbm_bytes for o in ops if o.pipelined)
    manual_arrays = sum(o.ideal_hbm_bytes for o in ops if not o.pipelined)
    return int(pipelined + min(manual_arrays, manual_dma_bytes))


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """Per grid step (in traversal order) seconds of each term, for the advisor and plots."""

    compute_s: np.ndarray
    dma_s: np.ndarray
    overhead_s: float
    #: Sum over the units (MXU + VPU + EUP) of each step's busy time: how much work the step has, which the
    #: compiler-backed timing uses to tell heavy steps (all predicated paths run) from light ones.
    work_s: np.ndarray | None = None
    #: TensorCore each step runs on (megacore split), and the seconds before / after the steps per core.
    core: np.ndarray | None = None
    prologue_s: np.ndarray | None = None
    epilogue_s: np.ndarray | None = None
    #: Times each step waits out the DMA latency when its copies are the longer part: 1, or the iterations of
    #: the body's own software pipelines (:attr:`perfmodel.schedule.timing.StepWork.dma_waves`).
    dma_waves: np.ndarray | None = None
    #: MXU seconds of each step at the kernel's achievable MXU rate (the analytic model's).
    mxu_s: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """All pallas_calls of one traced function, in program order."""

    function: str
    chip: str
    kernels: tuple[KernelAnalysis, ...]
    notes: tuple[str, ...] = ()
    #: The XLA ops the function runs around its pallas_calls (perfmodel.schedule.xla_ops.XlaOps); None: not counted.
    xla: Any = None

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("expected_s", "xla_s", "total_s")

    @property
    def expected_s(self) -> float:
        """The pallas_calls' expected time (what the block-size advisor ranks)."""
        return sum(k.time.expected_s for k in self.kernels)

    @property
    def xla_s(self) -> float:
        """The expected time of the XLA ops around the pallas_calls (0 when not counted)."""
        return float(self.xla.expected_s) if self.xla is not None else 0.0

    @property
    def total_s(self) -> float:
        """What a user times: the pallas_calls and the XLA ops around them."""
        return self.expected_s + self.xla_s

    def kernel(self, name: str) -> KernelAnalysis:
        for k in self.kernels:
            if k.name == name:
                return k
        known = ", ".join(k.name for k in self.kernels) or "none"
        raise InputError(f"no pallas_call named '{name}' in {self.function}; kernels: {known}")

    def as_dict(self) -> dict[str, Any]:
        """Plain-JSON form (per-step arrays left out); what `perfmodel analyze --json` prints."""
        return to_jsonable(self)
