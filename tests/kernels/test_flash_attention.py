"""flash_attention (prefill) kernel beyond the shared contract (tests/kernels/test_contract.py: lowering, cost
estimate, tuned defaults, a small default-block call vs the reference): tilings, masks and windows in interpret mode
vs the pure-jnp reference and JAX's shipped kernel, block skipping, block sizes and VMEM, the real compiler, input
validation."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash

from kernels.flash_attention import (
    FlashAttentionBlockSizes,
    attention_mask,
    default_block_sizes,
    flash_attention,
    flash_attention_reference,
)
from kernels.flash_attention import DEFAULT_BLOCK_SIZES
from kernels.flash_attention.kernel import kv_block_range, make_plan
from perfmodel.hw import get_chip
from perfmodel.schedule.shapes import parse_shape
from kernels.tuned import load_tuned_file

#: (atol, rtol) per input dtype. bf16: the kernel feeds bf16 probabilities to
#: the PV matmul and rounds the output to bf16 (8 mantissa bits, ~4e-3 relative).
TOLERANCES = {"float32": (2e-5, 2e-5), "bfloat16": (1.5e-2, 1.5e-2)}

BS = FlashAttentionBlockSizes
SLOW = pytest.mark.slow


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    window: int | None
    blocks: FlashAttentionBlockSizes


CASES = [
    # MHA, aligned: 2 q blocks x 2 kv blocks, diagonal tiles masked, the upper one skipped.
    Case("mha-causal", 1, 2, 2, 256, 256, 128, True, None, BS(block_q=128, block_kv=128)),
    # GQA 4, prefill chunk after a 260-token prefix, unaligned: kv tail block of 44 rows,
    # two 128-row compute slices per 256-row K/V block.
    Case("gqa4-causal-prefix", 1, 4, 1, 40, 300, 128, True, None, BS(block_q=16, block_kv=256, block_kv_compute=128)),
    # GQA 8, bidirectional, unaligned q and kv, head_dim 64.
    Case("gqa8-full", 2, 8, 1, 72, 200, 64, False, None, BS(block_q=32, block_kv=128)),
    # GQA 4 with a sliding window: blocks skipped on both sides of the band.
    Case("gqa4-window", 1, 8, 2, 256, 256, 128, True, 100, BS(block_q=32, block_kv=128)),
    # Sequences shorter than one block: blocks shrink to the whole sequence.
    Case("short", 2, 2, 1, 8, 72, 128, True, None, BS(block_q=128, block_kv=512)),
    # A window wider than the sequence behaves as plain causal.
    Case("wide-window", 1, 2, 1, 48, 160, 128, True, 1000, BS(block_q=16, block_kv=128)),
]


def _inputs(case: Case, dtype, seed: int = 0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (case.batch, case.q_heads, case.q_len, case.head_dim), jnp.float32)
    k = jax.random.normal(kk, (case.batch, case.kv_heads, case.kv_len, case.head_dim), jnp.float32)
    v = jax.random.normal(kv, (case.batch, case.kv_heads, case.kv_len, case.head_dim), jnp.float32)
    # Scale q up a little so the softmax is peaked, not near-uniform.
    return (2.0 * q).astype(dtype), k.astype(dtype), v.astype(dtype)


def _check(out, ref, dtype_name):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    # Interpret mode fills unwritten buffers with NaN: a skipped write shows up here.
    assert not np.isnan(out).any(), f"{np.isnan(out).sum()} output elements never written"
    atol, rtol = TOLERANCES[dtype_name]
    np.testing.assert_allclose(out, np.asarray(ref), atol=atol, rtol=rtol)


def _reference_cases() -> list:
    # Every case in bf16; f32 on the smallest ("short"); the other f32 cases: -m slow.
    cases = []
    for case in CASES:
        for dtype, dtype_id in [(jnp.float32, "f32"), (jnp.bfloat16, "bf16")]:
            marks = SLOW if dtype_id == "f32" and case.id != "short" else ()
            cases.append(pytest.param(case, dtype, marks=marks, id=f"{case.id}-{dtype_id}"))
    return cases


@pytest.mark.parametrize("case, dtype", _reference_cases())
def test_matches_reference(case, dtype):
    q, k, v = _inputs(case, dtype)
    out = flash_attention(q, k, v, causal=case.causal, sliding_window=case.window, block_sizes=case.blocks,
                          interpret=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = flash_attention_reference(q, k, v, causal=case.causal, sliding_window=case.window)
    _check(out, ref, jnp.dtype(dtype).name)


def test_custom_sm_scale():
    case = CASES[0]
    q, k, v = _inputs(case, jnp.float32, seed=3)
    out = flash_attention(q, k, v, sm_scale=0.3, block_sizes=case.blocks, interpret=True)
    _check(out, flash_attention_reference(q, k, v, sm_scale=0.3), "float32")


def test_never_visible_blocks_are_not_computed():
    # 128 queries at positions 384..511 with a 64-key window see keys >= 384 - 63 = 321,
    # i.e. K/V blocks 2 and 3 (block_kv = 128); blocks 0 and 1 (keys 0..255) are never
    # visible. Poison their V with NaN: computing them (even masked, p = 0) would give
    # 0 * NaN = NaN in the output.
    case = Case("poison", 1, 4, 1, 128, 512, 128, True, 64, BS(block_q=32, block_kv=128))
    q, k, v = _inputs(case, jnp.float32, seed=1)
    v_poisoned = v.at[:, :, :256].set(jnp.nan)
    k_poisoned = k.at[:, :, :256].set(jnp.nan)
    out = flash_attention(q, k_poisoned, v_poisoned, sliding_window=64, block_sizes=case.blocks, interpret=True)
    _check(out, flash_attention_reference(q, k, v, sliding_window=64), "float32")


def _jax_blocks(block: int) -> jax_flash.BlockSizes:
    return jax_flash.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)


# Causal by default; bidirectional (also checked against the reference by "gqa8-full"): -m slow.
@pytest.mark.parametrize("causal", [True, pytest.param(False, marks=SLOW)], ids=["causal", "full"])
def test_agrees_with_jax_shipped_kernel(causal):
    # Independent check: JAX's own Pallas TPU flash attention (MHA only, so K/V heads
    # are repeated for it), run in TPU interpret mode. With q_len == kv_len both
    # kernels put query i at position i.
    case = Case("jax", 1, 4, 2, 256, 256, 128, causal, None, BS(block_q=128, block_kv=128))
    q, k, v = _inputs(case, jnp.float32, seed=2)
    scale = 1.0 / math.sqrt(case.head_dim)
    ours = flash_attention(q, k, v, causal=causal, block_sizes=case.blocks, interpret=True)
    k_rep, v_rep = (jnp.repeat(x, case.q_heads // case.kv_heads, axis=1) for x in (k, v))
    with pltpu.force_tpu_interpret_mode():
        theirs = jax_flash.flash_attention(q, k_rep, v_rep, causal=causal, sm_scale=scale,
                                           block_sizes=_jax_blocks(128))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[CASES[0].id, CASES[2].id])
def test_reference_agrees_with_jax_reference(case):
    # JAX's pure-jnp mha_reference_no_custom_vjp, on repeated K/V heads (it has no GQA).
    q, k, v = _inputs(case, jnp.float32, seed=4)
    scale = 1.0 / math.sqrt(case.head_dim)
    k_rep, v_rep = (jnp.repeat(x, case.q_heads // case.kv_heads, axis=1) for x in (k, v))
    with jax.default_matmul_precision("highest"):
        theirs = jax_flash.mha_reference_no_custom_vjp(q, k_rep, v_rep, causal=case.causal, sm_scale=scale)
    ours = flash_attention_reference(q, k, v, causal=case.causal)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- soft-cap, sinks, segment ids


def _segments(lengths: list[int], batch: int) -> jnp.ndarray:
    """[batch, sum(lengths)] int32: packed sequences of these lengths, ids 0, 1, ... (rows shifted by 1 per batch)."""
    ids = np.concatenate([np.full(n, i, np.int32) for i, n in enumerate(lengths)])
    return jnp.asarray(np.stack([ids + b for b in range(batch)]))


FEATURE_CASES = [
    # GQA 2, causal, aligned 2x2 blocks: soft-cap 5 bites (scores scaled by 2 reach |s| ~ 10).
    pytest.param(Case("cap", 1, 4, 2, 256, 256, 128, True, None, BS(block_q=128, block_kv=128)),
                 dict(logit_soft_cap=5.0), id="soft-cap"),
    # GQA 4, a chunk after a prefix, unaligned tail, two compute slices: per-head sinks, one above the scores.
    pytest.param(Case("sinks", 1, 4, 1, 40, 300, 128, True, None, BS(block_q=16, block_kv=256, block_kv_compute=128)),
                 dict(sinks=jnp.array([0.0, 3.0, -2.0, 30.0], jnp.float32)), id="sinks"),
    # GQA 2, causal, packed sequences of 100, 60 and 96 tokens (boundaries inside blocks), two batch rows.
    pytest.param(Case("seg", 2, 4, 2, 256, 256, 128, True, None, BS(block_q=64, block_kv=128)),
                 dict(segments=[100, 60, 96]), id="segments-causal"),
    # Sliding window + segments + soft-cap + sinks together, GQA 2, unaligned.
    pytest.param(Case("all", 1, 2, 1, 200, 200, 128, True, 48, BS(block_q=32, block_kv=128)),
                 dict(segments=[70, 130], logit_soft_cap=8.0, sinks=jnp.array([1.0, -1.0], jnp.float32)),
                 id="window-segments-cap-sinks"),
]


def _feature_kwargs(case: Case, features: dict) -> dict:
    kwargs = {k: v for k, v in features.items() if k != "segments"}
    if "segments" in features:
        ids = _segments(features["segments"], case.batch)
        kwargs.update(q_segment_ids=ids[:, case.kv_len - case.q_len:], kv_segment_ids=ids)
    return kwargs


@pytest.mark.parametrize("case, features", FEATURE_CASES)
def test_features_match_reference(case, features):
    q, k, v = _inputs(case, jnp.float32, seed=5)
    kwargs = _feature_kwargs(case, features)
    out = flash_attention(q, k, v, causal=case.causal, sliding_window=case.window, block_sizes=case.blocks,
                          interpret=True, **kwargs)
    ref = flash_attention_reference(q, k, v, causal=case.causal, sliding_window=case.window, **kwargs)
    _check(out, ref, "float32")
    # Each feature changes the result (else the test would pass with it ignored).
    plain = flash_attention_reference(q, k, v, causal=case.causal, sliding_window=case.window)
    assert np.abs(np.asarray(ref) - np.asarray(plain)).max() > 1e-2


def test_sinks_hand_worked():
    # One query, one key (q_len = kv_len = 1, causal): the softmax is over {score, sink}. q . k = 0 (q = 0), so
    # p_key = e^0 / (e^0 + e^sink); sink = ln 3 -> p_key = 1/4 and the output is v / 4.
    q = jnp.zeros((1, 1, 1, 128), jnp.float32)
    k = jnp.ones((1, 1, 1, 128), jnp.float32)
    v = jnp.full((1, 1, 1, 128), 2.0, jnp.float32)
    sinks = jnp.array([math.log(3.0)], jnp.float32)
    out = flash_attention(q, k, v, sinks=sinks, interpret=True)
    np.testing.assert_allclose(np.asarray(out), 0.5, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(flash_attention_reference(q, k, v, sinks=sinks)), 0.5, rtol=1e-6)


def test_query_without_visible_key_outputs_zeros():
    # Bidirectional, segment ids: queries of segment 7 match no key (keys are segments 0 and 1) -> zeros, no NaN.
    case = Case("orphan", 1, 2, 1, 64, 256, 128, False, None, BS(block_q=32, block_kv=128))
    q, k, v = _inputs(case, jnp.float32, seed=6)
    q_ids = jnp.asarray(np.r_[np.zeros(40, np.int32), np.full(24, 7, np.int32)][None])
    kv_ids = _segments([100, 156], 1)
    out = flash_attention(q, k, v, causal=False, q_segment_ids=q_ids, kv_segment_ids=kv_ids,
                          block_sizes=case.blocks, interpret=True)
    ref = flash_attention_reference(q, k, v, causal=False, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    _check(out, ref, "float32")
    assert not np.asarray(out)[0, :, 40:].any()


def test_cost_estimate_counts_the_feature_inputs():
    # GQA 2 (4 q / 2 kv heads), batch 1, causal 256 tokens, 128-blocks: tiles per kv head = 3 (q block 0 -> kv 0;
    # q block 1 -> kv 0, 1). Sinks: one f32 (8, 128) tile per q head = 4 * 4096 B = 16384 B. Segment ids: q ids
    # over 128 lanes per kv head 2 * 256 * 128 * 4 = 262144 B, kv ids over 8 sublanes per tile
    # 2 * 3 * 128 * 8 * 4 = 24576 B. Soft-cap: one tanh per computed score, 3 tiles * 128 * 128 * 4 heads = 196608.
    from kernels.flash_attention.kernel import cost_estimate

    q = jax.ShapeDtypeStruct((1, 4, 256, 128), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 2, 256, 128), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, 256), jnp.int32)
    blocks = BS(block_q=128, block_kv=128)
    plain = cost_estimate(make_plan(q, kv, kv, causal=True, sliding_window=None, sm_scale=None, block_sizes=blocks,
                                    chip="tpu-v5e"))
    featured = cost_estimate(make_plan(q, kv, kv, causal=True, sliding_window=None, sm_scale=None,
                                       block_sizes=blocks, chip="tpu-v5e", logit_soft_cap=30.0,
                                       sinks=jax.ShapeDtypeStruct((4,), jnp.float32), q_segment_ids=ids,
                                       kv_segment_ids=ids))
    assert featured.bytes_accessed - plain.bytes_accessed == 16384 + 262144 + 24576
    assert featured.transcendentals - plain.transcendentals == 196608
    # CostEstimate flops count VPU ops too: the cap adds two multiplies per score (the mask is counted: causal).
    assert featured.flops - plain.flops == 2 * 196608


# ----------------------------------------------------------------------------- block skipping


def _plan(q_len, kv_len, *, causal=True, window=None, block_q=128, block_kv=128, heads=(1, 1), head_dim=128):
    q = jax.ShapeDtypeStruct((1, heads[0], q_len, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, heads[1], kv_len, head_dim), jnp.bfloat16)
    return make_plan(q, kv, kv, causal=causal, sliding_window=window, sm_scale=None,
                     block_sizes=BS(block_q=block_q, block_kv=block_kv), chip="tpu-v5e")


@pytest.mark.parametrize(
    "q_len, kv_len, causal, window, block_q, block_kv",
    [(256, 256, True, None, 32, 128), (40, 300, True, None, 16, 128), (300, 300, True, 50, 32, 128),
     (200, 1000, True, 130, 64, 128), (72, 200, False, None, 32, 128), (96, 640, True, 1, 32, 128)],
)
def test_kv_block_range_is_exact(q_len, kv_len, causal, window, block_q, block_kv):
    """The visited K/V blocks of each query block are exactly those with a visible key."""
    plan = _plan(q_len, kv_len, causal=causal, window=window, block_q=block_q, block_kv=block_kv)
    mask = np.asarray(attention_mask(q_len, kv_len, causal=causal, sliding_window=window))
    spans = []
    for qi in range(plan.q_blocks):
        rows = mask[qi * block_q:(qi + 1) * block_q]
        needed = [kb for kb in range(plan.kv_blocks) if rows[:, kb * block_kv:(kb + 1) * block_kv].any()]
        first, last = (int(x) for x in kv_block_range(plan, qi, np))
        assert needed == list(range(first, last + 1)), f"q block {qi}"
        spans.append(last - first + 1)
    assert plan.kv_steps == max(spans)


def test_sliding_window_shrinks_the_grid():
    # 8k causal, window 1024, 512-blocks: q block i needs keys [512 i - 1023, 512 i + 511],
    # which start in block i - 2 (512 (i-2) + 1) and end in block i: 3 blocks, not 16.
    assert _plan(8192, 8192, window=1024, block_q=512, block_kv=512).kv_steps == 3
    # Plain causal: the last q block needs all 16.
    assert _plan(8192, 8192, block_q=512, block_kv=512).kv_steps == 16


# ----------------------------------------------------------------------------- block sizes


def test_defaults_exist_for_every_pallas_tpu_and_fit_vmem():
    for chip in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x"):
        limit = get_chip(chip).memory.vmem_default_scoped_limit_bytes_per_core
        for group in (1, 4, 8, 16):
            sizes = default_block_sizes(chip, group=group, head_dim=128, vmem_limit=limit)
            assert sizes.vmem_bytes(q_dtype="bfloat16", kv_dtype="bfloat16", head_dim=128, group=group,
                                    q_len=8192, kv_len=8192) <= limit, (chip, group)


def test_defaults_shrink_block_q_for_large_groups():
    limit = get_chip("tpu-v5e").memory.vmem_default_scoped_limit_bytes_per_core
    small = default_block_sizes("tpu-v5e", group=1, vmem_limit=limit)
    big = default_block_sizes("tpu-v5e", group=16, vmem_limit=limit)
    assert big.block_q < small.block_q
    assert big.block_kv == small.block_kv


def _stored_blocks(entry: dict) -> FlashAttentionBlockSizes:
    return BS(block_q=entry["block_q"], block_kv=entry["block_kv"], block_kv_compute=entry["block_kv_compute"])


def test_f32_queries_take_the_bf16_defaults_before_fitting():
    # The stored defaults themselves: tests/kernels/test_contract.py. f32 queries are not tuned separately: the
    # bf16 entry, before fitting.
    for chip, configs in load_tuned_file("flash_attention")["defaults"].items():
        assert default_block_sizes(chip, q_dtype="float32", kv_dtype="float32") == _stored_blocks(configs["bf16"])


@pytest.mark.parametrize("chip", sorted(DEFAULT_BLOCK_SIZES))
def test_stored_defaults_pass_validation_at_the_tuned_shape(chip):
    data = load_tuned_file("flash_attention")
    q, k, _ = (parse_shape(t).shape for t in data["shapes"]["bf16"])
    shape = dict(q_dtype="bfloat16", kv_dtype="bfloat16", head_dim=q[3], group=q[1] // k[1], q_len=q[2], kv_len=k[2])
    sizes = DEFAULT_BLOCK_SIZES[chip]
    sizes.validate(**shape, spec=get_chip(chip))  # raises over the default scoped VMEM limit
    assert data["defaults"][chip]["bf16"]["vmem_limit_bytes"] is None  # this kernel never raises the limit
    # At the shape it was tuned on, fitting to the scoped limit changes nothing.
    limit = get_chip(chip).memory.vmem_default_scoped_limit_bytes_per_core
    assert default_block_sizes(chip, **shape, vmem_limit=limit) == sizes


def test_f32_defaults_shrink_until_they_fit():
    # f32 doubles every buffer: the fitted defaults still pass validation on every chip, GQA 4 at 8k tokens.
    for chip in DEFAULT_BLOCK_SIZES:
        spec = get_chip(chip)
        shape = dict(q_dtype="float32", kv_dtype="float32", head_dim=128, group=4, q_len=8192, kv_len=8192)
        sizes = default_block_sizes(chip, **shape, vmem_limit=spec.memory.vmem_default_scoped_limit_bytes_per_core)
        sizes.validate(**shape, spec=spec)


def test_fitting_halves_block_q_then_block_kv(monkeypatch):
    # Hand-worked, tpu-v5e (16 MiB scoped), f32, head_dim 128, group 1, 8192 tokens, blocks 64 / 8192 / 256:
    # pipelined 2 * (2*1*bq*128*4 + 2*bkv*128*4), scratch 4*bq*(256+128), temporaries bq*256*(8+4).
    # bq 64: 2*(65536 + 8388608) = 16908288 + 98304 + 196608 > 16 MiB (16777216). block_q halves to 32, 16, 8
    # (the f32 sublane floor): 2*(8192 + 8388608) + 12288 + 24576 = 16830464 still > 16 MiB; then block_kv
    # halves to 4096: 2*(8192 + 4194304) + 12288 + 24576 = 8441856 <= 16 MiB.
    import kernels.flash_attention.blocks as fb

    monkeypatch.setattr(fb, "default_block_table",
                        lambda: {"tpu-v5e": {"bf16": BS(block_q=64, block_kv=8192, block_kv_compute=256)}})
    sizes = default_block_sizes("tpu-v5e", q_dtype="float32", kv_dtype="float32", head_dim=128, group=1,
                                q_len=8192, kv_len=8192, vmem_limit=16 * 2**20)
    assert sizes == BS(block_q=8, block_kv=4096, block_kv_compute=256)


def test_effective_blocks_shrink_to_short_sequences():
    sizes = BS(block_q=512, block_kv=1024, block_kv_compute=256)
    assert sizes.effective(q_len=40, kv_len=100) == (40, 100, 100)  # one slice: whole sequence
    assert sizes.effective(q_len=40, kv_len=700) == (40, 512, 256)  # 2 slices of 256 fit in 700
    assert sizes.effective(q_len=4096, kv_len=4096) == (512, 1024, 256)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_q=0, block_kv=128), r"block_sizes\.block_q: must be a positive int"),
        (dict(block_q=True, block_kv=128), r"block_sizes\.block_q: must be a positive int"),
        (dict(block_q=12, block_kv=128), r"block_sizes\.block_q: 12 is not a multiple of 8"),
        (dict(block_q=16, block_kv=200), r"block_sizes\.block_kv: 200 is not a multiple of 128"),
        (dict(block_q=16, block_kv=512, block_kv_compute=384), r"block_kv_compute: 384 does not divide"),
        (dict(block_q=16, block_kv=256, block_kv_compute=100), r"block_kv_compute: 100 is not a multiple of 128"),
    ],
)
def test_block_sizes_validate_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BS(**kwargs)


# ----------------------------------------------------------------------------- bad input


def _sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


Q = _sds((1, 8, 256, 128))
KV = _sds((1, 2, 256, 128))


@pytest.mark.parametrize(
    "q, k, v, kwargs, match",
    [
        (_sds((8, 256, 128)), KV, KV, {}, r"q: expected rank 4"),
        (Q, KV, _sds((1, 2, 128, 128)), {}, r"v: shape .* must equal k's shape"),
        (Q, _sds((2, 2, 256, 128)), _sds((2, 2, 256, 128)), {}, r"k: batch 2 does not match q's batch 1"),
        (Q, _sds((1, 2, 256, 64)), _sds((1, 2, 256, 64)), {}, r"k: head_dim 64 does not match"),
        (Q, _sds((1, 3, 256, 128)), _sds((1, 3, 256, 128)), {}, r"k: kv_heads=3 does not divide q_heads=8"),
        (Q, _sds((1, 2, 256, 128), jnp.float32), _sds((1, 2, 256, 128), jnp.float32), {},
         r"k, v: dtypes .* must equal q's dtype"),
        (_sds((1, 8, 256, 128), jnp.float16), _sds((1, 2, 256, 128), jnp.float16),
         _sds((1, 2, 256, 128), jnp.float16), {}, r"q: dtype float16 is not supported"),
        (_sds((1, 8, 256, 128), jnp.float8_e4m3fn), _sds((1, 2, 256, 128), jnp.float8_e4m3fn),
         _sds((1, 2, 256, 128), jnp.float8_e4m3fn), {}, r"q: dtype float8_e4m3fn is not supported"),
        (_sds((1, 8, 300, 128)), KV, KV, {}, r"q: q_len=300 > kv_len=256"),
        (Q, KV, KV, dict(sliding_window=0), r"sliding_window: must be a positive int"),
        (Q, KV, KV, dict(sliding_window=64, causal=False), r"sliding_window: needs causal=True"),
        (Q, KV, KV, dict(block_sizes=BS(block_q=8, block_kv=128)), r"block_q: 8 is not a multiple of 16"),
        (Q, KV, KV, dict(block_sizes=(128, 128)), r"block_sizes: expected FlashAttentionBlockSizes"),
        (_sds((1, 8, 8192, 128)), _sds((1, 2, 8192, 128)), _sds((1, 2, 8192, 128)),
         dict(block_sizes=BS(block_q=4096, block_kv=8192)), r"block_sizes: block_q=4096, .* need .* of VMEM, over the .* scoped limit of tpu-v5e; use smaller blocks"),
        (Q, KV, KV, dict(logit_soft_cap=0.0), r"logit_soft_cap: must be a positive finite number"),
        (Q, KV, KV, dict(logit_soft_cap=float("inf")), r"logit_soft_cap: must be a positive finite number"),
        (Q, KV, KV, dict(sinks=jnp.zeros((2,))), r"sinks: expected shape \(8,\) \(one logit per q head\)"),
        (Q, KV, KV, dict(sinks=jnp.zeros((8,), jnp.int32)), r"sinks: expected a float array"),
        (Q, KV, KV, dict(q_segment_ids=jnp.zeros((1, 256), jnp.int32)), r"q_segment_ids, kv_segment_ids: give both"),
        (Q, KV, KV, dict(q_segment_ids=jnp.zeros((1, 128), jnp.int32), kv_segment_ids=jnp.zeros((1, 256), jnp.int32)),
         r"q_segment_ids: expected shape \(1, 256\) \[batch, seq_len\], got \(1, 128\)"),
        (Q, KV, KV, dict(q_segment_ids=jnp.zeros((1, 256), jnp.int32), kv_segment_ids=jnp.zeros((1, 256))),
         r"kv_segment_ids: expected an integer array"),
        (Q, KV, KV, dict(chip="tpu-v9z"), r"unknown chip 'tpu-v9z'"),
        (Q, KV, KV, dict(chip="h100-sxm"), r"chip: 'h100-sxm' is a GPU"),
    ],
)
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_input_raises_value_error_naming_the_argument(q, k, v, kwargs, match):
    fn = jax.jit(lambda q, k, v: flash_attention(q, k, v, **kwargs))
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(fn, q, k, v)


def test_a_chip_the_json_lacks_takes_the_reference_chips_defaults():
    # the one policy of every kernel (kernels.tiling.tuned_entry_chip): tpu-v3 has no entry, it takes tpu-v5e's
    assert "tpu-v3" not in DEFAULT_BLOCK_SIZES
    assert default_block_sizes("tpu-v3") == default_block_sizes("tpu-v5e")


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 300], ids=["causal", "window"])
def test_larger_prefill_matches_reference(window):
    # 1k tokens, GQA 8, bf16, several blocks on every axis.
    case = Case("large", 1, 8, 1, 1024, 1024, 128, True, window, BS(block_q=128, block_kv=256, block_kv_compute=128))
    q, k, v = _inputs(case, jnp.bfloat16, seed=11)
    out = flash_attention(q, k, v, sliding_window=window, block_sizes=case.blocks, interpret=True)
    _check(out, flash_attention_reference(q, k, v, sliding_window=window), "bfloat16")


# ----------------------------------------------------------------------------- the real compiler


def _libtpu() -> bool:
    from perfmodel.compiler.toolchain import available

    return available()


# tpu-v5e and tpu-v6e by default (the compile matrix, tests/compiler, compiles the same catalog call: one compile per
# chip in a whole run); tpu-7x: -m slow.
@pytest.mark.needs_libtpu
@pytest.mark.skipif(not _libtpu(), reason="libtpu not installed: pip install -e '.[tpu-compiler]'")
@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v6e", pytest.param("tpu-7x", marks=SLOW)])
def test_tuned_defaults_compile_within_the_estimate(chip):
    # Regression: with the group's heads and the compute slices unrolled, Mosaic kept every head's f32
    # score/probability tiles at once and allocated ~44 MiB of scoped VMEM at the v6e/7x defaults (then
    # 1024/2048/1024; over the 32 MiB limit) while the estimate said 22 MiB. The body now loops over
    # heads and slices, and the estimate counts one head's temporaries: it must cover Mosaic's figure.
    from perfmodel.compiler.api import CompileCall, compile_report

    shapes = ("q=1x32x8192x128:bf16", "k=1x8x8192x128:bf16", "v=1x8x8192x128:bf16")
    report = compile_report(CompileCall(kind="catalog", target="flash_attention", shapes=shapes), get_chip(chip))
    assert report.compiled, report.error
    (kernel,) = report.kernels
    spec = get_chip(chip)
    sizes = default_block_sizes(chip, group=4, vmem_limit=spec.memory.vmem_default_scoped_limit_bytes_per_core)
    estimate = sizes.vmem_bytes(q_dtype="bfloat16", kv_dtype="bfloat16", head_dim=128, group=4, q_len=8192,
                                kv_len=8192)
    assert kernel.scoped_vmem_bytes <= estimate <= 1.15 * kernel.scoped_vmem_bytes


def test_vmem_estimate_hand_worked():
    # The v6e/7x defaults 1024/1024/1024 at GQA 4, bf16, head_dim 128:
    #   q and out blocks 2 * 2 * (4 * 1024 * 128 * 2) = 4 MiB, K and V blocks 2 * 2 * (1024 * 128 * 2) = 1 MiB
    #   f32 scratch: max and sum 2 * 4 * 1024 * 128 * 4 = 4 MiB, accumulator 4 * 1024 * 128 * 4 = 2 MiB
    #   one head's [1024, 1024] score tile in f32 + probabilities in bf16: 1024 * 1024 * 6 = 6 MiB
    # -> 17 MiB (Mosaic allocates 15.6 MiB on v6e, 16.0 MiB on 7x).
    sizes = FlashAttentionBlockSizes(block_q=1024, block_kv=1024, block_kv_compute=1024)
    assert sizes.vmem_bytes(q_dtype="bfloat16", kv_dtype="bfloat16", head_dim=128, group=4, q_len=8192,
                            kv_len=8192) == 17 * 2**20
    # f32 adds four [block_q, head_dim] f32 tiles for the HIGHEST-precision splits, and f32 probabilities.
    f32 = FlashAttentionBlockSizes(block_q=256, block_kv=1024, block_kv_compute=512)
    # q/out 2*2*(4*256*128*4) = 2 MiB, K/V 2*2*(1024*128*4) = 2 MiB, scratch 4*4*256*384 = 1.5 MiB,
    # scores + probabilities 256*512*8 = 1 MiB, splits 4*256*128*4 = 0.5 MiB -> 7 MiB (Mosaic: 6.5-6.7 MiB).
    assert f32.vmem_bytes(q_dtype="float32", kv_dtype="float32", head_dim=128, group=4, q_len=8192,
                          kv_len=8192) == 7 * 2**20
