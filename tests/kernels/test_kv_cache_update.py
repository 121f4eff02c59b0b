"""Paged KV-cache update kernel: interpret mode vs the jnp reference on poisoned caches, lowering, cost, errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.kv_cache_update import (
    DEFAULT_BLOCK_SIZES,
    KvCacheUpdateBlockSizes,
    kv_cache_update,
    kv_cache_update_reference,
)
from kernels.matmul.lowering import MOSAIC_CUSTOM_CALL, cost_estimates, export_for_tpu
from perfmodel.errors import UnknownChipError
from perfmodel.hw.registry import get_chip

PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM = 6, 8, 2, 128
#: Values untouched cache slots hold: NaN in float caches, 77 in int8 caches, -5 in scale caches.
SENTINEL = {jnp.dtype(jnp.bfloat16): np.nan, jnp.dtype(jnp.float32): np.nan, jnp.dtype(jnp.int8): 77}
SCALE_SENTINEL = -5.0
#: The update is a copy (exact) or a quantization that must agree with the reference's codes to +-1
#: (rounding at .5 boundaries) and its scales to f32 rounding.
TOL = {
    jnp.dtype(jnp.bfloat16): dict(rtol=0, atol=0),
    jnp.dtype(jnp.float32): dict(rtol=0, atol=0),
    jnp.dtype(jnp.int8): dict(rtol=0, atol=1),
}
SCALE_TOL = dict(rtol=1e-6, atol=0)
SMALL = KvCacheUpdateBlockSizes(tokens_per_block=4)
S = jax.ShapeDtypeStruct


def _caches(cache_dtype, quantize: bool) -> dict[str, np.ndarray]:
    shape = (PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM)
    fill = SENTINEL[jnp.dtype(cache_dtype)]
    caches = {"k_cache": np.full(shape, fill).astype(cache_dtype), "v_cache": np.full(shape, fill).astype(cache_dtype)}
    if quantize:
        scale_shape = (PAGES, PAGE_SIZE, KV_HEADS, 1)
        caches["k_scale_cache"] = np.full(scale_shape, SCALE_SENTINEL, np.float32)
        caches["v_scale_cache"] = np.full(scale_shape, SCALE_SENTINEL, np.float32)
    return caches


def _new_tokens(seed: int, num_tokens: int, dtype):
    rng = np.random.default_rng(seed)
    new_k = jnp.asarray(rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)), dtype)
    new_v = jnp.asarray(rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)), dtype)
    slots = rng.choice(PAGES * PAGE_SIZE, num_tokens, replace=False).astype(np.int32)
    slots[num_tokens // 2] = -1  # a padding token: not written
    return new_k, new_v, slots


def _run(new_k, new_v, slots, caches, **kwargs):
    # Fresh device copies: the kernel donates (consumes) the caches it is given.
    args = {name: jnp.asarray(c) for name, c in caches.items()}
    k_cache, v_cache = args.pop("k_cache"), args.pop("v_cache")
    return kv_cache_update(new_k, new_v, k_cache, v_cache, jnp.asarray(slots), **args, **kwargs)


def _written_mask(slots: np.ndarray, tail: int) -> np.ndarray:
    mask = np.zeros(PAGES * PAGE_SIZE, bool)
    mask[slots[slots >= 0]] = True
    return mask.reshape(PAGES, PAGE_SIZE, *([1] * tail))


@pytest.mark.parametrize("quantize", [False, True], ids=["copy", "int8"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("num_tokens", [16, 13], ids=["16tok", "13tok"])  # 13: partial last block of 4
def test_matches_reference_and_leaves_other_slots_untouched(quantize, dtype, num_tokens):
    new_k, new_v, slots = _new_tokens(num_tokens + 7 * quantize, num_tokens, dtype)
    cache_dtype = jnp.int8 if quantize else dtype
    caches = _caches(cache_dtype, quantize)
    outs = _run(new_k, new_v, slots, caches, block_sizes=SMALL, interpret=True)
    ref_caches = {name: jnp.asarray(c) for name, c in caches.items()}
    refs = kv_cache_update_reference(new_k, new_v, ref_caches.pop("k_cache"), ref_caches.pop("v_cache"),
                                     jnp.asarray(slots), **ref_caches)
    assert len(outs) == len(caches)
    for (name, before), out, ref in zip(caches.items(), outs, refs):
        out, ref = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
        assert out.shape == before.shape, name
        written = np.broadcast_to(_written_mask(slots, out.ndim - 2), out.shape)
        # Every written element matches the reference ...
        tol = SCALE_TOL if "scale" in name else TOL[jnp.dtype(cache_dtype)]
        np.testing.assert_allclose(out[written], ref[written], **tol, err_msg=name)
        assert np.isfinite(out[written]).all(), name
        # ... and every other element still holds its sentinel, bit for bit.
        np.testing.assert_array_equal(out[~written], before.astype(np.float32)[~written], err_msg=name)


def test_slot_is_page_times_page_size_plus_offset():
    # Slot 19 with page_size 8 is page 19 // 8 = 2, offset 19 % 8 = 3.
    new = jnp.full((1, KV_HEADS, HEAD_DIM), 2.5, jnp.float32)
    caches = _caches(jnp.float32, False)
    k_cache, v_cache = _run(new, -new, np.array([19], np.int32), caches, interpret=True)
    assert float(k_cache[2, 3, 0, 0]) == 2.5 and float(v_cache[2, 3, 1, 127]) == -2.5
    assert int(np.isnan(np.asarray(k_cache)).sum()) == k_cache.size - KV_HEADS * HEAD_DIM


def test_caches_are_donated_and_updated_in_place():
    new_k, new_v, slots = _new_tokens(1, 4, jnp.float32)
    k_cache = jnp.asarray(_caches(jnp.float32, False)["k_cache"])
    v_cache = jnp.asarray(_caches(jnp.float32, False)["v_cache"])
    kv_cache_update(new_k, new_v, k_cache, v_cache, jnp.asarray(slots), interpret=True)
    assert k_cache.is_deleted() and v_cache.is_deleted()


def test_inside_an_outer_jit_with_traced_slots():
    new_k, new_v, slots = _new_tokens(2, 5, jnp.bfloat16)
    caches = _caches(jnp.bfloat16, False)
    f = jax.jit(lambda nk, nv, kc, vc, s: kv_cache_update(nk, nv, kc, vc, s, interpret=True))
    k_cache, _ = f(new_k, new_v, jnp.asarray(caches["k_cache"]), jnp.asarray(caches["v_cache"]), jnp.asarray(slots))
    ref, _ = kv_cache_update_reference(new_k, new_v, jnp.asarray(caches["k_cache"]), jnp.asarray(caches["v_cache"]),
                                       jnp.asarray(slots))
    np.testing.assert_array_equal(np.asarray(k_cache.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)))


# ----- lowering and cost estimate -----

PROD_NEW = (S((512, 8, 128), jnp.bfloat16),) * 2
PROD_SLOTS = S((512,), jnp.int32)


def test_lowers_to_mosaic_in_place_at_production_shape():
    cache = S((4096, 16, 8, 128), jnp.bfloat16)
    text = export_for_tpu(lambda nk, nv, kc, vc, s: kv_cache_update(nk, nv, kc, vc, s), *PROD_NEW, cache, cache,
                          PROD_SLOTS)
    assert MOSAIC_CUSTOM_CALL in text
    assert "output_operand_aliases" in text  # the caches are aliased input -> output
    assert "kv_cache_update[tokens_per_block=64]" in text


def test_quantized_update_lowers_and_costs_as_the_perfmodel_model():
    from perfmodel.model.kvcache import kv_cache_update as kv_cache_update_model

    cache, scales = S((4096, 16, 8, 128), jnp.int8), S((4096, 16, 8, 1), jnp.float32)
    text = export_for_tpu(
        lambda nk, nv, kc, vc, s, ks, vs: kv_cache_update(nk, nv, kc, vc, s, k_scale_cache=ks, v_scale_cache=vs),
        *PROD_NEW, cache, cache, PROD_SLOTS, scales, scales,
    )
    assert MOSAIC_CUSTOM_CALL in text
    (est,) = cost_estimates(text)
    cost = kv_cache_update_model(num_tokens=512, kv_heads=8, head_dim=128, page_size=16, kv_dtype="int8",
                                 src_dtype="bf16")
    assert est["flops"] == round(cost.useful_flops + cost.vpu_ops)
    assert est["transcendentals"] == round(cost.eup_ops)
    assert est["bytes_accessed"] == round(cost.hbm_read_bytes + cost.hbm_write_bytes)
    # Independent floor: read 2 * 512*8*128 bf16 = 2 MiB, write the same count as int8 = 1 MiB.
    assert est["bytes_accessed"] >= 3 * 2**20


# ----- block sizes -----

def test_block_sizes_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        KvCacheUpdateBlockSizes(64)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMALL.tokens_per_block = 8  # type: ignore[misc]


@pytest.mark.parametrize("chip_name", sorted(DEFAULT_BLOCK_SIZES))
def test_default_table_entries_fit_each_chip(chip_name):
    try:
        chip = get_chip(chip_name)
    except UnknownChipError:
        pytest.skip(f"no spec for {chip_name} yet")
    # 8 kv heads x head_dim 128, bf16 tokens quantized to int8: the heavier of the two paths.
    DEFAULT_BLOCK_SIZES[chip_name].check(kv_heads=8, head_dim=128, new_dtype=jnp.bfloat16, quantize=True, chip=chip)


def test_vmem_estimate_hand_worked():
    # 64 tokens x 8 heads x 128 bf16: one slab 64*16*128*2 B = 256 KiB (8 heads pad to the 16-row
    # bf16 tile); K and V double-buffered = 1 MiB. Quantizing adds two int8 slabs (8 heads pad to 32
    # rows: 64*32*128 = 256 KiB each), two scale blocks 64*8*128*4 = 256 KiB each, two f32 temporaries
    # 64*8*128*4 = 256 KiB each: 1.5 MiB more.
    blocks = KvCacheUpdateBlockSizes(tokens_per_block=64)
    assert blocks.vmem_bytes(kv_heads=8, head_dim=128, new_dtype=jnp.bfloat16, quantize=False) == 2**20
    assert blocks.vmem_bytes(kv_heads=8, head_dim=128, new_dtype=jnp.bfloat16, quantize=True) == 2**20 + 3 * 2**19


# ----- bad input -----

def _bad_call(case: str) -> None:
    new = jnp.ones((3, KV_HEADS, HEAD_DIM), jnp.bfloat16)
    cache = jnp.zeros((PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM), jnp.bfloat16)
    qcache = cache.astype(jnp.int8)
    scales = jnp.zeros((PAGES, PAGE_SIZE, KV_HEADS, 1), jnp.float32)
    slots = jnp.array([0, 9, 17], jnp.int32)
    calls = {
        "new_k_2d": lambda: kv_cache_update(new[0], new[0], cache, cache, slots),
        "new_v_shape": lambda: kv_cache_update(new, new[:2], cache, cache, slots),
        "cache_heads": lambda: kv_cache_update(new, new, cache[:, :, :1], cache[:, :, :1], slots),
        "v_cache_dtype": lambda: kv_cache_update(new, new, cache, cache.astype(jnp.float32), slots),
        "cache_dtype": lambda: kv_cache_update(new, new, cache.astype(jnp.float32), cache.astype(jnp.float32), slots),
        "slot_past_cache": lambda: kv_cache_update(new, new, cache, cache, jnp.array([0, 48, 1], jnp.int32)),
        "slot_below_pad": lambda: kv_cache_update(new, new, cache, cache, jnp.array([0, -2, 1], jnp.int32)),
        "slot_duplicate": lambda: kv_cache_update(new, new, cache, cache, jnp.array([5, 5, 1], jnp.int32)),
        "slots_length": lambda: kv_cache_update(new, new, cache, cache, slots[:2]),
        "slots_float": lambda: kv_cache_update(new, new, cache, cache, slots.astype(jnp.float32)),
        "int8_no_scales": lambda: kv_cache_update(new, new, qcache, qcache, slots),
        "scale_shape": lambda: kv_cache_update(new, new, qcache, qcache, slots, k_scale_cache=scales[..., 0],
                                               v_scale_cache=scales),
        "scales_for_bf16": lambda: kv_cache_update(new, new, cache, cache, slots, k_scale_cache=scales),
        "block_zero": lambda: kv_cache_update(new, new, cache, cache, slots,
                                              block_sizes=KvCacheUpdateBlockSizes(tokens_per_block=0)),
        "vmem": lambda: kv_cache_update(new, new, cache, cache, slots,
                                        block_sizes=KvCacheUpdateBlockSizes(tokens_per_block=100_000)),
        "block_type": lambda: kv_cache_update(new, new, cache, cache, slots, block_sizes=64),
        "gpu_name": lambda: kv_cache_update(new, new, cache, cache, slots, chip="tpu-v99"),
    }
    calls[case]()


@pytest.mark.parametrize(
    "case, match",
    [
        ("new_k_2d", r"new_k: expected \[num_tokens, kv_heads, head_dim\]"),
        ("new_v_shape", r"new_v: bfloat16\[2, 2, 128\] must match new_k's bfloat16\[3, 2, 128\]"),
        ("cache_heads", r"k_cache: expected \[num_pages, page_size, 2, 128\] to match new_k"),
        ("v_cache_dtype", r"v_cache: float32\[6, 8, 2, 128\] must match k_cache's bfloat16"),
        ("cache_dtype", r"k_cache: dtype float32 must equal new_k's \(bfloat16\) or be int8"),
        ("slot_past_cache", r"slot_mapping: token 1 has slot 48, outside the cache's 48 slots"),
        ("slot_below_pad", r"slot_mapping: token 1 has slot -2, outside .* or -1 to skip the token"),
        ("slot_duplicate", r"slot_mapping: slot 5 is written by more than one token"),
        ("slots_length", r"slot_mapping: expected int32\[3\] \(one slot per token\)"),
        ("slots_float", r"slot_mapping: expected int32\[3\]"),
        ("int8_no_scales", r"k_scale_cache: an int8 cache needs a float32 scale cache of shape \[6, 8, 2, 1\]"),
        ("scale_shape", r"k_scale_cache: an int8 cache needs .* got float32\[6, 8, 2\]"),
        ("scales_for_bf16", r"k_scale_cache: only an int8 cache takes scales"),
        ("block_zero", r"block_sizes.tokens_per_block=0 must be a positive int"),
        ("vmem", r"block_sizes \(tokens_per_block=100000\) need .* MiB of VMEM"),
        ("block_type", r"block_sizes: expected a KvCacheUpdateBlockSizes, got int"),
        ("gpu_name", r"unknown chip 'tpu-v99'"),
    ],
)
def test_bad_input_raises_value_error_naming_it(case, match):
    with pytest.raises(ValueError, match=match):
        _bad_call(case)


def test_too_many_tokens_for_smem_is_refused():
    # tpu-v5e SMEM is 1 MiB; half of it holds 131072 int32 slots. 131073 tokens pad to the block of 4:
    # 131076 slots * 4 B = 524304 B > 524288 B, so the call is refused.
    # eval_shape traces the wrapper (no arrays allocated; slot values are not checked when traced).
    new = S((131073, 1, 128), jnp.float32)
    cache = S((1024, 16, 1, 128), jnp.float32)
    with pytest.raises(ValueError, match=r"slot_mapping: 131073 tokens need 524304 B of SMEM"):
        jax.eval_shape(lambda nk, kc, s: kv_cache_update(nk, nk, kc, kc, s, block_sizes=SMALL),
                       new, cache, S((131073,), jnp.int32))


# ----- larger cases (pytest -m slow) -----

@pytest.mark.slow
def test_default_blocks_with_many_tokens():
    pages, page_size, heads, dim, tokens = 64, 16, 8, 128, 300
    rng = np.random.default_rng(13)
    new_k = jnp.asarray(rng.standard_normal((tokens, heads, dim)), jnp.bfloat16)
    new_v = jnp.asarray(rng.standard_normal((tokens, heads, dim)), jnp.bfloat16)
    slots = rng.choice(pages * page_size, tokens, replace=False).astype(np.int32)
    cache = np.full((pages, page_size, heads, dim), np.nan).astype(jnp.bfloat16)
    k_cache, v_cache = kv_cache_update(new_k, new_v, jnp.asarray(cache), jnp.asarray(cache), jnp.asarray(slots),
                                       interpret=True)
    ref_k, ref_v = kv_cache_update_reference(new_k, new_v, jnp.asarray(cache), jnp.asarray(cache), jnp.asarray(slots))
    for out, ref in ((k_cache, ref_k), (v_cache, ref_v)):
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32)))
