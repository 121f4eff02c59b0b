"""The compiler-backed step time (perfmodel.schedule.compiled) from hand-made step times and bundle counts."""

from types import SimpleNamespace

import numpy as np
import pytest

from perfmodel.hw.registry import get_chip
from perfmodel.schedule.compiled import CompiledTimingConstants, compiled_time
from perfmodel.schedule.results import StepTimes

CONSTANTS = CompiledTimingConstants(dma_latency_s=2e-7, stall_factor=1.0, provenance={})


def _kernel(dma_waves):
    steps = StepTimes(compute_s=np.array([1e-7, 1e-7]), dma_s=np.array([1e-6, 1e-6]), overhead_s=0.0,
                      work_s=np.array([1e-7, 1e-7]), core=np.array([0, 0]), prologue_s=np.array([0.0]),
                      epilogue_s=np.array([0.0]), dma_waves=dma_waves)
    return SimpleNamespace(name="k", step_times=steps, time=SimpleNamespace(op_floor_s=0.0, expected_s=0.0))


@pytest.mark.parametrize("waves, per_step_latencies", [(None, 1), (np.array([1.0, 1.0]), 1), (np.array([5.0, 5.0]), 5)])
def test_each_pipeline_iteration_of_a_dma_bound_step_waits_out_the_latency(waves, per_step_latencies):
    chip = get_chip("tpu-v5e")
    compiled = SimpleNamespace(loop=SimpleNamespace(always_bundles=10.0, predicated_bundles=0.0, predicated_max_bundles=0.0))
    t = compiled_time(_kernel(waves), compiled, chip, CONSTANTS)
    # Two DMA-bound steps of 1 µs copies (10 bundles at 1.5 GHz = 6.7 ns of compute) + 200 ns per wave,
    # prologue and epilogue one latency each: 5 waves -> 2 x (1 + 5 x 0.2) + 2 x 0.2 = 4.4 µs.
    assert t.limiter == "dma"
    assert t.expected_s == pytest.approx(2 * (1e-6 + per_step_latencies * 2e-7) + 2 * 2e-7, rel=1e-12)


@pytest.mark.parametrize("chip_name, mxu_floor", [("tpu-v5e", False), ("tpu-7x", True), ("tpu-7x/core", True)])
def test_a_fitted_kernel_mxu_share_bounds_a_steps_compute(chip_name, mxu_floor):
    chip = get_chip(chip_name)
    steps = StepTimes(compute_s=np.array([5e-6]), dma_s=np.array([1e-6]), overhead_s=0.0, work_s=np.array([5e-6]),
                      core=np.array([0]), prologue_s=np.array([0.0]), epilogue_s=np.array([0.0]),
                      mxu_s=np.array([5e-6]))
    kernel = SimpleNamespace(name="k", step_times=steps, time=SimpleNamespace(op_floor_s=0.0, expected_s=5e-6))
    compiled = SimpleNamespace(loop=SimpleNamespace(always_bundles=1000.0, predicated_bundles=0.0, predicated_max_bundles=0.0))
    t = compiled_time(kernel, compiled, chip, CONSTANTS)
    bundles_s = 1000.0 / chip.compute.clock_hz
    # 1,000 bundles (0.53 µs at 7x's 1.9 GHz, 0.67 µs at v5e's 1.5 GHz) against 5 µs of MXU work at the
    # kernel share: only a chip whose Pallas MXU share was fitted on measurements (efficiency.yaml
    # pallas_kernel_shares.mxu: TPU7x) takes the MXU time; the DMA (1 µs + 0.2 µs latency) is shorter either way.
    # TPU7x's steps also add its fitted residual (efficiency.yaml pallas_step_residual_s: 0.24 µs): 5.24 µs.
    step = 5e-6 + 2.4e-7 if mxu_floor else max(bundles_s, 1.2e-6)
    assert t.expected_s == pytest.approx(step + 2 * 2e-7, rel=1e-12)
