"""Compiler-backed expected time of a pallas_call: the analytic schedule with its step compute taken from the
TPU compiler's VLIW schedule instead of peak rates and a fixed per-step constant.

Per grid step i (on its TensorCore):

* compute_i = stall x bundles_i / clock. bundles_i is the grid-loop body the
  compiler emitted: the bundles every step runs, plus the predicated ones
  (``pl.when`` paths, masked blocks) in proportion to how heavy step i is by
  the analytic model: the lightest step runs only the always-run bundles, the
  heaviest runs all of them (``w_i = (work_i - min) / (max - min)``; 1 when all
  steps do the same work). ``stall`` (>= 1) is the share of cycles the static
  schedule does not show (MXU result latency, VMEM bank conflicts).
* dma_i = the analytic DMA time of the step's block copies at the achievable
  HBM rate, plus ``dma_latency_s`` when the step copies anything (a copy's
  issue-to-completion latency, which double buffering cannot hide when the
  step's compute is shorter).
* step_i = max(compute_i, dma_i); expected = prologue + sum + epilogue on the
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
    bundles = loop.always_bundles + loop.predicated_bundles * share
    compute = c.stall_factor * bundles / clock
    dma = np.asarray(st.dma_s, dtype=float)
    dma = np.where(dma > 0, dma + c.dma_latency_s, 0.0)
    stacked = np.stack([compute, dma])
    step = stacked.max(axis=0)
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
