"""Attention over a paged KV cache: one decode step, vLLM TPU's ragged mixed batches and DeepSeek MLA decode.

The KV cache is stored in fixed-size pages reached through a per-sequence page table; these models count the
whole pages the kernels read (a partial last page costs a full one), the page table, quantized caches' f32
scales (:data:`KV_SCALES` layouts) and, for ragged batches, the bundled kernel's flat q blocks
(:func:`ragged_fetches`). Tile and pair counts, softmax work and tuned blocks come from
:mod:`perfmodel.model.attention`, whose conventions (causal queries at the last positions, useful vs issued
FLOPs, online softmax) hold here too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.attention import check_heads, floor_sum, kv_tiles, softmax_work, tuned_block, visible_pairs
from perfmodel.model.core import Num, OpCost, combine
from perfmodel.model.dtypes import (
    DTYPES,
    INDEX_BYTES,
    SCALE_BYTES,
    default_kv_scale,
    is_quantized,
    matmul_path,
    parse_dtype,
)
from perfmodel.model.shapes import cdiv, chip_tiles, choice, fval, round_up, sizes

#: The ``kv_scale`` layouts of a KV cache (None: the KV dtype's default, see :func:`default_kv_scale`).
KV_SCALES = (None, "none", "per-tensor", "per-token", "per-page")


def _context_batch(context_lens: Num, batch: Num | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Context lengths and the explicit batch (None: context_lens' last axis is the batch)."""
    lens = sizes("context_lens", context_lens)
    if batch is None:
        return np.atleast_1d(lens), None
    return lens, sizes("batch", batch)


def _reduce(per_seq: Num, batch: np.ndarray | None) -> Num:
    """Total over sequences: sum over the last axis, or batch x the per-sequence value."""
    arr = np.asarray(per_seq, dtype=float)
    return fval(arr * batch if batch is not None else arr.sum(axis=-1))


def _resolve_kv_scale(kv_dtype: str, kv_scale: str | None) -> str:
    choice("kv_scale", kv_scale, KV_SCALES)
    quantized = is_quantized(kv_dtype)
    if kv_scale is None:
        return default_kv_scale(kv_dtype)
    if kv_scale != "none" and not quantized:
        raise InputError(f"`kv_scale` {kv_scale}: a {kv_dtype} KV cache has no scales; use `kv_dtype` int8/fp8/int4")
    return kv_scale


def kv_scale_bytes(tokens: Num, pages: Num, kv_heads: Num, kv_scale: str) -> np.ndarray:
    """Bytes of f32 K and V scales for ``tokens`` tokens in ``pages`` pages (per-tensor scales: ~0)."""
    if kv_scale == "per-token":
        return 2.0 * SCALE_BYTES * np.asarray(tokens) * kv_heads
    if kv_scale == "per-page":
        return 2.0 * SCALE_BYTES * np.asarray(pages) * kv_heads
    return np.zeros(())


def _page_table_width(lens: np.ndarray, page_size: np.ndarray, pages_per_seq: Num | None,
                      per_seq_axis: bool) -> np.ndarray:
    """Page-table entries per sequence; InputError when a context needs more pages than given."""
    needed = cdiv(lens, page_size)
    if pages_per_seq is None:
        return np.max(needed, axis=-1, keepdims=True) if per_seq_axis else needed
    given = sizes("pages_per_seq", pages_per_seq)
    given_b = given[..., None] if (per_seq_axis and given.ndim) else given
    over = np.broadcast_to(needed > given_b, np.broadcast_shapes(needed.shape, np.shape(given_b)))
    if np.any(over):
        i = np.flatnonzero(over)[0]
        n = np.broadcast_to(needed, over.shape).flat[i]
        ln = np.broadcast_to(lens, over.shape).flat[i]
        g = np.broadcast_to(given_b, over.shape).flat[i]
        ps = np.broadcast_to(page_size, over.shape).flat[i]
        raise InputError(f"a context of {ln} tokens needs {n} pages of {ps} tokens but `pages_per_seq` is {g}; "
                         f"give `pages_per_seq` {n} or more, or a larger `page_size`")
    return given_b


def _paged_attention_cost(
    *,
    name: str,
    q_lens: np.ndarray,
    lens: np.ndarray,
    batch: np.ndarray | None,
    q_heads: np.ndarray,
    kv_heads: np.ndarray,
    head_dim: np.ndarray,
    page_size: np.ndarray,
    kv_dtype: str,
    q_dtype: str,
    kv_scale: str,
    precision: str | None,
    block_q: Num,
    table_entries: np.ndarray,
    chip: object | None,
    seq_mask: np.ndarray | None = None,
    kv_pages_fetched: np.ndarray | None = None,
    kv_scale_read: np.ndarray | None = None,
    scale_gather: tuple[np.ndarray, np.ndarray] | None = None,
    fold_scales: bool = False,
    dequant_overlaps: bool = False,
) -> OpCost:
    """Causal paged attention of sequences with q_lens new tokens whose context (new tokens included) is lens.

    Every per-sequence quantity broadcasts against ``lens``; totals sum the last
    axis (``batch`` None) or multiply by ``batch``. ``seq_mask`` keeps a subset
    of the sequences (the decode or prefill part of a ragged batch). ``kv_pages_fetched``: pages each
    sequence's K/V DMAs move when they differ from the pages its q blocks see (a kernel whose q blocks
    are not aligned to the sequence, see :func:`ragged_pages_fetched`); None: those pages.
    ``kv_scale_read``: scale bytes each sequence's K/V reads move (None: :func:`kv_scale_bytes` of its pages);
    ``scale_gather``: (read, write) bytes per sequence of an XLA gather that lays the scales out before the kernel.
    ``fold_scales``: K scales multiply the scores together with the softmax scale and V scales the probabilities
    (one VPU op per score) instead of dequantizing the cache (one op per K/V element). ``dequant_overlaps``: the
    widening of a KV block runs while the next block's DMA is in flight (a double-buffered kernel), so it is VPU
    work, not serial time added to the expected time.
    """
    group = check_heads(q_heads, kv_heads)
    tiles = chip_tiles(chip)
    path = matmul_path(chip, q_dtype, kv_dtype, precision)
    keep = np.ones(np.shape(lens)) if seq_mask is None else seq_mask.astype(float)
    bq = np.minimum(block_q, q_lens)
    pages_visited = kv_tiles(q_lens, lens, bq, page_size, True, None)
    tokens_visited = pages_visited * page_size
    q_blocks = cdiv(q_lens, bq)
    rows = round_up(bq * group, tiles.sublanes)

    def total(x: Num) -> Num:
        return _reduce(np.asarray(x, dtype=float) * keep, batch)

    useful = total(4.0 * head_dim * q_heads * visible_pairs(q_lens, lens, True, None))
    issued = total(4.0 * kv_heads * rows * round_up(head_dim, tiles.mxu) * tokens_visited * path.passes)
    scores = 1.0 * q_heads * bq * tokens_visited
    row_blocks = 1.0 * q_heads * bq * pages_visited
    vpu, eup = softmax_work(scores, row_blocks, head_dim, scores)
    out_rows = 1.0 * q_heads * q_blocks * bq
    vpu = vpu + out_rows * 2 * head_dim
    eup = eup + out_rows
    notes = list(path.notes)
    kv_elems = 2.0 * kv_heads * head_dim * tokens_visited
    serial = np.zeros(())
    scaled = kv_scale != "none"
    if path.converts_rhs:  # KV dequantized between its DMA and the MXU: on the critical path
        widen = kv_elems * (DTYPES[kv_dtype].widen_ops_per_element + (scaled and not fold_scales))
        serial = np.zeros(()) if dequant_overlaps else widen
        vpu = vpu + widen + (scores if scaled and fold_scales else 0.0)
    elif scaled:
        # Scales applied to the scores (K, or folded into the softmax scale's multiply) and the probabilities (V).
        vpu = vpu + (1.0 if fold_scales else 2.0) * scores
    pages_read = pages_visited if kv_pages_fetched is None else kv_pages_fetched
    scale_read = (kv_scale_bytes(pages_read * page_size, pages_read, kv_heads, kv_scale) if kv_scale_read is None
                  else kv_scale_read)
    kv_bytes = 2.0 * kv_heads * head_dim * page_size * pages_read * DTYPES[kv_dtype].itemsize_bytes + scale_read
    gather_read, gather_write = (np.zeros(()), np.zeros(())) if scale_gather is None else scale_gather
    q_bytes = 1.0 * q_heads * head_dim * DTYPES[q_dtype].itemsize_bytes * q_lens
    # Page table (int32, scalar-prefetched whole), context length and query start per sequence.
    table_bytes = 1.0 * (table_entries + 2) * INDEX_BYTES
    pages_needed = cdiv(lens, page_size)
    stored = pages_needed * page_size
    notes.append("KV read in whole pages: a partial last page costs a full page")
    if kv_scale == "per-tensor":
        notes.append("per-tensor KV scales (two scalars) cost no bandwidth")
    with np.errstate(divide="ignore", invalid="ignore"):
        page_waste = 1.0 - np.asarray(total(lens), dtype=float) / np.asarray(total(stored), dtype=float)
    return OpCost(
        name=name,
        mxu_flops=issued,
        useful_flops=useful,
        mxu_dtype=path.compute_dtype,
        vpu_ops=total(vpu),
        serial_vpu_ops=total(serial),
        eup_ops=total(eup),
        hbm_read_bytes=total(kv_bytes + q_bytes + table_bytes + gather_read),
        hbm_write_bytes=total(q_bytes + gather_write),
        notes=tuple(notes),
        metrics={
            "sequences": total(1.0),
            "query_tokens": total(q_lens),
            "context_tokens": total(lens),
            "kv_pages_read": total(pages_read),
            "kv_bytes": total(kv_bytes),
            "page_table_bytes": total(table_bytes),
            "partial_page_waste": fval(np.nan_to_num(page_waste)),
            **({} if scale_gather is None else {"kv_scale_bytes": total(scale_read),
                                                "scale_gather_bytes": total(gather_read + gather_write)}),
        },
    )


def _paged_common(q_heads: Num, kv_heads: Num, head_dim: Num, page_size: Num, kv_dtype: str, q_dtype: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str, str]:
    return (sizes("q_heads", q_heads), sizes("kv_heads", kv_heads), sizes("head_dim", head_dim),
            sizes("page_size", page_size), parse_dtype(kv_dtype, "`kv_dtype`"), parse_dtype(q_dtype, "`q_dtype`"))


def paged_decode_attention(
    *,
    context_lens: Num,
    q_heads: Num,
    kv_heads: Num,
    head_dim: Num,
    page_size: Num,
    kv_dtype: str = "bf16",
    q_dtype: str = "bf16",
    kv_scale: str | None = None,
    batch: Num | None = None,
    pages_per_seq: Num | None = None,
    precision: str | None = None,
    chip: object | None = None,
) -> OpCost:
    """One decode step (one query token per sequence) over a paged KV cache.

    ``context_lens``: one length per sequence (last axis = the batch; leading
    axes are independent scenarios), or, with ``batch``, one length (or an
    array of them) that all ``batch`` sequences share. KV bytes count whole
    pages (a partial last page costs a full one), scales (``kv_scale``: None
    = :func:`default_kv_scale`, per-token for a quantized cache; "per-token" / "per-page" store f32
    K and V scales per kv head), the page table (``pages_per_seq`` int32
    entries per sequence; default: the most any sequence needs), q and the
    output. GQA: the q heads of a group share one pass over their KV pages. ``precision``: of the dots (None =
    default, see :func:`perfmodel.model.attention.flash_attention`).
    """
    lens, b = _context_batch(context_lens, batch)
    q_heads, kv_heads, head_dim, page_size, kv_dt, q_dt = _paged_common(q_heads, kv_heads, head_dim, page_size,
                                                                        kv_dtype, q_dtype)
    scale = _resolve_kv_scale(kv_dt, kv_scale)
    table = _page_table_width(lens, page_size, pages_per_seq, per_seq_axis=b is None)
    ones = np.ones_like(lens)
    cost = _paged_attention_cost(
        name="decode-attention", q_lens=ones, lens=lens, batch=b, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim, page_size=page_size, kv_dtype=kv_dt, q_dtype=q_dt, kv_scale=scale, precision=precision,
        block_q=1, table_entries=table, chip=chip)
    return dataclasses.replace(cost, launches=1, launch_kind="pallas")


def ragged_pages_fetched(q_lens: np.ndarray, lens: np.ndarray, page_size: np.ndarray, block_q: np.ndarray,
                         block_kv: np.ndarray) -> np.ndarray:
    """KV pages the bundled ragged kernel copies per sequence (last axis: the batch, in q order).

    The kernel's q blocks are ``block_q`` rows of the flat token axis (the sequences' query rows
    concatenated), not of each sequence; per q block, each sequence with a row in it fetches its
    ``block_kv``-token KV blocks up to the one holding the causal position of its last row there, each
    block's pages only as far as the sequence's context. So per (sequence, q block touched):
    ``min(ppb * (last_pos // block_kv + 1), cdiv(kv_len, page_size))`` pages, ``ppb = block_kv // page_size``;
    the sequence's last q block reaches its last position and fetches every page.
    """
    return ragged_fetches(q_lens, lens, page_size, block_q, block_kv)[1]


def ragged_fetches(q_lens: np.ndarray, lens: np.ndarray, page_size: np.ndarray, block_q: np.ndarray,
                   block_kv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(KV blocks, pages) the bundled ragged kernel fetches per sequence (see :func:`ragged_pages_fetched`): per
    (sequence, q block touched) ``min(last_pos // block_kv + 1, cdiv(pages, ppb))`` blocks, each of ``ppb`` pages
    but the sequence's last block, which stops at its last page."""
    q_lens, lens = np.broadcast_arrays(np.asarray(q_lens, np.int64), np.asarray(lens, np.int64))
    ps, bq, bkv = (np.asarray(x, np.int64) for x in (page_size, block_q, block_kv))
    ppb = bkv // ps
    starts = np.cumsum(q_lens, axis=-1) - q_lens  # first flat row of each sequence
    ends = starts + q_lens
    pages = cdiv(lens, ps)
    first_block = starts // bq
    touched = np.where(q_lens > 0, (np.maximum(ends, 1) - 1) // bq - first_block + 1, 0)
    # Every q block before the last: last row (b + 1) * bq - 1 at position off + (b + 1) * bq - 1.
    base = lens - ends + (first_block + 1) * bq - 1  # that position in the sequence's first q block (>= 0)
    # Those blocks fetching fewer than all pages: ppb * (base + bq * i) // bkv + ppb < pages, i.e. the KV block
    # index stays below cdiv(pages, ppb) - 1.
    below = np.maximum(cdiv(pages, ppb) - 1, 0) * bkv - base  # position bound (exclusive) of such blocks
    partial = np.clip(cdiv(np.maximum(below, 0), bq), 0, np.maximum(touched - 1, 0))
    blocks_partial = floor_sum(partial, bkv, bq, np.maximum(base, 0)) + partial
    full = touched - partial
    return (np.where(touched > 0, blocks_partial + cdiv(pages, ppb) * full, 0),
            np.where(touched > 0, ppb * blocks_partial + pages * full, 0))


def ragged_paged_attention(
    *,
    query_lens: Num,
    context_lens: Num,
    q_heads: Num,
    kv_heads: Num,
    head_dim: Num,
    page_size: Num,
    kv_dtype: str = "bf16",
    q_dtype: str = "bf16",
    kv_scale: str | None = None,
    block_q: Num | None = None,
    block_kv: Num | None = None,
    pages_per_seq: Num | None = None,
    precision: str | None = None,
    chip: object | None = None,
) -> OpCost:
    """One mixed batch of prefill chunks and decode tokens (vLLM TPU's ragged paged attention).

    ``query_lens[i]`` new tokens of sequence i attend causally over its
    ``context_lens[i]`` tokens (the new ones included, so query_lens <=
    context_lens). Sequences with one query token form the ``decode`` part,
    the rest the ``prefill`` part; the result's ``parts`` are (prefill,
    decode) and its times split accordingly. Prefill chunks are processed in
    blocks of ``block_q`` query tokens (default: the bundled kernel's tuned block_q for the chip, see
    :func:`tuned_block`), each re-reading the pages it needs. KV traffic follows the bundled kernel's combined
    K/V pages (one copy per page for every kv head) and flat q blocks: :func:`ragged_pages_fetched` with
    ``block_kv`` (default: the kernel's tuned block_kv); compute counts the pages the queries see.

    A quantized cache's per-token or per-page f32 scales are read as the kernel reads them: an XLA gather before
    the kernel lays out each sequence's scales per KV block (``[2 * kv_heads, block_kv]``, per-page scales repeated
    over their tokens; it reads the scales of every page-table entry and writes ``cdiv(entries, block_kv /
    page_size)`` blocks), and the kernel copies one such block with each KV block it fetches. The scales fold into
    the scores (K) and the probabilities (V); the codes are widened while the next KV block's DMA is in flight (VPU
    work, not serial time).
    """
    q_lens = np.atleast_1d(sizes("query_lens", query_lens))
    lens = np.atleast_1d(sizes("context_lens", context_lens))
    if q_lens.shape[-1:] != lens.shape[-1:] and q_lens.shape[-1] != 1 and lens.shape[-1] != 1:
        raise InputError(f"`query_lens` has {q_lens.shape[-1]} sequences but `context_lens` has {lens.shape[-1]}; "
                         "give one of each per sequence")
    q_lens, lens = np.broadcast_arrays(q_lens, lens)
    if np.any(q_lens > lens):
        i = np.flatnonzero(q_lens > lens)[0]
        raise InputError(f"`query_lens` {q_lens.flat[i]} exceeds `context_lens` {lens.flat[i]}: the context "
                         "includes the new tokens, so it must be at least the query length")
    q_heads, kv_heads, head_dim, page_size, kv_dt, q_dt = _paged_common(q_heads, kv_heads, head_dim, page_size,
                                                                        kv_dtype, q_dtype)
    scale = _resolve_kv_scale(kv_dt, kv_scale)
    bq = sizes("block_q", block_q if block_q is not None else tuned_block("ragged_paged_attention", "block_q", chip))
    if block_kv is None:  # the tuned block, rounded up to whole pages (tpu-inference uses pages up to 256 tokens)
        tuned = tuned_block("ragged_paged_attention", "block_kv", chip)
        bkv = np.maximum(-(-tuned // np.asarray(page_size, dtype=np.int64)), 1) * page_size
    else:
        bkv = sizes("block_kv", block_kv)
    if np.any(bkv % page_size):
        raise InputError(f"`block_kv` {bkv} must be a multiple of `page_size` {page_size} (whole pages per KV block)")
    table = _page_table_width(lens, page_size, pages_per_seq, per_seq_axis=True)
    blocks, fetched = ragged_fetches(q_lens, lens, page_size, bq, bkv)
    scales: dict = {}
    if scale in ("per-token", "per-page"):
        block_scale_bytes = 2.0 * SCALE_BYTES * kv_heads * bkv  # one KV block's K and V scales, every head
        scales = dict(kv_scale_read=blocks * block_scale_bytes, fold_scales=True, dequant_overlaps=True,
                      scale_gather=(kv_scale_bytes(table * page_size, table, kv_heads, scale),
                                    cdiv(table, bkv // page_size) * block_scale_bytes))
    common = dict(q_lens=q_lens, lens=lens, batch=None, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                  page_size=page_size, kv_dtype=kv_dt, q_dtype=q_dt, kv_scale=scale, precision=precision,
                  block_q=bq, table_entries=table, chip=chip, kv_pages_fetched=fetched, **scales)
    decode = q_lens == 1
    prefill_part = _paged_attention_cost(name="prefill", seq_mask=~decode, **common)
    decode_part = _paged_attention_cost(name="decode", seq_mask=decode, **common)
    notes = ("parts: prefill (query_lens > 1) and decode (query_lens == 1) sequences of one kernel launch",)
    cost = combine("ragged-attention", [prefill_part, decode_part], notes=notes + prefill_part.notes, launches=1,
                   launch_kind="pallas")
    metrics = {f"{p.name}_{k}": v for p in (prefill_part, decode_part) for k, v in p.metrics.items()}
    return dataclasses.replace(cost, metrics=metrics)


def mla_decode(
    *,
    context_lens: Num,
    q_heads: Num,
    page_size: Num,
    kv_lora_rank: Num = 512,
    rope_head_dim: Num = 64,
    kv_dtype: str = "bf16",
    q_dtype: str = "bf16",
    batch: Num | None = None,
    pages_per_seq: Num | None = None,
    chip: object | None = None,
) -> OpCost:
    """DeepSeek-style multi-head latent attention, decode step, absorbed form.

    Each cached token stores one latent of ``kv_lora_rank`` plus a shared
    rope key of ``rope_head_dim`` (DeepSeek-V3: 512 + 64 = 576 values), shared
    by all q heads (an MQA-like layout). Per q head and token: scores over
    the 576-d [latent; rope] (2*576 FLOPs) and the value product over the
    512-d latent (2*512 FLOPs). The W_UK / W_UV absorption matmuls belong to
    the projections and are not counted here.
    """
    lens, b = _context_batch(context_lens, batch)
    q_heads, page_size = sizes("q_heads", q_heads), sizes("page_size", page_size)
    rank, rope = sizes("kv_lora_rank", kv_lora_rank), sizes("rope_head_dim", rope_head_dim)
    kv_dt, q_dt = parse_dtype(kv_dtype, "`kv_dtype`"), parse_dtype(q_dtype, "`q_dtype`")
    table = _page_table_width(lens, page_size, pages_per_seq, per_seq_axis=b is None)
    tiles = chip_tiles(chip)
    path = matmul_path(chip, q_dt, kv_dt)
    pages = cdiv(lens, page_size)
    tokens = pages * page_size
    qk_dim = rank + rope

    def total(x: Num) -> Num:
        return _reduce(np.asarray(x, dtype=float) * np.ones(np.shape(lens)), b)

    useful = total(2.0 * q_heads * lens * (qk_dim + rank))
    issued = total(2.0 * round_up(q_heads, tiles.sublanes) * tokens
                   * (round_up(qk_dim, tiles.mxu) + round_up(rank, tiles.mxu)) * path.passes)
    scores = 1.0 * q_heads * tokens
    vpu, eup = softmax_work(scores, 1.0 * q_heads * pages, rank, scores)
    vpu = vpu + 2.0 * q_heads * rank
    eup = eup + 1.0 * q_heads
    if path.converts_rhs:
        vpu = vpu + 1.0 * tokens * qk_dim * DTYPES[kv_dt].widen_ops_per_element
    latent_bytes = 1.0 * tokens * qk_dim * DTYPES[kv_dt].itemsize_bytes
    q_item = DTYPES[q_dt].itemsize_bytes
    read = latent_bytes + q_heads * qk_dim * q_item + (table + 2) * INDEX_BYTES
    write = 1.0 * q_heads * rank * q_item
    return OpCost(
        name="mla-decode",
        mxu_flops=issued,
        useful_flops=useful,
        mxu_dtype=path.compute_dtype,
        vpu_ops=total(vpu),
        eup_ops=total(eup),
        hbm_read_bytes=total(read),
        hbm_write_bytes=total(write),
        launches=1,
        launch_kind="pallas",
        notes=path.notes + ("absorbed MLA: one shared latent+rope KV row per token, read in whole pages",),
        metrics={
            "sequences": total(1.0),
            "context_tokens": total(lens),
            "kv_bytes_per_token": fval(qk_dim * DTYPES[kv_dt].itemsize_bytes),
            "kv_bytes": total(latent_bytes),
        },
    )
