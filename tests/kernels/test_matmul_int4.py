"""The matmul's packed int4 weights (w_dtype="int4") in interpret mode against matmul_reference, on the bf16 path
and on the int8 one (w4a8: quantize_activations), the packing helper's nibble order, input errors, and the op model's
int4 weight bytes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.matmul import MatmulBlockSizes, matmul, matmul_reference
from kernels.quant import pack_int4, quantize_int4, unpack_int4

#: bf16 output; the unpacked codes are exact in bf16, blockwise scales are folded into the bf16 tile (one more
#: rounding per weight, rel 2^-9), per-channel ones applied in f32: the usual bf16 tolerance.
TOL = dict(rtol=1.6e-2, atol=1.6e-2)
SMALL = MatmulBlockSizes(bm=32, bk=256, bn=128)


def _weights(seed: int, k: int, n: int, blockwise: bool) -> tuple[jax.Array, jax.Array]:
    """(packed codes, scales): per channel [N] or per 128 rows of K [cdiv(K, 128), N]."""
    w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / np.sqrt(k)
    if not blockwise:
        q, s = quantize_int4(w, axis=0)
        return pack_int4(q), s[0]
    groups = -(-k // 128)
    padded = jnp.pad(w, ((0, groups * 128 - k), (0, 0))).reshape(groups, 128, n)
    q, s = quantize_int4(padded, axis=1)
    return pack_int4(q.reshape(groups * 128, n)[:k]), s[:, 0, :]


def test_pack_int4_nibble_order():
    # Rows 0 and 1 share byte row 0: low nibble row 0 (-1 -> 0xF), high nibble row 1 (3 -> 0x3): 0x3F = 63.
    # Rows 2 (-8 -> 0x8) and 3 (7 -> 0x7) share byte row 1: 0x78 = 120. Row 128 goes to byte row 64's low nibble.
    codes = jnp.zeros((256, 1), jnp.int32).at[0, 0].set(-1).at[1, 0].set(3).at[2, 0].set(-8).at[3, 0].set(7)
    packed = pack_int4(codes.at[128, 0].set(5))
    assert packed.shape == (128, 1) and packed.dtype == jnp.uint8
    assert (int(packed[0, 0]), int(packed[1, 0]), int(packed[64, 0])) == (63, 120, 5)
    # K = 300 pads to 512 rows: 256 byte rows; unpacking gives the codes back.
    c = jnp.asarray(np.random.RandomState(0).randint(-8, 8, (300, 3)))
    assert pack_int4(c).shape == (256, 3) and bool((unpack_int4(pack_int4(c), 300) == c).all())


@pytest.mark.parametrize("shape", [pytest.param((64, 512, 256), id="64x512x256"),
                                   pytest.param((40, 300, 200), id="40x300x200")])
@pytest.mark.parametrize("blockwise", [False, True], ids=["per-channel", "blockwise"])
def test_int4_weights_match_the_reference(shape, blockwise):
    m, k, n = shape
    x = jax.random.normal(jax.random.key(1), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(2, k, n, blockwise)
    out = matmul(x, wp, w_scale=s, w_dtype="int4", activation="silu", block_sizes=SMALL, interpret=True)
    ref = matmul_reference(x, wp, w_scale=s, w_dtype="int4", activation="silu")
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.isfinite(out32).all()
    np.testing.assert_allclose(out32, ref32, **TOL)


def test_int4_blockwise_scales_in_bf16_on_chips_with_bf16_scaling():
    # tpu-v6e multiplies blockwise scales in bf16 (plan.scales_in_bf16: its spec's compiler.vpu_bf16_arithmetic):
    # one more bf16 rounding of each scale (rel 2^-9) than tpu-v5e's f32 product; both stay within the bf16
    # tolerance of the reference, and the two differ (the bf16 path is taken).
    from kernels.matmul.plan import scales_in_bf16
    from perfmodel.hw.registry import get_chip

    assert scales_in_bf16(get_chip("tpu-v6e")) and not scales_in_bf16(get_chip("tpu-v5e"))
    m, k, n = 48, 512, 256
    x = jax.random.normal(jax.random.key(7), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(8, k, n, True)
    s = s * (1 + jax.random.uniform(jax.random.key(9), s.shape) / 100)  # scales not exact in bf16
    ref = np.asarray(matmul_reference(x, wp, w_scale=s, w_dtype="int4").astype(jnp.float32))
    outs = {chip: np.asarray(matmul(x, wp, w_scale=s, w_dtype="int4", block_sizes=SMALL, chip=chip,
                                    interpret=True).astype(jnp.float32)) for chip in ("tpu-v5e", "tpu-v6e")}
    for out in outs.values():
        np.testing.assert_allclose(out, ref, **TOL)
    assert not np.array_equal(outs["tpu-v5e"], outs["tpu-v6e"])


@pytest.mark.parametrize("blockwise", [False, True], ids=["per-channel", "blockwise"])
def test_int4_unpacked_in_a_loop_when_the_tile_is_large(monkeypatch, blockwise):
    from kernels.matmul import body as body_module

    # INT4_INLINE_MAX_UNITS = 0: every tile takes the looped unpacking (_unpack_int4_tile) instead of the unrolled
    # per-chunk one. M = 24, K = 520 (three bk = 256 K blocks, the last 8 columns valid), N = 136 (a second,
    # 8-column block): shapes no other test traces, so no cached trace of the unrolled path is reused.
    monkeypatch.setattr(body_module, "INT4_INLINE_MAX_UNITS", 0)
    m, k, n = 24, 520, 136
    x = jax.random.normal(jax.random.key(5), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(6, k, n, blockwise)
    out = matmul(x, wp, w_scale=s, w_dtype="int4", block_sizes=SMALL, interpret=True)
    ref = matmul_reference(x, wp, w_scale=s, w_dtype="int4")
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)), **TOL)


def test_int4_at_large_bm_with_two_k_blocks():
    # bm = 256, bk = 256: K = 600 -> three K blocks (the last 88 columns valid), packed rows 384 (K padded to 768).
    m, k, n = 136, 600, 128
    x = jax.random.normal(jax.random.key(3), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(4, k, n, True)
    out = matmul(x, wp, w_scale=s, w_dtype="int4", block_sizes=MatmulBlockSizes(bm=256, bk=256, bn=128),
                 interpret=True)
    ref = matmul_reference(x, wp, w_scale=s, w_dtype="int4")
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)), **TOL)


#: w4a8 (quantize_activations with int4 weights): exact int32 sums of the int8 x codes and int4 w codes, scales in
#: f32, bf16 out.
W4A8_TOL = dict(rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("shape, blocks", [
    pytest.param((64, 512, 256), SMALL, id="64x512x256"),
    pytest.param((40, 300, 200), SMALL, id="40x300x200-unaligned"),
    pytest.param((96, 1100, 136), MatmulBlockSizes(bm=32, bk=512, bn=128), id="96x1100x136-3-k-blocks"),
])
@pytest.mark.parametrize("blockwise", [False, True], ids=["per-channel", "blockwise"])
def test_w4a8_int4_weights_on_the_int8_path_match_the_reference(shape, blocks, blockwise):
    m, k, n = shape
    x = jax.random.normal(jax.random.key(11), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(12, k, n, blockwise)
    bias = jax.random.normal(jax.random.key(13), (n,), jnp.float32)
    out = matmul(x, wp, w_scale=s, bias=bias, w_dtype="int4", quantize_activations=True, block_sizes=blocks,
                 interpret=True)
    ref = matmul_reference(x, wp, w_scale=s, bias=bias, w_dtype="int4", quantize_activations=True)
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)),
                               **W4A8_TOL)


def test_w4a8_hand_worked():
    # x = [127, -63.5]: max |x| = 127, scale 1, codes [127, -64] (round half to even); w codes [3, -2], channel
    # scale 0.5: (127 * 3 + (-64) * (-2)) * 1 * 0.5 = (381 + 128) / 2 = 254.5 (f32 out, exact).
    x = jnp.zeros((16, 2), jnp.bfloat16).at[0].set(jnp.array([127.0, -63.5], jnp.bfloat16))
    wp = pack_int4(jnp.array([[3], [-2]], jnp.int32))
    out = matmul(x, wp, w_scale=jnp.array([0.5], jnp.float32), w_dtype="int4", quantize_activations=True,
                 out_dtype=jnp.float32, interpret=True)
    assert float(out[0, 0]) == 254.5 and float(jnp.abs(out[1:]).max()) == 0.0


@pytest.mark.parametrize("case, match", [
    ("shape", r"w: w_dtype='int4' takes two codes per byte.*\[256, N\].*pack_int4"),
    ("no-scale", r"w_scale: int4 weights need scales"),
    ("quantize_activations-v4", r"quantize_activations: tpu-v4 has no int8 x int8 MXU path"),
    ("bk", r"block_sizes: bk=128 must be a multiple of 256"),
    ("w_dtype", r"w_dtype='int2' is not known"),
])
def test_bad_int4_input_names_it(case, match):
    x = jnp.zeros((16, 300), jnp.bfloat16)
    w = jnp.zeros((256, 128), jnp.uint8)
    s = jnp.ones((128,), jnp.float32)
    kwargs = dict(w_scale=s, w_dtype="int4", interpret=True)
    if case == "shape":
        w = jnp.zeros((150, 128), jnp.uint8)
    elif case == "no-scale":
        kwargs.pop("w_scale")
    elif case == "quantize_activations-v4":  # int4 weights go to the int8 MXU with quantize_activations; v4 has none
        kwargs.update(quantize_activations=True, chip="tpu-v4")
    elif case == "bk":
        kwargs["block_sizes"] = MatmulBlockSizes(bm=16, bk=128, bn=128)
    elif case == "w_dtype":
        kwargs["w_dtype"] = "int2"
    with pytest.raises(ValueError, match=match):
        matmul(x, w, **kwargs)


def test_op_model_int4_weight_bytes_are_half_of_int8():
    from perfmodel.model.gemm import gemm

    # M = 64, K = N = 4096: bf16 x 64*4096*2 = 524288 B; weights int8 16 MiB vs int4 8 MiB; scales 4096*4 B.
    i8 = gemm(m=64, n=4096, k=4096, rhs_dtype="int8", chip=None)
    i4 = gemm(m=64, n=4096, k=4096, rhs_dtype="int4", chip=None)
    assert i8.hbm_read_bytes == 524288 + 4096 * 4096 + 4096 * 4
    assert i4.hbm_read_bytes == 524288 + 4096 * 4096 // 2 + 4096 * 4


def test_split_int8_codes_hand_worked():
    from kernels.quant import int8_scale, split_int8_codes

    # x = [1.0, -0.3]: max|x| = 1, inv = 127. x * inv = [127, -38.1]: hi = [127, -38]; the remainders [0, -0.1]
    # times 254 round to lo = [0, -25]. Back: (-38 - 25/254) / 127 = -0.2999875..., within
    # 1 / (2 * 254 * 127) = 1.55e-5 of -0.3.
    x = jnp.array([[1.0, -0.3]], jnp.float32)
    inv, scale = int8_scale(jnp.max(jnp.abs(x), axis=1, keepdims=True))
    hi, lo = split_int8_codes(x, inv, 254)
    assert hi.dtype == lo.dtype == jnp.int8
    assert hi.tolist() == [[127, -38]] and lo.tolist() == [[0, -25]]
    back = (hi.astype(jnp.float32) + lo.astype(jnp.float32) / 254) * scale
    np.testing.assert_allclose(np.asarray(back), [[1.0, -0.3]], atol=1 / (2 * 254 * 127))


#: (M, K, N, chip, blockwise) of bf16 x int4 at decode on the int8 MXU (two code planes of x as rows): K = 300
#: (one masked K step at bk = 512), N = 200 (two column blocks at bn = 128); v5p: two TensorCores, each column
#: block quantizing the row; M = 8 pads the 32-row code group.
SPLIT_CASES = [
    pytest.param((64, 300, 200, "tpu-v5e", False), id="v5e-per-channel"),
    pytest.param((40, 300, 200, "tpu-v5e", True), id="v5e-blockwise"),
    pytest.param((8, 300, 200, "tpu-v5p", False), id="v5p-8-rows"),
    pytest.param((64, 700, 256, "tpu-v6e", False), id="v6e-two-k-blocks"),
]


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_bf16_x_int4_at_decode_on_the_int8_mxu(case):
    m, k, n, chip, blockwise = case
    # Rows of very different magnitudes: a per-token scale applied to the wrong rows shows.
    x = (jax.random.normal(jax.random.key(3), (m, k), jnp.float32)
         * jnp.linspace(0.05, 5.0, m)[:, None]).astype(jnp.bfloat16)
    wp, s = _weights(4, k, n, blockwise)
    bk = 256 if k <= 300 else 512
    out = matmul(x, wp, w_scale=s, w_dtype="int4", block_sizes=MatmulBlockSizes(bm=64, bk=bk, bn=128), chip=chip,
                 interpret=True)
    ref = matmul_reference(x, wp, w_scale=s, w_dtype="int4")
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.isfinite(out32).all()
    # x = s (hi + lo / 254) within max|x| / 64516 per element: far under the bf16 output's rounding.
    np.testing.assert_allclose(out32, ref32, **TOL)


def test_bf16_x_int4_at_decode_keeps_the_bf16_path_for_a_16_row_block():
    # bm = 16 is not a whole 32-row group of int8 codes: the call runs the bf16 MXU path (no error about codes the
    # caller never asked for) and still matches the reference.
    m, k, n = 40, 300, 200
    x = jax.random.normal(jax.random.key(5), (m, k), jnp.float32).astype(jnp.bfloat16)
    wp, s = _weights(6, k, n, False)
    out = matmul(x, wp, w_scale=s, w_dtype="int4", block_sizes=MatmulBlockSizes(bm=16, bk=256, bn=128),
                 chip="tpu-v5e", interpret=True)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)),
                               np.asarray(matmul_reference(x, wp, w_scale=s, w_dtype="int4").astype(jnp.float32)),
                               **TOL)


def test_int4_decode_on_int8_mxu_rule():
    from kernels import tiling
    from kernels.matmul.rules import SPLIT_X_MAX_ROWS, int4_decode_on_int8_mxu as rule

    kw = dict(lhs_dtype="bf16", rhs_dtype="int4", out_dtype="bf16")
    v4, v5e, v6e, v7 = (tiling.tpu_chip(c) for c in ("tpu-v4", "tpu-v5e", "tpu-v6e", "tpu-7x"))
    # Chips with an int8 MXU faster than bf16, up to 64 rows, bf16 in and out, int4 weights.
    assert rule(v5e, SPLIT_X_MAX_ROWS, **kw) and rule(v6e, 1, **kw) and rule(v5e, 64, blockwise=True, **kw)
    assert not rule(v5e, SPLIT_X_MAX_ROWS + 1, **kw)
    # v4 (int8 at the bf16 rate) and 7x (no int8 rate); an f32 output; int8 weights; blockwise on v6e's 256-deep
    # MXU (a 128-row group's partial product half fills it).
    assert not rule(v4, 64, **kw) and not rule(v7, 64, **kw) and not rule(None, 64, **kw)
    assert not rule(v5e, 64, lhs_dtype="bf16", rhs_dtype="int4", out_dtype="fp32")
    assert not rule(v5e, 64, lhs_dtype="bf16", rhs_dtype="int8", out_dtype="bf16")
    assert not rule(v6e, 64, blockwise=True, **kw)


def test_op_model_runs_int4_decode_on_the_int8_mxu():
    from perfmodel.hw.registry import get_chip
    from perfmodel.model.gemm import gemm

    v5e = get_chip("tpu-v5e")
    # 64 rows: two planes of 64 rows on the int8 MXU, 2 x 2 x 64 x 4096 x 14336 issued; 65 rows: the bf16 MXU.
    dec = gemm(m=64, n=14336, k=4096, rhs_dtype="int4", chip=v5e)
    big = gemm(m=65, n=14336, k=4096, rhs_dtype="int4", chip=v5e)
    assert dec.mxu_dtype == "int8" and dec.mxu_flops == 2 * 2 * 64 * 4096 * 14336
    assert big.mxu_dtype == "bf16" and any("two int8 code planes" in n for n in dec.notes)
    # The same bytes either way: bf16 activations, int4 weights and their scales.
    assert dec.hbm_read_bytes == 64 * 4096 * 2 + 4096 * 14336 / 2 + 14336 * 4
