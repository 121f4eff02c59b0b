"""Per-chip achievable shares of a Pallas kernel (efficiency.yaml ``pallas_kernel_shares``) in the schedule model's
per-core rates, and the XLA ops around the kernels priced on the one JAX device the function runs on."""

import jax
import jax.numpy as jnp
import pytest

from perfmodel.hw import get_chip
from perfmodel.model import efficiency
from perfmodel.model.core import ACHIEVABLE
from perfmodel.schedule.analyze import analyze
from perfmodel.schedule.timing import core_rates


def test_tpu7x_kernel_rates_use_the_fitted_shares_hand_worked():
    # tpu-7x: 2.307e15 bf16 FLOP/s and 7.37e12 B/s per chip, 2 TensorCores; fitted shares 0.69 (MXU), 0.59 (HBM).
    # Per core: 2.307e15 / 2 x 0.69 = 7.959e14 FLOP/s; 7.37e12 / 2 x 0.59 = 2.174e12 B/s.
    r = core_rates(get_chip("tpu-7x"))
    assert r.mxu_flops_per_s["bf16"] == pytest.approx(7.959e14, rel=1e-3)
    assert r.hbm_bytes_per_s == pytest.approx(2.174e12, rel=1e-3)
    # Units the file does not fit keep ACHIEVABLE: EUP 3.891e12 / 2 x 0.80 = 1.556e12 ops/s.
    assert r.eup_ops_per_s == pytest.approx(1.556e12, rel=1e-3)


def test_one_device_view_prices_a_kernel_like_the_chip():
    # A kernel runs on one TensorCore either way: tpu-7x/core has tpu-7x's per-core rates.
    assert core_rates(get_chip("tpu-7x/core")) == core_rates(get_chip("tpu-7x"))


def test_chips_without_a_fit_keep_the_defaults():
    shares = efficiency.kernel_shares(get_chip("tpu-v5e"))
    assert shares == {u: ACHIEVABLE[u][0] for u in efficiency.KERNEL_UNITS}


@pytest.mark.parametrize("value, match", [
    ({"mxu": 0.7, "ici": 0.5}, "unknown unit.*ici"),
    ({"mxu": 1.3}, r"mxu = 1.3: a share of peak is in \(0, 1\]"),
    ({"hbm": 0}, r"hbm = 0.0: a share of peak"),
])
def test_bad_kernel_shares_are_named(efficiency_table, value, match):
    efficiency_table({"chips": {"chip-x": {"pallas_kernel_shares": value}}})
    with pytest.raises(ValueError, match=f"chips.chip-x.pallas_kernel_shares.*{match}"):
        efficiency.chip_efficiency("chip-x")


def test_xla_ops_run_on_one_jax_device_of_a_split_chip():
    # x * 2 over 64 Mi bf16 elements: 128 MiB read + 128 MiB written = 268,435,456 B.
    # One TPU7x JAX device is one core: 7.37e12 / 2 B/s x its HBM share (tpu-7x/core 0.59) = 2.174e12 B/s,
    # so 268,435,456 / 2.174e12 = 123.5 us, on the whole chip's name as on the one-device view.
    x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    times = [analyze(lambda a: a * 2, x, chip=name).xla_s for name in ("tpu-7x", "tpu-7x/core")]
    assert times[0] == pytest.approx(times[1])
    assert times[0] == pytest.approx(268_435_456 / (7.37e12 / 2 * 0.59), rel=0.02)


def test_xla_ops_of_a_one_device_chip_are_unchanged(v5e):
    # TPU v5e is one device: 268,435,456 B at 8.19e11 B/s x 0.85 = 385.6 us.
    x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    assert analyze(lambda a: a * 2, x, chip=v5e).xla_s == pytest.approx(
        268_435_456 / (v5e.memory.hbm_bw_bytes_per_s_per_chip * 0.85), rel=0.02)


@pytest.mark.parametrize("residual_s", [0.0, 2.4e-7])
def test_the_step_residual_adds_to_every_step_hand_worked(residual_s):
    from dataclasses import replace

    import numpy as np

    from perfmodel.schedule.pipeline import dma_schedule, single_segment
    from perfmodel.schedule.timing import StepWork, pipeline_time

    # 4 steps of 1.592e9 bf16 FLOPs at 7.959e14 FLOP/s = 2.0 µs of MXU work each, no copies: 4 x 2.0 µs = 8 µs,
    # plus 4 x the residual (0.24 µs on TPU7x: 8.96 µs).
    rates = replace(core_rates(get_chip("tpu-7x")), mxu_flops_per_s={"bf16": 7.959e14}, step_residual_s=residual_s)
    seg = single_segment(4)
    dma = dma_schedule(np.zeros(4), np.zeros(4), seg)  # no copies
    work = StepWork(mxu_issued_flops={"bf16": 1.592e9}, vpu_ops=0.0, eup_ops=0.0, manual_dma_bytes=0.0)
    t = pipeline_time(work, dma, seg, rates, 4)
    assert t.expected_s == pytest.approx(4 * (2.0e-6 + residual_s), rel=1e-3)


def test_tpu7x_has_its_fitted_step_residual_and_other_chips_none():
    # efficiency.yaml tpu-7x.pallas_step_residual_s (fitted on the tokamax Pallas fit halves): 0.24 µs
    assert core_rates(get_chip("tpu-7x")).step_residual_s == pytest.approx(2.4e-7)
    assert core_rates(get_chip("tpu-7x/core")).step_residual_s == pytest.approx(2.4e-7)
    assert core_rates(get_chip("tpu-v5e")).step_residual_s == 0.0


@pytest.mark.parametrize("value", [-1e-7, 2e-3])
def test_a_bad_step_residual_is_named(efficiency_table, value):
    efficiency_table({"chips": {"chip-x": {"pallas_step_residual_s": value}}})
    with pytest.raises(ValueError, match=r"chips.chip-x.pallas_step_residual_s = .*seconds per grid step, in \[0, 1e-3\)"):
        efficiency.chip_efficiency("chip-x")


def test_analyze_reports_the_step_residual():
    # An 8192^3 bf16 matmul at the bundled kernel's default blocks on 7x: every step carries the fitted 0.24 µs,
    # and the report says so; v6e has no fitted residual.
    from kernels.matmul import matmul
    from perfmodel.schedule.analysis_render import render_kernel

    x = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    k = analyze(matmul, x, x, chip="tpu-7x").kernels[0]
    assert k.time.step_residual_s == pytest.approx(2.4e-7)
    assert "+ residual 240 ns per step" in render_kernel(k)
    assert analyze(matmul, x, x, chip="tpu-v6e").kernels[0].time.step_residual_s == 0.0
