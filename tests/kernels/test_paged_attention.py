"""paged_attention (decode) kernel beyond the shared contract (tests/kernels/test_contract.py: lowering of every
cache format, cost estimate, tuned defaults, a small default-block call vs the reference): cache formats and lengths
in interpret mode vs the pure-jnp reference and JAX's shipped kernel, block sizes and VMEM, the real compiler, input
validation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention_kernel as jax_paged
from jax.experimental.pallas.ops.tpu.paged_attention import quantization_utils as jax_quant
from jax.experimental.pallas.ops.tpu.paged_attention import util as jax_paged_util

from kernels.paged_attention import (
    DEFAULT_TOKENS_PER_COMPUTE_BLOCK,
    PagedAttentionBlockSizes,
    default_block_sizes,
    dequantize_pages,
    paged_attention,
    paged_attention_reference,
    quantize_pages,
)
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.shapes import parse_shape
from kernels.tuned import load_tuned_file

#: (atol, rtol) per (q dtype, cache dtype). bf16 queries run bf16 matmuls with bf16
#: probabilities and a bf16 output (~4e-3 relative); quantized caches are compared
#: with the reference on the same dequantized values, so quantization error cancels.
TOLERANCES = {
    ("float32", "float32"): (2e-5, 2e-5),
    ("bfloat16", "bfloat16"): (1.5e-2, 1.5e-2),
    ("float32", "int8"): (2e-5, 2e-5),
    ("bfloat16", "int8"): (1.5e-2, 1.5e-2),
    ("bfloat16", "float8_e4m3fn"): (1.5e-2, 1.5e-2),
}

PBS = PagedAttentionBlockSizes
SLOW = pytest.mark.slow
#: A page-table value that is no page at all: the kernel must never follow it.
GARBAGE_PAGE = 1 << 20


@dataclasses.dataclass(frozen=True)
class Cache:
    """One KV-cache format: query dtype, stored dtype, scale layout and a page size that tiles it."""

    id: str
    q_dtype: str
    kv_dtype: str
    per_token: bool | None  # None: unquantized
    page_size: int
    chip: str = "tpu-v5e"


FORMATS = [
    Cache("f32", "float32", "float32", None, 16),
    Cache("bf16", "bfloat16", "bfloat16", None, 16),
    Cache("int8-per-token", "bfloat16", "int8", True, 32),
    # int8 pages of 16 tokens (half an int8 sublane tile): whole 8-row HBM tiles, compiled by Mosaic on v4-7x.
    Cache("int8-per-token-page16", "bfloat16", "int8", True, 16),
    Cache("int8-per-page", "float32", "int8", False, 32),
    Cache("fp8-per-token", "bfloat16", "float8_e4m3fn", True, 32, chip="tpu-7x"),
]


@dataclasses.dataclass(frozen=True)
class Shape:
    id: str
    q_heads: int
    kv_heads: int
    head_dim: int
    #: Context lengths as a share of the table's capacity, resolved per page size.
    fill: tuple[float, ...]
    blocks_per_seq: int  # compute blocks of 128 tokens


SHAPES = [
    # MHA; lengths 0 (empty), 1, one page, a partial last page, full capacity.
    Shape("mha", 2, 2, 128, (0.0, 1.0 / 256, 0.0625, 0.52, 1.0), 2),
    # GQA 4: ragged lengths, each ending inside a page.
    Shape("gqa4", 8, 2, 128, (0.33, 0.71, 0.05), 2),
    # GQA 8 (all q heads on one kv head), head_dim 64, three compute blocks.
    Shape("gqa8", 8, 1, 64, (0.9, 0.4), 3),
]


def _lengths(shape: Shape, capacity: int) -> np.ndarray:
    # fill 1/256 -> 1 token; 0.52 of 256 -> 133 tokens (page 8 of 16, 5 rows in); etc.
    return np.array([max(0, min(capacity, round(f * capacity))) if f else 0 for f in shape.fill], np.int32)


def _make(shape: Shape, fmt: Cache, seed: int = 0):
    """Random queries and cache; a shuffled page table whose unused entries are garbage.

    Pages no sequence uses, and the rows of each last page past its sequence's
    length, hold NaN: reading or using any of them would show in the output.
    """
    rng = np.random.default_rng(seed)
    batch = len(shape.fill)
    ps = fmt.page_size
    ppcb = 128 // ps
    pages_per_seq = shape.blocks_per_seq * ppcb
    capacity = pages_per_seq * ps
    lengths = _lengths(shape, capacity)
    num_pages = batch * pages_per_seq + 5  # a few pages nobody owns
    table = rng.permutation(num_pages)[: batch * pages_per_seq].reshape(batch, pages_per_seq).astype(np.int32)
    used = np.arange(pages_per_seq)[None, :] * ps < lengths[:, None]
    table = np.where(used, table, GARBAGE_PAGE).astype(np.int32)
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = 2.0 * jax.random.normal(kq, (batch, shape.q_heads, shape.head_dim), jnp.float32)
    cache_shape = (shape.kv_heads, num_pages, ps, shape.head_dim)
    k = jax.random.normal(kk, cache_shape, jnp.float32)
    v = jax.random.normal(kv, cache_shape, jnp.float32)
    if fmt.per_token is None:
        k, v = k.astype(fmt.kv_dtype), v.astype(fmt.kv_dtype)
        k_scales = v_scales = None
    else:
        k, k_scales = quantize_pages(k, dtype=fmt.kv_dtype, per_token=fmt.per_token)
        v, v_scales = quantize_pages(v, dtype=fmt.kv_dtype, per_token=fmt.per_token)
    # Poison: every row that is not a live token of some sequence.
    live = np.zeros((num_pages, ps), bool)
    for b in range(batch):
        for t in range(lengths[b]):
            live[table[b, t // ps], t % ps] = True
    if jnp.issubdtype(k.dtype, jnp.floating):
        poison = jnp.asarray(~live)[None, :, :, None]
        k, v = jnp.where(poison, jnp.nan, k).astype(k.dtype), jnp.where(poison, jnp.nan, v).astype(v.dtype)
    else:  # int8 cannot hold NaN: poison the scales of dead rows instead (per token), or of dead pages
        if fmt.per_token:
            k_scales = jnp.where(jnp.asarray(~live)[None], jnp.nan, k_scales)
            v_scales = jnp.where(jnp.asarray(~live)[None], jnp.nan, v_scales)
        else:
            dead = jnp.asarray(~live.any(axis=1))[None]
            k_scales, v_scales = jnp.where(dead, jnp.nan, k_scales), jnp.where(dead, jnp.nan, v_scales)
    return dict(q=q.astype(fmt.q_dtype), k_pages=k, v_pages=v, page_table=jnp.asarray(table),
                lengths=jnp.asarray(lengths), k_scales=k_scales, v_scales=v_scales), ppcb


def _reference_inputs(inputs):
    """The same problem with poison replaced by finite values (the reference reads every row)."""
    clean = dict(inputs)
    table = np.asarray(inputs["page_table"])
    clean["page_table"] = jnp.asarray(np.where(table == GARBAGE_PAGE, 0, table))
    for name in ("k_pages", "v_pages", "k_scales", "v_scales"):
        if clean[name] is not None:
            clean[name] = jnp.nan_to_num(clean[name], nan=0.0)
    return clean


def _check(out, ref, fmt: Cache):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    # Interpret mode fills unwritten buffers with NaN; poisoned pages would give NaN too.
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} NaN output elements"
    atol, rtol = TOLERANCES[(fmt.q_dtype, fmt.kv_dtype)]
    np.testing.assert_allclose(out, np.asarray(ref), atol=atol, rtol=rtol)


def _reference_cases() -> list:
    # Every cache format on GQA 4; every shape (MHA with the edge lengths 0, 1, one page, full) in bf16. The other
    # (shape, format) pairs: -m slow.
    cases = []
    for shape in SHAPES:
        for fmt in FORMATS:
            marks = () if shape.id == "gqa4" or fmt.id == "bf16" else SLOW
            cases.append(pytest.param(shape, fmt, marks=marks, id=f"{shape.id}-{fmt.id}"))
    return cases


@pytest.mark.parametrize("shape, fmt", _reference_cases())
def test_matches_reference(shape, fmt):
    inputs, ppcb = _make(shape, fmt)
    out = paged_attention(**inputs, block_sizes=PBS(pages_per_compute_block=ppcb), chip=fmt.chip, interpret=True)
    q = inputs["q"]
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = paged_attention_reference(**_reference_inputs(inputs))
    _check(out, ref, fmt)
    # Empty sequences give exact zeros.
    empty = np.asarray(inputs["lengths"]) == 0
    assert np.all(np.asarray(out, np.float32)[empty] == 0.0)


def test_default_block_sizes_and_sm_scale():
    fmt = FORMATS[0]
    inputs, _ = _make(SHAPES[1], fmt, seed=5)
    out = paged_attention(**inputs, sm_scale=0.2, interpret=True)
    _check(out, paged_attention_reference(**_reference_inputs(inputs), sm_scale=0.2), fmt)


# ----------------------------------------------------------------------------- JAX's kernel


def _dense_inputs(seed=7):
    """A problem JAX's kernel also accepts: every page-table entry valid, lengths >= 1."""
    rng = np.random.default_rng(seed)
    batch, q_heads, kv_heads, head_dim, ps, pps = 3, 8, 2, 128, 32, 8
    num_pages = batch * pps
    table = jnp.asarray(rng.permutation(num_pages).reshape(batch, pps).astype(np.int32))
    lengths = jnp.asarray(np.array([5, 130, 256], np.int32))
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (batch, q_heads, head_dim), jnp.float32)
    k = jax.random.normal(kk, (kv_heads, num_pages, ps, head_dim), jnp.float32)
    v = jax.random.normal(kv, (kv_heads, num_pages, ps, head_dim), jnp.float32)
    return q, k, v, table, lengths


def test_agrees_with_jax_shipped_kernel_bf16():
    # Independent check: JAX's Pallas TPU paged_attention (same cache layout), in TPU
    # interpret mode. It applies no softmax scale, so both get q / 16 (exact in bf16)
    # and ours runs with sm_scale=1.
    q, k, v, table, lengths = _dense_inputs()
    q, k, v = (q / 16).astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    ours = paged_attention(q, k, v, table, lengths, sm_scale=1.0, block_sizes=PBS(pages_per_compute_block=4),
                           interpret=True)
    with pltpu.force_tpu_interpret_mode():
        theirs = jax_paged.paged_attention(q, k, v, lengths, table, pages_per_compute_block=4)
    np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs, np.float32), atol=2e-2, rtol=2e-2)


def test_agrees_with_jax_shipped_kernel_int8_per_token():
    # JAX's int8 cache: value = stored * h / 127.5 with h broadcast over head_dim;
    # ours: value = stored * scale with one scale per token, so scale = h / 127.5.
    q, k, v, table, lengths = _dense_inputs(seed=8)
    q = q / 16
    qk, qv = jax_quant.quantize_to_int8(k), jax_quant.quantize_to_int8(v)
    k_scales, v_scales = (x.scales[..., 0] / jax_quant.MAX_INT8 for x in (qk, qv))
    ours = paged_attention(q, qk.weight, qv.weight, table, lengths, k_scales=k_scales, v_scales=v_scales,
                           sm_scale=1.0, block_sizes=PBS(pages_per_compute_block=4), interpret=True)
    with pltpu.force_tpu_interpret_mode():
        theirs = jax_paged.paged_attention(q, qk, qv, lengths, table, pages_per_compute_block=4)
    # JAX's kernel dequantizes to bf16 before its f32 matmul: bf16-level agreement.
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-2, rtol=2e-2)


def test_reference_agrees_with_jax_reference():
    # JAX's pure-jnp grouped_query_attention_reference on the gathered dense cache.
    q, k, v, table, lengths = _dense_inputs(seed=9)
    kv_heads, _, ps, head_dim = k.shape
    dense = [x[:, table].reshape(kv_heads, table.shape[0], -1, head_dim).transpose(1, 0, 2, 3) for x in (k, v)]
    with jax.default_matmul_precision("highest"):
        theirs = jax_paged_util.grouped_query_attention_reference(q, *dense, lengths)
    ours = paged_attention_reference(q, k, v, table, lengths, sm_scale=1.0)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5, rtol=1e-5)


def test_quantize_round_trip():
    x = jax.random.normal(jax.random.key(0), (2, 3, 32, 128), jnp.float32)
    for per_token in (True, False):
        stored, scales = quantize_pages(x, dtype="int8", per_token=per_token)
        assert stored.dtype == jnp.int8 and scales.shape == (x.shape[:3] if per_token else x.shape[:2])
        # Rounding error at most half a step: |x - q*s| <= s / 2.
        step = scales[..., None] if per_token else scales[..., None, None]
        err = jnp.abs(dequantize_pages(stored, scales) - x)
        assert bool(jnp.all(err <= step / 2 + 1e-6))


# ----------------------------------------------------------------------------- block sizes


@pytest.mark.parametrize(
    "chip, page_size, pages_per_seq, expected",
    [
        ("tpu-v5e", 16, 128, 32),  # target 512 tokens: 32 pages of 16, and 32 divides 128
        ("tpu-v5e", 16, 24, 24),  # lane-aligned divisors of 24 (n x 16 % 128 == 0): 8, 24; both <= 32 pages
        ("tpu-v5e", 32, 64, 16),  # 512 / 32 = 16 pages
        ("tpu-v6e", 32, 64, 32),  # target 1024 tokens: 32 pages of 32
        ("tpu-v5e", 256, 4, 2),  # 1 or 2 pages of 256 fit in 512 tokens: 2
        ("tpu-v5e", 1024, 4, 1),  # one 1024-token page already exceeds the target: the smallest block
    ],
)
def test_default_pages_per_compute_block(monkeypatch, chip, page_size, pages_per_seq, expected):
    import kernels.paged_attention.blocks as pb

    # The fitting rule on hand-picked token targets (the stored ones come from the advisor).
    monkeypatch.setattr(pb, "default_tokens_table", lambda: {"tpu-v5e": {"bf16": 512}, "tpu-v6e": {"bf16": 1024}})
    sizes = default_block_sizes(chip, page_size=page_size, pages_per_seq=pages_per_seq)
    assert sizes.pages_per_compute_block == expected


def test_default_tokens_come_from_the_tuned_json():
    # The stored pages per block at the tuned shape (and that the call passes validation there):
    # tests/kernels/test_contract.py. The lookup keeps the stored token count for other page sizes.
    data = load_tuned_file("paged_attention")
    shapes = {parse_shape(t).name: parse_shape(t).shape for t in data["shapes"]["bf16"]}
    page_size = shapes["k_pages"][2]
    assert sorted(DEFAULT_TOKENS_PER_COMPUTE_BLOCK) == sorted(data["defaults"])
    for chip, configs in data["defaults"].items():
        stored = configs["bf16"]
        assert stored["tokens_per_compute_block"] == stored["pages_per_compute_block"] * page_size
        assert DEFAULT_TOKENS_PER_COMPUTE_BLOCK[chip] == stored["tokens_per_compute_block"]


def test_default_block_sizes_errors():
    with pytest.raises(ValueError, match=r"page_table: 12 pages per sequence of 16 tokens admit no compute block"):
        default_block_sizes("tpu-v5e", page_size=16, pages_per_seq=12)
    # A chip the JSON lacks (tpu-v3) takes tpu-v5e's target (kernels.tiling.tuned_entry_chip, every kernel's policy).
    assert default_block_sizes("tpu-v3", page_size=16, pages_per_seq=16) == default_block_sizes(
        "tpu-v5e", page_size=16, pages_per_seq=16)


@pytest.mark.parametrize("value", [0, -2, True, 2.0])
def test_block_sizes_validate_themselves(value):
    with pytest.raises(ValueError, match=r"block_sizes\.pages_per_compute_block: must be a positive int"):
        PBS(pages_per_compute_block=value)


# ----------------------------------------------------------------------------- bad input


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


Q = _sds((2, 8, 128))
KP = _sds((2, 64, 16, 128))
PT = _sds((2, 16), jnp.int32)
LN = _sds((2,), jnp.int32)
K8 = _sds((2, 64, 32, 128), jnp.int8)
PT8 = _sds((2, 8), jnp.int32)
S8 = _sds((2, 64, 32), jnp.float32)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((_sds((2, 8, 1, 128)), KP, KP, PT, LN), {}, r"q: expected rank 3"),
        ((Q, _sds((2, 64, 128)), _sds((2, 64, 128)), PT, LN), {}, r"k_pages: expected rank 4"),
        ((Q, KP, _sds((2, 32, 16, 128)), PT, LN), {}, r"v_pages: shape .* must equal k_pages' shape"),
        ((Q, KP, _sds((2, 64, 16, 128), jnp.float32), PT, LN), {}, r"v_pages: dtype float32 must equal"),
        ((Q, _sds((2, 64, 16, 64)), _sds((2, 64, 16, 64)), PT, LN), {}, r"k_pages: head_dim 64 does not match"),
        ((Q, _sds((3, 64, 16, 128)), _sds((3, 64, 16, 128)), PT, LN), {}, r"k_pages: kv_heads=3 does not divide"),
        ((Q, KP, KP, _sds((3, 16), jnp.int32), LN), {}, r"page_table: expected shape \[batch=2"),
        ((Q, KP, KP, PT, _sds((3,), jnp.int32)), {}, r"lengths: expected shape \[batch=2\]"),
        ((Q, KP, KP, _sds((2, 16), jnp.int16), LN), {}, r"page_table: dtype must be int32"),
        ((Q, K8, K8, PT8, LN), {}, r"k_scales: required for int8 pages"),
        ((Q, KP, KP, PT, LN), dict(k_scales=S8, v_scales=S8), r"k_scales: given for bfloat16 pages"),
        ((Q, K8, K8, PT8, LN), dict(k_scales=_sds((2, 64, 16), jnp.float32), v_scales=S8),
         r"k_scales: shape \(2, 64, 16\) must be \[kv_heads, num_pages\]"),
        ((Q, K8, K8, PT8, LN), dict(k_scales=S8, v_scales=_sds((2, 64, 32), jnp.bfloat16)),
         r"v_scales: dtype must be float32"),
        ((Q, K8, K8, PT8, LN), dict(k_scales=S8, v_scales=_sds((2, 64), jnp.float32)),
         r"v_scales: shape \(2, 64\) must equal k_scales' shape"),
        ((_sds((2, 8, 128), jnp.float16), KP, KP, PT, LN), {}, r"q: dtype float16 is not supported"),
        ((Q, _sds((2, 64, 16, 128), jnp.float32), _sds((2, 64, 16, 128), jnp.float32), PT, LN), {},
         r"k_pages: float pages must match q's dtype"),
        ((Q, _sds((2, 64, 32, 128), jnp.float8_e4m3fn), _sds((2, 64, 32, 128), jnp.float8_e4m3fn), PT8, LN),
         dict(k_scales=S8, v_scales=S8), r"k_pages: dtype float8_e4m3fn needs fp8 support, which tpu-v5e lacks"),
        ((Q, _sds((2, 64, 4, 128)), _sds((2, 64, 4, 128)), PT, LN), {},
         r"k_pages: page_size 4 is not a multiple of 8 \(a page must be whole 8-row tiles"),
        ((Q, _sds((2, 64, 12, 128), jnp.int8), _sds((2, 64, 12, 128), jnp.int8), PT, LN),
         dict(k_scales=_sds((2, 64), jnp.float32), v_scales=_sds((2, 64), jnp.float32)),
         r"k_pages: page_size 12 is not a multiple of 8"),
        ((Q, KP, KP, PT, LN), dict(block_sizes=PBS(pages_per_compute_block=3)),
         r"pages_per_compute_block: 3 does not divide the page table's 16 pages"),
        ((Q, KP, KP, PT, LN), dict(block_sizes=PBS(pages_per_compute_block=4)),
         r"pages_per_compute_block: 4 pages x page_size 16 = 64 tokens, not a multiple of 128"),
        ((Q, _sds((2, 8192, 16, 128)), _sds((2, 8192, 16, 128)), _sds((2, 4096), jnp.int32), LN),
         dict(block_sizes=PBS(pages_per_compute_block=4096)), r"pages_per_compute_block: 4096 pages need .* VMEM"),
        ((Q, KP, KP, PT, LN), dict(block_sizes=16), r"block_sizes: expected PagedAttentionBlockSizes"),
        ((Q, KP, KP, PT, LN), dict(chip="h100-sxm"), r"chip: 'h100-sxm' is a GPU"),
    ],
)
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_shapes_raise_value_error_naming_the_argument(args, kwargs, match):
    fn = jax.jit(lambda *a: paged_attention(*a, **kwargs))
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(fn, *args)


def _concrete(table, lengths):
    q = jnp.ones((2, 4, 128), jnp.bfloat16)
    k = jnp.ones((1, 8, 16, 128), jnp.bfloat16)
    return q, k, k, jnp.asarray(table, jnp.int32), jnp.asarray(lengths, jnp.int32)


@pytest.mark.parametrize(
    "table, lengths, match",
    [
        # Sequence 1 uses 17 tokens -> pages 0 and 1 of its row; entry [1, 1] = 8 is past 8 pages.
        ([[0, 1, 2, 3, 4, 5, 6, 7], [2, 8, 0, 0, 0, 0, 0, 0]], [5, 17],
         r"page_table: page_table\[1, 1\] = 8 points past the cache of 8 pages"),
        ([[0, 1, 2, 3, 4, 5, 6, 7], [-1, 0, 0, 0, 0, 0, 0, 0]], [5, 3],
         r"page_table: page_table\[1, 0\] = -1 points past"),
        ([[0] * 8, [1] * 8], [5, 129], r"lengths: lengths\[1\] = 129 is outside \[0, 128\]"),
        ([[0] * 8, [1] * 8], [-1, 3], r"lengths: lengths\[0\] = -1 is outside"),
    ],
)
def test_bad_values_raise_value_error_naming_the_argument(table, lengths, match):
    with pytest.raises(ValueError, match=match):
        paged_attention(*_concrete(table, lengths), interpret=True)


def test_garbage_past_the_length_is_allowed():
    # Entries past each sequence's length are never read, so garbage there is fine.
    table = [[0, 99, -5, 0, 0, 0, 0, 0], [3, 4, 1 << 30, 0, 0, 0, 0, 0]]
    out = paged_attention(*_concrete(table, [16, 32]), block_sizes=PBS(pages_per_compute_block=8), interpret=True)
    # All-ones cache: every value row is ones, so the output is exactly one.
    np.testing.assert_array_equal(np.asarray(out, np.float32), 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [FORMATS[1], FORMATS[2]], ids=[FORMATS[1].id, FORMATS[2].id])
def test_larger_decode_batch_matches_reference(fmt):
    # 8 sequences up to 1k tokens, 32 q heads over 8 kv heads, 256-token compute blocks.
    shape = Shape("large", 32, 8, 128, (1.0, 0.93, 0.5, 0.27, 0.61, 0.02, 0.75, 0.4), 8)
    inputs, ppcb = _make(shape, fmt, seed=12)
    out = paged_attention(**inputs, block_sizes=PBS(pages_per_compute_block=2 * ppcb), chip=fmt.chip,
                          interpret=True)
    _check(out, paged_attention_reference(**_reference_inputs(inputs)), fmt)


def test_runs_under_an_outer_jit():
    # Under jit the table and lengths are tracers: value checks are skipped, shapes still checked.
    args = _concrete([[0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 0, 0, 0, 0, 0, 0]], [100, 20])
    fn = jax.jit(lambda *a: paged_attention(*a, block_sizes=PBS(pages_per_compute_block=8), interpret=True))
    np.testing.assert_array_equal(np.asarray(fn(*args), np.float32), 1.0)


# ----------------------------------------------------------------------------- the real compiler


def _libtpu() -> bool:
    from perfmodel.compiler.toolchain import available

    return available()


# tpu-v6e by default; tpu-v4 (no bf16 VPU: K and V widen through f32): -m slow.
@pytest.mark.needs_libtpu
@pytest.mark.skipif(not _libtpu(), reason="libtpu not installed: pip install -e '.[tpu-compiler]'")
@pytest.mark.parametrize("chip", [pytest.param("tpu-v4", marks=SLOW), "tpu-v6e"])
def test_int8_pages_of_16_tokens_compile_within_the_estimate(chip):
    # Regression: int8 pages had to be 32 tokens (the int8 sublane tile), so the production layout of
    # 16-token pages was refused; XLA tiles the cache in 8-row tiles and Mosaic compiles the page DMAs.
    from perfmodel.compiler.api import CompileCall, compile_report

    shapes = ("q=64x32x128:bf16", "k_pages=8x8192x16x128:int8", "v_pages=8x8192x16x128:int8",
              "page_table=64x128:int32=arange", "lengths=64:int32=2048", "k_scales=8x8192x16:f32",
              "v_scales=8x8192x16:f32")
    report = compile_report(CompileCall(kind="function", target="kernels.paged_attention:paged_attention",
                                        shapes=shapes), get_chip(chip))
    assert report.compiled, report.error
    (kernel,) = report.kernels
    sizes = default_block_sizes(chip, page_size=16, pages_per_seq=128)
    estimate = sizes.vmem_bytes(page_size=16, pages_per_seq=128, num_q_per_kv=4, kv_heads=8, head_dim=128,
                                q_dtype="bfloat16", kv_dtype="int8", per_token_scales=True, chip=get_chip(chip))
    # XLA may keep small operands (q, the gathered scales) in VMEM, which Mosaic then need not buffer.
    assert kernel.scoped_vmem_bytes <= estimate


def test_vmem_estimate_hand_worked():
    # Decode at GQA 4, 8 kv heads, head_dim 128, bf16 pages of 16, 8 pages (128 tokens) per block:
    #   q and out blocks: 2 * 2 * 8 heads * ([4, 128] bf16: 4-row tile) 4*128*2 = 32 KiB
    #   K and V two-slot page buffers of all 8 kv heads: 2 * 2 * 8 * 8 * 16*128*2 = 1024 KiB
    #   f32 max / sum [8, 4, 128] and accumulator [8, 4, 128]: 3 * 8 * 4*128*4 = 48 KiB   -> 1104 KiB
    #   (Mosaic's figure for the same block at 64-token pages, 2 pages per block: 1130496 B = 1104 KiB)
    # int8 pages with per-token scales add [8 heads, 16 blocks, 128 tokens] f32 rows, 2 buffers each for K
    # and V (256 KiB), and halve the page buffers (512 KiB): 848 KiB; on tpu-v4 (no bf16 VPU) Mosaic also
    # widens K and V through f32: 2.75 * 128*128*4 = 176 KiB more (Mosaic: 1020 KiB in all).
    sizes = PBS(pages_per_compute_block=8)
    kw = dict(page_size=16, pages_per_seq=128, num_q_per_kv=4, kv_heads=8, head_dim=128, q_dtype="bfloat16")
    assert sizes.vmem_bytes(**kw, kv_dtype="bfloat16", per_token_scales=None) == 1104 * 2**10
    v5e, v4 = get_chip("tpu-v5e"), get_chip("tpu-v4")
    assert sizes.vmem_bytes(**kw, kv_dtype="int8", per_token_scales=True, chip=v5e) == 848 * 2**10
    assert sizes.vmem_bytes(**kw, kv_dtype="int8", per_token_scales=True, chip=v4) == (848 + 176) * 2**10


# ----------------------------------------------------------------------------- prefetch across grid steps


def _ragged_batch(seed: int):
    """Six sequences (empty ones first, between and last) with page-boundary and partial lengths, 16-token pages,
    two 128-token compute blocks per sequence: every prefetch case (next block, next sequence, an empty next
    sequence, the last sequence of a core) and garbage page-table entries past each length."""
    fmt = FORMATS[1]
    shape = Shape("ragged", 8, 2, 128, (0.0, 0.5, 1.0, 0.0, 0.0625 + 1 / 256, 0.0), 2)
    inputs, ppcb = _make(shape, fmt, seed=seed)
    # 256-token capacity: lengths 0, 128 (a block boundary), 256 (full), 0, 17 (one token into page 2), 0.
    assert list(np.asarray(inputs["lengths"])) == [0, 128, 256, 0, 17, 0]
    return inputs, ppcb, fmt


@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v5p"])  # one core; megacore: two halves of three sequences
def test_prefetch_across_sequences_with_empty_and_ragged_lengths(chip):
    inputs, ppcb, fmt = _ragged_batch(seed=21)
    out = paged_attention(**inputs, block_sizes=PBS(pages_per_compute_block=ppcb), chip=chip, interpret=True)
    _check(out, paged_attention_reference(**_reference_inputs(inputs)), fmt)
    empty = np.asarray(inputs["lengths"]) == 0
    assert np.all(np.asarray(out, np.float32)[empty] == 0.0)


def test_no_races_on_two_cores():
    # tpu-v5p (megacore): grid (2 cores, 3 sequences), the sequence axis carries a DMA from one step to the next.
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret

    inputs, ppcb, fmt = _ragged_batch(seed=22)
    params = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)
    out = paged_attention(**inputs, block_sizes=PBS(pages_per_compute_block=ppcb), chip="tpu-v5p", interpret=params)
    _check(out, paged_attention_reference(**_reference_inputs(inputs)), fmt)
    assert tpu_interpret.races is not None and not tpu_interpret.races.races_found
