"""matmul kernel beyond the shared contract (tests/kernels/test_contract.py: lowering, cost estimate, tuned
defaults, a small default-block call vs the reference): tilings, epilogues and weight formats in interpret mode,
block sizes and VMEM, input errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from kernels.matmul import MatmulBlockSizes, default_block_sizes, default_block_table, matmul, matmul_reference
from kernels.matmul.blocks import FALLBACK_BLOCK_SIZES
from kernels.matmul.blocks import DECODE_MAX_M
from kernels.matmul.entry import TUNED
from kernels.matmul.plan import make_plan
from perfmodel.errors import UnknownChipError
from perfmodel.hw.registry import get_chip
from kernels.tuned import load_tuned_defaults
from perfmodel.schedule.shapes import parse_shape
from perfmodel.schedule.tuned import MAX_RAISED_VMEM_FRACTION

#: assert_allclose tolerances by output dtype. bf16 outputs carry one bf16 rounding (rel 2^-8) of
#: values whose f32 accumulation order differs from the reference's.
TOL = {
    jnp.dtype(jnp.bfloat16): dict(rtol=1.6e-2, atol=1.6e-2),
    jnp.dtype(jnp.float32): dict(rtol=2e-5, atol=2e-5),
}
SMALL = MatmulBlockSizes(bm=64, bk=128, bn=128)


def _inputs(seed: int, m: int, k: int, n: int, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    kx, kw, kb = jax.random.split(jax.random.key(seed), 3)
    # Scale by 1/sqrt(K) so outputs stay O(1) and absolute tolerances mean the same at every K.
    x = jax.random.normal(kx, (m, k), jnp.float32)
    w = jax.random.normal(kw, (k, n), jnp.float32) / np.sqrt(k)
    bias = jax.random.normal(kb, (n,), jnp.float32)
    return x.astype(dtype), w.astype(dtype), bias


def _assert_matches(out: jax.Array, ref: jax.Array) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    # Interpret mode fills fresh output buffers with NaN, so a skipped write shows up here.
    assert np.isfinite(out32).all()
    np.testing.assert_allclose(out32, ref32, **TOL[jnp.dtype(out.dtype)])


@pytest.fixture(scope="module")
def fp8_chip(tmp_path_factory) -> str:
    """A copy of the tpu-v5e spec with an fp8 matmul rate and fp8 pairs (independent of the built-in specs)."""
    data = yaml.safe_load(open(_spec_path("tpu-v5e")))
    data["name"] = "tpu-test-fp8"
    data["aliases"], data["jax_device_kinds"] = [], []
    data["compute"]["matmul_flops_per_s_per_chip"]["fp8"] = 3.94e14
    data["sources"]["compute.matmul_flops_per_s_per_chip.fp8"] = next(iter(data["references"]))
    pairs = data["compute"]["native_matmul_dtype_pairs"]
    data["compute"]["native_matmul_dtype_pairs"] = pairs + [p for p in ("bf16 x fp8", "fp8 x fp8") if p not in pairs]
    path = tmp_path_factory.mktemp("spec") / "tpu-test-fp8.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _spec_path(name: str) -> str:
    import importlib.resources

    return str(importlib.resources.files("hwspecs") / f"{name}.yaml")


# ----- numerics in interpret mode -----

ALIGNED, UNALIGNED, SHORT = (128, 256, 256), (100, 300, 200), (8, 1000, 130)
SLOW = pytest.mark.slow


# Every tiling once in bf16 (aligned: grid (2, 2, 2); nothing aligned: K zero-padded to 384, partial last M and N
# blocks); f32 on the smallest problem (one short M block, N just over one lane tile). The rest: -m slow.
@pytest.mark.parametrize("shape, dtype", [
    pytest.param(ALIGNED, jnp.bfloat16, id="128x256x256-bf16"),
    pytest.param(UNALIGNED, jnp.bfloat16, id="100x300x200-bf16"),
    pytest.param(SHORT, jnp.float32, id="8x1000x130-f32"),
    pytest.param(SHORT, jnp.bfloat16, id="8x1000x130-bf16", marks=SLOW),
    pytest.param(ALIGNED, jnp.float32, id="128x256x256-f32", marks=SLOW),
    pytest.param(UNALIGNED, jnp.float32, id="100x300x200-f32", marks=SLOW),
])
def test_matches_reference(shape, dtype):
    m, k, n = shape
    x, w, _ = _inputs(sum(shape), m, k, n, dtype)
    out = matmul(x, w, block_sizes=SMALL, interpret=True)
    _assert_matches(out, matmul_reference(x, w))


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
def test_fused_bias_and_activation(activation):
    x, w, bias = _inputs(1, 72, 200, 136, jnp.bfloat16)
    out = matmul(x, w, bias=bias, activation=activation, block_sizes=SMALL, interpret=True)
    ref = matmul_reference(x, w, bias=bias, activation=activation)
    _assert_matches(out, ref)
    if activation == "relu":
        assert float(jnp.min(out.astype(jnp.float32))) == 0.0


@pytest.mark.parametrize("dtype", [jnp.bfloat16, pytest.param(jnp.float32, marks=SLOW)], ids=["bf16", "f32"])
def test_int8_weights_with_per_channel_scales(dtype):
    m, k, n = 40, 300, 200
    x, _, bias = _inputs(2, m, k, n, dtype)
    kq, ks = jax.random.split(jax.random.key(3))
    wq = jax.random.randint(kq, (k, n), -127, 128, dtype=jnp.int32).astype(jnp.int8)
    scale = jax.random.uniform(ks, (n,), jnp.float32, 0.5, 1.5) / (127 * np.sqrt(k))
    out = matmul(x, wq, w_scale=scale, bias=bias, activation="silu", block_sizes=SMALL, interpret=True)
    _assert_matches(out, matmul_reference(x, wq, w_scale=scale, bias=bias, activation="silu"))


@pytest.mark.parametrize("fp8", [jnp.float8_e4m3fn, pytest.param(jnp.float8_e5m2, marks=SLOW)], ids=["e4m3fn", "e5m2"])
def test_fp8_weights_on_a_chip_with_an_fp8_path(fp8, fp8_chip):
    x, w, _ = _inputs(4, 48, 256, 128, jnp.bfloat16)
    w8 = w.astype(fp8)
    scale = jnp.linspace(0.5, 2.0, 128, dtype=jnp.float32)
    out = matmul(x, w8, w_scale=scale, block_sizes=SMALL, chip=fp8_chip, interpret=True)
    _assert_matches(out, matmul_reference(x, w8, w_scale=scale))


def test_out_dtype_f32_from_bf16_inputs():
    x, w, _ = _inputs(5, 64, 256, 128, jnp.bfloat16)
    out = matmul(x, w, out_dtype=jnp.float32, block_sizes=SMALL, interpret=True)
    _assert_matches(out, matmul_reference(x, w, out_dtype=jnp.float32))


def test_hand_worked_product():
    # x = [[1, 2]], w = [[3, 4], [5, 6]]: x @ w = [1*3 + 2*5, 1*4 + 2*6] = [13, 16]; + bias [1, -20] = [14, -4];
    # relu -> [14, 0].
    x = jnp.array([[1.0, 2.0]], jnp.float32)
    w = jnp.array([[3.0, 4.0], [5.0, 6.0]], jnp.float32)
    out = matmul(x, w, bias=jnp.array([1.0, -20.0]), activation="relu", interpret=True)
    np.testing.assert_array_equal(np.asarray(out), [[14.0, 0.0]])


def test_inside_an_outer_jit():
    x, w, _ = _inputs(7, 32, 128, 128, jnp.float32)
    out = jax.jit(lambda a, b: matmul(a, b, interpret=True) * 2.0)(x, w)
    _assert_matches(out, matmul_reference(x, w) * 2.0)


def test_agrees_with_jax_shipped_pallas_matmul():
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu import matmul as jax_matmul

    x, w, _ = _inputs(8, 256, 256, 256, jnp.bfloat16)
    with pltpu.force_tpu_interpret_mode():
        theirs = jax_matmul.matmul(x, w, block_shape=(128, 128), block_k=128)
    ours = matmul(x, w, block_sizes=MatmulBlockSizes(bm=128, bk=128, bn=128), interpret=True)
    # Same tiles, same f32 accumulation order, same final cast: bit-identical.
    np.testing.assert_array_equal(np.asarray(ours.astype(jnp.float32)), np.asarray(theirs.astype(jnp.float32)))


def test_unaligned_k_is_masked_in_the_kernel_not_padded_in_the_wrapper():
    # K = 300 with bk = 128: three K steps, the last holds 300 - 2*128 = 44 valid columns. The wrapper must not
    # copy x or w (no pad / concatenate / dynamic_update_slice in the traced program: one pallas_call).
    x, w, _ = _inputs(12, 32, 300, 128, jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda a, b: matmul(a, b, block_sizes=SMALL, interpret=True))(x, w)
    prims = {str(e.primitive) for e in jaxpr.jaxpr.eqns}
    inner = {str(e.primitive) for e in jaxpr.jaxpr.eqns[0].params["jaxpr"].eqns} if len(jaxpr.jaxpr.eqns) == 1 else prims
    assert not {"pad", "concatenate", "dynamic_update_slice"} & (prims | inner)
    assert "pallas_call" in inner
    _assert_matches(matmul(x, w, block_sizes=SMALL, interpret=True), matmul_reference(x, w))


# ----- block sizes -----

PROD = MatmulBlockSizes(bm=512, bk=1024, bn=1024)


def test_block_sizes_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        MatmulBlockSizes(512, 1024, 1024)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PROD.bm = 256  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(bm=100, bk=128, bn=128), r"block_sizes.bm=100 must be a multiple of 8"),
        (dict(bm=64, bk=200, bn=128), r"block_sizes.bk=200 must be a multiple of 128.*try 128 or 256"),
        (dict(bm=64, bk=128, bn=0), r"block_sizes.bn=0 must be a positive int"),
        (dict(bm=64, bk=128, bn=128.0), r"block_sizes.bn=128.0 must be a positive int"),
    ],
)
def test_block_sizes_reject_bad_tiles(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MatmulBlockSizes(**kwargs)


def test_bf16_needs_16_row_blocks():
    x, w, _ = _inputs(9, 64, 128, 128, jnp.bfloat16)
    with pytest.raises(ValueError, match=r"block_sizes.bm=8 must be a multiple of 16"):
        matmul(x, w, block_sizes=MatmulBlockSizes(bm=8, bk=128, bn=128), interpret=True)


def test_vmem_between_scoped_and_physical_raises_the_limit():
    chip = get_chip("tpu-v5e")
    big = MatmulBlockSizes(bm=1024, bk=2048, bn=2048)
    # bf16 tiles: x 1024*2048*2 = 4 MiB, w 2048*2048*2 = 8 MiB, out 4 MiB; double-buffered 32 MiB;
    # f32 accumulator 1024*2048*4 = 8 MiB; Mosaic's staging of the x tile on v5e's 128-wide MXU
    # 1.5 * 4 MiB = 6 MiB; total 46 MiB: over v5e's 16 MiB scoped default, under its 128 MiB
    # VMEM -> compile with 46 MiB * 1.25 = 57.5 MiB.
    need = 46 * 2**20
    assert big.vmem_bytes(x_dtype=jnp.bfloat16, w_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16, epilogue_vectors=0,
                          chip=chip) == need
    limit = big.check(x_dtype=jnp.bfloat16, w_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16, epilogue_vectors=0, chip=chip)
    assert limit == int(need * 1.25)
    assert PROD.check(x_dtype=jnp.bfloat16, w_dtype=jnp.bfloat16, out_dtype=jnp.bfloat16, epilogue_vectors=1,
                      chip=chip) is None


def test_blocks_over_physical_vmem_raise():
    x, w, _ = _inputs(10, 64, 128, 128, jnp.float32)
    huge = MatmulBlockSizes(bm=4096, bk=4096, bn=4096)
    with pytest.raises(ValueError, match=r"block_sizes \(bm=4096,bk=4096,bn=4096\) need .* MiB of VMEM"):
        matmul(x, w, block_sizes=huge, interpret=True)


def test_decode_rows_take_the_decode_defaults():
    # Up to DECODE_MAX_M rows of x the "<pair> decode" entry, above it the square GEMM's; a pair without a decode
    # entry (f32) keeps its own at any M.
    table = default_block_table()["tpu-v5e"]
    assert default_block_sizes("tpu-v5e", "bf16", "int8", m=DECODE_MAX_M) == table["bf16 x int8 decode"]
    assert default_block_sizes("tpu-v5e", "bf16", "int8", m=DECODE_MAX_M + 1) == table["bf16 x int8"]
    assert default_block_sizes("tpu-v5e", "bf16", "int8") == table["bf16 x int8"]
    assert "fp32 x fp32 decode" not in table
    assert default_block_sizes("tpu-v5e", "fp32", "fp32", m=8) == table["fp32 x fp32"]
    # The decode entries fetch fewer, larger weight tiles than the square GEMM's clamped to 64 rows.
    square, dec = table["bf16 x int8"], table["bf16 x int8 decode"]
    assert dec.bk * dec.bn > square.bk * square.bn


def test_chips_and_pairs_the_json_lacks_fall_back():
    # tpu-v5e has no fp8 MXU rate, so its table has no fp8 pair: the fallback blocks. A chip spec file has no entry
    # at all: the reference chip's (kernels.tiling.tuned_entry_chip, every kernel's policy).
    assert "bf16 x fp8" not in load_tuned_defaults("matmul")["tpu-v5e"]
    assert default_block_sizes("tpu-v5e", "bf16", "fp8") == FALLBACK_BLOCK_SIZES
    assert default_block_sizes("my-chip.yaml", "bf16", "bf16") == default_block_sizes("tpu-v5e", "bf16", "bf16")
    assert default_block_sizes("my-chip.yaml", "bf16", "bf16") != FALLBACK_BLOCK_SIZES


@pytest.mark.parametrize("chip_name", sorted(default_block_table()))
def test_stored_defaults_pass_the_check_within_the_default_scoped_vmem_unless_marked(chip_name):
    try:
        chip = get_chip(chip_name)
    except UnknownChipError:
        pytest.skip(f"no spec for {chip_name} yet")
    stored = load_tuned_defaults("matmul")[chip_name]
    configs = {config.key: config for config in TUNED.configs}
    assert set(stored) <= set(configs)
    for key, entry in stored.items():
        # Each configuration's call as tuned (kernels/matmul/entry.py): its shapes, with a bias (the epilogue
        # fused: a bias row, plus the per-channel scale row of quantized weights; blockwise scales are the
        # variant's scale rows), and its static arguments (quantize_activations, w_dtype), planned as the wrapper
        # plans it at the stored blocks. "... decode" entries are tuned on the decode problem (64 rows against the
        # whole weight matrix); "int8 x int8" is quantize_activations on bf16 activations (a resident row, the codes,
        # the lookahead's shares); "bf16 x int4" counts the packed tile as an int8 [bk, bn] one, plus the unpacked
        # tile (two code planes of x at decode on int8-MXU chips); "... blockwise": one scale per 128 rows of K (the
        # codes in bf16 on v6e: the variant's float_codes).
        arrays = {s.name: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype))
                  for s in map(parse_shape, configs[key].shapes)}
        # Raises if a default breaks the tiling rules or the chip's physical VMEM.
        plan = make_plan(arrays.pop("x"), arrays.pop("w"), **arrays, **configs[key].static,
                         block_sizes=default_block_table()[chip_name][key], chip=chip_name)
        # None: the default scoped limit suffices; else the JSON says so and the limit stays within 3/4 of VMEM.
        limit = plan.vmem_limit_bytes
        assert limit == entry["vmem_limit_bytes"], (chip_name, key)
        assert limit is None or limit <= MAX_RAISED_VMEM_FRACTION * chip.memory.vmem_bytes_per_core


# ----- bad input names the argument -----

def _bad_call(case: str) -> None:
    x = jnp.ones((16, 128), jnp.bfloat16)
    w = jnp.ones((128, 128), jnp.bfloat16)
    wq = jnp.ones((128, 128), jnp.int8)
    scale = jnp.ones((128,), jnp.float32)
    calls = {
        "x_1d": lambda: matmul(jnp.ones((128,), jnp.bfloat16), w),
        "k_mismatch": lambda: matmul(x, jnp.ones((64, 128), jnp.bfloat16)),
        "x_int8": lambda: matmul(jnp.ones((16, 128), jnp.int8), wq, w_scale=scale),
        "w_dtype": lambda: matmul(x, jnp.ones((128, 128), jnp.float32)),
        "int8_no_scale": lambda: matmul(x, wq),
        "scale_shape": lambda: matmul(x, wq, w_scale=jnp.ones((64,), jnp.float32)),
        "scale_float_w": lambda: matmul(x, w, w_scale=scale),
        "bias_shape": lambda: matmul(x, w, bias=jnp.ones((127,), jnp.float32)),
        "activation": lambda: matmul(x, w, activation="tanh"),
        "out_dtype": lambda: matmul(x, w, out_dtype=jnp.int8),
        "fp8_on_v5e": lambda: matmul(x, w.astype(jnp.float8_e4m3fn), chip="tpu-v5e"),
        "unknown_chip": lambda: matmul(x, w, chip="tpu-v99"),
        "block_type": lambda: matmul(x, w, block_sizes=(512, 1024, 1024)),
    }
    calls[case]()


@pytest.mark.parametrize(
    "case, match",
    [
        ("x_1d", r"x: expected a 2-D \[M, K\] array"),
        ("k_mismatch", r"w: shape \(64, 128\) does not match x's K=128"),
        ("x_int8", r"x: dtype int8 not supported"),
        ("w_dtype", r"w: dtype float32 must match x \(bfloat16\)"),
        ("int8_no_scale", r"w_scale: int8 weights need per-output-channel scales"),
        ("scale_shape", r"w_scale: expected a float array of shape \(128,\)"),
        ("scale_float_w", r"w_scale: only int8 / fp8 weights take scales"),
        ("bias_shape", r"bias: expected a float array of shape \(128,\)"),
        ("activation", r"activation='tanh' is not known; use one of none, relu, gelu, silu"),
        ("out_dtype", r"out_dtype: int8 not supported"),
        ("fp8_on_v5e", r"w: float8_e4m3fn weights need an fp8 MXU path, which tpu-v5e lacks"),
        ("unknown_chip", r"unknown chip 'tpu-v99'"),
        ("block_type", r"block_sizes: expected a MatmulBlockSizes, got tuple"),
    ],
)
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_input_raises_value_error_naming_it(case, match):
    with pytest.raises(ValueError, match=match):
        _bad_call(case)


def test_gpu_chip_is_rejected(tmp_path):
    data = yaml.safe_load(open(_spec_path("tpu-v5e")))
    data.update(name="gpu-test", kind="gpu", aliases=[], jax_device_kinds=[])
    path = tmp_path / "gpu-test.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"chip: '.*gpu-test.yaml' is a GPU; these Pallas kernels target TPUs"):
        matmul(jnp.ones((16, 128), jnp.bfloat16), jnp.ones((128, 128), jnp.bfloat16), chip=str(path))


# ----- larger cases (pytest -m slow) -----

@pytest.mark.slow
@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_default_blocks_at_a_larger_shape(weights):
    # The stored v5e defaults (matmul.json) clamp to this problem: bm to 512, bn to at most 768.
    m, k, n = 512, 2048, 768
    x, w, bias = _inputs(11, m, k, n, jnp.bfloat16)
    scale = None
    if weights == "int8":
        scale = jnp.max(jnp.abs(w.astype(jnp.float32)), axis=0) / 127
        w = jnp.round(w.astype(jnp.float32) / scale).astype(jnp.int8)
    out = matmul(x, w, w_scale=scale, bias=bias, activation="gelu", interpret=True)
    _assert_matches(out, matmul_reference(x, w, w_scale=scale, bias=bias, activation="gelu"))


# ----- kernels.common.with_ref_names (shared by the kernels) -----

def test_with_ref_names_gives_the_kernel_a_signature_and_checks_the_count():
    import inspect

    from kernels.common import with_ref_names

    seen = []
    named = with_ref_names(lambda *refs: seen.append(refs), ["x_ref", "o_ref"])
    assert list(inspect.signature(named).parameters) == ["x_ref", "o_ref"]
    named(1, 2)
    assert seen == [(1, 2)]
    with pytest.raises(TypeError, match=r"got 3 refs for 2 names \(x_ref, o_ref\)"):
        named(1, 2, 3)
