"""Ragged paged attention: one mixed prefill + decode batch over a combined K/V paged cache (Pallas TPU).

This module holds the public wrapper :func:`ragged_paged_attention` and the pallas_call around the kernel body (grid,
BlockSpecs, scratch, the per-q-block sequence ranges, the KV scales gathered per KV block); the plan and the argument
checks are in :mod:`kernels.ragged_paged_attention.plan`, the kernel body in :mod:`kernels.ragged_paged_attention.body`.

Layout (JAX's / vLLM's combined cache, K and V of every KV head of a token in one page row):

* ``q``          ``[total_tokens, q_heads, head_dim]``: the query tokens of every
  sequence, concatenated; sequence ``s`` owns rows ``cu_q_lens[s]:cu_q_lens[s+1]``.
* ``kv_pages``   ``[num_pages, page_size, 2 * kv_heads, head_dim]``: row ``2h`` of a
  token is K of KV head ``h``, row ``2h + 1`` its V (interleaved). A page is one
  contiguous block of HBM, so one DMA moves it for every head.
* ``page_table`` ``[max_seqs, pages_per_seq]`` int32: page ids of each sequence.
* ``kv_lens``    ``[max_seqs]`` int32: context length of each sequence, the new
  tokens included (their K/V must already be in the cache).
* ``cu_q_lens``  ``[max_seqs + 1]`` int32, ``cu_q_lens[0] == 0``, non-decreasing.
* ``num_seqs``   ``[1]`` int32: how many leading entries of the three above are live.

Query ``i`` of a sequence with ``q_len`` new tokens and ``kv_len`` context is at
position ``p = kv_len - q_len + i`` and sees KV positions ``max(0, p - window + 1) .. p``
(``window`` infinite unless ``sliding_window`` is given). Query head ``j`` reads KV
head ``j // (q_heads // kv_heads)`` (GQA). Scores are ``sm_scale * q.k``, then
``soft_cap * tanh(score / soft_cap)`` with a soft cap; a sink logit per q head
(``sinks``) joins each row's softmax denominator without a value. Rows from
``cu_q_lens[num_seqs]`` to ``total_tokens`` (padding) come out as zeros.

Grid design
-----------
The grid is ``(cdiv(total_tokens, block_q),)``, "parallel". Step ``b`` owns the
aligned q block ``b * block_q : (b + 1) * block_q`` of the flat token axis for
**all** heads: q and the output are viewed as ``[total_tokens, q_heads * head_dim]``
(a free reshape) and pipelined by Pallas. Inside a step a dynamic loop visits the
sequences that own a row of the block (range ``seq_lo[b] .. seq_hi[b]``, computed in
the wrapper) and, per sequence, the KV blocks its rows see (from the sliding
window's first block to the last causal one). A KV block is ``block_kv // page_size``
pages, each copied HBM -> VMEM by one DMA holding K and V of every head, all on one
semaphore; a full block is awaited by one wait sized to the block (a partial last
block page by page). Blocks are double-buffered: the step's next (sequence, KV
block) is fetched while the current one is scored. In VMEM a bf16 / f32 block keeps
each token's 32-bit rows padded to a stride whose strided loads hit distinct VMEM
banks (9 words for 8 bf16 KV heads; blocks.kv_row_layout), the page DMAs writing
around the padding. Per KV head (unrolled), K and V are strided loads of the block
(bf16 K and V of a head share one 32-bit word: truncated to 16 bits, V shifted down
first), the ``G = q_heads // kv_heads`` heads of the group are
stacked into one ``(G * block_q, head_dim)`` LHS, and an online softmax runs in f32
VMEM scratch. Page ids are clamped into the cache by the wrapper, so the kernel
runs with Mosaic's bounds checks off.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import interpret_params, with_ref_names
from kernels.perf import resolve_chip
from kernels.ragged_paged_attention.blocks import STATS_LANES, RaggedPagedAttentionBlockSizes
from kernels.ragged_paged_attention.body import MASK_VALUE, _ragged_paged_attention_kernel, token_order
from kernels.ragged_paged_attention.plan import RaggedPagedAttentionPlan, cost_estimate, make_plan


def ragged_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_table: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array | int,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    kv_scales: jax.Array | None = None,
    block_sizes: RaggedPagedAttentionBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Causal GQA attention of a ragged batch of sequences over a combined K/V paged cache.

    Args:
      q: ``[total_tokens, q_heads, head_dim]`` queries of all sequences, concatenated.
      kv_pages: ``[num_pages, page_size, 2 * kv_heads, head_dim]``, K of head h at row 2h, V at 2h + 1.
      kv_lens: ``[max_seqs]`` int32 context lengths (new tokens included).
      page_table: ``[max_seqs, pages_per_seq]`` int32 page ids.
      cu_q_lens: ``[max_seqs + 1]`` int32 cumulative query lengths.
      num_seqs: ``[1]`` int32 array (or an int): live sequences.
      sm_scale: score scale; ``1 / sqrt(head_dim)`` when None.
      sliding_window: a query sees its ``sliding_window`` most recent positions (itself included); None: all.
      soft_cap: logit soft cap ``c``: scores become ``c * tanh(score / c)``; None: off.
      sinks: ``[q_heads]`` float sink logits (one extra softmax term per head, no value); None: off.
      kv_scales: f32 scales of an int8 / float8_e4m3fn ``kv_pages`` (K or V = code * scale), interleaved like the
        pages (column ``2h`` scales K of KV head h, ``2h + 1`` its V): ``[num_pages, page_size, 2 * kv_heads]``
        per token, or ``[num_pages, 2 * kv_heads]`` per page. Required for a quantized cache, refused otherwise.
      block_sizes: tile sizes; the chip's defaults when None.
      chip: TPU whose defaults and scoped-VMEM budget apply.
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU).

    Returns:
      ``[total_tokens, q_heads, head_dim]`` in q's dtype; padding rows are zero.

    Shapes, dtypes and block sizes are checked always; page ids, lengths and
    ``cu_q_lens`` are checked when they are concrete (not under an outer jit).
    Under a jit, page ids are clamped into the cache. Raises ValueError naming the argument at fault.
    """
    chip = resolve_chip(chip, interpret=interpret)
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(-1)
    plan = make_plan(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
                     sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks, kv_scales=kv_scales,
                     block_sizes=block_sizes, chip=chip, interpret=interpret)
    return _ragged_paged_attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks, kv_scales,
                                   plan=plan, interpret=interpret)


def _sequence_ranges(cu_q_lens, num_seqs, *, total_tokens: int, block_q: int):
    """Per q block: first and one-past-last sequence that owns one of its rows."""
    num_blocks = pl.cdiv(total_tokens, block_q)
    live = jnp.arange(cu_q_lens.shape[0] - 1) < num_seqs[0]
    block_start = jnp.arange(num_blocks, dtype=jnp.int32)[:, None] * block_q
    block_end = jnp.minimum(block_start + block_q, total_tokens)
    ends_before = live[None, :] & (cu_q_lens[None, 1:] <= block_start)
    starts_before_end = live[None, :] & (cu_q_lens[None, :-1] < block_end)
    return (jnp.sum(ends_before, axis=1, dtype=jnp.int32), jnp.sum(starts_before_end, axis=1, dtype=jnp.int32))


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _ragged_paged_attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks, kv_scales, *,
                            plan: RaggedPagedAttentionPlan, interpret: bool):
    total_tokens, q_heads, head_dim = plan.total_tokens, plan.q_heads, plan.head_dim
    num_pages, page_size, kv_heads = plan.num_pages, plan.page_size, plan.kv_heads
    combined = 2 * kv_heads
    group = plan.group
    block_q, block_kv = plan.blocks.block_q, plan.blocks.block_kv
    rows = group * block_q
    seq_lo, seq_hi = _sequence_ranges(cu_q_lens, num_seqs, total_tokens=total_tokens, block_q=block_q)
    # Validated on the way in: every page id the kernel may copy lies inside the cache (bounds checks off).
    safe_table = jnp.clip(page_table, 0, num_pages - 1).reshape(-1)
    layout = plan.layout
    if plan.quantized:  # a page's tokens x (K, V of every head) as one [page_size * 2 * kv_heads, head_dim] slab
        kv_hbm = kv_pages.reshape(num_pages, page_size * combined, head_dim)
        kv_scratch = pltpu.VMEM((2, block_kv * combined, head_dim), kv_pages.dtype)
    else:  # [num_pages, page_size, words, pack, head_dim]: a token's 32-bit rows (the same bytes, a free view)
        kv_hbm = kv_pages.reshape(num_pages, page_size, layout.words, layout.pack, head_dim)
        kv_scratch = pltpu.VMEM((2, block_kv, layout.stride, layout.pack, head_dim), kv_pages.dtype)
    # Sink logits, lane-replicated: one [1, STATS_LANES] row per q head (-inf-like when off: no extra term).
    sink_rows = jnp.broadcast_to(
        (jnp.full((q_heads,), MASK_VALUE, jnp.float32) if sinks is None else sinks.astype(jnp.float32))[:, None],
        (q_heads, STATS_LANES))

    scale_inputs, scale_specs, scale_scratch, scale_names = [], [], [], []
    if plan.quantized:
        scale_inputs = [block_scales(kv_scales, page_table, kv_lens, page_size=page_size, block_kv=block_kv)]
        scale_specs = [pl.BlockSpec(memory_space=pl.ANY)]
        scale_scratch = [pltpu.VMEM((2, combined, block_kv), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
        scale_names = ["kv_scales", "scale_buf", "scale_sems"]

    qo_spec = pl.BlockSpec((block_q, q_heads * head_dim), lambda b, *_: (b, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(pl.cdiv(total_tokens, block_q),),
        in_specs=[qo_spec, pl.BlockSpec((q_heads, STATS_LANES), lambda b, *_: (0, 0)),
                  pl.BlockSpec(memory_space=pl.ANY), *scale_specs],
        out_specs=qo_spec,
        scratch_shapes=[
            kv_scratch,
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM((kv_heads, rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, rows, head_dim), jnp.float32),
            pltpu.VMEM((kv_heads, group, head_dim), jnp.float32),
            pltpu.VMEM((kv_heads, group, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, group, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, group, head_dim), jnp.float32),
            *scale_scratch,
        ],
    )
    kernel = functools.partial(_ragged_paged_attention_kernel, plan=plan)
    names = ["kv_lens", "page_table", "cu_q_lens", "seq_lo", "seq_hi", "q", "sinks", "kv_pages"]
    names += scale_names[:1] + ["o", "kv_buf", "sems", "m", "l", "acc", "q1", "m1", "l1", "acc1"] + scale_names[1:]
    kernel = with_ref_names(kernel, tuple(names))
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((total_tokens, q_heads * head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), disable_bounds_checks=True),
        interpret=interpret_params(interpret),
        cost_estimate=cost_estimate(plan),
        name="ragged_paged_attention",
    )
    with jax.named_scope(f"ragged_paged_attention_bq{block_q}_bkv{block_kv}"):
        out = call(kv_lens, safe_table, cu_q_lens, seq_lo, seq_hi,
                   q.reshape(total_tokens, q_heads * head_dim), sink_rows, kv_hbm, *scale_inputs)
    return out.reshape(total_tokens, q_heads, head_dim)


def block_scales(kv_scales, page_table, kv_lens, *, page_size: int, block_kv: int):
    """The scales the kernel reads, gathered by the page table (an XLA gather before the kernel): ``[max_seqs *
    blocks_per_seq, 2 * kv_heads, block_kv]`` f32, row ``s * blocks_per_seq + j`` holding KV block j of sequence
    s with tokens on lanes (row 2h scales K of head h, 2h + 1 its V), so one DMA per KV block brings every head's
    scales and each head's is a lane vector that folds into its scores (K) and probabilities (V). Per-page scales
    are repeated over their page's tokens. Tokens past a sequence's context get scale 0 (the cache may hold
    anything there, NaN included)."""
    max_seqs, pages_per_seq = page_table.shape
    num_pages, combined = kv_scales.shape[0], kv_scales.shape[-1]
    pages_per_block = block_kv // page_size
    blocks = -(-pages_per_seq // pages_per_block)
    table = jnp.pad(jnp.clip(page_table, 0, num_pages - 1), ((0, 0), (0, blocks * pages_per_block - pages_per_seq)))
    scales = kv_scales[table]  # [max_seqs, pages, page_size, 2 * kv_heads] or [max_seqs, pages, 2 * kv_heads]
    if kv_scales.ndim == 2:
        scales = jnp.broadcast_to(scales[:, :, None], (max_seqs, table.shape[1], page_size, combined))
    scales = scales.reshape(max_seqs, blocks, block_kv, combined)
    position = jnp.arange(blocks * block_kv, dtype=jnp.int32).reshape(1, blocks, block_kv, 1)
    scales = jnp.where(position < kv_lens.reshape(-1, 1, 1, 1), scales, 0.0)
    scales = jnp.swapaxes(scales, 2, 3)[..., token_order(block_kv, combined // 2)]  # the kernel's token order
    return scales.reshape(max_seqs * blocks, combined, block_kv)
