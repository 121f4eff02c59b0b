"""Attention models: flash prefill, paged decode, ragged batches, MLA decode."""

import itertools

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.model.attention import flash_attention, floor_sum, kv_tiles, visible_pairs
from perfmodel.model.core import evaluate
from perfmodel.model.paged_attention import mla_decode, paged_decode_attention, ragged_paged_attention

# ----------------------------------------------------------------------------- counting helpers vs brute force


def _brute(q_len, kv_len, bq, bkv, causal, window):
    """Tiles with a visible pair and visible pairs, by enumerating every (query, key)."""
    off = kv_len - q_len
    tiles, pairs = set(), 0
    for r, c in itertools.product(range(q_len), range(kv_len)):
        ok = not causal or (c <= r + off and (window is None or c > r + off - window))
        if ok:
            pairs += 1
            tiles.add((r // bq, c // bkv))
    return len(tiles), pairs


@pytest.mark.parametrize("q_len,kv_len,bq,bkv,causal,window", [
    (1, 1, 1, 1, True, None), (7, 7, 2, 3, True, None), (5, 19, 4, 4, True, None), (16, 16, 8, 8, True, 5),
    (9, 30, 2, 7, True, 3), (12, 12, 5, 5, False, None), (33, 40, 8, 16, True, 1), (3, 50, 8, 8, True, 100),
])
def test_tile_and_pair_counts_match_enumeration(q_len, kv_len, bq, bkv, causal, window):
    tiles, pairs = _brute(q_len, kv_len, bq, bkv, causal, window)
    w = None if window is None else np.asarray(window)
    assert kv_tiles(np.asarray(q_len), np.asarray(kv_len), np.asarray(bq), np.asarray(bkv), causal, w) == tiles
    assert visible_pairs(np.asarray(q_len), np.asarray(kv_len), causal, w) == pairs


@pytest.mark.parametrize("n,m,a,b", [(0, 3, 2, 1), (10, 7, 3, 2), (100, 13, 29, 0), (50, 1, 5, 5), (37, 128, 512, 511)])
def test_floor_sum(n, m, a, b):
    assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


# ----------------------------------------------------------------------------- flash attention


def test_noncausal_mha_hand_worked(v5e):
    b, s, h, d = 2, 1024, 8, 128
    cost = flash_attention(batch=b, q_len=s, kv_len=s, q_heads=h, kv_heads=h, head_dim=d, causal=False, chip=v5e)
    # QK^T and PV: 2 * 2*s*s*d per head and batch
    assert cost.useful_flops == cost.mxu_flops == 4 * s * s * d * h * b
    # Q read + O written once: b*h*s*d*2 bytes each; K and V read once per 512-row q block (2 blocks).
    q = b * h * s * d * 2
    assert cost.hbm_write_bytes == q
    assert cost.hbm_read_bytes == q + 2 * 2 * q
    assert cost.metrics["kv_reread_factor"] == 2


def test_causal_masking_waste_at_block_size(v5e):
    s, d = 1024, 128
    big = flash_attention(batch=1, q_len=s, kv_len=s, q_heads=1, kv_heads=1, head_dim=d, block_q=512,
                          block_kv=512, chip=v5e)
    small = flash_attention(batch=1, q_len=s, kv_len=s, q_heads=1, kv_heads=1, head_dim=d, block_q=128,
                            block_kv=128, chip=v5e)
    pairs = s * (s + 1) // 2  # the lower triangle with its diagonal
    assert big.useful_flops == small.useful_flops == 4 * d * pairs
    # 512-blocks: q block 0 sees kv block 0, q block 1 sees kv blocks 0-1: 3 tiles of 512x512.
    assert big.metrics["kv_tiles"] == 3
    assert big.metrics["masked_tile_share"] == pytest.approx(1 - pairs / (3 * 512 * 512))
    # 128-blocks: 8*9/2 = 36 tiles; less is wasted.
    assert small.metrics["kv_tiles"] == 36
    assert small.metrics["masked_tile_share"] == pytest.approx(1 - pairs / (36 * 128 * 128))
    assert small.metrics["masked_tile_share"] < big.metrics["masked_tile_share"]
    assert big.mxu_flops == 4 * 3 * 512 * 512 * d


@pytest.mark.parametrize("chip_name", ["tpu-v5e", "tpu-v6e", "tpu-v2"])
def test_default_blocks_are_the_bundled_kernels_tuned_ones(chip_name):
    from kernels.tuned import stored_blocks
    from perfmodel.hw.registry import get_chip

    chip = get_chip(chip_name)
    # v2 has no stored flash defaults: the default chip's (v5e) apply, as documented.
    stored = stored_blocks("flash_attention", chip_name) or stored_blocks("flash_attention", "tpu-v5e")
    cost = flash_attention(batch=1, q_len=8192, kv_len=8192, q_heads=32, kv_heads=8, head_dim=128, chip=chip)
    assert (cost.metrics["block_q"], cost.metrics["block_kv"]) == (stored["block_q"], stored["block_kv"])
    # Short sequences: at most the length rounded up to the tile (1001 -> 1008 rows, 1024 lanes).
    short = flash_attention(batch=1, q_len=1001, kv_len=1001, q_heads=32, kv_heads=8, head_dim=128, chip=chip)
    assert short.metrics["block_q"] == min(stored["block_q"], 1008)
    assert short.metrics["block_kv"] == min(stored["block_kv"], 1024)


def test_ragged_default_block_q_is_the_bundled_kernels_tuned_one(v5e):
    from kernels.tuned import stored_blocks

    stored = stored_blocks("ragged_paged_attention", "tpu-v5e")["block_q"]
    kw = dict(query_lens=[512], context_lens=[512], q_heads=32, kv_heads=8, head_dim=128, page_size=16, chip=v5e)
    assert ragged_paged_attention(**kw).hbm_bytes == ragged_paged_attention(block_q=stored, **kw).hbm_bytes
    assert ragged_paged_attention(**kw).hbm_bytes != ragged_paged_attention(block_q=4 * stored, **kw).hbm_bytes


def test_gqa_shares_kv_reads(v6e):
    kw = dict(batch=1, q_len=2048, kv_len=2048, q_heads=32, head_dim=128, chip=v6e)
    mha, gqa, mqa = (flash_attention(kv_heads=h, **kw) for h in (32, 8, 1))
    assert mha.useful_flops == gqa.useful_flops == mqa.useful_flops
    q_bytes = 32 * 2048 * 128 * 2
    kv_mha = mha.hbm_read_bytes - q_bytes
    assert gqa.hbm_read_bytes - q_bytes == pytest.approx(kv_mha / 4)
    assert mqa.hbm_read_bytes - q_bytes == pytest.approx(kv_mha / 32)


def test_sliding_window_pairs(v5e):
    s, w = 4096, 1024
    cost = flash_attention(batch=1, q_len=s, kv_len=s, q_heads=1, kv_heads=1, head_dim=128, sliding_window=w,
                           chip=v5e)
    # row r sees min(r + 1, w) keys: 1 + 2 + ... + 1024, then 1024 for the other 3072 rows
    assert cost.useful_flops == 4 * 128 * (w * (w + 1) // 2 + w * (s - w))


def test_chunked_prefill_after_prefix(v5e):
    cost = flash_attention(batch=1, q_len=512, kv_len=4096, q_heads=1, kv_heads=1, head_dim=128, chip=v5e)
    # queries at positions 3584..4095 see 3585..4096 keys
    assert cost.useful_flops == 4 * 128 * sum(range(3585, 4097))


def test_head_dim_64_pads_on_v6e(v6e):
    cost = flash_attention(batch=1, q_len=1024, kv_len=1024, q_heads=8, kv_heads=8, head_dim=64, causal=False,
                           chip=v6e)
    # head_dim 64 pads to the 256-wide MXU: 3/4 of the issued FLOPs are padding
    assert cost.padding_waste == pytest.approx(0.75)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_heads=3), r"^`kv_heads` 3 must divide `q_heads` 8"),
    (dict(q_len=2048), r"^`q_len` must be <= `kv_len` for causal attention"),
    (dict(sliding_window=128, causal=False), r"^`sliding_window` needs causal attention"),
    (dict(head_dim=0), r"^`head_dim` must be >= 1, got 0$"),
    (dict(batch=-1), r"^`batch` must be >= 1, got -1$"),
    (dict(dtype="bf8"), r"^`dtype`: unknown dtype 'bf8'"),
    (dict(block_q=0), r"^`block_q` must be >= 1"),
])
def test_flash_bad_input(v5e, kwargs, match):
    args = dict(batch=1, q_len=1024, kv_len=1024, q_heads=8, kv_heads=8, head_dim=128, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        flash_attention(**args)


# ----------------------------------------------------------------------------- paged decode


def test_decode_hand_worked(v5e):
    lens = [1000, 2000, 17]
    cost = paged_decode_attention(context_lens=lens, q_heads=32, kv_heads=8, head_dim=128, page_size=16, chip=v5e)
    pages = 63 + 125 + 2  # ceil(1000/16), ceil(2000/16), ceil(17/16)
    kv = pages * 16 * 8 * 128 * 2 * 2  # whole pages x kv heads x head dim x (K, V) x bf16
    table = 3 * 125 * 4 + 3 * 2 * 4  # [3, 125] int32 page table + context length and query start per sequence
    q = 3 * 32 * 128 * 2
    assert cost.metrics["kv_pages_read"] == pages
    assert cost.hbm_read_bytes == kv + table + q
    assert cost.hbm_write_bytes == q
    assert cost.useful_flops == 4 * 128 * 32 * sum(lens)
    # GQA group of 4 q heads pads to 8 rows: half the issued MXU work is padding (pages are 128-aligned here).
    r = evaluate(cost, v5e)
    assert r.bound == "HBM-bound"
    assert r.floor_s == pytest.approx((kv + table + 2 * q) / 8.19e11)


def test_partial_last_page_costs_a_full_page(v5e):
    kw = dict(q_heads=8, kv_heads=8, head_dim=128, page_size=16, pages_per_seq=2, chip=v5e)
    a = paged_decode_attention(context_lens=[17], **kw)
    b = paged_decode_attention(context_lens=[32], **kw)
    assert a.metrics["kv_bytes"] == b.metrics["kv_bytes"] == 2 * 16 * 8 * 128 * 2 * 2
    assert a.metrics["partial_page_waste"] == pytest.approx(1 - 17 / 32)
    assert b.metrics["partial_page_waste"] == 0


@pytest.mark.parametrize("kv_dtype,scale,per_token_bytes", [
    # per token and kv head: K and V of head_dim elements, plus f32 K and V scales where per-token
    # (a quantized cache defaults to per-token scales, as everywhere: default_kv_scale)
    ("bf16", None, 2 * 128 * 2), ("int8", None, 2 * 128 + 2 * 4), ("int8", "per-tensor", 2 * 128),
    ("fp8", "per-token", 2 * 128 + 2 * 4),
    ("int4", "per-token", 2 * 64 + 2 * 4),
])
def test_kv_dtype_and_scales(v6e, kv_dtype, scale, per_token_bytes):
    cost = paged_decode_attention(context_lens=[4096], q_heads=32, kv_heads=8, head_dim=128, page_size=16,
                                  kv_dtype=kv_dtype, kv_scale=scale, chip=v6e)
    assert cost.metrics["kv_bytes"] == 4096 * 8 * per_token_bytes


def test_per_page_scales(v5e):
    cost = paged_decode_attention(context_lens=[100], q_heads=8, kv_heads=8, head_dim=128, page_size=16,
                                  kv_dtype="int8", kv_scale="per-page", chip=v5e)
    # 7 pages: 7*16 tokens of int8 K and V, plus one f32 K and V scale per page and kv head
    assert cost.metrics["kv_bytes"] == 7 * 16 * 8 * 128 * 2 + 7 * 8 * 2 * 4


def test_batch_form_equals_list_form(v5e):
    kw = dict(q_heads=32, kv_heads=8, head_dim=128, page_size=16, chip=v5e)
    listed = paged_decode_attention(context_lens=[1000] * 4, **kw)
    batched = paged_decode_attention(context_lens=1000, batch=4, **kw)
    for f in ("mxu_flops", "useful_flops", "vpu_ops", "eup_ops", "hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(listed, f) == pytest.approx(getattr(batched, f))


def test_int8_kv_on_v5e_converts(v5e):
    cost = paged_decode_attention(context_lens=[512], q_heads=8, kv_heads=8, head_dim=128, page_size=16,
                                  kv_dtype="int8", chip=v5e)
    assert any("no native bf16 x int8" in n for n in cost.notes)


@pytest.mark.parametrize("kwargs,match", [
    # ceil(1000 / 16) = 63 pages; the CLI prefixes the context flag the user gave (tests/cli/test_review_findings.py)
    (dict(pages_per_seq=10), r"^a context of 1000 tokens needs 63 pages of 16 tokens but `pages_per_seq` is 10; "
                             r"give `pages_per_seq` 63 or more"),
    (dict(kv_heads=5), r"^`kv_heads` 5 must divide `q_heads` 32"),
    (dict(context_lens=[100, 0]), r"^`context_lens` must be >= 1, got 0$"),
    (dict(page_size=0), r"^`page_size` must be >= 1"),
    (dict(kv_dtype="int3"), r"^`kv_dtype`: unknown dtype 'int3'"),
    (dict(kv_scale="per-token"), r"^`kv_scale` per-token: a bf16 KV cache has no scales"),
    (dict(kv_scale="per-head", kv_dtype="int8"), r"^`kv_scale`: got 'per-head'; use one of"),
])
def test_decode_bad_input(v5e, kwargs, match):
    args = dict(context_lens=[1000], q_heads=32, kv_heads=8, head_dim=128, page_size=16, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        paged_decode_attention(**args)


# ----------------------------------------------------------------------------- ragged


def test_ragged_decode_part_equals_decode_attention(v5e):
    kw = dict(q_heads=32, kv_heads=8, head_dim=128, page_size=16, chip=v5e)
    ragged = ragged_paged_attention(query_lens=[1, 1, 512], context_lens=[100, 300, 1024], pages_per_seq=64, **kw)
    prefill, decode = ragged.parts
    alone = paged_decode_attention(context_lens=[100, 300], pages_per_seq=64, **kw)
    for f in ("mxu_flops", "useful_flops", "vpu_ops", "eup_ops", "hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(decode, f) == pytest.approx(getattr(alone, f)), f
    # the prefill part: 512 new tokens at positions 512..1023 of a 1024-token context
    assert prefill.useful_flops == 4 * 128 * 32 * sum(range(513, 1025))
    r = evaluate(ragged, v5e)
    parts = [evaluate(p, v5e) for p in ragged.parts]
    assert r.unit_s["hbm"] == pytest.approx(sum(p.unit_s["hbm"] for p in parts))
    assert r.floor_s <= sum(p.floor_s for p in parts) + 1e-15


def test_ragged_prefill_rereads_pages_per_query_block(v5e):
    # A fresh 256-token prefill in 128-token q and KV blocks: block 0 reads 8 pages, block 1 reads 16.
    cost = ragged_paged_attention(query_lens=[256], context_lens=[256], q_heads=8, kv_heads=8, head_dim=128,
                                  page_size=16, block_q=128, block_kv=128, chip=v5e)
    assert cost.metrics["prefill_kv_pages_read"] == 8 + 16
    assert cost.metrics["decode_kv_pages_read"] == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(query_lens=[5, 1], context_lens=[4, 10]), r"^`query_lens` 5 exceeds `context_lens` 4"),
    (dict(query_lens=[1, 1, 1], context_lens=[10, 10]), r"^`query_lens` has 3 sequences but `context_lens` has 2"),
    (dict(query_lens=[0, 1], context_lens=[10, 10]), r"^`query_lens` must be >= 1, got 0"),
])
def test_ragged_bad_input(v5e, kwargs, match):
    with pytest.raises(InputError, match=match):
        ragged_paged_attention(q_heads=8, kv_heads=8, head_dim=128, page_size=16, chip=v5e, **kwargs)


# ----------------------------------------------------------------------------- MLA


def test_mla_decode_hand_worked(v5e):
    cost = mla_decode(context_lens=4096, batch=2, q_heads=128, page_size=64, chip=v5e)
    # latent 512 + rope 64 = 576 bf16 values per token, shared by all heads
    assert cost.metrics["kv_bytes_per_token"] == 576 * 2
    assert cost.metrics["kv_bytes"] == 2 * 4096 * 576 * 2
    # per head and token: 2*576 (scores) + 2*512 (values)
    assert cost.useful_flops == 2 * 2 * 128 * 4096 * (576 + 512)


def test_mla_reads_far_less_kv_than_gqa(v5e):
    mla = mla_decode(context_lens=4096, batch=1, q_heads=128, page_size=64, chip=v5e)
    mha = paged_decode_attention(context_lens=4096, batch=1, q_heads=128, kv_heads=128, head_dim=128,
                                 page_size=64, chip=v5e)
    assert mla.metrics["kv_bytes"] * 50 < mha.metrics["kv_bytes"]
