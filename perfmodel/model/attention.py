"""Attention: flash-style prefill, decode over a paged KV cache, ragged mixed batches, MLA decode.

Conventions
-----------
* Causal attention places the ``q_len`` queries at the *last* positions of
  the ``kv_len`` keys (a prefill chunk after a cached prefix), so query row
  ``r`` sees keys ``[0, r + kv_len - q_len]`` (further clipped to the last
  ``sliding_window`` keys).
* Useful FLOPs are ``4 * head_dim`` per visible (query, key) pair per q head
  (QK^T and PV). Issued FLOPs count whole (block_q x block_kv) tiles: a tile
  with any visible pair is computed in full, fully masked tiles are skipped;
  head_dim pads to the MXU edge and rows to the sublane tile.
* K and V are read once per (q block, kv block) tile a kernel visits, for all
  q heads of a GQA group at once; Q is read and O written once.
* Softmax is the online (flash) form: per score element a max, subtract, sum
  and cast on the VPU plus one exp on the EUP; masked tiles add a compare and
  select; per row and kv block the running max / sum / accumulator rescale.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from perfmodel.errors import InputError
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
from perfmodel.model.shapes import cdiv, chip_tiles, choice, fval, optional_size, round_up, sizes

#: VPU ops per computed score element: running max, subtract, row sum, cast of p to the matmul dtype.
SOFTMAX_VPU_OPS_PER_SCORE = 4
#: Extra VPU ops per score element of a masked tile (iota compare + select).
MASK_VPU_OPS_PER_SCORE = 2
#: EUP ops per score element (exp).
SOFTMAX_EUP_OPS_PER_SCORE = 1
#: Per row and kv block: new max, exp(m_old - m_new) (EUP), rescale of l; plus head_dim accumulator rescale ops.
ONLINE_SOFTMAX_VPU_OPS_PER_ROW_BLOCK = 3
ONLINE_SOFTMAX_EUP_OPS_PER_ROW_BLOCK = 1

KV_SCALES = (None, "none", "per-tensor", "per-token", "per-page")


# ----------------------------------------------------------------------------- counting helpers


def floor_sum(n: Num, m: Num, a: Num, b: Num) -> np.ndarray:
    """sum_{i=0}^{n-1} floor((a*i + b) / m) for integer arrays (n, b >= 0; m >= 1; a >= 0), vectorized.

    The Euclid-like reduction: each round removes the whole quotients of a and
    b, then swaps the roles of the axes; O(log) rounds.
    """
    n, m, a, b = (np.array(x, dtype=np.int64) for x in np.broadcast_arrays(n, m, a, b))
    ans = np.zeros(n.shape, dtype=np.int64)
    active = n > 0
    while np.any(active):
        q = a // m
        ans += np.where(active, (n * (n - 1) // 2) * q, 0)
        a = a - q * m
        q = b // m
        ans += np.where(active, n * q, 0)
        b = b - q * m
        y = a * n + b
        active &= y >= m
        safe_m = np.where(active, m, 1)
        n, b, m, a = (np.where(active, y // safe_m, 0), np.where(active, y % safe_m, 0),
                      np.where(active, a, 1), np.where(active, m, 0))
    return ans


def _sum_min(lo: np.ndarray, hi: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """sum_{x=lo}^{hi} min(x, cap) for lo <= hi + 1 (empty range: 0)."""
    c = np.clip(cap, lo - 1, hi)
    return (lo + c) * (c - lo + 1) // 2 + cap * (hi - c)


def visible_pairs(q_len: np.ndarray, kv_len: np.ndarray, causal: bool, window: np.ndarray | None) -> np.ndarray:
    """(query, key) pairs attention actually uses, per (batch, head)."""
    if not causal:
        return q_len * kv_len
    cap = kv_len if window is None else np.minimum(window, kv_len)
    return _sum_min(kv_len - q_len + 1, kv_len, cap)


def kv_tiles(q_len: np.ndarray, kv_len: np.ndarray, bq: np.ndarray, bkv: np.ndarray, causal: bool,
             window: np.ndarray | None) -> np.ndarray:
    """(q block, kv block) tiles with at least one visible pair, per (batch, head)."""
    nq = cdiv(q_len, bq)
    nkv = cdiv(kv_len, bkv)
    if not causal:
        return nq * nkv
    off = kv_len - q_len
    # Highest visible key of q block j: j*bq + bq - 1 + off, except the last block: kv_len - 1.
    hi_sum = floor_sum(nq - 1, bkv, bq, bq - 1 + off) + (kv_len - 1) // bkv
    if window is None:
        lo_sum = 0
    else:
        # Lowest visible key of q block j: max(0, j*bq + off - window + 1).
        c = off - window + 1
        j0 = np.where(c > 0, 0, np.minimum(-c // bq + 1, nq))
        lo_sum = floor_sum(nq - j0, bkv, bq, j0 * bq + c)
    return hi_sum - lo_sum + nq


def _check_heads(q_heads: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    if np.any(q_heads % kv_heads):
        bad = np.broadcast_arrays(q_heads, kv_heads)
        i = np.flatnonzero(bad[0] % bad[1])[0]
        raise InputError(f"`kv_heads` {bad[1].flat[i]} must divide `q_heads` {bad[0].flat[i]} "
                         "(GQA groups need a whole number of q heads per kv head)")
    return q_heads // kv_heads


def _softmax_work(scores: Num, row_blocks: Num, head_dim: Num, masked_scores: Num) -> tuple[Num, Num]:
    """(VPU ops, EUP ops) of online softmax over ``scores`` computed elements."""
    vpu = (SOFTMAX_VPU_OPS_PER_SCORE * scores + MASK_VPU_OPS_PER_SCORE * masked_scores
           + (ONLINE_SOFTMAX_VPU_OPS_PER_ROW_BLOCK + head_dim) * row_blocks)
    eup = SOFTMAX_EUP_OPS_PER_SCORE * scores + ONLINE_SOFTMAX_EUP_OPS_PER_ROW_BLOCK * row_blocks
    return vpu, eup


def tuned_block(kernel: str, field: str, chip: object | None) -> int:
    """The bundled kernel's stored default for one block field on ``chip``: the data its ``blocks.py`` reads
    (``kernels/<kernel>/tuned.json``), so the op model and the shipped kernel agree. A chip without stored
    defaults (or none given) takes the default chip's. The kernel may shrink its blocks further to fit VMEM
    for large GQA groups or f32; the op model does not."""
    from kernels.tuned import stored_blocks
    from perfmodel.hw.registry import DEFAULT_CHIP

    name = getattr(chip, "name", None)
    blocks = (stored_blocks(kernel, name) if name else None) or stored_blocks(kernel, DEFAULT_CHIP)
    return int(blocks[field])


def _default_block(value: Num | None, field: str, chip: object | None, length: np.ndarray, multiple: int,
                   name: str) -> np.ndarray:
    """The block size used: given, or the bundled flash attention's tuned one for the chip, at most the length
    rounded up to the tile multiple."""
    if value is not None:
        return sizes(name, value)
    return np.minimum(tuned_block("flash_attention", field, chip), round_up(length, multiple))


# ----------------------------------------------------------------------------- prefill


def flash_attention(
    *,
    batch: Num,
    q_len: Num,
    kv_len: Num,
    q_heads: Num,
    kv_heads: Num,
    head_dim: Num,
    causal: bool = True,
    sliding_window: Num | None = None,
    dtype: str = "bf16",
    block_q: Num | None = None,
    block_kv: Num | None = None,
    precision: str | None = None,
    soft_cap: bool = False,
    sinks: bool = False,
    segment_ids: bool = False,
    chip: object | None = None,
) -> OpCost:
    """Flash-style attention (prefill), MHA / GQA / MQA, causal or not, optional sliding window.

    ``soft_cap``: scores capped as c * tanh(s / c) (one more EUP op and two VPU multiplies per score).
    ``sinks``: a sink logit per q head (the bundled kernel reads one f32 (8, 128) tile per head).
    ``segment_ids``: packed sequences; every computed tile is masked, and the bundled kernel reads the q ids
    replicated over 128 lanes once per kv head and the kv ids replicated over 8 sublanes per tile
    (int32).

    ``precision``: of the QK^T and PV dots (None = default: an fp32 dot is one bf16 pass on a TPU; the bundled
    kernel asks for "highest" with f32 inputs, six passes).

    Blocks default to the bundled flash attention's tuned blocks for the chip (:func:`tuned_block`), at most
    the length rounded up to the tile. metrics:
    ``masked_tile_share`` (share of computed score elements that are masked
    or padding), ``kv_tiles`` per (batch, head), ``grid_steps``.
    """
    batch, q_len, kv_len = sizes("batch", batch), sizes("q_len", q_len), sizes("kv_len", kv_len)
    q_heads, kv_heads, head_dim = sizes("q_heads", q_heads), sizes("kv_heads", kv_heads), sizes("head_dim", head_dim)
    window = optional_size("sliding_window", sliding_window)
    dt = parse_dtype(dtype, "`dtype`")
    group = _check_heads(q_heads, kv_heads)
    if window is not None and not causal:
        raise InputError("`sliding_window` needs causal attention; drop `no_causal` or the window")
    if causal and np.any(q_len > kv_len):
        raise InputError("`q_len` must be <= `kv_len` for causal attention (queries are the last q_len positions)")
    tiles = chip_tiles(chip)
    path = matmul_path(chip, dt, dt, precision)
    bq = _default_block(block_q, "block_q", chip, q_len, max(tiles.sublanes, 8), "block_q")
    bkv = _default_block(block_kv, "block_kv", chip, kv_len, max(tiles.lanes, 128), "block_kv")

    pairs = visible_pairs(q_len, kv_len, causal, window)
    tiles_n = kv_tiles(q_len, kv_len, bq, bkv, causal, window)
    heads_b = batch * q_heads
    useful = 4.0 * head_dim * pairs * heads_b
    issued = (4.0 * round_up(bq, tiles.sublanes) * round_up(bkv, tiles.mxu) * round_up(head_dim, tiles.mxu)
              * tiles_n * heads_b * path.passes)
    scores = 1.0 * tiles_n * bq * bkv * heads_b
    masked = scores if (causal or window is not None or segment_ids) else 0.0
    row_blocks = 1.0 * tiles_n * bq * heads_b
    vpu, eup = _softmax_work(scores, row_blocks, head_dim, masked)
    if soft_cap:
        vpu, eup = vpu + 2.0 * scores, eup + scores
    # Final normalisation: one reciprocal per row, head_dim multiplies and a cast.
    rows = 1.0 * cdiv(q_len, bq) * bq * heads_b
    vpu = vpu + rows * 2 * head_dim
    eup = eup + rows
    item = DTYPES[dt].itemsize_bytes
    q_bytes = 1.0 * batch * q_heads * q_len * head_dim * item
    kv_bytes = 2.0 * batch * kv_heads * tiles_n * bkv * head_dim * item
    ideal_kv = 2.0 * batch * kv_heads * kv_len * head_dim * item
    side_bytes = 0.0
    if sinks:
        side_bytes = side_bytes + 1.0 * batch * q_heads * 8 * 128 * 4
    if segment_ids:
        side_bytes = side_bytes + 1.0 * batch * kv_heads * (q_len * 128 + tiles_n * bkv * 8) * 4
    vmem = (2 * (bq * group + 2 * bkv) * head_dim * item + 2 * bq * group * head_dim * item
            + bq * group * (head_dim + 2 * 128) * 4 + bq * group * bkv * 4)
    steps = tiles_n * batch * kv_heads
    notes = list(path.notes)
    fixed = 0.0
    if chip is not None and chip.overheads.pallas_grid_step_overhead_s:
        fixed = steps * chip.overheads.pallas_grid_step_overhead_s
    if causal:
        notes.append("causal: fully masked tiles skipped, diagonal tiles computed in full")
    notes.append("K/V re-read once per q block (all q heads of a GQA group share each K/V tile)")
    with np.errstate(divide="ignore", invalid="ignore"):
        masked_share = 1.0 - pairs * heads_b / scores
    return OpCost(
        name="attention",
        mxu_flops=fval(issued),
        useful_flops=fval(useful),
        mxu_dtype=path.compute_dtype,
        vpu_ops=fval(vpu),
        eup_ops=fval(eup),
        hbm_read_bytes=fval(q_bytes + kv_bytes + side_bytes),
        hbm_write_bytes=fval(q_bytes),
        fixed_s=fval(fixed),
        launches=1,
        launch_kind="pallas",
        vmem_bytes=fval(vmem),
        notes=tuple(notes),
        metrics={
            "block_q": fval(bq),
            "block_kv": fval(bkv),
            "kv_tiles": fval(tiles_n),
            "masked_tile_share": fval(masked_share),
            "kv_reread_factor": fval(kv_bytes / ideal_kv),
            "grid_steps": fval(steps),
        },
    )


# ----------------------------------------------------------------------------- paged KV


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
    group = _check_heads(q_heads, kv_heads)
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
    vpu, eup = _softmax_work(scores, row_blocks, head_dim, scores)
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
    default, see :func:`flash_attention`).
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
    vpu, eup = _softmax_work(scores, 1.0 * q_heads * pages, rank, scores)
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
