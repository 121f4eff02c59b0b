"""Expected time of a pipelined Pallas grid.

Per TensorCore: prologue (its first step's block fetches, not overlapped) +
the sum over its steps of max(step compute, step DMA + DMA latency, per-step overhead) + step residual +
epilogue (its last step's write-backs). The residual is the chip's fitted
``pallas_step_residual_s`` (:func:`perfmodel.model.efficiency.step_residual_s`; 0 where not fitted): what a
step adds that overlaps neither its compute nor its copies. Step compute is the largest of the
MXU, VPU and EUP times (the units issue in parallel from one VLIW bundle);
step DMA moves the next step's fetches and the previous step's write-backs
plus any manual copies the body starts. Rates are per core (chip peak /
cores per chip) scaled by the achievable shares of a Pallas kernel on the chip
(:func:`perfmodel.model.efficiency.kernel_shares`: fitted per chip where measured, else
:data:`perfmodel.model.core.ACHIEVABLE`); the per-step overhead is the chip's
``overheads.pallas_grid_step_overhead_s`` and the DMA latency its ``overheads.dma_latency_s`` (the
compiler-backed timing, :mod:`perfmodel.schedule.compiled`, adds the same latency to the same steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.hw.spec import ChipSpec
from perfmodel.schedule.pipeline import DmaSchedule, Segments


@dataclass(frozen=True, kw_only=True)
class HostDispatch:
    """Host-side cost of launching one jitted call (Python dispatch + runtime), in seconds."""

    seconds: float
    source: str


#: Derived from the JAX Pallas TPU matmul guide's own TPU v5e measurements:
#: jnp.matmul at 1024^3 bf16 took 0.11943 ms (timeit mean incl. dispatch)
#: while its roofline floor is 2*1024^3 / 197 TFLOP/s = 10.9 us, leaving
#: ~108.5 us that no device-side model explains. Pallas points of the same
#: guide are then checked against expected_s (tests/schedule/test_calibration.py).
DEFAULT_HOST_DISPATCH = HostDispatch(
    seconds=1.085e-4,
    source="JAX Pallas TPU matmul guide (docs.jax.dev/en/latest/pallas/tpu/matmul.html), TPU v5e: "
           "jnp.matmul 1024^3 bf16 0.11943 ms measured minus its 10.9 us roofline floor",
)

#: A call is dispatch-dominated when its device time is below this many host dispatch times.
DISPATCH_DOMINATED_RATIO = 2.0


@dataclass(frozen=True, kw_only=True)
class StepWork:
    """Work at every grid step (``(n,)`` arrays or scalars broadcast to n)."""

    #: MXU rate key -> issued FLOPs per step.
    mxu_issued_flops: dict[str, Any]
    vpu_ops: Any
    eup_ops: Any
    manual_dma_bytes: Any
    #: Iterations of the body's own software pipelines per step (loops that start and wait on DMAs): each
    #: waits out the DMA latency when its copies are the longer part. 0: none (the step is one wave).
    dma_waves: Any = 0.0


@dataclass(frozen=True, kw_only=True)
class CoreRates:
    """Achievable per-core rates used for the expected time."""

    mxu_flops_per_s: dict[str, float]
    vpu_ops_per_s: float
    eup_ops_per_s: float
    hbm_bytes_per_s: float
    step_overhead_s: float
    #: Issue-to-completion latency a step that copies anything adds to its copies' transfer time.
    dma_latency_s: float = 0.0
    #: Seconds every step adds after the longest of its compute, copies and overhead (fitted per chip:
    #: :func:`perfmodel.model.efficiency.step_residual_s`).
    step_residual_s: float = 0.0


def core_rates(chip: ChipSpec) -> CoreRates:
    """Chip peaks split per TensorCore and scaled by the achievable shares of a Pallas kernel on this chip
    (:func:`perfmodel.model.efficiency.kernel_shares`: fitted where measured, else ACHIEVABLE)."""
    from perfmodel.model.efficiency import kernel_shares, step_residual_s

    cores = chip.cores.cores_per_chip
    eff = kernel_shares(chip)
    return CoreRates(
        mxu_flops_per_s={k: v / cores * eff["mxu"] for k, v in chip.compute.matmul_flops_per_s_per_chip.items()},
        vpu_ops_per_s=chip.compute.vpu_flops_per_s_per_chip / cores * eff["vpu"],
        eup_ops_per_s=chip.compute.eup_ops_per_s_per_chip / cores * eff["eup"],
        hbm_bytes_per_s=chip.memory.hbm_bw_bytes_per_s_per_chip / cores * eff["hbm"],
        step_overhead_s=chip.overheads.pallas_grid_step_overhead_s or 0.0,
        dma_latency_s=chip.overheads.dma_latency_s or 0.0,
        step_residual_s=step_residual_s(chip),
    )


@dataclass(frozen=True, kw_only=True)
class PipelineTime:
    """Raw result of :func:`pipeline_time`."""

    expected_s: float
    #: Per core.
    prologue_s: np.ndarray
    steps_s: np.ndarray
    epilogue_s: np.ndarray
    compute_s: np.ndarray
    dma_s: np.ndarray
    #: Per step, MXU + VPU + EUP seconds (the units' sum, not their max).
    work_s: np.ndarray
    overhead_s: float
    #: Seconds every step adds after its max (CoreRates.step_residual_s).
    residual_s: float
    #: Per step, times the step waits out the DMA latency when DMA-bound (>= 1).
    dma_waves: np.ndarray
    #: Per step, MXU seconds at the achievable rate.
    mxu_s: np.ndarray
    #: Index (into per-core arrays) of the slowest core.
    slowest_core: int
    steps_limited_by: dict[str, int]


def pipeline_time(work: StepWork, dma: DmaSchedule, seg: Segments, rates: CoreRates, n: int,
                  extra_prologue_bytes: float = 0.0, mult: np.ndarray | None = None) -> PipelineTime:
    """Expected seconds of the grid: slowest core's prologue + sum of per-step maxima + epilogue.

    ``mult``: how many steps of the full grid each of the ``n`` steps stands for (a periodic grid evaluated
    on representative periods, :class:`perfmodel.schedule.pipeline.Traversal`); the per-step arrays stay
    those of the ``n`` steps."""
    mxu = np.zeros(n)
    for key, flops in work.mxu_issued_flops.items():
        mxu = mxu + np.broadcast_to(np.asarray(flops, dtype=float), (n,)) / rates.mxu_flops_per_s[key]
    vpu = np.broadcast_to(np.asarray(work.vpu_ops, dtype=float), (n,)) / rates.vpu_ops_per_s
    eup = np.broadcast_to(np.asarray(work.eup_ops, dtype=float), (n,)) / rates.eup_ops_per_s
    compute = np.maximum(np.maximum(mxu, vpu), eup)
    manual = np.broadcast_to(np.asarray(work.manual_dma_bytes, dtype=float), (n,))
    dma_s = (dma.overlapped_bytes + manual) / rates.hbm_bytes_per_s
    overhead = rates.step_overhead_s
    # Double buffering issues step i+1's copies when step i starts and waits for them when step i+1 does: when
    # the copies are the longer part, each step also waits out their issue-to-completion latency, and so does
    # each iteration of a pipeline the body runs itself (emit_pipeline: all its copies are manual DMAs).
    waves = np.maximum(np.broadcast_to(np.asarray(work.dma_waves, dtype=float), (n,)), 1.0)
    dma_step = np.where(dma_s > 0, dma_s + rates.dma_latency_s * waves, 0.0)
    stacked = np.stack([compute, dma_step, np.full(n, overhead)])
    step = stacked.max(axis=0) + rates.step_residual_s
    which = stacked.argmax(axis=0)
    per_core_steps = np.bincount(seg.core, weights=step if mult is None else step * mult, minlength=seg.cores)
    prologue = (dma.prologue_bytes + extra_prologue_bytes) / rates.hbm_bytes_per_s
    epilogue = dma.epilogue_bytes / rates.hbm_bytes_per_s
    total = prologue + per_core_steps + epilogue
    slowest = int(np.argmax(total))
    counts = np.bincount(which, minlength=3) if mult is None else \
        np.rint(np.bincount(which, weights=mult, minlength=3)).astype(np.int64)
    return PipelineTime(
        expected_s=float(total[slowest]),
        prologue_s=prologue,
        steps_s=per_core_steps,
        epilogue_s=epilogue,
        compute_s=compute,
        dma_s=dma_s,
        work_s=mxu + vpu + eup,
        dma_waves=waves,
        mxu_s=mxu,
        overhead_s=overhead,
        residual_s=rates.step_residual_s,
        slowest_core=slowest,
        steps_limited_by={"compute": int(counts[0]), "dma": int(counts[1]), "overhead": int(counts[2])},
    )
