"""Ragged paged attention: one mixed prefill + decode batch over a paged KV cache (Pallas TPU).

Layout (shared with ``kernels/paged_attention``):

* ``q``          ``[total_tokens, q_heads, head_dim]``: the query tokens of every
  sequence, concatenated; sequence ``s`` owns rows ``cu_q_lens[s]:cu_q_lens[s+1]``.
* ``k_pages``, ``v_pages`` ``[kv_heads, num_pages, page_size, head_dim]``.
* ``page_table`` ``[max_seqs, pages_per_seq]`` int32: page ids of each sequence.
* ``kv_lens``    ``[max_seqs]`` int32: context length of each sequence, the new
  tokens included (their K/V must already be in the cache).
* ``cu_q_lens``  ``[max_seqs + 1]`` int32, ``cu_q_lens[0] == 0``, non-decreasing.
* ``num_seqs``   ``[1]`` int32: how many leading entries of the three above are live.

Query ``i`` of a sequence with ``q_len`` new tokens and ``kv_len`` context sees
KV positions ``0 .. kv_len - q_len + i`` (causal within the sequence). Query
head ``j`` reads KV head ``j // (q_heads // kv_heads)`` (GQA). Rows from
``cu_q_lens[num_seqs]`` to ``total_tokens`` (padding) come out as zeros.

Grid design
-----------
The grid is ``(kv_heads, cdiv(total_tokens, block_q))``; both axes are
independent ("parallel"). Step ``(h, b)`` owns the aligned q block
``b * block_q : (b + 1) * block_q`` of the flat token axis and the ``G =
q_heads // kv_heads`` query heads of KV head ``h``. q and the output are viewed
as ``[total_tokens, q_heads * head_dim]`` (a free reshape), so the block is
``(block_q, G * head_dim)`` and is pipelined by Pallas. Inside a step:

1. the output block is zeroed (padding rows stay zero);
2. a dynamic loop visits the sequences that own a row of the block (a range
   ``seq_lo[b] .. seq_hi[b]`` computed in the wrapper from ``cu_q_lens``, passed
   by scalar prefetch); a block may hold many decode tokens of many sequences
   or a slice of one long prefill;
3. for each such sequence, a dynamic loop runs over the KV blocks it needs
   (up to the last causal position of its rows in this q block) with an
   online softmax in f32 VMEM scratch. The ``G`` heads are stacked into one
   ``(G * block_q, head_dim)`` LHS so each KV block costs one QK^T and one PV
   matmul. KV pages are copied HBM -> VMEM by manual DMAs, double-buffered:
   the next (sequence, KV block) pair of the step is fetched while the current
   one is scored. Pages past ``cdiv(kv_len, page_size)`` are never fetched;
   stale buffer rows are masked (scores) and zeroed (values);
4. the finished rows of the sequence are merged into the output block.

A step issues its first DMA without overlap (no prefetch across grid steps).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import DEFAULT_CHIP, check_paged_kv_cache, interpret_params
from kernels.tiling import tpu_chip
from kernels.ragged_paged_attention.blocks import (
    LANES,
    STATS_LANES,
    RaggedPagedAttentionBlockSizes,
    default_block_sizes,
    sublane_multiple,
)

#: Bytes of one scalar-prefetched int32 (lengths, page ids, offsets).
INDEX_BYTES = 4
#: Finite "minus infinity" for masked scores (keeps exp() and max() NaN-free).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def ragged_paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    kv_lens: jax.Array,
    page_table: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array | int,
    *,
    sm_scale: float | None = None,
    block_sizes: RaggedPagedAttentionBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
) -> jax.Array:
    """Causal GQA attention of a ragged batch of sequences over a paged KV cache.

    Args:
      q: ``[total_tokens, q_heads, head_dim]`` queries of all sequences, concatenated.
      k_pages, v_pages: ``[kv_heads, num_pages, page_size, head_dim]`` paged cache.
      kv_lens: ``[max_seqs]`` int32 context lengths (new tokens included).
      page_table: ``[max_seqs, pages_per_seq]`` int32 page ids.
      cu_q_lens: ``[max_seqs + 1]`` int32 cumulative query lengths.
      num_seqs: ``[1]`` int32 array (or an int): live sequences.
      sm_scale: score scale; ``1 / sqrt(head_dim)`` when None.
      block_sizes: tile sizes; the chip's defaults when None.
      chip: TPU whose defaults and scoped-VMEM budget apply.
      interpret: run in Pallas TPU interpret mode (CPU).

    Returns:
      ``[total_tokens, q_heads, head_dim]`` in q's dtype; padding rows are zero.

    Shapes, dtypes and block sizes are checked always; page ids, lengths and
    ``cu_q_lens`` are checked when they are concrete (not under an outer jit).
    Raises ValueError naming the argument at fault.
    """
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(-1)
    _check_shapes(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs)
    page_size = k_pages.shape[2]
    group = q.shape[1] // k_pages.shape[0]
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, q_dtype=q.dtype, page_size=page_size)
    block_sizes.validate(q_dtype=q.dtype, kv_dtype=k_pages.dtype, page_size=page_size, q_heads_per_kv_head=group,
                         head_dim=q.shape[2], chip=chip)
    _check_smem(page_table, q.shape[0], block_sizes.block_q, chip)
    _check_values(q, k_pages, kv_lens, page_table, cu_q_lens, num_seqs)
    scale = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    return _ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=scale,
                                   block_sizes=block_sizes, chip=chip, interpret=interpret)


def _check_shapes(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs) -> None:
    if q.ndim != 3:
        raise ValueError(f"q must be [total_tokens, q_heads, head_dim], got shape {q.shape}")
    _, q_heads, head_dim = q.shape
    kv_heads, page_size = check_paged_kv_cache(k_pages, v_pages, q_heads=q_heads, head_dim=head_dim)
    if head_dim % LANES:
        raise ValueError(f"q head_dim={head_dim} must be a multiple of {LANES} (lane tiling of the head slices)")
    kv_sub = sublane_multiple(k_pages.dtype)
    if page_size % kv_sub:
        raise ValueError(f"k_pages page_size={page_size} must be a multiple of {kv_sub} for "
                         f"{np.dtype(k_pages.dtype).name} pages (sublane tiling)")
    if page_table.ndim != 2:
        raise ValueError(f"page_table must be [max_seqs, pages_per_seq], got shape {page_table.shape}")
    max_seqs = page_table.shape[0]
    if kv_lens.shape != (max_seqs,):
        raise ValueError(f"kv_lens shape {kv_lens.shape} must be ({max_seqs},) to match page_table")
    if cu_q_lens.shape != (max_seqs + 1,):
        raise ValueError(f"cu_q_lens shape {cu_q_lens.shape} must be ({max_seqs + 1},) (max_seqs + 1)")
    if num_seqs.shape != (1,):
        raise ValueError(f"num_seqs must be an int or a [1] array, got shape {num_seqs.shape}")
    for name, arr in (("kv_lens", kv_lens), ("page_table", page_table), ("cu_q_lens", cu_q_lens)):
        if arr.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {arr.dtype}")


def scalar_prefetch_bytes(*, max_seqs: int, pages_per_seq: int, total_tokens: int, block_q: int) -> int:
    """SMEM the scalar-prefetched metadata takes: kv_lens, page table, cu_q_lens, per-q-block sequence ranges."""
    num_blocks = -(-total_tokens // block_q)
    return INDEX_BYTES * (max_seqs + max_seqs * pages_per_seq + max_seqs + 1 + 2 * num_blocks)


def _check_smem(page_table, total_tokens: int, block_q: int, chip: str) -> None:
    smem = tpu_chip(chip).memory.smem_bytes_per_core
    need = scalar_prefetch_bytes(max_seqs=page_table.shape[0], pages_per_seq=page_table.shape[1],
                                 total_tokens=total_tokens, block_q=block_q)
    if smem is not None and need > smem:
        raise ValueError(f"page_table {list(page_table.shape)} with the other scalar-prefetched metadata needs "
                         f"{need} B of SMEM, over the {smem} B of {chip}; split the batch or shorten pages_per_seq")


def _concrete(x) -> np.ndarray | None:
    """x as a numpy array, or None when it is traced (checks are skipped then)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_values(q, k_pages, kv_lens, page_table, cu_q_lens, num_seqs) -> None:
    values = [_concrete(x) for x in (kv_lens, page_table, cu_q_lens, num_seqs)]
    if any(v is None for v in values):
        return
    lens, table, cu, n = values
    n = int(n[0])
    max_seqs, pages_per_seq = table.shape
    page_size, num_pages = k_pages.shape[2], k_pages.shape[1]
    if not 0 <= n <= max_seqs:
        raise ValueError(f"num_seqs={n} must be in [0, {max_seqs}] (rows of page_table)")
    if cu[0] != 0:
        raise ValueError(f"cu_q_lens[0] must be 0, got {cu[0]}")
    q_lens = np.diff(cu[: n + 1])
    if np.any(q_lens < 0):
        raise ValueError(f"cu_q_lens must be non-decreasing over the first num_seqs+1={n + 1} entries")
    if cu[n] > q.shape[0]:
        raise ValueError(f"cu_q_lens[num_seqs]={cu[n]} exceeds q's total_tokens={q.shape[0]}")
    lens = lens[:n]
    if np.any(lens < q_lens):
        s = int(np.argmax(lens < q_lens))
        raise ValueError(f"kv_lens[{s}]={lens[s]} is smaller than the sequence's query length {q_lens[s]}; "
                         "kv_lens must count the new tokens too")
    if np.any(lens > pages_per_seq * page_size):
        s = int(np.argmax(lens > pages_per_seq * page_size))
        raise ValueError(f"kv_lens[{s}]={lens[s]} needs more than pages_per_seq={pages_per_seq} pages "
                         f"of {page_size} tokens")
    for s in range(n):
        used = table[s, : -(-int(lens[s]) // page_size)]
        bad = (used < 0) | (used >= num_pages)
        if np.any(bad):
            p = int(np.argmax(bad))
            raise ValueError(f"page_table[{s}, {p}]={used[p]} points outside the cache "
                             f"(k_pages has {num_pages} pages)")


def _sequence_ranges(cu_q_lens, num_seqs, *, total_tokens: int, block_q: int):
    """Per q block: first and one-past-last sequence that owns one of its rows."""
    num_blocks = pl.cdiv(total_tokens, block_q)
    live = jnp.arange(cu_q_lens.shape[0] - 1) < num_seqs[0]
    block_start = jnp.arange(num_blocks, dtype=jnp.int32)[:, None] * block_q
    block_end = jnp.minimum(block_start + block_q, total_tokens)
    ends_before = live[None, :] & (cu_q_lens[None, 1:] <= block_start)
    starts_before_end = live[None, :] & (cu_q_lens[None, :-1] < block_end)
    return (jnp.sum(ends_before, axis=1, dtype=jnp.int32), jnp.sum(starts_before_end, axis=1, dtype=jnp.int32))


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "chip", "interpret"))
def _ragged_paged_attention(q, k_pages, v_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale: float,
                            block_sizes: RaggedPagedAttentionBlockSizes, chip: str, interpret: bool):
    total_tokens, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    group = q_heads // kv_heads
    block_q, block_kv = block_sizes.block_q, block_sizes.block_kv
    pages_per_block = block_sizes.pages_per_block(page_size)
    rows = group * block_q
    seq_lo, seq_hi = _sequence_ranges(cu_q_lens, num_seqs, total_tokens=total_tokens, block_q=block_q)

    qo_spec = pl.BlockSpec((block_q, group * head_dim), lambda h, b, *_: (b, h))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(kv_heads, pl.cdiv(total_tokens, block_q)),
        in_specs=[qo_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=qo_spec,
        scratch_shapes=[
            pltpu.VMEM((2, pages_per_block, page_size, head_dim), k_pages.dtype),
            pltpu.VMEM((2, pages_per_block, page_size, head_dim), v_pages.dtype),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM((rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((rows, head_dim), jnp.float32),
        ],
    )
    kernel = functools.partial(_ragged_paged_attention_kernel, sm_scale=sm_scale, group=group,
                               pages_per_seq=pages_per_seq)
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((total_tokens, q_heads * head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret_params(interpret),
        cost_estimate=_cost_estimate(q, k_pages, page_table, block_q),
        name="ragged_paged_attention",
    )
    with jax.named_scope(f"ragged_paged_attention_bq{block_q}_bkv{block_kv}"):
        out = call(kv_lens, page_table.reshape(-1), cu_q_lens, seq_lo, seq_hi,
                   q.reshape(total_tokens, q_heads * head_dim), k_pages, v_pages)
    return out.reshape(total_tokens, q_heads, head_dim)


def assumed_lengths(*, total_tokens: int, max_seqs: int, pages_per_seq: int, num_pages: int,
                    page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The (query_lens, context_lens) the static cost estimate assumes.

    XLA needs the estimate at trace time, before lengths are known: the
    ``total_tokens`` are split evenly over ``min(max_seqs, total_tokens)``
    sequences whose contexts share the cache evenly (capped at
    ``pages_per_seq`` pages, and at least their query length).
    """
    n = max(1, min(max_seqs, total_tokens))
    q_lens = np.full(n, total_tokens // n, np.int64)
    q_lens[: total_tokens % n] += 1
    share_tokens = min(pages_per_seq, num_pages // n) * page_size
    return q_lens, np.maximum(q_lens, share_tokens)


def _cost_estimate(q, k_pages, page_table, block_q: int):
    """pl.CostEstimate from perfmodel's ragged paged attention model at the assumed lengths."""
    from perfmodel.model.attention import ragged_paged_attention as ragged_model
    from perfmodel.model.core import to_cost_estimate

    total_tokens, q_heads, head_dim = q.shape
    kv_heads, num_pages, page_size, _ = k_pages.shape
    q_lens, kv_lens = assumed_lengths(total_tokens=total_tokens, max_seqs=page_table.shape[0],
                                      pages_per_seq=page_table.shape[1], num_pages=num_pages, page_size=page_size)
    cost = ragged_model(query_lens=q_lens, context_lens=kv_lens, q_heads=q_heads, kv_heads=kv_heads,
                        head_dim=head_dim, page_size=page_size, kv_dtype=np.dtype(k_pages.dtype).name,
                        q_dtype=np.dtype(q.dtype).name, block_q=block_q)
    return to_cost_estimate(cost)


def _ragged_paged_attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs] int32
    page_table_ref,  # [max_seqs * pages_per_seq] int32 (flattened page table)
    cu_q_lens_ref,  # [max_seqs + 1] int32
    seq_lo_ref,  # [num_q_blocks] int32: first sequence with a row in the q block
    seq_hi_ref,  # [num_q_blocks] int32: one past the last such sequence
    # Inputs.
    q_ref,  # VMEM [block_q, group * head_dim]: the q heads of KV head h, tokens of q block b
    k_hbm_ref,  # HBM [kv_heads, num_pages, page_size, head_dim]
    v_hbm_ref,  # HBM [kv_heads, num_pages, page_size, head_dim]
    # Output.
    o_ref,  # VMEM [block_q, group * head_dim]
    # Scratch.
    k_buf,  # VMEM [2, pages_per_block, page_size, head_dim]: two K slots
    v_buf,  # VMEM [2, pages_per_block, page_size, head_dim]: two V slots
    sems,  # DMA semaphores [2]: one per slot
    m_ref,  # VMEM [group * block_q, STATS_LANES] f32: running row max (lane-replicated)
    l_ref,  # VMEM [group * block_q, STATS_LANES] f32: running row sum of exp
    acc_ref,  # VMEM [group * block_q, head_dim] f32: unnormalised output
    *,
    sm_scale: float,
    group: int,
    pages_per_seq: int,
):
    h = pl.program_id(0)
    block_start = pl.program_id(1) * q_ref.shape[0]
    block_q = q_ref.shape[0]
    head_dim = acc_ref.shape[1]
    _, pages_per_block, page_size, _ = k_buf.shape
    block_kv = pages_per_block * page_size

    def kv_blocks_needed(s):
        """KV blocks sequence s needs for its rows in this q block (0 if it has none)."""
        q_start, q_end, kv_len = cu_q_lens_ref[s], cu_q_lens_ref[s + 1], kv_lens_ref[s]
        last_row = jnp.minimum(q_end, block_start + block_q) - 1
        last_pos = kv_len - q_end + last_row  # = kv_len - q_len + (last_row - q_start)
        has_rows = (q_end > q_start) & (last_pos >= 0)
        return jnp.where(has_rows, lax.div(jnp.maximum(last_pos, 0), block_kv) + 1, 0)

    def for_each_page_copy(s, j, slot, action):
        num_pages = lax.div(kv_lens_ref[s] + page_size - 1, page_size)

        # A loop over the block's pages (not unrolled: a block may hold hundreds of pages).
        def page_copy(i, carry):
            page = j * pages_per_block + i

            @pl.when(page < num_pages)
            def _():
                page_id = page_table_ref[s * pages_per_seq + jnp.minimum(page, pages_per_seq - 1)]
                for src, dst in ((k_hbm_ref, k_buf), (v_hbm_ref, v_buf)):
                    action(pltpu.make_async_copy(src.at[h, page_id], dst.at[slot, i], sems.at[slot]))

            return carry

        lax.fori_loop(0, pages_per_block, page_copy, 0)

    def start_fetch(s, j, slot):
        for_each_page_copy(s, j, slot, lambda copy: copy.start())

    def wait_fetch(s, j, slot):
        for_each_page_copy(s, j, slot, lambda copy: copy.wait())

    def attend(s, j, slot):
        q_end, kv_len = cu_q_lens_ref[s + 1], kv_lens_ref[s]
        k = k_buf[slot].reshape(block_kv, head_dim)
        v = v_buf[slot].reshape(block_kv, head_dim)
        v_pos = j * block_kv + lax.broadcasted_iota(jnp.int32, (block_kv, head_dim), 0)
        v = jnp.where(v_pos < kv_len, v, jnp.zeros_like(v))  # stale slot rows may hold NaN
        q = jnp.concatenate([q_ref[:, g * head_dim:(g + 1) * head_dim] for g in range(group)], axis=0)
        scores = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * sm_scale
        token = block_start + lax.broadcasted_iota(jnp.int32, (block_q, block_kv), 0)
        q_pos = jnp.concatenate([token + (kv_len - q_end)] * group, axis=0)  # [group * block_q, block_kv]
        kv_pos = j * block_kv + lax.broadcasted_iota(jnp.int32, scores.shape, 1)
        scores = jnp.where((kv_pos <= q_pos) & (kv_pos < kv_len), scores, MASK_VALUE)
        m_prev, l_prev = m_ref[...], l_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(scores, axis=1, keepdims=True))
        p = jnp.exp(scores - jnp.tile(m_next, (1, block_kv // STATS_LANES)))
        alpha = jnp.exp(m_prev - m_next)
        m_ref[...] = m_next
        l_ref[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        acc_ref[...] = acc_ref[...] * jnp.tile(alpha, (1, head_dim // STATS_LANES)) + pv

    def finish(s):
        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]
        out = acc_ref[...] * jnp.tile(1.0 / l_ref[...], (1, head_dim // STATS_LANES))
        token = block_start + lax.broadcasted_iota(jnp.int32, (block_q, head_dim), 0)
        mine = (token >= q_start) & (token < q_end)
        for g in range(group):
            cols = slice(g * head_dim, (g + 1) * head_dim)
            rows = out[g * block_q:(g + 1) * block_q].astype(o_ref.dtype)
            o_ref[:, cols] = jnp.where(mine, rows, o_ref[:, cols])

    def sequence(s, slot):
        n = kv_blocks_needed(s)
        # Sequence s - 1 of this step (if it had KV blocks) already fetched our first block.
        prefetched = (s > seq_lo) & (kv_blocks_needed(jnp.maximum(s - 1, 0)) > 0)

        @pl.when((n > 0) & jnp.logical_not(prefetched))
        def _():
            start_fetch(s, 0, slot)

        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        def kv_block(j, slot):
            # Prefetch the step's next (sequence, KV block): the next block of s, else the first of s + 1.
            more_here = j + 1 < n
            following = jnp.minimum(s + 1, seq_hi - 1)  # clamped: SMEM reads stay in bounds
            next_s = jnp.where(more_here, s, following)
            has_next = more_here | ((s + 1 < seq_hi) & (kv_blocks_needed(following) > 0))

            @pl.when(has_next)
            def _():
                start_fetch(next_s, jnp.where(more_here, j + 1, 0), 1 - slot)

            wait_fetch(s, j, slot)
            attend(s, j, slot)
            return 1 - slot

        slot = lax.fori_loop(0, n, kv_block, slot)

        @pl.when(n > 0)
        def _():
            finish(s)

        return slot

    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
    seq_lo = seq_lo_ref[pl.program_id(1)]
    seq_hi = seq_hi_ref[pl.program_id(1)]
    lax.fori_loop(seq_lo, seq_hi, sequence, jnp.int32(0))
