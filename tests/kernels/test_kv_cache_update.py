"""Paged KV-cache update kernel, both cache layouts, beyond the shared contract (tests/kernels/test_contract.py:
lowering in place, cost estimate, tuned defaults, a small call vs the reference): interpret mode vs the jnp reference
on poisoned caches, page revisits and skipped tokens, chaining into paged_attention (head-major), block sizes and
VMEM, errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels.kv_cache_update as kvcu
from kernels.kv_cache_update import (
    DEFAULT_BLOCK_SIZES,
    DEFAULT_LAYOUT,
    KvCacheUpdateBlockSizes,
    head_major_vmem_bytes,
    kv_cache_update,
    kv_cache_update_reference,
)
from kernels.kv_cache_update.blocks import default_block_sizes
from perfmodel.errors import InputError, UnknownChipError
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.shapes import parse_shape
from kernels.tuned import load_tuned_file

PAGE_SIZE, KV_HEADS, HEAD_DIM = 8, 2, 128
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
SLOW = pytest.mark.slow


@dataclasses.dataclass(frozen=True)
class Layout:
    """One cache layout at test size: where (page, row) sit in the cache and scale-cache shapes."""

    name: str
    pages: int

    @property
    def head_major(self) -> bool:
        return self.name == "head-major"

    def cache_shape(self, pages: int | None = None, page_size: int = PAGE_SIZE, heads: int = KV_HEADS,
                    dim: int = HEAD_DIM) -> tuple[int, ...]:
        pages = self.pages if pages is None else pages
        return (heads, pages, page_size, dim) if self.head_major else (pages, page_size, heads, dim)

    def scale_shape(self, pages: int | None = None, page_size: int = PAGE_SIZE, heads: int = KV_HEADS):
        pages = self.pages if pages is None else pages
        return (heads, pages, page_size) if self.head_major else (pages, page_size, heads, 1)

    def slot_mask(self, written: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A [pages, page_size] mask broadcast onto a cache or scale cache of ``shape``."""
        if self.head_major:
            mask = written.reshape(1, *written.shape, *([1] * (len(shape) - 3)))
        else:
            mask = written.reshape(*written.shape, *([1] * (len(shape) - 2)))
        return np.broadcast_to(mask, shape)


# 16 head-major pages: two 8-page scale blocks; 6 token-major pages as before.
HEAD_MAJOR = Layout("head-major", 16)
TOKEN_MAJOR = Layout("token-major", 6)
LAYOUTS = [HEAD_MAJOR, TOKEN_MAJOR]


def _caches(layout: Layout, cache_dtype, quantize: bool, pages: int | None = None) -> dict[str, np.ndarray]:
    shape = layout.cache_shape(pages)
    fill = SENTINEL[jnp.dtype(cache_dtype)]
    caches = {"k_cache": np.full(shape, fill).astype(cache_dtype), "v_cache": np.full(shape, fill).astype(cache_dtype)}
    if quantize:
        caches["k_scale_cache"] = np.full(layout.scale_shape(pages), SCALE_SENTINEL, np.float32)
        caches["v_scale_cache"] = np.full(layout.scale_shape(pages), SCALE_SENTINEL, np.float32)
    return caches


def _new_tokens(seed: int, num_tokens: int, dtype, num_slots: int):
    rng = np.random.default_rng(seed)
    new_k = jnp.asarray(rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)), dtype)
    new_v = jnp.asarray(rng.standard_normal((num_tokens, KV_HEADS, HEAD_DIM)), dtype)
    slots = rng.choice(num_slots, num_tokens, replace=False).astype(np.int32)
    slots[num_tokens // 2] = -1  # a padding token: not written
    return new_k, new_v, slots


def _run(new_k, new_v, slots, caches, **kwargs):
    # Fresh device copies: the kernel donates (consumes) the caches it is given.
    args = {name: jnp.asarray(c) for name, c in caches.items()}
    k_cache, v_cache = args.pop("k_cache"), args.pop("v_cache")
    return kv_cache_update(new_k, new_v, k_cache, v_cache, jnp.asarray(slots), **args, **kwargs)


def _reference(new_k, new_v, slots, caches, layout: Layout):
    args = {name: jnp.asarray(c) for name, c in caches.items()}
    return kv_cache_update_reference(new_k, new_v, args.pop("k_cache"), args.pop("v_cache"), jnp.asarray(slots),
                                     layout=layout.name, **args)


def _written(slots: np.ndarray, pages: int, page_size: int = PAGE_SIZE) -> np.ndarray:
    mask = np.zeros(pages * page_size, bool)
    mask[slots[slots >= 0]] = True
    return mask.reshape(pages, page_size)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _layout_kwargs(layout: Layout) -> dict:
    return dict(layout=layout.name) | ({} if layout.head_major else dict(block_sizes=SMALL))


def test_head_major_is_the_default_and_every_layout_is_tested():
    # The parametrized cases here cover head-major and token-major; the combined layout (the one
    # ragged_paged_attention reads) has its own tests below.
    assert DEFAULT_LAYOUT == "head-major"
    assert sorted([la.name for la in LAYOUTS] + ["combined"]) == sorted(kvcu.LAYOUTS)


def _update_cases() -> list:
    # Every layout and token count (13: a partial last token-major block of 4; head-major has no token blocks),
    # copied and quantized, with bf16 tokens; f32 tokens on the smallest call, the head-major one. The other f32
    # calls: -m slow.
    cases = []
    for layout, num_tokens in [(HEAD_MAJOR, 12), (TOKEN_MAJOR, 16), (TOKEN_MAJOR, 13)]:
        for dtype, dtype_id in [(jnp.bfloat16, "bf16"), (jnp.float32, "f32")]:
            for quantize, q_id in [(False, "copy"), (True, "int8")]:
                marks = SLOW if dtype_id == "f32" and layout is TOKEN_MAJOR else ()
                cases.append(pytest.param(layout, num_tokens, quantize, dtype, marks=marks,
                                          id=f"{layout.name}-{num_tokens}tok-{dtype_id}-{q_id}"))
    return cases


@pytest.mark.parametrize("layout, num_tokens, quantize, dtype", _update_cases())
def test_matches_reference_and_leaves_other_slots_untouched(layout, num_tokens, quantize, dtype):
    new_k, new_v, slots = _new_tokens(num_tokens + 7 * quantize, num_tokens, dtype, layout.pages * PAGE_SIZE)
    cache_dtype = jnp.int8 if quantize else dtype
    caches = _caches(layout, cache_dtype, quantize)
    outs = _run(new_k, new_v, slots, caches, **_layout_kwargs(layout), interpret=True)
    refs = _reference(new_k, new_v, slots, caches, layout)
    assert len(outs) == len(caches)
    for (name, before), out, ref in zip(caches.items(), outs, refs):
        assert out.shape == before.shape and out.dtype == before.dtype, name
        written = layout.slot_mask(_written(slots, layout.pages), out.shape)
        # Every written element matches the reference ...
        out_f, ref_f = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
        tol = SCALE_TOL if "scale" in name else TOL[jnp.dtype(cache_dtype)]
        np.testing.assert_allclose(out_f[written], ref_f[written], **tol, err_msg=name)
        assert np.isfinite(out_f[written]).all(), name
        # ... and every other element still holds its sentinel, bit for bit (also the untouched rows of
        # pages the head-major kernel read and wrote back).
        np.testing.assert_array_equal(_bits(out)[~written], _bits(before)[~written], err_msg=name)


@pytest.mark.parametrize("quantize", [False, True], ids=["f32", "int8"])
def test_head_major_hand_worked_slots_revisiting_pages(quantize):
    # 11 pages of 8 (not a multiple of 8 pages: the scale block spans all pages). Token t's K row is
    # the constant t + 1, its V row -(t + 1). Slots in call order, page = slot // 8, row = slot % 8:
    #   t0: 19 -> (2, 3)   t1: 42 -> (5, 2)   t2: 16 -> (2, 0)   t3: -1 (skipped)
    #   t4: 23 -> (2, 7)   t5: 43 -> (5, 3)
    # so pages 2 and 5 are each revisited after another page in between.
    # Quantized, a constant row c has absmax |c|: scale = |c| / 127, codes round(c * 127 / |c|) = +-127.
    pages, n = 11, 6
    values = np.arange(1, n + 1, dtype=np.float32)
    new = jnp.asarray(np.broadcast_to(values[:, None, None], (n, KV_HEADS, HEAD_DIM)))
    slots = np.array([19, 42, 16, -1, 23, 43], np.int32)
    caches = _caches(HEAD_MAJOR, jnp.int8 if quantize else jnp.float32, quantize, pages=pages)
    outs = _run(new, -new, slots, caches, interpret=True)
    k, v = np.asarray(outs[0]), np.asarray(outs[1])
    expected = {(2, 3): 1.0, (5, 2): 2.0, (2, 0): 3.0, (2, 7): 5.0, (5, 3): 6.0}
    for (page, row), c in expected.items():
        if quantize:
            assert (k[:, page, row] == 127).all() and (v[:, page, row] == -127).all()
            np.testing.assert_allclose(np.asarray(outs[2])[:, page, row], c / 127, rtol=1e-6)
            np.testing.assert_allclose(np.asarray(outs[3])[:, page, row], c / 127, rtol=1e-6)
        else:
            assert (k[:, page, row] == c).all() and (v[:, page, row] == -c).all()
    untouched = k != 77 if quantize else ~np.isnan(k)
    assert int(untouched.sum()) == len(expected) * KV_HEADS * HEAD_DIM
    if quantize:
        assert int((np.asarray(outs[2]) != SCALE_SENTINEL).sum()) == len(expected) * KV_HEADS


def test_head_major_plan_hand_worked():
    # Slots [19, 42, 16, -1 | 18, 43, 17], page_size 8, bf16 (row granule 2), blocks of 4 tokens in call order
    # (the second block padded with a skipped entry). Pages 2, 5, 2, 0 | 2, 5, 2, 0; rows 3, 2, 0, -1 | 2, 3, 1, -1.
    # Granule keys (page * 4 granules + row // 2): 9, 22, 8, -1 | 9, 23, 8, -1.
    # lead = the block's first token on the same granule: 0, 1, 2, 3 | 0, 1, 2, 3 (no granule twice in a block);
    # full = a lead whose 2 rows the block writes: none.
    # Quantized, the page scale rows (key = page): 2, 5, 2, -1 | 2, 5, 2, -1 -> lead 0, 1, 0, 3 | 0, 1, 0, 3;
    # never full (8 rows a page).
    from kernels.kv_cache_update.body import _head_major_plan

    slots = jnp.array([19, 42, 16, -1, 18, 43, 17], jnp.int32)
    pages, rows, lead, full, slead, sfull = (np.asarray(a).tolist() for a in _head_major_plan(
        slots, page_size=8, granule=2, tokens_per_block=4, quantize=True))
    assert pages == [2, 5, 2, 0, 2, 5, 2, 0]
    assert rows == [3, 2, 0, -1, 2, 3, 1, -1]
    assert lead == [0, 1, 2, 3, 0, 1, 2, 3] and full == [0] * 8
    assert slead == [0, 1, 0, 3, 0, 1, 0, 3] and sfull == [0] * 8
    # Slots [6, 0, 7, 1, 9]: 6 and 7 share a granule in block 0 (lead 0, full: no read), so do 0 and 1 (lead 1);
    # 9 is alone in block 1 (its neighbour 8 unwritten: read).
    _, _, lead, full = (np.asarray(a).tolist() for a in _head_major_plan(
        jnp.array([6, 0, 7, 1, 9], jnp.int32), page_size=8, granule=2, tokens_per_block=4, quantize=False))
    assert lead[:5] == [0, 1, 0, 1, 0] and full[:5] == [1, 1, 0, 0, 0]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int8], ids=["bf16", "int8"])
def test_head_major_granules_shared_and_split_across_blocks(dtype):
    # 40 tokens: two blocks of 32 (HEAD_MAJOR_TOKENS_PER_BLOCK) in a shuffled call order. Slots 0..34 fill
    # granules (bf16 pairs, int8 fours), some within a block, some split over both blocks (each block
    # reads what the other wrote); 62 and 63 share a pair. Slots 34, 36, 41, 44 write one row of a granule whose
    # other rows hold sentinels: those must come back bit for bit.
    rng = np.random.default_rng(5)
    slots = np.concatenate([np.arange(0, 35), [36, 41, 44, 62, 63]]).astype(np.int32)
    slots = slots[rng.permutation(40)]
    quantize = dtype == jnp.int8
    new_k, new_v, _ = _new_tokens(11, 40, jnp.bfloat16, HEAD_MAJOR.pages * PAGE_SIZE)
    caches = _caches(HEAD_MAJOR, dtype, quantize)
    outs = _run(new_k, new_v, slots, caches, interpret=True)
    refs = _reference(new_k, new_v, slots, caches, HEAD_MAJOR)
    written = _written(slots, HEAD_MAJOR.pages)
    for (name, before), out, ref in zip(caches.items(), outs, refs):
        mask = HEAD_MAJOR.slot_mask(written, out.shape)
        tol = SCALE_TOL if "scale" in name else TOL[jnp.dtype(dtype)]
        np.testing.assert_allclose(np.asarray(out.astype(jnp.float32))[mask],
                                   np.asarray(ref.astype(jnp.float32))[mask], **tol, err_msg=name)
        np.testing.assert_array_equal(_bits(out)[~mask], _bits(before)[~mask], err_msg=name)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[la.name for la in LAYOUTS])
def test_all_tokens_skipped_changes_nothing(layout):
    new_k, new_v, _ = _new_tokens(3, 5, jnp.bfloat16, layout.pages * PAGE_SIZE)
    caches = _caches(layout, jnp.int8, True)
    outs = _run(new_k, new_v, np.full(5, -1, np.int32), caches, **_layout_kwargs(layout), interpret=True)
    for (name, before), out in zip(caches.items(), outs):
        np.testing.assert_array_equal(_bits(out), _bits(before), err_msg=name)


def test_token_major_slot_is_page_times_page_size_plus_offset():
    # Slot 19 with page_size 8 is page 19 // 8 = 2, offset 19 % 8 = 3.
    new = jnp.full((1, KV_HEADS, HEAD_DIM), 2.5, jnp.float32)
    caches = _caches(TOKEN_MAJOR, jnp.float32, False)
    k_cache, v_cache = _run(new, -new, np.array([19], np.int32), caches, layout="token-major", interpret=True)
    assert float(k_cache[2, 3, 0, 0]) == 2.5 and float(v_cache[2, 3, 1, 127]) == -2.5
    assert int(np.isnan(np.asarray(k_cache)).sum()) == k_cache.size - KV_HEADS * HEAD_DIM


@pytest.mark.parametrize("layout", LAYOUTS, ids=[la.name for la in LAYOUTS])
def test_caches_are_donated_and_updated_in_place(layout):
    new_k, new_v, slots = _new_tokens(1, 4, jnp.float32, layout.pages * PAGE_SIZE)
    k_cache = jnp.asarray(_caches(layout, jnp.float32, False)["k_cache"])
    v_cache = jnp.asarray(_caches(layout, jnp.float32, False)["v_cache"])
    kv_cache_update(new_k, new_v, k_cache, v_cache, jnp.asarray(slots), layout=layout.name, interpret=True)
    assert k_cache.is_deleted() and v_cache.is_deleted()


@pytest.mark.parametrize("layout", LAYOUTS, ids=[la.name for la in LAYOUTS])
def test_inside_an_outer_jit_with_traced_slots(layout):
    new_k, new_v, slots = _new_tokens(2, 5, jnp.bfloat16, layout.pages * PAGE_SIZE)
    caches = _caches(layout, jnp.bfloat16, False)
    f = jax.jit(lambda nk, nv, kc, vc, s: kv_cache_update(nk, nv, kc, vc, s, layout=layout.name, interpret=True))
    k_cache, _ = f(new_k, new_v, jnp.asarray(caches["k_cache"]), jnp.asarray(caches["v_cache"]), jnp.asarray(slots))
    ref, _ = _reference(new_k, new_v, slots, caches, layout)
    np.testing.assert_array_equal(_bits(k_cache), _bits(ref))


# ----- chaining: kv_cache_update (head-major) -> paged_attention -----

#: paged_attention output vs its reference on the same caches (bf16 queries), and vs dense attention
#: over the original tokens (int8 adds the per-token quantization error, ~1/254 of each row's absmax).
CHAIN_TOL = {"bfloat16": dict(atol=1.5e-2, rtol=1.5e-2), "int8": dict(atol=1.5e-2, rtol=1.5e-2)}
DENSE_TOL = {"bfloat16": dict(atol=1.5e-2, rtol=1.5e-2), "int8": dict(atol=4e-2, rtol=4e-2)}


def _dense_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One sequence: q [q_heads, d], k/v [tokens, kv_heads, d] -> [q_heads, d] (f32, softmax over tokens)."""
    q_heads, d = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    out = np.zeros((q_heads, d), np.float32)
    for h in range(q_heads):
        kh, vh = k[:, h // group].astype(np.float64), v[:, h // group].astype(np.float64)
        s = kh @ q[h].astype(np.float64) / np.sqrt(d)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ vh
    return out


# int8 (quantize on write, scales read back) by default; the bf16 chain: -m slow.
@pytest.mark.parametrize("kv_dtype, page_size", [pytest.param("bfloat16", 16, marks=SLOW), ("int8", 32)],
                         ids=["bf16", "int8"])
def test_written_cache_is_read_by_paged_attention(kv_dtype, page_size):
    from kernels.paged_attention import PagedAttentionBlockSizes, paged_attention, paged_attention_reference

    batch, q_heads, kv_heads, dim = 2, 4, 2, 128
    pages_per_seq = 128 // page_size  # one compute block of 128 tokens
    num_pages = batch * pages_per_seq + 3  # spare pages nobody owns
    history = np.array([20, 45])  # tokens already cached; each ends inside a page, sequence 1 past its first
    rng = np.random.default_rng(11)
    table = rng.permutation(num_pages)[: batch * pages_per_seq].reshape(batch, pages_per_seq).astype(np.int32)
    tokens_k = rng.standard_normal((batch, 128, kv_heads, dim)).astype(np.float32)
    tokens_v = rng.standard_normal((batch, 128, kv_heads, dim)).astype(np.float32)

    def slot(b: int, pos: int) -> int:
        return int(table[b, pos // page_size]) * page_size + pos % page_size

    quantize = kv_dtype == "int8"
    # Unwritten rows are poison: NaN in a bf16 cache, NaN scales next to an int8 cache.
    fill = 77 if quantize else np.nan
    shape = (kv_heads, num_pages, page_size, dim)
    caches = [jnp.asarray(np.full(shape, fill), kv_dtype) for _ in range(2)]
    scales = [jnp.full((kv_heads, num_pages, page_size), np.nan, jnp.float32) for _ in range(2)] if quantize else []

    def write(bs_pos: list[tuple[int, int]], extra_pad: int = 0):
        nonlocal caches, scales
        nk = np.stack([tokens_k[b, p] for b, p in bs_pos] + [np.zeros((kv_heads, dim), np.float32)] * extra_pad)
        nv = np.stack([tokens_v[b, p] for b, p in bs_pos] + [np.zeros((kv_heads, dim), np.float32)] * extra_pad)
        slots = np.array([slot(b, p) for b, p in bs_pos] + [-1] * extra_pad, np.int32)
        kw = dict(k_scale_cache=scales[0], v_scale_cache=scales[1]) if quantize else {}
        outs = kv_cache_update(jnp.asarray(nk, jnp.bfloat16), jnp.asarray(nv, jnp.bfloat16), *caches,
                               jnp.asarray(slots), **kw, interpret=True)
        caches, scales = list(outs[:2]), list(outs[2:])

    # Prefill the history (one call), then a decode step: one new token per sequence plus a padding token.
    write([(b, p) for b in range(batch) for p in range(history[b])])
    write([(1, history[1]), (0, history[0])], extra_pad=1)
    lengths = jnp.asarray(history + 1, jnp.int32)
    q = jnp.asarray(rng.standard_normal((batch, q_heads, dim)), jnp.bfloat16)
    kw = dict(k_scales=scales[0], v_scales=scales[1]) if quantize else {}
    out = paged_attention(q, *caches, jnp.asarray(table), lengths, **kw,
                          block_sizes=PagedAttentionBlockSizes(pages_per_compute_block=pages_per_seq), interpret=True)
    out = np.asarray(out.astype(jnp.float32))
    assert np.isfinite(out).all()  # no poisoned (unwritten) row was used
    clean = {k: jnp.nan_to_num(x) for k, x in kw.items()}
    ref = paged_attention_reference(q, *(jnp.nan_to_num(c) for c in caches), jnp.asarray(table), lengths, **clean)
    np.testing.assert_allclose(out, np.asarray(ref), **CHAIN_TOL[kv_dtype])
    # The cached tokens are where paged_attention looks for them: dense attention over the originals.
    for b in range(batch):
        n = history[b] + 1
        k = np.asarray(jnp.asarray(tokens_k[b, :n], jnp.bfloat16).astype(jnp.float32))
        v = np.asarray(jnp.asarray(tokens_v[b, :n], jnp.bfloat16).astype(jnp.float32))
        dense = _dense_attention(np.asarray(q[b].astype(jnp.float32)), k, v)
        np.testing.assert_allclose(out[b], dense, **DENSE_TOL[kv_dtype], err_msg=f"sequence {b}")


# ----- block sizes and VMEM -----

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


def test_one_stored_configuration_and_a_fallback():
    # The stored defaults themselves: tests/kernels/test_contract.py. One configuration per chip (int8 caches, the
    # larger VMEM need, which the bf16 path reuses), and a chip the JSON lacks takes tpu-v5e's (every kernel's
    # policy, kernels.tiling.tuned_entry_chip).
    stored = load_tuned_file("kv_cache_update")["defaults"]
    assert all(len(configs) == 1 for configs in stored.values())
    assert default_block_sizes("my-chip.yaml") == default_block_sizes("tpu-v5e")


@pytest.mark.parametrize("chip_name", sorted(DEFAULT_BLOCK_SIZES))
@pytest.mark.parametrize("quantize", [True, False], ids=["int8-cache", "bf16-cache"])
def test_stored_defaults_fit_the_default_scoped_vmem_at_the_tuned_shape(chip_name, quantize):
    data = load_tuned_file("kv_cache_update")
    ((key, shapes),) = data["shapes"].items()
    _, kv_heads, head_dim = parse_shape(shapes[0]).shape  # new_k [tokens, kv_heads, head_dim]
    limit = DEFAULT_BLOCK_SIZES[chip_name].check(kv_heads=kv_heads, head_dim=head_dim, new_dtype=jnp.bfloat16,
                                                 quantize=quantize, chip=get_chip(chip_name))
    stored = data["defaults"][chip_name][key]["vmem_limit_bytes"]
    # Tuned on int8 caches: that check matches the JSON; bf16 caches need less, so never a raised limit
    # when the int8 one needed none.
    assert limit == stored if quantize else (limit is None or stored is not None)


def test_vmem_estimate_hand_worked():
    # As Mosaic allocates it. 64 tokens x 8 heads x 128 bf16: one slab 64*8*128*2 B = 128 KiB (8 rows are
    # one whole 8-row tile, for every dtype); K and V double-buffered = 512 KiB. Quantizing adds two int8
    # slabs (64 KiB each), two f32 scale blocks 64*8*128*4 = 256 KiB each (the trailing 1 pads to 128
    # lanes), and the quantization's f32 temporaries: four f32 slabs (4 * 256 KiB) without a bf16 VPU
    # (tpu-v4, or no chip given), 1.125 f32 slabs of 64 tokens (288 KiB) with one (tpu-v5e).
    blocks = KvCacheUpdateBlockSizes(tokens_per_block=64)
    kw = dict(kv_heads=8, head_dim=128, new_dtype=jnp.bfloat16)
    assert blocks.vmem_bytes(**kw, quantize=False) == 512 * 2**10
    assert blocks.vmem_bytes(**kw, quantize=True) == (512 + 640 + 1024) * 2**10
    assert blocks.vmem_bytes(**kw, quantize=True, chip=get_chip("tpu-v5e")) == (512 + 640 + 288) * 2**10
    # A call of at most one block is one grid step: Mosaic single-buffers the token blocks.
    assert blocks.vmem_bytes(**kw, quantize=False, num_tokens=64) == 256 * 2**10
    assert blocks.vmem_bytes(**kw, quantize=False, num_tokens=32) == 128 * 2**10


def test_head_major_no_dma_races(monkeypatch):
    # TPU interpret mode with race detection (two cores; the grid is "arbitrary", so one core runs it): granule
    # reads, in-VMEM inserts and write-backs of tokens sharing a granule, within a block and across blocks
    # (a shape no other test uses, so nothing compiled without race detection is reused).
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
    from jax.experimental.pallas import tpu as pltpu

    import kernels.kv_cache_update.kernel as kernel_module

    params = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)
    monkeypatch.setattr(kernel_module, "interpret_params", lambda interpret: params if interpret else False)
    rng = np.random.default_rng(9)
    slots = np.concatenate([np.arange(0, 30), [33, 38, 39, 45, 46, 47, 52]]).astype(np.int32)[rng.permutation(37)]
    new_k, new_v, _ = _new_tokens(12, 37, jnp.bfloat16, HEAD_MAJOR.pages * PAGE_SIZE)
    caches = _caches(HEAD_MAJOR, jnp.int8, True)
    outs = _run(new_k, new_v, slots, caches, interpret=True)
    assert tpu_interpret.races is not None and not tpu_interpret.races.races_found
    refs = _reference(new_k, new_v, slots, caches, HEAD_MAJOR)
    np.testing.assert_allclose(np.asarray(outs[0], np.float32), np.asarray(refs[0], np.float32), atol=1, rtol=0)


def test_head_major_vmem_estimate_hand_worked():
    # 8 kv heads x 128, pages of 16, 64 tokens (two blocks of 32):
    #   new K and V blocks, two buffers each: 4 * 32 tokens * 8 heads * 128 * 2 B = 256 KiB
    #   bf16 K and V row granules (2 rows, not padded to 16): 2 * 32 * 8 * 2 * 128 * 2 B = 256 KiB -> 512 KiB
    #   int8 granules (4 rows): 2 * 32 * 8 * 4 * 128 B = 256 KiB, f32 scale rows [8, 1, 16] with lanes padded to
    #   128: 2 * 32 * 8 * 128 * 4 B = 256 KiB -> 256 + 256 + 256 = 768 KiB.
    # (The scratch, 256 and 512 KiB, is Mosaic's scoped-VMEM figure on v5e.)
    kw = dict(kv_heads=8, page_size=16, head_dim=128, new_dtype=jnp.bfloat16, num_tokens=64)
    assert head_major_vmem_bytes(**kw, cache_dtype=jnp.bfloat16, quantize=False) == 512 * 2**10
    assert head_major_vmem_bytes(**kw, cache_dtype=jnp.int8, quantize=True) == 768 * 2**10
    # One token: one block of one, single-buffered; new K and V [1, 8, 128] bf16 (8 rows) 2 * 8 * 128 * 2 B = 4 KiB,
    # granules 2 * 8 * 2 * 128 * 2 B = 8 KiB.
    assert head_major_vmem_bytes(**(kw | dict(num_tokens=1)), cache_dtype=jnp.bfloat16, quantize=False) == 12 * 2**10


def test_head_major_traffic_model_hand_worked():
    # perfmodel's op model with layout="head-major" (what the kernel's CostEstimate uses). One bf16 decode token,
    # 8 kv heads x 128, pages of 16: read the new K and V, 2 * 8 * 128 * 2 B = 4096 B, its slot, 4 B, and its K
    # and V 2-row granules, 2 * 8 * 2 * 128 * 2 B = 8192 B -> 12292 B; write the granules back, 8192 B; the rows
    # written are 4096 B (cache writes 2.0x the rows).
    from perfmodel.model.kvcache import kv_cache_update as model
    from kernels.kv_cache_update.plan import cost_estimate

    bf16 = model(num_tokens=1, kv_heads=8, head_dim=128, page_size=16, layout="head-major")
    assert (bf16.hbm_read_bytes, bf16.hbm_write_bytes, bf16.metrics["kv_bytes_written"]) == (12292, 8192, 4096)
    rows = model(num_tokens=1, kv_heads=8, head_dim=128, page_size=16)  # token-major / combined: the rows only
    assert (rows.hbm_read_bytes, rows.hbm_write_bytes) == (4100, 4096)
    # int8 with per-token scales, 3 tokens, 2 heads x 128, pages of 8: 12 rows (K and V, 3 tokens, 2 heads).
    # Read: new 12 * 128 * 2 B = 3072, slots 12 B, 4-row granules 12 * 4 * 128 B = 6144, page scale rows
    # 12 * 8 * 4 B = 384 -> 9612 B. Write: 6144 + 384 = 6528 B. Rows written: 12 * 128 B + 12 scales * 4 B = 1584 B.
    int8 = model(num_tokens=3, kv_heads=2, head_dim=128, page_size=8, kv_dtype="int8", layout="head-major")
    assert (int8.hbm_read_bytes, int8.hbm_write_bytes, int8.metrics["kv_bytes_written"]) == (9612, 6528, 1584)
    est = cost_estimate(num_tokens=3, kv_heads=2, head_dim=128, page_size=8, new_dtype=jnp.bfloat16,
                        cache_dtype=jnp.int8, layout="head-major")
    assert est.bytes_accessed == 9612 + 6528
    with pytest.raises(InputError, match=r"`layout`: got 'page'; use one of rows, head-major"):
        model(num_tokens=1, kv_heads=8, head_dim=128, page_size=16, layout="page")


# ----- bad input -----

def _bad_call(case: str) -> None:
    new = jnp.ones((3, KV_HEADS, HEAD_DIM), jnp.bfloat16)
    cache = jnp.zeros((6, PAGE_SIZE, KV_HEADS, HEAD_DIM), jnp.bfloat16)  # token-major
    qcache = cache.astype(jnp.int8)
    scales = jnp.zeros((6, PAGE_SIZE, KV_HEADS, 1), jnp.float32)
    hm = jnp.zeros((KV_HEADS, 6, PAGE_SIZE, HEAD_DIM), jnp.bfloat16)  # head-major
    hm_q, hm_scales = hm.astype(jnp.int8), jnp.zeros((KV_HEADS, 6, PAGE_SIZE), jnp.float32)
    slots = jnp.array([0, 9, 17], jnp.int32)

    def tm(*args, **kwargs):
        return kv_cache_update(*args, layout="token-major", **kwargs)

    calls = {
        "layout": lambda: kv_cache_update(new, new, hm, hm, slots, layout="page-major"),
        "new_k_2d": lambda: kv_cache_update(new[0], new[0], hm, hm, slots),
        "new_v_shape": lambda: kv_cache_update(new, new[:2], hm, hm, slots),
        "new_k_int": lambda: kv_cache_update(new.astype(jnp.int32), new.astype(jnp.int32), hm, hm, slots),
        "hm_cache_heads": lambda: kv_cache_update(new, new, hm[:1], hm[:1], slots),
        "hm_given_token_major": lambda: kv_cache_update(new, new, cache, cache, slots),
        "hm_scale_shape": lambda: kv_cache_update(new, new, hm_q, hm_q, slots, k_scale_cache=scales,
                                                  v_scale_cache=scales),
        "hm_block_sizes": lambda: kv_cache_update(new, new, hm, hm, slots, block_sizes=SMALL),
        "hm_slot_past_cache": lambda: kv_cache_update(new, new, hm, hm, jnp.array([0, 48, 1], jnp.int32)),
        # 512 kv heads of 8192: a block of 32 tokens needs 2 * 32 * 512 * 8192 * 2 B = 512 MiB of new K/V and
        # twice that of bf16 row granules: 1.5 GiB.
        # Traced with eval_shape: nothing allocated.
        "hm_vmem": lambda: jax.eval_shape(
            lambda nk, kc: kv_cache_update(nk, nk, kc, kc, jnp.arange(32, dtype=jnp.int32)),
            S((32, 512, 8192), jnp.bfloat16), S((512, 4, PAGE_SIZE, 8192), jnp.bfloat16)),
        "cache_heads": lambda: tm(new, new, cache[:, :, :1], cache[:, :, :1], slots),
        "v_cache_dtype": lambda: tm(new, new, cache, cache.astype(jnp.float32), slots),
        "cache_dtype": lambda: tm(new, new, cache.astype(jnp.float32), cache.astype(jnp.float32), slots),
        "slot_past_cache": lambda: tm(new, new, cache, cache, jnp.array([0, 48, 1], jnp.int32)),
        "slot_below_pad": lambda: tm(new, new, cache, cache, jnp.array([0, -2, 1], jnp.int32)),
        "slot_duplicate": lambda: tm(new, new, cache, cache, jnp.array([5, 5, 1], jnp.int32)),
        "slots_length": lambda: tm(new, new, cache, cache, slots[:2]),
        "slots_float": lambda: tm(new, new, cache, cache, slots.astype(jnp.float32)),
        "int8_no_scales": lambda: tm(new, new, qcache, qcache, slots),
        "scale_shape": lambda: tm(new, new, qcache, qcache, slots, k_scale_cache=scales[..., 0], v_scale_cache=scales),
        "scales_for_bf16": lambda: tm(new, new, cache, cache, slots, k_scale_cache=scales),
        "hm_scales_for_bf16": lambda: kv_cache_update(new, new, hm, hm, slots, k_scale_cache=hm_scales),
        "block_zero": lambda: tm(new, new, cache, cache, slots,
                                 block_sizes=KvCacheUpdateBlockSizes(tokens_per_block=0)),
        # The kernel clamps the block to the call's tokens, so the huge block needs more tokens (abstract).
        "vmem": lambda: jax.eval_shape(
            lambda nk, kc, sl: tm(nk, nk, kc, kc, sl, block_sizes=KvCacheUpdateBlockSizes(tokens_per_block=100_000)),
            S((200_000, KV_HEADS, HEAD_DIM), jnp.bfloat16), S((25_000, PAGE_SIZE, KV_HEADS, HEAD_DIM), jnp.bfloat16),
            S((200_000,), jnp.int32)),
        "block_type": lambda: tm(new, new, cache, cache, slots, block_sizes=64),
        "gpu_name": lambda: kv_cache_update(new, new, hm, hm, slots, chip="tpu-v99"),
    }
    calls[case]()


@pytest.mark.parametrize(
    "case, match",
    [
        ("layout", r"layout: 'page-major' is not one of 'head-major', 'token-major'"),
        ("new_k_2d", r"new_k: expected \[num_tokens, kv_heads, head_dim\]"),
        ("new_v_shape", r"new_v: bfloat16\[2, 2, 128\] must match new_k's bfloat16\[3, 2, 128\]"),
        ("new_k_int", r"new_k: dtype int32 not supported; use bfloat16 or float32"),
        ("hm_cache_heads",
         r"k_cache: expected \[2, num_pages, page_size, 128\] \(layout='head-major'\) to match new_k"),
        ("hm_given_token_major", r"k_cache: expected \[2, num_pages, page_size, 128\] \(layout='head-major'\)"),
        ("hm_scale_shape", r"k_scale_cache: an int8 cache needs a float32 scale cache of shape \[2, 6, 8\] "
                           r"\(layout='head-major'\), got float32\[6, 8, 2, 1\]"),
        ("hm_block_sizes", r"block_sizes: only layout='token-major' or 'combined' takes block sizes"),
        ("hm_slot_past_cache", r"slot_mapping: token 1 has slot 48, outside the cache's 48 slots"),
        ("hm_vmem", r"layout='head-major' \(pages of 8 tokens\) need 1.50 GiB of VMEM but tpu-v5e has 128 MiB per core; "
                    r"split the kv heads over several calls"),
        ("cache_heads", r"k_cache: expected \[num_pages, page_size, 2, 128\] \(layout='token-major'\) to match new_k"),
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
        ("hm_scales_for_bf16", r"k_scale_cache: only an int8 cache takes scales"),
        ("block_zero", r"block_sizes.tokens_per_block=0 must be a positive int"),
        ("vmem", r"block_sizes \(tokens_per_block=100000\) need .* of VMEM but tpu-v5e has 128 MiB per core; use a "
                 r"smaller tokens_per_block"),
        ("block_type", r"block_sizes: expected a KvCacheUpdateBlockSizes, got int"),
        ("gpu_name", r"unknown chip 'tpu-v99'"),
    ],
)
@pytest.mark.usefixtures("traced_on_v5e")
def test_bad_input_raises_value_error_naming_it(case, match):
    with pytest.raises(ValueError, match=match):
        _bad_call(case)


def test_reference_rejects_an_unknown_layout():
    new = jnp.ones((1, KV_HEADS, HEAD_DIM), jnp.float32)
    with pytest.raises(ValueError, match=r"layout: 'rows' is not one of"):
        kv_cache_update_reference(new, new, new, new, jnp.zeros(1, jnp.int32), layout="rows")


@pytest.mark.usefixtures("traced_on_v5e")
def test_too_many_tokens_for_smem_is_refused():
    # tpu-v5e SMEM is 1 MiB; half of it is 524288 B.
    # Token-major: 131073 tokens pad to the block of 4: 131076 slots * 4 B = 524304 B > 524288 B.
    # Head-major: page, row, lead and full per token, 16 B each, padded to blocks of 32:
    # 32769 tokens -> 32800 * 16 B = 524800 B > 524288 B.
    # eval_shape traces the wrapper (no arrays allocated; slot values are not checked when traced).
    new = S((131073, 1, 128), jnp.float32)
    cache = S((1024, 16, 1, 128), jnp.float32)
    with pytest.raises(ValueError, match=r"slot_mapping: 131073 tokens need 524304 B of SMEM"):
        jax.eval_shape(lambda nk, kc, s: kv_cache_update(nk, nk, kc, kc, s, block_sizes=SMALL, layout="token-major"),
                       new, cache, S((131073,), jnp.int32))
    new = S((32769, 1, 128), jnp.float32)
    cache = S((1, 4096, 16, 128), jnp.float32)
    with pytest.raises(ValueError, match=r"slot_mapping: 32769 tokens need 524800 B of SMEM"):
        jax.eval_shape(lambda nk, kc, s: kv_cache_update(nk, nk, kc, kc, s), new, cache, S((32769,), jnp.int32))


# ----- larger cases (pytest -m slow) -----

@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=[la.name for la in LAYOUTS])
def test_default_blocks_with_many_tokens(layout):
    pages, page_size, heads, dim, tokens = 64, 16, 8, 128, 300
    rng = np.random.default_rng(13)
    new_k = jnp.asarray(rng.standard_normal((tokens, heads, dim)), jnp.bfloat16)
    new_v = jnp.asarray(rng.standard_normal((tokens, heads, dim)), jnp.bfloat16)
    slots = rng.choice(pages * page_size, tokens, replace=False).astype(np.int32)
    cache = np.full(layout.cache_shape(pages, page_size, heads, dim), np.nan).astype(jnp.bfloat16)
    k_cache, v_cache = kv_cache_update(new_k, new_v, jnp.asarray(cache), jnp.asarray(cache), jnp.asarray(slots),
                                       layout=layout.name, interpret=True)
    ref_k, ref_v = kv_cache_update_reference(new_k, new_v, jnp.asarray(cache), jnp.asarray(cache), jnp.asarray(slots),
                                             layout=layout.name)
    for out, ref in ((k_cache, ref_k), (v_cache, ref_v)):
        np.testing.assert_array_equal(_bits(out), _bits(ref))


# ----- combined layout: kv_pages [num_pages, page_size, 2 * kv_heads, head_dim] (ragged_paged_attention's) -----

def _combined_case(dtype, slots, *, pages=6, seed=0):
    tokens = len(slots)
    kk, kv_, kc = jax.random.split(jax.random.key(seed), 3)
    new_k = jax.random.normal(kk, (tokens, KV_HEADS, HEAD_DIM), jnp.float32).astype(dtype)
    new_v = jax.random.normal(kv_, (tokens, KV_HEADS, HEAD_DIM), jnp.float32).astype(dtype)
    kv_pages = jnp.full((pages, PAGE_SIZE, 2 * KV_HEADS, HEAD_DIM), np.nan, dtype)  # untouched slots stay NaN
    return new_k, new_v, kv_pages, jnp.asarray(slots, jnp.int32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("slots", [
    [3],  # one decode token mid-page
    [7, 8, 9, -1, 40, 0, 47],  # a run across the page 0/1 boundary, padding, the last slot (6 pages x 8 - 1), slot 0
    [16, 17, 18, 19, 20, -1, -1, -1, -1, 33],  # 10 tokens: 3 blocks of 4, the last one partial (unaligned count)
])
def test_combined_matches_reference(dtype, slots):
    new_k, new_v, kv_pages, slot_mapping = _combined_case(dtype, slots)
    (want,) = kv_cache_update_reference(new_k, new_v, kv_pages, None, slot_mapping, layout="combined")
    got = kvcu.kv_pages_update(new_k, new_v, kv_pages, slot_mapping, block_sizes=SMALL, interpret=True)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # K of head h sits at row 2h, V at 2h + 1: token 0 (slot slots[0]) checked by hand, not via the reference.
    page, row = divmod(slots[0], PAGE_SIZE)
    np.testing.assert_array_equal(np.asarray(got[page, row, 2], np.float32), np.asarray(new_k[0, 1], np.float32))
    np.testing.assert_array_equal(np.asarray(got[page, row, 3], np.float32), np.asarray(new_v[0, 1], np.float32))
    written = {s for s in slots if s >= 0}
    untouched = [s for s in range(6 * PAGE_SIZE) if s not in written]
    flat = np.asarray(got, np.float32).reshape(6 * PAGE_SIZE, -1)
    assert np.isnan(flat[untouched]).all() and not np.isnan(flat[sorted(written)]).any()


def test_combined_all_padding_leaves_cache_unchanged():
    new_k, new_v, kv_pages, slot_mapping = _combined_case(jnp.float32, [-1, -1, -1])
    kv_pages = kv_pages.at[2].set(1.5)
    got = kvcu.kv_pages_update(new_k, new_v, kv_pages.copy(), slot_mapping, block_sizes=SMALL, interpret=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(kv_pages))


def test_combined_feeds_ragged_paged_attention():
    """Decode + a prefill chunk written by the kernel, then read by ragged_paged_attention; page tables hold
    garbage past each sequence's length and one sequence is empty (no KV, no query)."""
    from kernels.ragged_paged_attention import ragged_paged_attention
    from kernels.ragged_paged_attention.reference import ragged_paged_attention_reference

    dtype, q_heads, head_dim, page_size, kv_heads, num_pages = jnp.float32, 4, 128, 8, 2, 12
    kv_lens = np.array([11, 0, 5], np.int32)  # seq 0: 10 cached + 1 new (decode); seq 1 empty; seq 2: 5 new (prefill)
    page_table = np.array([[3, 7, 999], [-4, 123, 5], [9, 2**30, -1]], np.int32)  # garbage past each length
    new_pos = [(0, 10), (2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]  # (sequence, position) of each new token
    slots = [page_table[s, p // page_size] * page_size + p % page_size for s, p in new_pos]
    cu_q_lens = np.array([0, 1, 1, 6], np.int32)
    keys = jax.random.split(jax.random.key(3), 4)
    kv_pages = jax.random.normal(keys[0], (num_pages, page_size, 2 * kv_heads, head_dim), jnp.float32).astype(dtype)
    new_k = jax.random.normal(keys[1], (len(slots), kv_heads, head_dim), jnp.float32).astype(dtype)
    new_v = jax.random.normal(keys[2], (len(slots), kv_heads, head_dim), jnp.float32).astype(dtype)
    q = jax.random.normal(keys[3], (len(slots), q_heads, head_dim), jnp.float32).astype(dtype)
    (want_pages,) = kv_cache_update_reference(new_k, new_v, kv_pages, None, jnp.asarray(slots, jnp.int32),
                                              layout="combined")
    pages = kvcu.kv_pages_update(new_k, new_v, kv_pages.copy(), jnp.asarray(slots, jnp.int32), block_sizes=SMALL,
                                 interpret=True)
    np.testing.assert_array_equal(np.asarray(pages), np.asarray(want_pages))
    args = (jnp.asarray(kv_lens), jnp.asarray(page_table), jnp.asarray(cu_q_lens), jnp.asarray([3], jnp.int32))
    want = ragged_paged_attention_reference(q, want_pages, *args)
    got = ragged_paged_attention(q, pages, *args, interpret=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(v_cache="same"), r"v_cache: layout='combined' keeps K and V in one cache"),
    (dict(pages_shape=(6, PAGE_SIZE, KV_HEADS, HEAD_DIM)), r"k_cache: expected \[num_pages, page_size, 4, 128\]"),
    (dict(cache_dtype=jnp.int8), r"k_cache: dtype int8 must equal new_k's .* layout='combined'"),
    (dict(slots=[1, 1]), r"slot_mapping: slot 1 is written by more than one token"),
])
def test_combined_errors(kwargs, match):
    new_k, new_v, kv_pages, slot_mapping = _combined_case(jnp.float32, kwargs.get("slots", [0, 1]))
    if "pages_shape" in kwargs:
        kv_pages = jnp.zeros(kwargs["pages_shape"], jnp.float32)
    if "cache_dtype" in kwargs:
        kv_pages = kv_pages.astype(kwargs["cache_dtype"])
    v_cache = kv_pages if kwargs.get("v_cache") else None
    with pytest.raises(ValueError, match=match):
        kv_cache_update(new_k, new_v, kv_pages, v_cache, slot_mapping, layout="combined", interpret=True)


# ----- combined layout, int8 cache: quantize on write, per-token scales [num_pages, page_size, 2 * kv_heads] -----

def _combined_int8_case(slots):
    new_k, new_v, _, slot_mapping = _combined_case(jnp.bfloat16, slots)
    kv_pages = jnp.full((6, PAGE_SIZE, 2 * KV_HEADS, HEAD_DIM), 99, jnp.int8)  # untouched slots stay 99
    kv_scales = jnp.full((6, PAGE_SIZE, 2 * KV_HEADS), np.nan, jnp.float32)  # and NaN scales
    return new_k, new_v, kv_pages, kv_scales, slot_mapping


def test_combined_int8_quantizes_on_write():
    slots = [7, 8, -1, 40, 0]  # across the page 0/1 boundary, padding, slot 0
    new_k, new_v, kv_pages, kv_scales, slot_mapping = _combined_int8_case(slots)
    want_pages, want_scales = kvcu.kv_pages_update_reference(new_k, new_v, kv_pages, slot_mapping, kv_scales=kv_scales)
    pages, scales = kvcu.kv_pages_update(new_k, new_v, kv_pages.copy(), slot_mapping, kv_scales=kv_scales.copy(),
                                         block_sizes=SMALL, interpret=True)
    np.testing.assert_array_equal(np.asarray(pages), np.asarray(want_pages))
    np.testing.assert_array_equal(np.asarray(scales), np.asarray(want_scales))
    # Token 0 (slot 7: page 0, row 7) by hand: K of head 1 at row 2, V at 3; code * scale within half a step of
    # the bf16 row, the step being the row's max |x| / 127.
    for row, new in ((2, new_k[0, 1]), (3, new_v[0, 1])):
        x = np.asarray(new, np.float32)
        step = np.abs(x).max() / 127
        np.testing.assert_allclose(float(scales[0, 7, row]), step, rtol=1e-6)
        assert np.abs(np.asarray(pages[0, 7, row], np.float32) * step - x).max() <= step / 2 + 1e-6
    written = {s for s in slots if s >= 0}
    untouched = [s for s in range(6 * PAGE_SIZE) if s not in written]
    assert (np.asarray(pages).reshape(6 * PAGE_SIZE, -1)[untouched] == 99).all()
    assert np.isnan(np.asarray(scales).reshape(6 * PAGE_SIZE, -1)[untouched]).all()


@pytest.mark.slow
def test_combined_int8_feeds_ragged_paged_attention():
    """Write a decode token and a prefill chunk into an int8 cache, then read it with ragged_paged_attention's
    int8 path: it equals the attention reference over the same codes and scales."""
    from kernels.ragged_paged_attention import quantize_kv_pages, ragged_paged_attention
    from kernels.ragged_paged_attention.reference import ragged_paged_attention_reference

    kv_lens, cu_q_lens = np.array([11, 5], np.int32), np.array([0, 1, 6], np.int32)
    page_table = np.array([[3, 1, 999], [4, 2**30, -1]], np.int32)  # garbage past each length
    new_pos = [(0, 10), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]  # (sequence, position) of each new token
    slot_mapping = jnp.asarray([page_table[s, p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for s, p in new_pos],
                               jnp.int32)
    new_k, new_v, _, _ = _combined_case(jnp.bfloat16, list(range(len(new_pos))), seed=1)
    keys = jax.random.split(jax.random.key(5), 3)
    old = jax.random.normal(keys[0], (6, PAGE_SIZE, 2 * KV_HEADS, HEAD_DIM), jnp.float32)  # cached tokens
    kv_pages, kv_scales = quantize_kv_pages(old)  # the same per-row int8 quantizer
    pages, scales = kvcu.kv_pages_update(new_k, new_v, kv_pages, slot_mapping, kv_scales=kv_scales, block_sizes=SMALL,
                                         interpret=True)
    q = jax.random.normal(keys[1], (len(new_pos), 4, HEAD_DIM), jnp.float32).astype(jnp.bfloat16)
    args = (jnp.asarray(kv_lens), jnp.asarray(page_table), jnp.asarray(cu_q_lens), jnp.asarray([2], jnp.int32))
    want = ragged_paged_attention_reference(q, pages, *args, kv_scales=scales)
    got = ragged_paged_attention(q, pages, *args, kv_scales=scales, interpret=True)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("make, match", [
    (lambda k, v, p, s: (p, None), r"kv_scales: an int8 kv_pages needs float32 per-token scales \[6, 8, 4\], got None"),
    (lambda k, v, p, s: (p, s[..., :2]), r"kv_scales: .* \[6, 8, 4\], got float32\[6, 8, 2\]"),
    (lambda k, v, p, s: (p.astype(jnp.bfloat16), s), "kv_scales: a bfloat16 kv_pages takes no scales"),
])
def test_combined_int8_errors(make, match):
    new_k, new_v, kv_pages, kv_scales, slot_mapping = _combined_int8_case([0, 1])
    pages, scales = make(new_k, new_v, kv_pages, kv_scales)
    with pytest.raises(ValueError, match=match):
        kvcu.kv_pages_update(new_k, new_v, pages, slot_mapping, kv_scales=scales, block_sizes=SMALL, interpret=True)
