"""Compiler-backed expected time of a pallas_call: the analytic schedule with its step compute taken from the
TPU compiler's VLIW schedule instead of peak rates and a fixed per-step constant.

Per grid step i (on its TensorCore):

* compute_i = stall x bundles_i / clock. bundles_i is the grid-loop body the
  compiler emitted: the bundles every step runs, plus the predicated ones
  (``pl.when`` paths, masked blocks) in proportion to how heavy step i is by
  the analytic model: the lightest step runs only the always-run bundles, the
  heaviest runs the most one step can (``LoopStats.predicated_max_bundles``:
  a masked and an unmasked path whose branch conditions exclude each other
  count once) (``w_i = (work_i - min) / (max - min)``; 1 when all steps do the
  same work). ``stall`` (>= 1) is the share of cycles the static
  schedule does not show (MXU result latency, VMEM bank conflicts). Where
  the chip has a fitted Pallas-kernel MXU share (``efficiency.yaml``
  ``pallas_kernel_shares.mxu``: TPU7x), compute_i is at least the step's MXU
  work at that share: a bundle issues MXU pushes, the share says how fast
  the MXU drains them (tokamax's MXU-bound kernels on 7x ran 1.22-1.40x
  slower than their bundles at the clock).
* dma_i = the analytic DMA time of the step's block copies at the achievable
  HBM rate, plus ``dma_latency_s`` when the step copies anything (a copy's
  issue-to-completion latency, which double buffering cannot hide when the
  step's compute is shorter), once per iteration of a software pipeline the
  body runs itself (``StepTimes.dma_waves``).
* step_i = max(compute_i, dma_i) + the chip's fitted step residual
  (``efficiency.yaml`` ``pallas_step_residual_s``, as the analytic timing
  adds it; TPU7x); expected = prologue + sum + epilogue on the
  slowest core (prologue and epilogue pay the latency once each), and never
  below the op floor.

``stall`` and ``dma_latency_s`` are fitted on published TPU v5e measurements
(``perfmodel/data/calibration/compiled_timing.json`` says which point fits
which constant; the others are held out). Clock rates are the chip spec's
``compute.clock_hz`` (sourced or marked derived in hwspecs/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.hw.spec import ChipSpec
from perfmodel.model.efficiency import fitted_kernel_shares, step_residual_s


@dataclass(frozen=True, kw_only=True)
class CompiledTimingConstants:
    #: Issue-to-completion latency of a step's block copies, seconds.
    dma_latency_s: float
    #: Cycles per static bundle in a grid-step loop body (>= 1).
    stall_factor: float
    #: Which published point fitted which constant, and which were held out.
    provenance: dict[str, Any]


@lru_cache(maxsize=1)
def default_constants() -> CompiledTimingConstants:
    data = json.loads(resources.files("perfmodel.data").joinpath("calibration/compiled_timing.json").read_text())
    return CompiledTimingConstants(dma_latency_s=float(data["dma_latency_s"]), stall_factor=float(data["stall_factor"]),
                                   provenance=data)


@dataclass(frozen=True, kw_only=True)
class CompiledTime:
    """Compiler-backed expected time of one pallas_call, next to the analytic one."""

    expected_s: float
    analytic_expected_s: float
    clock_hz: float
    #: Mean over the steps of the bundles a step runs (predicated paths weighted) and the seconds of each term.
    mean_step_bundles: float
    mean_step_compute_s: float
    mean_step_dma_s: float
    prologue_s: float
    epilogue_s: float
    steps_limited_by: dict[str, int]
    limiter: str
    #: True when the sum came out under the op floor and was raised to it.
    floored: bool
    efficiency: float


def compiled_time(kernel: Any, compiled: Any, chip: ChipSpec,
                  constants: CompiledTimingConstants | None = None) -> CompiledTime:
    """``kernel``: a KernelAnalysis made with keep_step_times=True; ``compiled``: its KernelCompile."""
    c = constants or default_constants()
    st = kernel.step_times
    if st is None or st.work_s is None:
        raise ValueError("compiled_time needs an analysis made with keep_step_times=True")
    loop = compiled.loop
    if loop is None:
        raise InputError(f"pallas_call {kernel.name}: the compiler's schedule has no readable loop body")
    clock = chip.compute.clock_hz
    if not clock:
        raise InputError(f"--hw {chip.name}: the spec has no compute.clock_hz, so bundles cannot become seconds")
    n = len(st.work_s)
    work = np.asarray(st.work_s, dtype=float)
    lo, hi = (float(work.min()), float(work.max())) if n else (0.0, 0.0)
    share = (work - lo) / (hi - lo) if hi > lo * (1 + 1e-9) and hi > 0 else np.ones(n)
    bundles = loop.always_bundles + loop.predicated_max_bundles * share
    compute = c.stall_factor * bundles / clock
    if "mxu" in fitted_kernel_shares(chip) and st.mxu_s is not None:
        # Where a Pallas kernel's sustained MXU share was measured on this chip, a step's MXU work takes at
        # least that long: the static schedule shows the pushes a bundle issues, not how fast the MXU drains.
        compute = np.maximum(compute, np.asarray(st.mxu_s, dtype=float))
    dma = np.asarray(st.dma_s, dtype=float)
    waves = np.ones(n) if st.dma_waves is None else np.asarray(st.dma_waves, dtype=float)
    dma = np.where(dma > 0, dma + c.dma_latency_s * waves, 0.0)
    stacked = np.stack([compute, dma])
    step = stacked.max(axis=0) + step_residual_s(chip)
    which = stacked.argmax(axis=0)
    core = np.asarray(st.core if st.core is not None else np.zeros(n, dtype=int))
    cores = int(core.max()) + 1 if n else 1
    per_core = np.bincount(core, weights=step, minlength=cores)
    pro = np.asarray(st.prologue_s, dtype=float) + c.dma_latency_s
    epi = np.asarray(st.epilogue_s, dtype=float) + c.dma_latency_s
    total = pro + per_core + epi
    slow = int(np.argmax(total))
    expected = float(total[slow])
    floor = kernel.time.op_floor_s
    floored = expected < floor
    expected = max(expected, floor)
    counts = np.bincount(which, minlength=2)
    limited = {"compute": int(counts[0]), "dma": int(counts[1])}
    return CompiledTime(
        expected_s=expected,
        analytic_expected_s=kernel.time.expected_s,
        clock_hz=float(clock),
        mean_step_bundles=float(bundles.mean()) if n else 0.0,
        mean_step_compute_s=float(compute.mean()) if n else 0.0,
        mean_step_dma_s=float(dma.mean()) if n else 0.0,
        prologue_s=float(pro[slow]),
        epilogue_s=float(epi[slow]),
        steps_limited_by=limited,
        limiter=max(limited, key=limited.get),
        floored=floored,
        efficiency=floor / expected if expected > 0 else float("nan"),
    )


@dataclass(frozen=True, kw_only=True)
class CompiledKernel:
    """One pallas_call seen both ways: the analytic schedule model and the TPU compiler."""

    name: str
    #: perfmodel's VMEM estimate and Mosaic's allocation (None when the compiler did not report one).
    vmem_estimate_bytes: int
    vmem_allocated_bytes: int | None
    compile: Any  # KernelCompile
    time: CompiledTime | None
    analytic_expected_s: float
    steps: int

    @property
    def vmem_error(self) -> float | None:
        """Estimate / allocation - 1."""
        a = self.vmem_allocated_bytes
        return None if not a else self.vmem_estimate_bytes / a - 1


def pair(analysis: Any, report: Any, chip: ChipSpec,
         constants: CompiledTimingConstants | None = None) -> tuple[CompiledKernel, ...]:
    """Pair an Analysis (keep_step_times=True) with a CompileReport kernel by kernel, in program order."""
    if not report.compiled:
        return ()
    if len(report.kernels) != len(analysis.kernels):
        raise InputError(f"the compiled program has {len(report.kernels)} Pallas kernels but {len(analysis.kernels)} "
                         "pallas_calls were traced; cannot pair them")
    out = []
    for k, comp in zip(analysis.kernels, report.kernels):
        t = compiled_time(k, comp, chip, constants) if comp.loop is not None and k.step_times is not None else None
        out.append(CompiledKernel(name=k.name, vmem_estimate_bytes=k.vmem.total_bytes,
                                  vmem_allocated_bytes=comp.scoped_vmem_bytes, compile=comp, time=t,
                                  analytic_expected_s=k.time.expected_s, steps=k.steps))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class CompiledCandidate:
    """A tune candidate after the compiler saw it."""

    candidate: Any  # perfmodel.schedule.tune.Candidate
    #: None when Mosaic rejected the candidate (``error`` says why).
    compiled_s: float | None
    vmem_allocated_bytes: int | None
    error: str | None


def rerank_compiled(result: Any, shapes: Any, chip: ChipSpec, *, top: int, extra: Any = None, jobs: int | None = None,
                    progress: Any = None, address: str | None = None) -> tuple[CompiledCandidate, ...]:
    """Compile the ``top`` best candidates of a TuneResult in parallel processes; drop those the compiler
    rejects and rank the rest by the compiler-backed expected time (rejected ones last)."""
    from perfmodel.compiler.api import CompileCall, compile_many
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.catalog import get_entry

    entry = get_entry(result.kernel)
    cands = list(result.ranked[:top])
    calls = [CompileCall(kind="catalog", target=entry.name, shapes=tuple(shapes), blocks=dict(c.blocks),
                         extra=dict(extra or {})) for c in cands]
    reports = compile_many(calls, chip, jobs=jobs, progress=progress, backend="ray" if address else "thread",
                           address=address)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    out = []
    for c, rep in zip(cands, reports):
        if isinstance(rep, Exception):
            out.append(CompiledCandidate(candidate=c, compiled_s=None, vmem_allocated_bytes=None, error=str(rep)))
            continue
        if not rep.compiled:
            out.append(CompiledCandidate(candidate=c, compiled_s=None, vmem_allocated_bytes=None, error=rep.error))
            continue
        a = analyze(entry.make_function(specs, c.blocks, chip, extra=extra), *args, chip=chip, keep_step_times=True)
        views = pair(a, rep, chip)
        times = [v.time.expected_s if v.time else v.analytic_expected_s for v in views]
        vmem = max((v.vmem_allocated_bytes or 0 for v in views), default=0) or None
        out.append(CompiledCandidate(candidate=c, compiled_s=sum(times), vmem_allocated_bytes=vmem, error=None))
    out.sort(key=lambda x: (x.compiled_s is None, x.compiled_s or 0.0))
    return tuple(out)
