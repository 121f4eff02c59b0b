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
    # Units the file does not fit keep ACHIEVABLE: EUP 4.51e12 / 2 x 0.80 = 1.804e12 ops/s.
    assert r.eup_ops_per_s == pytest.approx(1.804e12, rel=1e-3)


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
