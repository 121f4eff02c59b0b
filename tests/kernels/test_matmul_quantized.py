"""The matmul's quantized variants in interpret mode against matmul_reference: int8 x int8 with per-token
activation quantization fused in (quantize_activations), blockwise (one scale per 128 rows of K) int8 / fp8 weights, at
aligned and unaligned shapes; the int8-MXU refusal on chips without one; the op model's dynamic-quantization
terms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.matmul import MatmulBlockSizes, matmul, matmul_reference, quantizes_x_in_bf16
from kernels.quant import quantize_int8

#: assert_allclose tolerances by (output dtype, variant). The int8 x int8 path sums exact integer products
#: in int32 and applies two f32 scales: it differs from the reference only by f32 rounding of the scales and
#: the final bf16 rounding (rel 2^-8). Weight-only blockwise scales are folded into the weights in x's dtype
#: (one more bf16 rounding per weight, rel 2^-9, averaged over K), so bf16 needs the usual 1.6e-2.
TOL = {
    ("bfloat16", "quantize_activations"): dict(rtol=8e-3, atol=8e-3),
    ("bfloat16", "weight_only"): dict(rtol=1.6e-2, atol=1.6e-2),
    ("float32", "quantize_activations"): dict(rtol=1e-5, atol=1e-5),
    ("float32", "weight_only"): dict(rtol=2e-5, atol=2e-5),
}
SMALL = MatmulBlockSizes(bm=32, bk=256, bn=128)
#: (M, K, N): aligned to the blocks; nothing aligned (K = 300: two K blocks, the last 44 columns valid, three
#: scale groups, the last of 44 rows); decode-like one short row block.
SHAPES = [pytest.param((64, 512, 256), id="64x512x256"), pytest.param((40, 300, 200), id="40x300x200"),
          pytest.param((8, 1000, 130), id="8x1000x130")]


def _weights(seed: int, k: int, n: int, blockwise: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(float weights, int8 codes, scales): per channel [N] or per 128 rows of K [cdiv(K, 128), N]."""
    w = jax.random.normal(jax.random.key(seed), (k, n), jnp.float32) / np.sqrt(k)
    if not blockwise:
        q, s = quantize_int8(w, axis=0)
        return w, q, s[0]
    groups = -(-k // 128)
    padded = jnp.pad(w, ((0, groups * 128 - k), (0, 0))).reshape(groups, 128, n)
    q, s = quantize_int8(padded, axis=1)
    return w, q.reshape(groups * 128, n)[:k], s[:, 0, :]


def _x(seed: int, m: int, k: int, dtype) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (m, k), jnp.float32).astype(dtype)


def _check(out: jax.Array, ref: jax.Array, variant: str) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.isfinite(out32).all()  # interpret mode fills unwritten output with NaN
    np.testing.assert_allclose(out32, ref32, **TOL[(jnp.dtype(out.dtype).name, variant)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blockwise", [False, True], ids=["per-channel", "blockwise"])
def test_int8_x_int8_with_per_token_quantization(shape, blockwise):
    m, k, n = shape
    x = _x(1, m, k, jnp.bfloat16)
    _, wq, s = _weights(2, k, n, blockwise)
    bias = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    out = matmul(x, wq, w_scale=s, bias=bias, quantize_activations=True, block_sizes=SMALL, interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s, bias=bias, quantize_activations=True), "quantize_activations")


def test_quantize_x_from_f32_activations():
    x = _x(3, 40, 300, jnp.float32)
    _, wq, s = _weights(4, 300, 200, False)
    out = matmul(x, wq, w_scale=s, quantize_activations=True, block_sizes=MatmulBlockSizes(bm=32, bk=128, bn=128),
                 interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s, quantize_activations=True), "quantize_activations")


def test_quantize_x_is_close_to_the_unquantized_product():
    # Per-token int8 of N(0, 1) activations: each code is off by at most half a step, amax / 254 ~ 1.5%
    # of the row max; over K = 512 terms of weights ~ 1/sqrt(K) the error stays well under 0.1 (outputs O(1)).
    x = _x(5, 64, 512, jnp.bfloat16)
    w, wq, s = _weights(6, 512, 256, False)
    out = matmul(x, wq, w_scale=s, quantize_activations=True, block_sizes=SMALL, interpret=True)
    exact = matmul_reference(x, w.astype(jnp.float32).astype(jnp.bfloat16))
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - exact.astype(jnp.float32)))) < 0.1


def test_hand_worked_int8_x_int8():
    # x = [[1, -2]]: amax 2, scale 2/127, codes round([1, -2] * 63.5) = [64 (63.5 rounds half-even to 64), -127].
    # w codes [[1], [1]] with per-channel scale 0.5: int32 sum 64 - 127 = -63; * 2/127 * 0.5 = -0.49606...
    x = jnp.array([[1.0, -2.0]], jnp.float32)
    w = jnp.array([[1], [1]], jnp.int8)
    out = matmul(x, w, w_scale=jnp.array([0.5]), quantize_activations=True, interpret=True)
    np.testing.assert_allclose(np.asarray(out), [[-63 * (2 / 127) * 0.5]], rtol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_blockwise_int8_weights(shape):
    m, k, n = shape
    x = _x(7, m, k, jnp.bfloat16)
    _, wq, s = _weights(8, k, n, True)
    out = matmul(x, wq, w_scale=s, activation="silu", block_sizes=SMALL, interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s, activation="silu"), "weight_only")


def test_blockwise_int8_weights_dequantized_at_large_bm():
    # bm = 256 > PARTIAL_SCALING_MAX_BM: the w tile is dequantized once per step (not partial sums per group);
    # M = 200 (one partial row block), K = 300 (second K block masked to 44 columns), N = 130 (two column blocks).
    m, k, n = 200, 300, 130
    x = _x(13, m, k, jnp.bfloat16)
    _, wq, s = _weights(14, k, n, True)
    out = matmul(x, wq, w_scale=s, block_sizes=MatmulBlockSizes(bm=256, bk=256, bn=128), interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s), "weight_only")


#: (M, K, N, blocks, chip) for quantize_activations's row groups and K steps:
#: * M = 80 at bm = 96: one row block of three 32-row groups (the last partly past M), quantized at its first
#:   step; K = 300 at bk = 128: a first, a middle and a masked last K step (44 valid columns); N = 200: two
#:   column blocks, the second reading the codes the first step made.
#: * M = 150 at bm = 64: three row blocks (the last 22 rows), each quantized ahead during the previous one's
#:   2 x 3 = 6 steps on single-core tpu-v5e: shares of 1 group (lookahead_share_groups(2, 6)), fetched 32 rows
#:   a step, steps 2-5 keeping share 1; the last row block's second share lies wholly past M and is clamped to
#:   the last share with rows in it (share 4, rows 128-159).
#: * M = 300 at bm = 128, bk = 256: three row blocks of 4 groups over 2 x 2 = 4 steps: 1 group per step, the
#:   last row block's shares 10 and 11 clamped to share 9 (rows 288-319, 12 of them valid).
#: * M = 600 at bm = 256, K = 300 at bk = 512 (one masked K step), N = 300 at bn = 128: three row blocks of
#:   8 groups over 3 steps: cdiv(8, 3) = 3 groups a step rounded up to 4, the smallest divisor of 8 (so shares
#:   tile the row block): 2 shares of 128 rows, step 2 keeping share 1.
#: * the same on tpu-v5p (two TensorCores): no lookahead, each row block quantized at its first step.
#: * M = 40 at bm = 64 on tpu-v5p: one row block, N = 200 at bn = 128: two column blocks run "parallel", each
#:   quantizing the row at its first of the three K steps (quantizes_each_column_block).
ROW_CASES = [
    pytest.param((80, 300, 200, MatmulBlockSizes(bm=96, bk=128, bn=128), "tpu-v5e"), id="one-row-block"),
    pytest.param((150, 300, 200, MatmulBlockSizes(bm=64, bk=128, bn=128), "tpu-v5e"), id="lookahead-1-group"),
    pytest.param((300, 300, 200, MatmulBlockSizes(bm=128, bk=256, bn=128), "tpu-v5e"), id="lookahead-2-groups"),
    pytest.param((600, 300, 300, MatmulBlockSizes(bm=256, bk=512, bn=128), "tpu-v5e"), id="lookahead-3-groups"),
    pytest.param((300, 300, 200, MatmulBlockSizes(bm=128, bk=256, bn=128), "tpu-v5p"), id="megacore"),
    pytest.param((40, 300, 200, MatmulBlockSizes(bm=64, bk=128, bn=128), "tpu-v5p"), id="megacore-each-column-block"),
    # tpu-v6e: codes from a bf16 product (quantizes_x_in_bf16), quantized ahead as on v5e.
    pytest.param((150, 300, 200, MatmulBlockSizes(bm=64, bk=128, bn=128), "tpu-v6e"), id="v6e-lookahead-1-group"),
    pytest.param((300, 300, 200, MatmulBlockSizes(bm=128, bk=256, bn=128), "tpu-v6e"), id="v6e-lookahead-2-groups"),
]


@pytest.mark.parametrize("case", ROW_CASES)
@pytest.mark.parametrize("blockwise", [False, True], ids=["per-channel", "blockwise"])
def test_int8_x_int8_row_groups_and_k_steps(case, blockwise):
    m, k, n, blocks, chip = case
    # Rows of very different magnitudes: a scale written to the wrong rows, slot or row block shows.
    x = _x(15, m, k, jnp.bfloat16) * jnp.linspace(0.1, 10.0, m, dtype=jnp.float32)[:, None].astype(jnp.bfloat16)
    _, wq, s = _weights(16, k, n, blockwise)
    out = matmul(x, wq, w_scale=s, quantize_activations=True, block_sizes=blocks, chip=chip, interpret=True)
    ref = matmul_reference(x, wq, w_scale=s, quantize_activations=True, bf16_codes=quantizes_x_in_bf16(chip, x.dtype))
    _check(out, ref, "quantize_activations")


def test_codes_from_a_bf16_product_on_bf16_vpus():
    """v6e's codes are those of kernels.quant.quantize_int8_bf16: its kernel matches that reference at the f32
    tolerance (exact integer sums) and not the f32-codes one, which differs by more on the same data."""
    assert quantizes_x_in_bf16("tpu-v6e", jnp.bfloat16)
    assert not quantizes_x_in_bf16("tpu-v6e", jnp.float32)  # f32 x keeps f32 codes
    assert not quantizes_x_in_bf16("tpu-v5e", jnp.bfloat16)  # no bf16 VPU
    m, k, n = 64, 384, 256
    x = _x(21, m, k, jnp.bfloat16) * jnp.linspace(0.1, 10.0, m, dtype=jnp.float32)[:, None].astype(jnp.bfloat16)
    _, wq, s = _weights(22, k, n, False)
    out = matmul(x, wq, w_scale=s, quantize_activations=True, chip="tpu-v6e", out_dtype=jnp.float32,
                 block_sizes=MatmulBlockSizes(bm=32, bk=128, bn=128), interpret=True)
    bf16_ref = matmul_reference(x, wq, w_scale=s, quantize_activations=True, bf16_codes=True, out_dtype=jnp.float32)
    f32_ref = matmul_reference(x, wq, w_scale=s, quantize_activations=True, out_dtype=jnp.float32)
    _check(out, bf16_ref, "quantize_activations")
    tol = TOL[("float32", "quantize_activations")]
    assert not np.allclose(np.asarray(out), np.asarray(f32_ref), **tol)
    # Both quantizations stay close to the unquantized product (per-token int8: ~1% of each row's scale).
    exact = matmul_reference(x, wq, w_scale=s, out_dtype=jnp.float32)
    for ref in (bf16_ref, f32_ref):
        err = np.abs(np.asarray(ref) - np.asarray(exact)).max(axis=1) / np.abs(np.asarray(exact)).max(axis=1)
        assert err.max() < 0.03


def test_bf16_codes_reference_needs_bf16_x():
    x = jnp.ones((8, 128), jnp.float32)
    with pytest.raises(ValueError, match="bf16_codes: x must be bfloat16"):
        matmul_reference(x, jnp.ones((128, 128), jnp.int8), w_scale=jnp.ones((128,)), quantize_activations=True,
                         bf16_codes=True)


def test_int8_codes_from_a_bf16_product_hand_worked():
    from kernels.quant import int8_codes_bf16, int8_scale_bf16, quantize_int8_bf16

    # amax = 100: 127 / 100 = 1.27 = 1.0100010100011...b, toward zero in bf16 (8 significant bits)
    # 1.0100010b = 1 + 1/4 + 1/64 = 1.265625; scale = 1 / 1.265625 = 0.790123...
    inv, scale = int8_scale_bf16(jnp.array([[100.0], [0.0]]))
    assert inv.dtype == jnp.bfloat16 and inv.astype(jnp.float32).tolist() == [[1.265625], [0.0]]
    np.testing.assert_allclose(np.asarray(scale), [[1 / 1.265625], [0.0]], rtol=1e-7)
    # x = 100: 126.5625 -> bf16 126.5 (spacing 0.5 in [64, 128)) -> 126 (half to even; f32 codes: 127 at 1.27).
    # x = -2.5: -3.1640625 is a bf16 number -> -3. x = 51: 64.546875 -> bf16 64.5 -> 64 (f32 codes: 65).
    q = int8_codes_bf16(jnp.array([[100.0, -2.5, 51.0]], jnp.bfloat16), inv[:1])
    assert q.dtype == jnp.int8 and q.tolist() == [[126, -3, 64]]
    # Over many values: |q| <= 127 and |q - x inv| <= 1/2 + half the bf16 spacing (0.75 at most).
    x = (jax.random.normal(jax.random.key(5), (64, 4096), jnp.float32)
         * jnp.logspace(-3, 3, 64)[:, None]).astype(jnp.bfloat16)
    q, scale = quantize_int8_bf16(x)
    inv = int8_scale_bf16(jnp.max(jnp.abs(x.astype(jnp.float32)), axis=1, keepdims=True))[0]
    y = np.asarray(x.astype(jnp.float32) * inv.astype(jnp.float32))
    err = np.abs(np.asarray(q, np.float32) - y)
    half_spacing = np.where(np.abs(y) >= 1, 2.0 ** (np.floor(np.log2(np.maximum(np.abs(y), 1))) - 8), 2.0 ** -9)
    assert np.abs(np.asarray(q)).max() <= 127 and np.abs(np.asarray(q)).max(axis=1).min() >= 126
    assert (err <= 0.5 + half_spacing + 1e-6).all() and err.max() <= 0.75


@pytest.mark.parametrize("groups, steps, per_step", [
    (32, 16, 2),  # v6e's 1024-row block over 16 steps: 2 groups (64 rows) a step
    (8, 3, 4),  # cdiv(8, 3) = 3 does not divide 8: the next divisor, 4 (two shares, the third step keeps the 2nd)
    (2, 6, 1),  # more steps than groups: one group a step, the later steps keep the last
    (12, 5, 3),  # cdiv(12, 5) = 3 divides 12
    (7, 2, 7),  # a prime count of groups and cdiv(7, 2) = 4: the whole row block at the first step
])
def test_lookahead_share_groups_divide_the_row_block_and_cover_it(groups, steps, per_step):
    from kernels.matmul.plan import lookahead_share_groups

    assert lookahead_share_groups(groups, steps) == per_step


def test_lookahead_needs_a_next_row_block_two_steps_and_one_core():
    from kernels import tiling
    from kernels.matmul.plan import _lookahead

    v5e, v5p = tiling.tpu_chip("tpu-v5e"), tiling.tpu_chip("tpu-v5p")
    b = MatmulBlockSizes(bm=64, bk=128, bn=128)
    # (M, N, K) = (150, 200, 300): 3 row blocks, 2 x 3 steps each.
    assert _lookahead(v5e, 150, 200, 300, b)
    # M = 64: one row block, nothing to quantize ahead; N = K = 128: one step per row block; v5p: 2 cores.
    assert not _lookahead(v5e, 64, 200, 300, b)
    assert not _lookahead(v5e, 150, 128, 128, b)
    assert not _lookahead(v5p, 150, 200, 300, b)


def test_megacore_decode_quantizes_at_each_column_block():
    from kernels import tiling
    from kernels.matmul.plan import quantizes_each_column_block as each_j

    v5e, v5p = tiling.tpu_chip("tpu-v5e"), tiling.tpu_chip("tpu-v5p")
    b = MatmulBlockSizes(bm=64, bk=128, bn=128)
    # (M, N) = (64, 200): one row block, two column blocks, two TensorCores on v5p: each column block quantizes.
    assert each_j(v5p, 64, 200, b)
    # v5e: one core (j == 0 quantizes, j sequential); M = 65: two row blocks (the cores split rows); N = 128: one
    # column block.
    assert not each_j(v5e, 64, 200, b)
    assert not each_j(v5p, 65, 200, b)
    assert not each_j(v5p, 64, 128, b)


def test_single_k_step_skips_the_accumulator():
    # K = 200 fits one bk = 256 block (masked to 200 columns): the product goes straight to the epilogue.
    m, k, n = 48, 200, 256
    x = _x(17, m, k, jnp.bfloat16)
    _, wq, s = _weights(18, k, n, False)
    bias = jnp.linspace(-1.0, 1.0, n, dtype=jnp.float32)
    out = matmul(x, wq, w_scale=s, bias=bias, activation="relu", block_sizes=MatmulBlockSizes(bm=16, bk=256, bn=128),
                 interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s, bias=bias, activation="relu"), "weight_only")


def test_decode_chunk_widths():
    from kernels.matmul.body import _quant_chunk
    from kernels.matmul.plan import _col_chunk

    # bm = 64: 64 KiB / (4 B * 64 rows) = 256 columns of f32 partial sums; bn = 1024 splits into 4.
    assert _col_chunk(64, 1024) == 256
    # bm = 8: 64 KiB / 32 B = 2048 columns, capped at bn = 1024; bn = 384 is not a multiple of 256: one chunk.
    assert (_col_chunk(8, 1024), _col_chunk(64, 384)) == (1024, 384)
    # bm = 512 > 128: the whole bn.
    assert _col_chunk(512, 1024) == 1024
    # quantize_activations, 32-row groups: 64 KiB / (4 B * 32 rows) = 512 columns; bk = 640 is not a multiple of 512,
    # nor of 384 or 256: 128 divides it.
    assert (_quant_chunk(32, 2048), _quant_chunk(32, 640)) == (512, 128)


def test_blockwise_fp8_weights_on_v6e():
    m, k, n = 40, 300, 200
    x = _x(9, m, k, jnp.bfloat16)
    w, _, _ = _weights(10, k, n, False)
    groups = -(-k // 128)
    s = jnp.linspace(0.5, 2.0, groups * n, dtype=jnp.float32).reshape(groups, n)
    w8 = w.astype(jnp.float8_e4m3fn)
    out = matmul(x, w8, w_scale=s, block_sizes=SMALL, chip="tpu-v6e", interpret=True)
    _check(out, matmul_reference(x, w8, w_scale=s), "weight_only")


def test_blockwise_scales_differ_from_per_channel():
    # The same codes under per-block scales that vary along K must not equal a per-channel reading: a kernel
    # that ignored the K-group index would fail this.
    k, n = 256, 128
    x = _x(11, 32, k, jnp.bfloat16)
    _, wq, _ = _weights(12, k, n, False)
    # Codes up to 127 over K = 256: scales ~ 1 / (127 * 16) keep outputs O(1); the second group's are 3x.
    s = jnp.stack([jnp.full((n,), 0.5 / 2032), jnp.full((n,), 1.5 / 2032)]).astype(jnp.float32)
    out = matmul(x, wq, w_scale=s, block_sizes=SMALL, interpret=True)
    _check(out, matmul_reference(x, wq, w_scale=s), "weight_only")
    flat = matmul_reference(x, wq, w_scale=s[0])
    assert float(jnp.max(jnp.abs(out.astype(jnp.float32) - flat.astype(jnp.float32)))) > 0.1


@pytest.mark.parametrize("chip", ["tpu-v4", "tpu-7x"])
def test_quantize_x_refused_without_an_int8_mxu(chip):
    x = jnp.ones((32, 128), jnp.bfloat16)
    wq = jnp.ones((128, 128), jnp.int8)
    with pytest.raises(ValueError, match=rf"quantize_activations: {chip} has no int8 x int8 MXU path faster than bf16"):
        matmul(x, wq, w_scale=jnp.ones((128,)), quantize_activations=True, chip=chip, interpret=True)


@pytest.mark.parametrize("case, match", [
    ("bf16_weights", r"quantize_activations: the int8 MXU path needs int8 or packed int4 \(w_dtype=.int4.\) weights"),
    ("scale_shape", r"w_scale: expected a float array of shape \(128,\) \(per channel\) or \(2, 128\)"),
    ("bm_not_32", r"block_sizes.bm=16 must be a multiple of 32"),
])
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_quantized_input_names_it(case, match):
    x = jnp.ones((32, 256), jnp.bfloat16)
    wq = jnp.ones((256, 128), jnp.int8)
    calls = {
        "bf16_weights": lambda: matmul(x, jnp.ones((256, 128), jnp.bfloat16), quantize_activations=True),
        "scale_shape": lambda: matmul(x, wq, w_scale=jnp.ones((3, 128))),
        "bm_not_32": lambda: matmul(x, wq, w_scale=jnp.ones((128,)), quantize_activations=True,
                                    block_sizes=MatmulBlockSizes(bm=16, bk=128, bn=128)),
    }
    with pytest.raises(ValueError, match=match):
        calls[case]()


def test_op_model_reads_bf16_activations_and_counts_their_quantization():
    from perfmodel.errors import InputError
    from perfmodel.model.gemm import DYNAMIC_QUANT_OPS_PER_ELEMENT, gemm

    # M=8, K=N=128, chip=None (no padding): weights 128*128 int8 = 16384 B, activations read as bf16
    # 8*128*2 = 2048 B, per-channel scales 128*4 = 512 B, no per-token scales from HBM: 18944 B.
    # int8 activations quantized outside (no quantize_activations) are read as int8 (1024 B) plus 8 per-token f32
    # scales (32 B): 17952 B.
    fused = gemm(m=8, n=128, k=128, lhs_dtype="bf16", rhs_dtype="int8", quantize_activations=True)
    plain = gemm(m=8, n=128, k=128, lhs_dtype="int8", rhs_dtype="int8")
    assert fused.hbm_read_bytes == 18944 and plain.hbm_read_bytes == 17952
    assert fused.mxu_dtype == plain.mxu_dtype == "int8"
    assert fused.vpu_ops - plain.vpu_ops == DYNAMIC_QUANT_OPS_PER_ELEMENT * 8 * 128
    with pytest.raises(InputError, match=r"`quantize_activations`: .* `lhs_dtype` int8 is quantized already"):
        gemm(m=8, n=128, k=128, lhs_dtype="int8", rhs_dtype="int8", quantize_activations=True)


def test_op_model_counts_the_bf16_codes_on_a_bf16_vpu():
    from perfmodel.hw.registry import get_chip
    from perfmodel.model.gemm import (DYNAMIC_QUANT_OPS_PER_ELEMENT, DYNAMIC_QUANT_OPS_PER_ELEMENT_BF16, gemm,
                                      quantizes_in_bf16)

    v5e, v6e = get_chip("tpu-v5e"), get_chip("tpu-v6e")
    assert quantizes_in_bf16(v6e, "bf16") and not quantizes_in_bf16(v6e, "fp32")
    assert not quantizes_in_bf16(v5e, "bf16") and not quantizes_in_bf16(None, "bf16")
    # The kernel asks the same rule.
    assert quantizes_x_in_bf16("tpu-v6e", jnp.bfloat16) and not quantizes_x_in_bf16("tpu-v6e", jnp.float32)
    # M=256, K=N=1024 (whole vregs on both chips): the quantization's VPU ops are 7 (f32 codes) or 4 (bf16
    # codes) per activation element, 256 * 1024 of them; nothing else differs between the two reads.
    kw = dict(m=256, n=1024, k=1024, rhs_dtype="int8")
    for chip, ops in ((v5e, DYNAMIC_QUANT_OPS_PER_ELEMENT), (v6e, DYNAMIC_QUANT_OPS_PER_ELEMENT_BF16)):
        fused = gemm(**kw, lhs_dtype="bf16", quantize_activations=True, chip=chip)
        f32_source = gemm(**kw, lhs_dtype="fp32", quantize_activations=True, chip=chip)
        plain = gemm(**kw, lhs_dtype="int8", chip=chip)
        assert fused.vpu_ops - plain.vpu_ops == ops * 256 * 1024
        assert f32_source.vpu_ops - fused.vpu_ops == (DYNAMIC_QUANT_OPS_PER_ELEMENT - ops) * 256 * 1024


#: (M, K, N, blocks) of the blockwise int8 x int8 route on tpu-v6e at bm > 128 (codes held in bf16 against a bf16
#: dequantized w tile, on the bf16 MXU): M = 300 at bm = 256 (a second row block of 44 rows, quantized ahead),
#: K = 300 at bk = 256 (a masked second K step: 44 valid rows, the third scale group); N = 200 at bn = 128.
FLOAT_CODE_CASES = [
    pytest.param((300, 300, 200, MatmulBlockSizes(bm=256, bk=256, bn=128)), id="300x300x200"),
    pytest.param((512, 512, 256, MatmulBlockSizes(bm=256, bk=256, bn=256)), id="512x512x256"),
]


@pytest.mark.parametrize("case", FLOAT_CODE_CASES)
@pytest.mark.parametrize("int4", [False, True], ids=["w8a8", "w4a8"])
def test_blockwise_int8_x_int8_on_the_bf16_mxu_at_large_bm(case, int4):
    from kernels.matmul.plan import make_plan
    from kernels.quant import pack_int4

    m, k, n, blocks = case
    x = _x(19, m, k, jnp.bfloat16) * jnp.linspace(0.1, 10.0, m, dtype=jnp.float32)[:, None].astype(jnp.bfloat16)
    _, wq, s = _weights(20, k, n, True)
    if int4:  # codes in [-8, 7]: the int8 codes halved and clipped
        wq = jnp.clip(wq // 16, -8, 7).astype(jnp.int8)
    w = pack_int4(wq) if int4 else wq
    kw = dict(w_scale=s, quantize_activations=True, w_dtype="int4" if int4 else None, block_sizes=blocks,
              chip="tpu-v6e")
    variant = make_plan(x, w, **kw).variant
    assert variant.float_codes and variant.w_dequant
    # An f32 output keeps the exact int32 sums (the int8 route, its partial products scaled per group).
    assert not make_plan(x, w, out_dtype=jnp.float32, **kw).variant.float_codes
    blocks = MatmulBlockSizes(bm=blocks.bm, bk=512, bn=blocks.bn) if int4 else blocks
    out = matmul(x, w, w_scale=s, quantize_activations=True, w_dtype="int4" if int4 else None, block_sizes=blocks,
                 chip="tpu-v6e", interpret=True)
    # The codes are exact in bf16; the weights times their scales are rounded to bf16 (rel 2^-9 each, the scale
    # too: bf16 scaling on v6e), as the weight-only blockwise path does: its tolerance, the absolute part relative
    # to the largest output (rows scaled up to 10x: a rounding error of the large rows shows on small outputs).
    ref = matmul_reference(x, wq, w_scale=s, quantize_activations=True, bf16_codes=True).astype(jnp.float32)
    tol = TOL[("bfloat16", "weight_only")]
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref), rtol=tol["rtol"],
                               atol=tol["atol"] * float(jnp.max(jnp.abs(ref))))


def test_blockwise_codes_on_bf16_mxu_rule():
    from kernels import tiling
    from kernels.matmul.rules import BLOCKWISE_PARTIAL_MAX_ROWS, blockwise_codes_on_bf16_mxu as rule

    v5e, v6e = tiling.tpu_chip("tpu-v5e"), tiling.tpu_chip("tpu-v6e")
    # v6e's MXU is 256 deep, a scale group 128 rows: above 128 rows the codes go to the bf16 MXU.
    assert rule(v6e, BLOCKWISE_PARTIAL_MAX_ROWS + 1) and not rule(v6e, BLOCKWISE_PARTIAL_MAX_ROWS)
    # v5e's MXU is 128 deep (a group fills it): the int8 partial products stay; 256-row groups fill v6e's too;
    # an f32 output keeps the exact int32 sums.
    assert not rule(v5e, 8192) and not rule(v6e, 8192, scale_block=256) and not rule(None, 8192)
    assert not rule(v6e, 8192, out_dtype="fp32")


def test_op_model_follows_the_blockwise_route():
    from perfmodel.hw.registry import get_chip
    from perfmodel.model.gemm import gemm

    v5e, v6e = get_chip("tpu-v5e"), get_chip("tpu-v6e")
    kw = dict(n=8192, k=8192, lhs_dtype="bf16", rhs_dtype="int8", quantize_activations=True, weight_scale="per-block")
    # Large M on v6e: the bf16 MXU, the scales folded into the weights (K x N VPU work, not 2 x groups x M x N).
    big = gemm(m=8192, chip=v6e, **kw)
    assert big.mxu_dtype == "bf16" and any("bf16 MXU" in note for note in big.notes)
    # Decode-sized M on v6e and any M on v5e: the int8 MXU with the partial products scaled per group.
    for cost in (gemm(m=64, chip=v6e, **kw), gemm(m=8192, chip=v5e, **kw)):
        assert cost.mxu_dtype == "int8" and any("partial sums scaled per K block" in n for n in cost.notes)
    # The bf16 route's VPU work: 64 groups x 8192^2 outputs x 2 ops on the int8 route vs 8192^2 weights folded.
    assert big.vpu_ops < gemm(m=8192, chip=v5e, **kw).vpu_ops / 10
