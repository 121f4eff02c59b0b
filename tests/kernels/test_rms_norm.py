"""Fused residual-add + RMSNorm kernel beyond the shared contract (tests/kernels/test_contract.py: lowering, cost
estimate, tuned defaults, a small default-block call vs the reference): tilings, mixed dtypes and the quantized output
in interpret mode, block sizes and VMEM, input errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.quant import quantize_int8
from kernels.rms_norm import DEFAULT_BLOCK_SIZES, RmsNormBlockSizes, default_block_sizes, rms_norm, rms_norm_reference
from perfmodel.errors import UnknownChipError
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.shapes import parse_shape
from kernels.tuned import load_tuned_file

#: Tolerances by output dtype: bf16 outputs carry one bf16 rounding (2^-8 relative); f32 differs
#: from the reference only by rsqrt vs 1/sqrt and summation order.
TOL = {
    jnp.dtype(jnp.bfloat16): dict(rtol=1e-2, atol=1e-2),
    jnp.dtype(jnp.float32): dict(rtol=1e-5, atol=1e-5),
}
SLOW = pytest.mark.slow


def _inputs(seed: int, tokens: int, hidden: int, dtype, residual_dtype=None):
    kx, kr, kw = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (tokens, hidden), jnp.float32).astype(dtype)
    residual = jax.random.normal(kr, (tokens, hidden), jnp.float32).astype(residual_dtype or dtype)
    weight = jax.random.uniform(kw, (hidden,), jnp.float32, 0.5, 1.5)
    return x, residual, weight


def _assert_close(out: jax.Array, ref: jax.Array) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.isfinite(out32).all()  # fresh interpret-mode buffers start as NaN: catches skipped rows
    np.testing.assert_allclose(out32, ref32, **TOL[jnp.dtype(out.dtype)])


# Aligned (4 blocks of 16) and unaligned tokens and hidden in bf16; f32 on the smallest problem (fewer tokens than
# one block; its bf16 twin, one clamped block, is the contract's small case). The rest: -m slow.
@pytest.mark.parametrize("shape, dtype", [
    pytest.param((64, 256), jnp.bfloat16, id="64x256-bf16"),
    pytest.param((50, 200), jnp.bfloat16, id="50x200-bf16"),
    pytest.param((7, 1000), jnp.float32, id="7x1000-f32"),
    pytest.param((64, 256), jnp.float32, id="64x256-f32", marks=SLOW),
    pytest.param((50, 200), jnp.float32, id="50x200-f32", marks=SLOW),
])
def test_matches_reference(shape, dtype):
    x, residual, weight = _inputs(sum(shape), *shape, dtype)
    out, new_residual = rms_norm(x, residual, weight, block_sizes=RmsNormBlockSizes(block_tokens=16), interpret=True)
    ref_out, ref_residual = rms_norm_reference(x, residual, weight)
    _assert_close(out, ref_out)
    _assert_close(new_residual, ref_residual)


def test_residual_dtype_may_differ_from_x():
    x, residual, weight = _inputs(3, 48, 384, jnp.bfloat16, residual_dtype=jnp.float32)
    out, new_residual = rms_norm(x, residual, weight, eps=1e-5, block_sizes=RmsNormBlockSizes(block_tokens=16),
                                 interpret=True)
    ref_out, ref_residual = rms_norm_reference(x, residual, weight, eps=1e-5)
    assert new_residual.dtype == jnp.float32
    _assert_close(out, ref_out)
    _assert_close(new_residual, ref_residual)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, pytest.param(jnp.float32, marks=SLOW)], ids=["bf16", "f32"])
def test_quantized_output(dtype):
    tokens, hidden = 45, 200
    x, residual, weight = _inputs(4, tokens, hidden, dtype)
    q, scale, new_residual = rms_norm(x, residual, weight, quantize=True,
                                      block_sizes=RmsNormBlockSizes(block_tokens=32), interpret=True)
    ref_q, ref_scale, ref_residual = rms_norm_reference(x, residual, weight, quantize=True)
    assert q.dtype == jnp.int8 and q.shape == (tokens, hidden) and scale.shape == (tokens,)
    np.testing.assert_allclose(np.asarray(scale), np.asarray(ref_scale), rtol=1e-5)
    # Codes may differ by one where out*127/amax sits within rounding error of a .5 boundary.
    assert np.abs(np.asarray(q, np.int32) - np.asarray(ref_q, np.int32)).max() <= 1
    assert np.abs(np.asarray(q)).max() == 127  # each row's absmax maps to +-127
    # Dequantized codes reproduce the float kernel output to half a quantization step (+ one rounding).
    out, _ = rms_norm_reference(x.astype(jnp.float32), residual.astype(jnp.float32), weight)
    dequant = np.asarray(q, np.float32) * np.asarray(scale)[:, None]
    assert (np.abs(dequant - np.asarray(out)) <= 1.01 * np.asarray(scale)[:, None]).all()
    _assert_close(new_residual, ref_residual)


def test_hand_worked_row():
    # x = [1, 2], residual = [2, 2] -> y = [3, 4]; mean(y^2) = (9 + 16) / 2 = 12.5; eps = 0:
    # out = y / sqrt(12.5) * [1, 2] = [0.848528, 2.262742]; the new residual is y itself.
    x = jnp.array([[1.0, 2.0]], jnp.float32)
    residual = jnp.array([[2.0, 2.0]], jnp.float32)
    out, new_residual = rms_norm(x, residual, jnp.array([1.0, 2.0]), eps=0.0, interpret=True)
    np.testing.assert_allclose(np.asarray(out), [[0.8485281, 2.2627417]], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(new_residual), [[3.0, 4.0]])


def test_quantize_int8_hand_worked():
    # amax = 4 -> scale = 4/127; codes = round(x * 127/4) = round([31.75, -63.5, 15.875, 127]) with
    # half-to-even -> [32, -64, 16, 127]. An all-zero row gets scale 0 and codes 0.
    q, scale = quantize_int8(jnp.array([[1.0, -2.0, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0]]))
    np.testing.assert_array_equal(np.asarray(q), [[32, -64, 16, 127], [0, 0, 0, 0]])
    np.testing.assert_allclose(np.asarray(scale)[:, 0], [4 / 127, 0.0], rtol=1e-7)


def test_inside_an_outer_jit():
    x, residual, weight = _inputs(5, 24, 128, jnp.float32)
    out, _ = jax.jit(lambda a, b, c: rms_norm(a, b, c, interpret=True))(x, residual, weight)
    _assert_close(out, rms_norm_reference(x, residual, weight)[0])


# ----- block sizes -----

def test_default_blocks_shrink_to_fit_vmem():
    # hidden 8192, bf16 in, int8 out (quantize). Per block of bt rows:
    # x bt*8192*2, residual in + out 2*bt*8192*2, int8 out bt*8192, weight 8192*4 (one 32-bit row),
    # scales bt*128*4; double-buffered; plus 2.1 f32 temporary tiles bt*8192*4 (v5e, as Mosaic allocates).
    # bt=64: x 1 MiB + residual 2 MiB + out 0.5 MiB + weight 32 KiB + scales 32 KiB = 3.56 MiB,
    # x2 = 7.13 MiB, + 2.1 * 2 MiB = 11.3 MiB <= 16 MiB (Mosaic: 11.1 MiB); bt=128 gives 22.5 MiB > 16 MiB.
    stored = default_block_sizes("tpu-v5e")
    assert stored.block_tokens >= 128  # the tuned default (hidden 4096) is too big for these rows
    fitted = stored.fitted(
        hidden=8192, x_dtype=jnp.bfloat16, residual_dtype=jnp.bfloat16, out_dtype=jnp.int8, quantize=True,
        chip=get_chip("tpu-v5e"),
    )
    assert fitted == RmsNormBlockSizes(block_tokens=64)


def test_a_chip_the_json_lacks_takes_the_reference_chips_blocks():
    # The stored defaults themselves: tests/kernels/test_contract.py. A chip the JSON lacks (e.g. a spec file)
    # takes tpu-v5e's (kernels.tiling.tuned_entry_chip, every kernel's policy); the fallback only without it.
    assert default_block_sizes("my-chip.yaml") == default_block_sizes("tpu-v5e")


@pytest.mark.parametrize("chip_name", sorted(DEFAULT_BLOCK_SIZES))
def test_stored_defaults_fit_the_default_scoped_vmem_at_the_tuned_shape(chip_name):
    data = load_tuned_file("rms_norm")
    hidden = parse_shape(data["shapes"]["bf16"][0]).shape[1]
    blocks = DEFAULT_BLOCK_SIZES[chip_name]
    dtypes = dict(hidden=hidden, x_dtype=jnp.bfloat16, residual_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16,
                  quantize=False)
    limit = blocks.check(**dtypes, chip=get_chip(chip_name))
    assert limit == data["defaults"][chip_name]["bf16"]["vmem_limit_bytes"]  # None: no raised limit needed
    # Fitting to the shape it was tuned on changes nothing.
    assert blocks.fitted(**dtypes, chip=get_chip(chip_name)) == blocks


def test_block_sizes_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        RmsNormBlockSizes(64)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RmsNormBlockSizes(block_tokens=64).block_tokens = 8  # type: ignore[misc]


@pytest.mark.parametrize("chip_name", sorted(DEFAULT_BLOCK_SIZES))
def test_default_table_entries_fit_each_chip(chip_name):
    try:
        chip = get_chip(chip_name)
    except UnknownChipError:
        pytest.skip(f"no spec for {chip_name} yet")
    blocks = DEFAULT_BLOCK_SIZES[chip_name]
    # A typical hidden size fits without shrinking below one bf16 tile, and the fitted block passes the checks.
    fitted = blocks.fitted(hidden=4096, x_dtype=jnp.bfloat16, residual_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16,
                           quantize=False, chip=chip)
    fitted.check(hidden=4096, x_dtype=jnp.bfloat16, residual_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16,
                 quantize=False, chip=chip)


# ----- bad input -----

@pytest.mark.parametrize(
    "case, match",
    [
        ("x_1d", r"x: expected a 2-D \[tokens, hidden\] array"),
        ("residual_shape", r"residual: shape \(16, 64\) must equal x's \(16, 128\)"),
        ("weight_shape", r"weight: expected shape \(128,\)"),
        ("x_int8", r"x: dtype int8 not supported"),
        ("eps", r"eps=-1.0 must be a non-negative float"),
        ("block_not_8", r"block_sizes.block_tokens=12 must be a multiple of 8"),
        ("block_bf16", r"block_sizes.block_tokens=8 must be a multiple of 16"),
        ("block_int8_out", r"block_sizes.block_tokens=16 must be a multiple of 32"),
        ("vmem", r"block_sizes \(block_tokens=65536\) need .* of VMEM but tpu-v5e has 128 MiB per core; use smaller"),
        ("block_type", r"block_sizes: expected a RmsNormBlockSizes, got int"),
        ("unknown_chip", r"unknown chip 'tpu-v99'"),
    ],
)
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_input_raises_value_error_naming_it(case, match):
    x = jnp.ones((16, 128), jnp.bfloat16)
    w = jnp.ones((128,), jnp.float32)
    calls = {
        "x_1d": lambda: rms_norm(jnp.ones((128,), jnp.bfloat16), x, w),
        "residual_shape": lambda: rms_norm(x, jnp.ones((16, 64), jnp.bfloat16), w),
        "weight_shape": lambda: rms_norm(x, x, jnp.ones((64,), jnp.float32)),
        "x_int8": lambda: rms_norm(x.astype(jnp.int8), x, w),
        "eps": lambda: rms_norm(x, x, w, eps=-1.0),
        "block_not_8": lambda: rms_norm(x, x, w, block_sizes=RmsNormBlockSizes(block_tokens=12)),
        "block_bf16": lambda: rms_norm(x, x, w, block_sizes=RmsNormBlockSizes(block_tokens=8)),
        "block_int8_out": lambda: rms_norm(x, x, w, quantize=True, block_sizes=RmsNormBlockSizes(block_tokens=16)),
        "vmem": lambda: rms_norm(jnp.ones((16, 8192), jnp.bfloat16), jnp.ones((16, 8192), jnp.bfloat16),
                                 jnp.ones((8192,)), block_sizes=RmsNormBlockSizes(block_tokens=65536)),
        "block_type": lambda: rms_norm(x, x, w, block_sizes=64),
        "unknown_chip": lambda: rms_norm(x, x, w, chip="tpu-v99"),
    }
    with pytest.raises(ValueError, match=match):
        calls[case]()


# ----- larger cases (pytest -m slow) -----

@pytest.mark.slow
@pytest.mark.parametrize("quantize", [False, True], ids=["bf16-out", "int8-out"])
def test_default_blocks_at_a_larger_shape(quantize):
    x, residual, weight = _inputs(12, 1000, 4096, jnp.bfloat16)
    outs = rms_norm(x, residual, weight, quantize=quantize, interpret=True)
    refs = rms_norm_reference(x, residual, weight, quantize=quantize)
    _assert_close(outs[-1], refs[-1])
    if quantize:
        assert np.abs(np.asarray(outs[0], np.int32) - np.asarray(refs[0], np.int32)).max() <= 1
        np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(refs[1]), rtol=1e-5)
    else:
        _assert_close(outs[0], refs[0])
