"""The Pallas kernel body of ragged paged attention, :func:`_ragged_paged_attention_kernel` (one q block per grid
step: the sequence loop, the double-buffered page DMAs of each KV block, the online softmax per KV head, the one-row
decode path), and its in-kernel helpers: lane-replicated statistics, the 128-lane windows of q heads (loads and
masked stores), the split of a padded bf16 / f32 KV block into K and V and of an 8-bit block into widened codes
(:func:`token_order`), the masking value and the scoring chunk. The grid design it implements is described in
:mod:`kernels.ragged_paged_attention.kernel`, which builds the pallas_call around it.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.ragged_paged_attention.blocks import LANES, STATS_LANES
from kernels.ragged_paged_attention.plan import RaggedPagedAttentionPlan

#: Finite "minus infinity" for masked scores (keeps exp() and max() NaN-free).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
#: KV tokens scored at once inside a KV block. Whole blocks: 128-token chunks, which would keep a chunk's
#: K, V and scores in registers, measured slower on v5e (4x the row reductions, more spills).
COMPUTE_TOKENS = 1 << 20


def _lanes(stats, width: int):
    """A lane-replicated ``[rows, STATS_LANES]`` statistic as ``[rows, width]`` (tiled, or its first lanes)."""
    if width >= STATS_LANES:
        return jnp.tile(stats, (1, width // STATS_LANES))
    return stats[:, :width]


def _head_windows(q_heads: int, head_dim: int) -> list[list[int]]:
    """q heads grouped by the 128-lane window of ``[.., q_heads * head_dim]`` they sit in: one head per window
    (or several windows) at head_dim >= 128, two per window at head_dim 64 (the last alone if q_heads is odd)."""
    per = max(1, LANES // head_dim)
    return [list(range(j, min(j + per, q_heads))) for j in range(0, q_heads, per)]


def _load_head(x_ref, j: int, head_dim: int):
    """Columns of q head j of a ``[rows, q_heads * head_dim]`` ref; below 128 lanes, the aligned window holding
    them is loaded and the head sliced out of the value (no unaligned lane loads)."""
    if head_dim >= LANES:
        return x_ref[:, j * head_dim:(j + 1) * head_dim]
    start = j * head_dim // LANES * LANES
    width = min(LANES, x_ref.shape[1] - start)
    offset = j * head_dim - start
    return x_ref[:, start:start + width][:, offset:offset + head_dim]


def _store_heads(o_ref, heads: dict, mine, head_dim: int) -> None:
    """Write ``heads`` (q head -> ``[rows, head_dim]`` value) into ``o_ref`` where ``mine(width)`` (a
    ``[rows, width]`` bool mask) holds, one aligned lane window at a time (heads sharing a 128-lane window are
    concatenated first)."""
    for window in _head_windows(len(heads), head_dim):
        cols = slice(window[0] * head_dim, (window[-1] + 1) * head_dim)
        vals = [heads[j].astype(o_ref.dtype) for j in window]
        val = jnp.concatenate(vals, axis=1) if len(vals) > 1 else vals[0]
        o_ref[:, cols] = jnp.where(mine(val.shape[1]), val, o_ref[:, cols])


def _word_rows(kv_buf, slot: int):
    """Slot ``slot`` of the padded ``[2, block_kv, stride, pack, head_dim]`` KV buffer as ``[block_kv * stride,
    head_dim]`` 32-bit rows (row ``stride * t + w``: word w of token t)."""
    _, block_kv, stride, _, head_dim = kv_buf.shape
    return kv_buf.bitcast(jnp.uint32).at[slot].reshape(block_kv * stride, head_dim)


def _split_kv(kv_buf, slot, h: int, layout, start: int, tokens: int, *, packed_pairs: bool):
    """K and V of KV head ``h`` for tokens ``start .. start + tokens`` of slot ``slot`` of the padded KV buffer
    (``[2, block_kv, stride, pack, head_dim]``, :class:`~kernels.ragged_paged_attention.blocks.KvRowLayout`):
    two ``[tokens, head_dim]``.

    K is row ``2h`` of a token, V row ``2h + 1``: value ``r % pack`` of 32-bit word ``r // pack``. One strided
    load of the 32-bit view (stride: the padded token, so the loaded rows sit in distinct VMEM banks) fetches a
    head's words for the tokens; a bf16 word holds K in its low half and V in its high half, split by a
    truncation to 16 bits (V shifted down first) and a bitcast. ``packed_pairs`` False reads the values by
    indexing instead (interpret mode, which cannot bitcast a ref in jax 0.10.2; same values)."""
    if not packed_pairs:
        return tuple(kv_buf[slot, pl.ds(start, tokens), r // layout.pack, r % layout.pack, :]
                     for r in (2 * h, 2 * h + 1))
    rows = _word_rows(kv_buf, slot)
    stride = layout.stride

    def words(r):
        return rows[pl.ds(r + stride * start, tokens, stride=stride), :]

    if layout.pack == 1:
        return pltpu.bitcast(words(2 * h), kv_buf.dtype), pltpu.bitcast(words(2 * h + 1), kv_buf.dtype)
    pairs = words(h)
    return (pltpu.bitcast(pairs.astype(jnp.uint16), kv_buf.dtype),
            pltpu.bitcast((pairs >> 16).astype(jnp.uint16), kv_buf.dtype))


def _split_quantized_kv(kv_ref, h: int, kv_heads: int, start: int, tokens: int, dtype, *, packed: bool):
    """K and V codes of KV head ``h`` for tokens ``start .. start + tokens`` of an 8-bit ``[block_kv * 2 * kv_heads,
    head_dim]`` block, widened exactly to ``dtype`` (bf16 or f32; fp8 codes stay fp8 when ``dtype`` is theirs):
    two ``[tokens, head_dim]``.

    Four 8-bit rows share a 32-bit word (row ``4w + i`` in byte i), so with an even ``kv_heads`` the rows ``2h``
    (K) and ``2h + 1`` (V) of a token are bytes ``2 * (h % 2)`` and ``2 * (h % 2) + 1`` of word ``h // 2`` of the
    token's ``kv_heads / 2`` words: one strided load of the 32-bit view fetches both, and shifts move each byte to
    the top and back (arithmetic for int8's sign; fp8's byte is placed in the top of a 16-bit half and read as
    its bit pattern). With one KV head a word holds two tokens (K, V of token 2r, then of 2r + 1): the block's
    words load unstrided and K (V) comes out as the even tokens followed by the odd ones (:func:`token_order`;
    the scores' positions and the scales follow the same order). ``packed`` False (interpret mode, which cannot
    bitcast a ref in jax 0.10.2) loads the 8-bit rows with a stride instead (same values, same order)."""
    stride = 2 * kv_heads
    first = 2 * h + stride * start
    if not packed:
        if kv_heads == 1:  # evens then odds, as the packed path produces them
            k, v = (jnp.concatenate([kv_ref[pl.ds(first + i + 2 * parity, tokens // 2, stride=4), :]
                                     for parity in (0, 1)], axis=0) for i in (0, 1))
        else:
            k = kv_ref[pl.ds(first, tokens, stride=stride), :]
            v = kv_ref[pl.ds(first + 1, tokens, stride=stride), :]
        if dtype == kv_ref.dtype:
            return k, v
        return k.astype(jnp.float32).astype(dtype), v.astype(jnp.float32).astype(dtype)
    if kv_heads == 1:
        words = kv_ref.bitcast(jnp.uint32)[pl.ds(start // 2, tokens // 2), :]
    else:
        words = kv_ref.bitcast(jnp.uint32)[pl.ds(h // 2 + kv_heads // 2 * start, tokens, stride=kv_heads // 2), :]
    byte = 2 * (h % 2)
    if kv_ref.dtype == jnp.int8:
        def code(b):  # signed byte b, sign-extended: shift it to the top, arithmetic shift back
            top = pltpu.bitcast(words << (24 - 8 * b), jnp.int32)
            return lax.shift_right_arithmetic(top, 24).astype(jnp.float32).astype(dtype)
    else:
        def code(b):  # fp8 byte b -> its uint8 value -> the fp8 bit pattern (widened unless the MXU takes it)
            raw = lax.shift_right_logical(words << (24 - 8 * b), jnp.uint32(24)).astype(jnp.uint8)
            codes = pltpu.bitcast(raw, kv_ref.dtype)
            return codes if dtype == kv_ref.dtype else codes.astype(jnp.float32).astype(dtype)
    if kv_heads == 1:  # bytes 0, 1: K, V of the even tokens; 2, 3: of the odd ones
        return (jnp.concatenate([code(0), code(2)], axis=0), jnp.concatenate([code(1), code(3)], axis=0))
    return code(byte), code(byte + 1)


def token_order(tokens: int, kv_heads: int) -> np.ndarray:
    """Order of a KV block's tokens in the scores of an 8-bit cache: natural, or with one KV head (two tokens per
    32-bit word) the even tokens then the odd ones."""
    if kv_heads != 1:
        return np.arange(tokens)
    return np.concatenate([np.arange(0, tokens, 2), np.arange(1, tokens, 2)])


def _ragged_paged_attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs] int32
    page_table_ref,  # [max_seqs * pages_per_seq] int32 (flattened page table, ids clamped into the cache)
    cu_q_lens_ref,  # [max_seqs + 1] int32
    seq_lo_ref,  # [num_q_blocks] int32: first sequence with a row in the q block
    seq_hi_ref,  # [num_q_blocks] int32: one past the last such sequence
    # Inputs.
    q_ref,  # VMEM [block_q, q_heads * head_dim]: every q head of the tokens of q block b
    sinks_ref,  # VMEM [q_heads, STATS_LANES] f32: sink logit per q head, lane-replicated
    kv_hbm_ref,  # HBM [num_pages, page_size, words, pack, head_dim] (layout), quantized [num_pages, page_size * 2 * kv_heads, head_dim]
    *refs,  # (quantized) scales_hbm_ref, then o_ref, the scratch below, (quantized) scale_buf, scale_sems
    plan: RaggedPagedAttentionPlan,
):
    sm_scale, group, kv_heads, page_size = plan.sm_scale, plan.group, plan.kv_heads, plan.page_size
    pages_per_block, pages_per_seq = plan.pages_per_block, plan.pages_per_seq
    sliding_window, soft_cap, packed_pairs = plan.sliding_window, plan.soft_cap, plan.packed_pairs
    quantized, native_codes, layout = plan.quantized, plan.native_codes, plan.layout
    # scales_hbm_ref: HBM [max_seqs * blocks_per_seq, 2 * kv_heads, block_kv] f32 (kernel.block_scales), quantized only.
    # o_ref: VMEM [block_q, q_heads * head_dim]. Scratch:
    # kv_buf: VMEM [2, block_kv, stride, pack, head_dim]: two slots of one KV block (all heads), each token's
    # 32-bit rows padded to the layout's stride; quantized [2, block_kv * 2 * kv_heads, head_dim] (unpadded);
    # sems: DMA semaphores [2], one per slot;
    # m_ref, l_ref: VMEM [kv_heads, group * block_q, STATS_LANES] f32: running row max / sum of exp (lane-replicated);
    # acc_ref: VMEM [kv_heads, group * block_q, head_dim] f32: unnormalised output;
    # q1_ref: VMEM [kv_heads, group, head_dim] f32: a one-row (decode) sequence's query, heads stacked per group;
    # m1_ref, l1_ref: VMEM [kv_heads, group, STATS_LANES] f32, acc1_ref [kv_heads, group, head_dim]: its state;
    # scale_buf: VMEM [2, 2 * kv_heads, block_kv] f32: the KV block's scales per slot, scale_sems: DMA semaphores [2].
    scales_hbm_ref, refs = (refs[0], refs[1:]) if quantized else (None, refs)
    o_ref, kv_buf, sems, m_ref, l_ref, acc_ref, q1_ref, m1_ref, l1_ref, acc1_ref = refs[:10]
    scale_buf, scale_sems = refs[10:] if quantized else (None, None)
    block_q = q_ref.shape[0]
    compute_dtype = q_ref.dtype if quantized else kv_buf.dtype  # the MXU's operand dtype
    block_start = pl.program_id(0) * block_q
    head_dim = acc_ref.shape[2]
    block_kv = pages_per_block * page_size
    page_rows = page_size * 2 * kv_heads

    def row_span(s):
        """(first, last) positions of sequence s's query rows in this q block, and whether it has any."""
        q_start, q_end, kv_len = cu_q_lens_ref[s], cu_q_lens_ref[s + 1], kv_lens_ref[s]
        first_row = jnp.maximum(q_start, block_start)
        last_row = jnp.minimum(q_end, block_start + block_q) - 1
        offset = kv_len - q_end  # position of row r is offset + r
        return offset + first_row, offset + last_row, (last_row >= first_row) & (offset + last_row >= 0)

    def kv_block_range(s):
        """[lo, hi) KV blocks sequence s's rows in this q block see (empty if it has none)."""
        first_pos, last_pos, has_rows = row_span(s)
        hi = jnp.where(has_rows, lax.div(jnp.maximum(last_pos, 0), block_kv) + 1, 0)
        if sliding_window is None:
            return jnp.int32(0), hi
        lo = lax.div(jnp.maximum(first_pos - sliding_window + 1, 0), block_kv)
        return jnp.minimum(lo, hi), hi

    def pages_in_block(s, j):
        """Pages of block j that hold tokens of sequence s (the block's pages past its context are skipped)."""
        num_pages = lax.div(kv_lens_ref[s] + page_size - 1, page_size)
        return jnp.clip(num_pages - j * pages_per_block, 0, pages_per_block)

    def page_slots(slot, first_token, tokens):
        """The VMEM destination of ``tokens`` tokens of a slot's block (the padding rows left out)."""
        if layout is None:
            return kv_buf.at[slot, pl.ds(first_token * 2 * kv_heads, tokens * 2 * kv_heads)]
        return kv_buf.at[slot, pl.ds(first_token, tokens), pl.ds(0, layout.words)]

    def page_copy(s, j, i, slot):
        page = jnp.minimum(j * pages_per_block + i, pages_per_seq - 1)
        page_id = page_table_ref[s * pages_per_seq + page]
        return pltpu.make_async_copy(kv_hbm_ref.at[page_id], page_slots(slot, i * page_size, page_size),
                                     sems.at[slot])

    blocks_per_seq = -(-pages_per_seq // pages_per_block)

    def scale_copy(s, j, slot):
        return pltpu.make_async_copy(scales_hbm_ref.at[s * blocks_per_seq + j], scale_buf.at[slot],
                                     scale_sems.at[slot])

    def start_fetch(s, j, slot):
        count = pages_in_block(s, j)
        if quantized:  # every head's scales of the block: one DMA
            scale_copy(s, j, slot).start()
        for i in range(pages_per_block):  # unrolled: one DMA per page, every head's K and V

            @pl.when(i < count)
            def _():
                page_copy(s, j, i, slot).start()

    def wait_fetch(s, j, slot):
        count = pages_in_block(s, j)
        if quantized:
            scale_copy(s, j, slot).wait()

        @pl.when(count == pages_per_block)
        def _():  # one wait sized to the whole block
            pltpu.make_async_copy(page_slots(1 - slot, 0, block_kv), page_slots(slot, 0, block_kv),
                                  sems.at[slot]).wait()

        @pl.when(count < pages_per_block)
        def _():  # a partial last block: one wait per fetched page
            def wait_page(i, carry):
                pltpu.make_async_copy(kv_hbm_ref.at[0], page_slots(slot, 0, page_size), sems.at[slot]).wait()
                return carry

            lax.fori_loop(0, count, wait_page, 0)

            def zero_page(i, carry):  # unfetched pages: zeros, never stale data (NaN in a fresh buffer)
                if layout is None:
                    kv_buf[slot, pl.ds(pl.multiple_of(i * page_rows, page_rows), page_rows), :] = jnp.zeros(
                        (page_rows, kv_buf.shape[2]), kv_buf.dtype)
                elif packed_pairs:  # through the 32-bit row view
                    rows = page_size * layout.stride
                    _word_rows(kv_buf, slot)[pl.ds(pl.multiple_of(i * rows, rows), rows), :] = jnp.zeros(
                        (rows, head_dim), jnp.uint32)
                else:
                    kv_buf[slot, pl.ds(i * page_size, page_size)] = jnp.zeros(
                        (page_size, *kv_buf.shape[2:]), kv_buf.dtype)
                return carry

            lax.fori_loop(count, pages_per_block, zero_page, 0)

    def softmax_block(qh, h, j, slot, q_pos, m_at, l_at, acc_at):
        """KV block j of KV head h in the online softmax of the stacked query rows qh at positions q_pos
        ([rows, 1] or a scalar), state in m_at, l_at, acc_at. The block is scored in chunks of COMPUTE_TOKENS
        so that one chunk's K, V and scores stay in vector registers. Rows past the context hold finite
        values (the tail of the sequence's last page, or zeros where a partial block fetched no page), so
        masked scores (p = 0) contribute nothing."""  # noqa: D401
        m, l, acc = m_at[...], l_at[...], acc_at[...]
        qh = qh.astype(compute_dtype)
        chunk = min(COMPUTE_TOKENS, block_kv)
        assert not (quantized and kv_heads == 1) or chunk == block_kv  # token_order spans the whole block
        for c in range(block_kv // chunk):
            if quantized:
                k, v = _split_quantized_kv(kv_buf.at[slot], h, kv_heads, c * chunk, chunk,
                                           kv_buf.dtype if native_codes else compute_dtype, packed=packed_pairs)
                tokens = pl.ds(c * chunk, chunk)
                # K's scale folds into the scores (with sm_scale), V's into the probabilities: [1, chunk] rows.
                k_scale = scale_buf[slot, pl.ds(2 * h, 1), tokens] * sm_scale
                v_scale = scale_buf[slot, pl.ds(2 * h + 1, 1), tokens]
            else:
                k, v = _split_kv(kv_buf, slot, h, layout, c * chunk, chunk, packed_pairs=packed_pairs)
                k_scale = sm_scale
            scores = lax.dot_general(qh, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * k_scale
            if soft_cap is not None:
                scores = soft_cap * jnp.tanh(scores * (1.0 / soft_cap))
            iota = lax.broadcasted_iota(jnp.int32, (1, chunk), 1)
            if quantized and kv_heads == 1:  # token_order: evens, then odds
                iota = jnp.where(iota < chunk // 2, 2 * iota, 2 * iota - (chunk - 1))
            kv_pos = j * block_kv + c * chunk + iota
            scores = jnp.where(window_mask(q_pos, kv_pos), scores, MASK_VALUE)
            m_next = jnp.maximum(m, jnp.max(scores, axis=1, keepdims=True))
            p = jnp.exp(scores - jnp.tile(m_next, (1, chunk // STATS_LANES)))
            alpha = jnp.exp(m - m_next)
            l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
            pv = jnp.dot((p * v_scale if quantized else p).astype(compute_dtype), v,
                         preferred_element_type=jnp.float32)
            acc = acc * _lanes(alpha, head_dim) + pv
            m = m_next
        m_at[...], l_at[...], acc_at[...] = m, l, acc

    def window_mask(q_pos, kv_pos):
        visible = kv_pos <= q_pos
        if sliding_window is not None:
            visible &= kv_pos > q_pos - sliding_window
        return visible

    def attend(s, j, slot):
        """Block path: every row of the q block, the group's heads stacked ([group * block_q] rows)."""
        q_end, kv_len = cu_q_lens_ref[s + 1], kv_lens_ref[s]
        q_pos = block_start + (kv_len - q_end) + lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
        q_pos = jnp.concatenate([q_pos] * group, axis=0) if group > 1 else q_pos  # [group * block_q, 1]
        for h in range(kv_heads):
            cols = [_load_head(q_ref, h * group + g, head_dim) for g in range(group)]
            qh = jnp.concatenate(cols, axis=0) if group > 1 else cols[0]
            softmax_block(qh, h, j, slot, q_pos, m_ref.at[h], l_ref.at[h], acc_ref.at[h])

    def attend_one(j, slot, q_pos):
        """One-row path (a decode token, or a prefill's single row in this block) at position q_pos: only the
        group's ``group`` query rows."""
        for h in range(kv_heads):
            softmax_block(q1_ref[h], h, j, slot, q_pos, m1_ref.at[h], l1_ref.at[h], acc1_ref.at[h])

    def sink_rows(h, rows_per_head):
        """Initial running max of KV head h's stacked rows: each q head's sink logit (MASK_VALUE when off)."""
        return jnp.concatenate([jnp.broadcast_to(sinks_ref[pl.ds(h * group + g, 1), :], (rows_per_head, STATS_LANES))
                                for g in range(group)], axis=0)

    def start_sequence():
        """Online-softmax state for a new sequence: the sink logit (or nothing) as the running max, sum 1."""
        for h in range(kv_heads):
            m_ref[h] = sink_rows(h, block_q)
            l_ref[h] = jnp.ones(l_ref.shape[1:], jnp.float32)
            acc_ref[h] = jnp.zeros(acc_ref.shape[1:], jnp.float32)

    def start_one(row):
        """One-row path: gather row ``row`` of the q block for every head (a masked sublane sum: rows past the
        batch may hold anything, NaN included) and reset the state."""
        mine = lax.broadcasted_iota(jnp.int32, (block_q, 1), 0) == row
        q_row = jnp.sum(jnp.where(mine, q_ref[...].astype(jnp.float32), 0.0), axis=0, keepdims=True)
        for h in range(kv_heads):
            heads = [q_row[:, (h * group + g) * head_dim:(h * group + g + 1) * head_dim] for g in range(group)]
            q1_ref[h] = jnp.concatenate(heads, axis=0) if group > 1 else heads[0]
            m1_ref[h] = sink_rows(h, 1)
            l1_ref[h] = jnp.ones(l1_ref.shape[1:], jnp.float32)
            acc1_ref[h] = jnp.zeros(acc1_ref.shape[1:], jnp.float32)

    def finish(s):
        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]

        def mine(width):
            token = block_start + lax.broadcasted_iota(jnp.int32, (block_q, width), 0)
            return (token >= q_start) & (token < q_end)

        heads = {}
        for h in range(kv_heads):
            out = acc_ref[h] * _lanes(1.0 / l_ref[h], head_dim)
            for g in range(group):
                heads[h * group + g] = out[g * block_q:(g + 1) * block_q]
        _store_heads(o_ref, heads, mine, head_dim)

    def finish_one(row):

        def mine(width):
            return lax.broadcasted_iota(jnp.int32, (block_q, width), 0) == row

        heads = {}
        for h in range(kv_heads):
            out = acc1_ref[h] * _lanes(1.0 / l1_ref[h], head_dim)
            for g in range(group):
                heads[h * group + g] = jnp.broadcast_to(out[g:g + 1], (block_q, head_dim))
        _store_heads(o_ref, heads, mine, head_dim)

    def sequence(s, slot):
        lo, hi = kv_block_range(s)
        # Sequence s - 1 of this step (if it had KV blocks) already fetched our first block.
        prev_lo, prev_hi = kv_block_range(jnp.maximum(s - 1, 0))
        prefetched = (s > seq_lo) & (prev_hi > prev_lo)

        @pl.when((hi > lo) & jnp.logical_not(prefetched))
        def _():
            start_fetch(s, lo, slot)

        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]
        first_row = jnp.maximum(q_start, block_start)
        one_row = jnp.minimum(q_end, block_start + block_q) - first_row == 1

        @pl.when(one_row)
        def _():
            start_one(first_row - block_start)

        @pl.when(jnp.logical_not(one_row))
        def _():
            start_sequence()

        def kv_block(j, slot):
            # Prefetch the step's next (sequence, KV block): the next block of s, else the first of s + 1.
            more_here = j + 1 < hi
            following = jnp.minimum(s + 1, seq_hi - 1)  # clamped: SMEM reads stay in bounds
            next_lo, next_hi = kv_block_range(following)
            has_next = more_here | ((s + 1 < seq_hi) & (next_hi > next_lo))

            @pl.when(has_next)
            def _():
                start_fetch(jnp.where(more_here, s, following), jnp.where(more_here, j + 1, next_lo), 1 - slot)

            wait_fetch(s, j, slot)

            @pl.when(one_row)
            def _():
                attend_one(j, slot, kv_lens_ref[s] - q_end + first_row)

            @pl.when(jnp.logical_not(one_row))
            def _():
                attend(s, j, slot)

            return 1 - slot

        slot = lax.fori_loop(lo, hi, kv_block, slot)

        @pl.when((hi > lo) & one_row)
        def _():
            finish_one(first_row - block_start)

        @pl.when((hi > lo) & jnp.logical_not(one_row))
        def _():
            finish(s)

        return slot

    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
    seq_lo = seq_lo_ref[pl.program_id(0)]
    seq_hi = seq_hi_ref[pl.program_id(0)]
    lax.fori_loop(seq_lo, seq_hi, sequence, jnp.int32(0))
