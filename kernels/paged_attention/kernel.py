"""Paged attention (decode) as a Pallas TPU kernel.

One grid step per sequence. The page table and context lengths are
scalar-prefetched into SMEM; the K/V cache stays in HBM and the kernel DMAs
the pages it needs itself, ``pages_per_compute_block`` pages at a time into a
two-slot VMEM buffer: one DMA per page and cache moves that page of every kv
head (a strided copy), and a full block is awaited with one wait per cache.
A loop over compute blocks starts the DMA of the next block before waiting
for the current one; the last block of a sequence starts the first block of
the next grid step's sequence (its slot and a "started" flag are carried in
SMEM), so no block is fetched with nothing to overlap except a core's first.
The grid is ``(cores, sequences per core)``, the second axis sequential: two
halves of an even batch on megacore chips, one TensorCore each. Per block, the
q heads that share a kv head are one ``[q_per_kv, head_dim]`` tile against
each ``[tokens, head_dim]`` K/V tile, kv head after kv head.

Pages past a sequence's length are never fetched (their page-table entries
may hold anything; the wrapper clamps every id into the cache, so Mosaic's
bounds checks are off); the partial last page is masked. Quantized K/V (int8, or
fp8 on chips with fp8) are widened in VMEM; their f32 scales, per page or per
token, are gathered for the batch's page tables by the wrapper (4 bytes per
page or token per head, against ``head_dim`` bytes per token of K or V) and
applied in the kernel to the score row (K) and the probability row (V), which
is where a per-token factor lies along the lane axis.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf
from kernels.common import check_paged_kv_cache, interpret_params, with_ref_names
from kernels.tiling import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    LANES,
    SUBLANES_32BIT,
    check_dtype,
    div,
    rem,
    tpu_chip,
)
from kernels.paged_attention.blocks import PagedAttentionBlockSizes, default_block_sizes
from kernels.perf import resolve_chip

#: Finite "minus infinity" for masked scores (no inf - inf = NaN in the max update).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
#: Kv heads per compute block up to which the head loop is unrolled (a loop beyond).
UNROLL_HEADS = 8
#: Pages per compute block up to which the page DMAs are issued unrolled (a loop beyond).
UNROLL_PAGES = 16
#: Stored KV dtypes that need scales.
QUANTIZED_DTYPES: tuple[str, ...] = ("int8",) + FP8_DTYPES


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """Static facts of one call."""

    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    num_pages: int
    page_size: int
    pages_per_seq: int
    pages_per_compute_block: int
    sm_scale: float
    q_dtype: str
    kv_dtype: str
    #: None: unquantized; False: per-page scales; True: per-token scales.
    per_token_scales: bool | None
    #: Grid rows run in parallel: 2 on megacore chips with an even batch (one half per TensorCore), else 1.
    cores: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def tokens_per_block(self) -> int:
        return self.pages_per_compute_block * self.page_size

    @property
    def blocks_per_seq(self) -> int:
        return self.pages_per_seq // self.pages_per_compute_block

    @property
    def quantized(self) -> bool:
        return self.per_token_scales is not None

    @property
    def kv_scale(self) -> str:
        """The op model's name for the scale layout."""
        if self.per_token_scales is None:
            return "none"
        return "per-token" if self.per_token_scales else "per-page"


def _paged_kernel(
    lengths_ref,  # [batch] int32, SMEM (scalar prefetch)
    page_table_ref,  # [batch * pages_per_seq] int32, SMEM (scalar prefetch), ids clamped into the cache
    carried,  # [2] int32, SMEM (scalar prefetch, zeros, written by the kernel): [0] 1 if the previous grid
    #           step started this step's first block, [1] the slot it started it in
    q_ref,  # [kv_heads, q_per_kv, head_dim]
    k_hbm,  # [kv_heads, num_pages, page_size, head_dim] in HBM
    v_hbm,  # [kv_heads, num_pages, page_size, head_dim] in HBM
    *rest,
    plan: _Plan,
):
    if plan.quantized:
        # f32 [kv_heads, blocks_per_seq, tokens_per_block] (per token) or
        # [kv_heads, blocks_per_seq, pages_per_compute_block] (per page)
        k_scale_ref, v_scale_ref, *rest = rest
    else:
        k_scale_ref = v_scale_ref = None
    (o_ref,  # [kv_heads, q_per_kv, head_dim]
     k_buf,  # [2, kv_heads, pages_per_compute_block, page_size, head_dim] VMEM, kv dtype
     v_buf,  # [2, kv_heads, pages_per_compute_block, page_size, head_dim] VMEM, kv dtype
     sems,  # DMA semaphores [2 (k, v), 2 (slot)]
     m_ref,  # [kv_heads, q_per_kv, LANES] f32: running max, replicated over lanes
     l_ref,  # [kv_heads, q_per_kv, LANES] f32: running denominator, replicated over lanes
     acc_ref,  # [kv_heads, q_per_kv, head_dim] f32: unnormalised output
     ) = rest
    step, steps = pl.program_id(1), pl.num_programs(1)
    b = pl.program_id(0) * steps + step
    length = lengths_ref[b]
    tokens = plan.tokens_per_block
    ppcb = plan.pages_per_compute_block
    blocks = div(length + tokens - 1, tokens)  # compute blocks holding at least one token

    def pages_in_block(seq_len, j):
        """Pages of block j holding tokens of a sequence of seq_len tokens (the rest are never fetched)."""
        return jnp.clip(div(seq_len + plan.page_size - 1, plan.page_size) - j * ppcb, 0, ppcb)

    def start(seq, seq_len, j, slot):
        """Start the K and V DMAs of block j of sequence seq into slot: one DMA per page and cache, all kv heads."""
        count = pages_in_block(seq_len, j)

        def page_copy(i):
            page = page_table_ref[seq * plan.pages_per_seq + j * ppcb + i]

            @pl.when(i < count)
            def _():
                pltpu.make_async_copy(k_hbm.at[:, page], k_buf.at[slot, :, i], sems.at[0, slot]).start()
                pltpu.make_async_copy(v_hbm.at[:, page], v_buf.at[slot, :, i], sems.at[1, slot]).start()

        _for_pages(ppcb, page_copy)

    def wait(j, slot):
        count = pages_in_block(length, j)

        @pl.when(count == ppcb)
        def _():  # a full block: one wait per cache sized to the slot
            pltpu.make_async_copy(k_buf.at[1 - slot], k_buf.at[slot], sems.at[0, slot]).wait()
            pltpu.make_async_copy(v_buf.at[1 - slot], v_buf.at[slot], sems.at[1, slot]).wait()

        @pl.when(count < ppcb)
        def _():  # the partial last block: one wait per fetched page
            def wait_page(i, carry):
                pltpu.make_async_copy(k_hbm.at[:, 0], k_buf.at[slot, :, 0], sems.at[0, slot]).wait()
                pltpu.make_async_copy(v_hbm.at[:, 0], v_buf.at[slot, :, 0], sems.at[1, slot]).wait()
                return carry

            jax.lax.fori_loop(0, count, wait_page, 0)

    # The previous grid step of this core started our first block if it had the chance (it never does
    # across cores: a core's first step fetches its own).
    prefetched = (step > 0) & (carried[0] == 1)
    first_slot = jnp.where(prefetched, carried[1], 0)
    carried[0] = 0
    next_b = jnp.minimum(b + 1, plan.batch - 1)  # clamped: SMEM reads stay in bounds
    next_len = jnp.where(step + 1 < steps, lengths_ref[next_b], 0)

    @pl.when(blocks == 0)
    def _empty():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when((blocks > 0) & jnp.logical_not(prefetched))
    def _prime():
        start(b, length, 0, first_slot)

    @pl.when(blocks > 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def body(j, slot):
        @pl.when(j + 1 < blocks)
        def _prefetch_here():
            start(b, length, j + 1, 1 - slot)

        @pl.when((j + 1 == blocks) & (next_len > 0))
        def _prefetch_next_sequence():
            start(next_b, next_len, 0, 1 - slot)
            carried[0] = 1
            carried[1] = 1 - slot

        wait(j, slot)

        def head(h, carry):
            _attend_block(q_ref, k_buf, v_buf, k_scale_ref, v_scale_ref, m_ref, l_ref, acc_ref,
                          plan=plan, h=h, j=j, slot=slot, length=length)
            return carry

        jax.lax.fori_loop(0, plan.kv_heads, head, 0, unroll=plan.kv_heads <= UNROLL_HEADS)
        return 1 - slot

    jax.lax.fori_loop(0, blocks, body, first_slot)

    @pl.when(blocks > 0)
    def _finalize():
        o_ref[...] = (acc_ref[...] / l_ref[...][:, :, 0:1]).astype(o_ref.dtype)


def _for_pages(count: int, fn) -> None:
    """fn(i) for i in range(count): unrolled up to UNROLL_PAGES pages (the scheduler then packs the DMA
    issues), a loop beyond (a block may hold hundreds of pages; unrolling them would dominate tracing)."""
    if count <= UNROLL_PAGES:
        for i in range(count):
            fn(i)
        return

    def step(i, carry):
        fn(i)
        return carry

    jax.lax.fori_loop(0, count, step, 0)


def _scale_row(scale_ref, *, plan: _Plan, h: Any, j: Any, length: Any) -> jax.Array:
    """[1, tokens] f32 scale of each token of compute block j of kv head h.

    Per token, scales of dead rows pass through (the caller masks them); per
    page, dead pages' scales (possibly NaN) are zeroed first, since the
    expansion matmul would spread a NaN to every lane.
    """
    row = scale_ref[h, pl.ds(j, 1), :]  # [1, tokens] per token, [1, pages_per_compute_block] per page
    if plan.per_token_scales:
        return row
    page_pos = j * plan.pages_per_compute_block + jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)
    row = jnp.where(page_pos * plan.page_size < length, row, 0.0)
    # Per page: spread page i's scale over its page_size lanes with a 0/1 matmul
    # (exact at HIGHEST precision): expand[i, t] = (i == t // page_size).
    shape = (plan.pages_per_compute_block, plan.tokens_per_block)
    page_of_lane = div(jax.lax.broadcasted_iota(jnp.int32, shape, 1), plan.page_size)
    expand = (jax.lax.broadcasted_iota(jnp.int32, shape, 0) == page_of_lane).astype(jnp.float32)
    return jax.lax.dot_general(row, expand, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32,
                               precision=jax.lax.Precision.HIGHEST)


def _attend_block(q_ref, k_buf, v_buf, k_scale_ref, v_scale_ref, m_ref, l_ref, acc_ref, *, plan: _Plan,
                  h: Any, j: Any, slot: Any, length: Any) -> None:
    tokens, head_dim = plan.tokens_per_block, plan.head_dim
    q = q_ref[h]  # [q_per_kv, head_dim]
    k = k_buf[slot, h].reshape(tokens, head_dim)  # [tokens, head_dim]
    v = v_buf[slot, h].reshape(tokens, head_dim)  # [tokens, head_dim]
    if plan.quantized:
        # Widen on the VPU to the query dtype (exact: int8 and fp8 values fit bf16);
        # int8 goes through f32, the conversion every TPU generation has. Scales come later.
        if plan.kv_dtype == "int8":
            k, v = k.astype(jnp.float32), v.astype(jnp.float32)
        k, v = k.astype(q.dtype), v.astype(q.dtype)
    precision = jax.lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                            precision=precision)  # [q_per_kv, tokens]
    if plan.quantized:
        s = s * _scale_row(k_scale_ref, plan=plan, h=h, j=j, length=length)
    s = s * plan.sm_scale
    token_pos = j * tokens + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    live = token_pos < length  # [q_per_kv, tokens]
    s = jnp.where(live, s, MASK_VALUE)
    # Rows past the length were not fetched and hold stale data (NaN in interpret
    # mode); zero them so that 0 * NaN cannot reach the accumulator.
    row_pos = j * tokens + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
    v = jnp.where(row_pos < length, v, jnp.zeros_like(v))
    m_prev = m_ref[h]  # [q_per_kv, LANES]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_next)
    p = jnp.exp(s - m_next[:, 0:1])  # [q_per_kv, tokens]
    l_ref[h] = alpha * l_ref[h] + jnp.sum(p, axis=1, keepdims=True)
    m_ref[h] = m_next
    if plan.quantized:
        # Dead rows of a partial page may carry any scale (even NaN): keep their p at 0.
        p = jnp.where(live, p * _scale_row(v_scale_ref, plan=plan, h=h, j=j, length=length), 0.0)
    pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32, precision=precision)  # [q_per_kv, head_dim]
    acc_ref[h] = acc_ref[h] * alpha[:, 0:1] + pv


def _check_shapes(q: Any, k_pages: Any, v_pages: Any, page_table: Any, lengths: Any, k_scales: Any,
                  v_scales: Any) -> None:
    if q.ndim != 3:
        raise ValueError(f"q: expected rank 3 [batch, q_heads, head_dim], got shape {q.shape}")
    batch, q_heads, head_dim = q.shape
    kv_heads, _ = check_paged_kv_cache(k_pages, v_pages, q_heads=q_heads, head_dim=head_dim)
    if page_table.ndim != 2 or page_table.shape[0] != batch:
        raise ValueError(f"page_table: expected shape [batch={batch}, pages_per_seq], got {page_table.shape}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths: expected shape [batch={batch}], got {lengths.shape}")
    for name, x in (("page_table", page_table), ("lengths", lengths)):
        if x.dtype != jnp.int32:
            raise ValueError(f"{name}: dtype must be int32, got {x.dtype}")
    if min(q.shape) == 0 or min(k_pages.shape) == 0 or page_table.shape[1] == 0:
        raise ValueError("q, k_pages, page_table: every dimension must be >= 1")
    quantized = np.dtype(k_pages.dtype).name in QUANTIZED_DTYPES
    for name, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
        if quantized and scales is None:
            raise ValueError(f"{name}: required for {k_pages.dtype} pages (value = stored * scale)")
        if not quantized and scales is not None:
            raise ValueError(f"{name}: given for {k_pages.dtype} pages; scales apply only to int8/fp8 pages")
        if scales is None:
            continue
        if scales.shape not in (k_pages.shape[:2], k_pages.shape[:3]):
            raise ValueError(
                f"{name}: shape {scales.shape} must be [kv_heads, num_pages] {k_pages.shape[:2]} (per page) "
                f"or [kv_heads, num_pages, page_size] {k_pages.shape[:3]} (per token)"
            )
        if scales.dtype != jnp.float32:
            raise ValueError(f"{name}: dtype must be float32, got {scales.dtype}")
    if k_scales is not None and v_scales is not None and k_scales.shape != v_scales.shape:
        raise ValueError(f"v_scales: shape {v_scales.shape} must equal k_scales' shape {k_scales.shape}")


def make_plan(q: Any, k_pages: Any, v_pages: Any, page_table: Any, lengths: Any, *, k_scales: Any,
              v_scales: Any, sm_scale: float | None, block_sizes: PagedAttentionBlockSizes | None,
              chip: str) -> _Plan:
    """Validate everything static about a call (ValueError naming the argument)."""
    spec = tpu_chip(chip)
    _check_shapes(q, k_pages, v_pages, page_table, lengths, k_scales, v_scales)
    check_dtype("q", q.dtype, FLOAT_DTYPES, spec)
    check_dtype("k_pages", k_pages.dtype, FLOAT_DTYPES + QUANTIZED_DTYPES, spec)
    kv_name = np.dtype(k_pages.dtype).name
    if kv_name in FLOAT_DTYPES and k_pages.dtype != q.dtype:
        raise ValueError(f"k_pages: float pages must match q's dtype {q.dtype}, got {k_pages.dtype}")
    batch, q_heads, head_dim = q.shape
    kv_heads, num_pages, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    # XLA tiles every cache in HBM in 8-row tiles (bf16 and int8 packed inside them), so a page of a
    # multiple of 8 tokens is whole tiles and one legal DMA for every dtype (int8 pages of 16 compile).
    if page_size % SUBLANES_32BIT:
        raise ValueError(
            f"k_pages: page_size {page_size} is not a multiple of {SUBLANES_32BIT} (a page must be whole "
            f"8-row tiles of the cache); use pages of a multiple of {SUBLANES_32BIT} tokens"
        )
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, page_size=page_size, pages_per_seq=pages_per_seq)
    elif not isinstance(block_sizes, PagedAttentionBlockSizes):
        raise ValueError(f"block_sizes: expected PagedAttentionBlockSizes, got {type(block_sizes).__name__}")
    per_token = None if k_scales is None else k_scales.ndim == 3
    block_sizes.validate(page_size=page_size, pages_per_seq=pages_per_seq, num_q_per_kv=q_heads // kv_heads,
                         kv_heads=kv_heads, head_dim=head_dim, q_dtype=q.dtype, kv_dtype=k_pages.dtype,
                         per_token_scales=per_token, spec=spec)
    return _Plan(
        batch=batch, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, num_pages=num_pages,
        page_size=page_size, pages_per_seq=pages_per_seq,
        pages_per_compute_block=block_sizes.pages_per_compute_block,
        sm_scale=float(1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale),
        q_dtype=np.dtype(q.dtype).name, kv_dtype=kv_name, per_token_scales=per_token,
        cores=2 if spec.cores.megacore and batch % 2 == 0 else 1,
    )


def check_values(page_table: Any, lengths: Any, *, num_pages: int, page_size: int) -> None:
    """Range checks of page_table and lengths when they are concrete (skipped under jit tracing)."""
    if isinstance(page_table, jax.core.Tracer) or isinstance(lengths, jax.core.Tracer):
        return
    table = np.asarray(page_table)
    lens = np.asarray(lengths)
    capacity = table.shape[1] * page_size
    bad = np.flatnonzero((lens < 0) | (lens > capacity))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"lengths: lengths[{b}] = {int(lens[b])} is outside [0, {capacity}] "
            f"(page_table holds {table.shape[1]} pages of {page_size} tokens per sequence)"
        )
    used = np.arange(table.shape[1])[None, :] * page_size < lens[:, None]
    wrong = used & ((table < 0) | (table >= num_pages))
    if wrong.any():
        b, i = (int(x) for x in np.argwhere(wrong)[0])
        raise ValueError(
            f"page_table: page_table[{b}, {i}] = {int(table[b, i])} points past the cache of "
            f"{num_pages} pages (valid: 0..{num_pages - 1})"
        )


def cost_estimate(plan: _Plan) -> pl.CostEstimate:
    """The pl.CostEstimate of this call from perfmodel's op model (chip=None: algorithmic work).

    Lengths are data, unknown at trace time: the estimate assumes every
    sequence fills its page table (the most work the call can do).
    """
    return perf.paged_attention_cost(
        context_lens=plan.pages_per_seq * plan.page_size, batch=plan.batch, pages_per_seq=plan.pages_per_seq,
        q_heads=plan.q_heads, kv_heads=plan.kv_heads, head_dim=plan.head_dim, page_size=plan.page_size,
        q_dtype=plan.q_dtype, kv_dtype=plan.kv_dtype, kv_scale=plan.kv_scale, chip=None,
    )


def _gather_scales(scales: jax.Array, page_table: jax.Array, plan: _Plan) -> jax.Array:
    """Each sequence's scales in page-table order.

    [batch, kv_heads, blocks_per_seq, lanes], one row per compute block, lanes =
    tokens_per_block (per-token scales) or pages_per_compute_block (per page).
    Entries past a sequence's length are clamped gathers of real pages (finite)
    and are masked in the kernel.
    """
    gathered = jnp.take(scales, page_table, axis=1, mode="clip")  # [kv_heads, batch, pages_per_seq(, page_size)]
    gathered = jnp.moveaxis(gathered, 1, 0)
    lanes = plan.tokens_per_block if plan.per_token_scales else plan.pages_per_compute_block
    return gathered.reshape(plan.batch, plan.kv_heads, plan.blocks_per_seq, lanes)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_sizes", "chip", "interpret"))
def _paged_attention_jit(q, k_pages, v_pages, page_table, lengths, k_scales, v_scales, *, sm_scale,
                         block_sizes, chip, interpret):
    plan = make_plan(q, k_pages, v_pages, page_table, lengths, k_scales=k_scales, v_scales=v_scales,
                     sm_scale=sm_scale, block_sizes=block_sizes, chip=chip)
    kv_heads, group, head_dim = plan.kv_heads, plan.group, plan.head_dim
    q_grouped = q.reshape(plan.batch, kv_heads, group, head_dim)
    per_core = plan.batch // plan.cores

    def seq_block(c, i, *_):
        return c * per_core + i, 0, 0, 0

    seq_spec = pl.BlockSpec((None, kv_heads, group, head_dim), seq_block)
    in_specs = [seq_spec, pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY)]
    operands = [q_grouped, k_pages, v_pages]
    if plan.quantized:
        for scales in (k_scales, v_scales):
            rows = _gather_scales(scales, page_table, plan)
            in_specs.append(pl.BlockSpec((None, *rows.shape[1:]), seq_block))
            operands.append(rows)
    buf_shape = (2, kv_heads, plan.pages_per_compute_block, plan.page_size, head_dim)
    name = f"paged_attention_ppcb{plan.pages_per_compute_block}_ps{plan.page_size}"
    with jax.named_scope(name):
        ref_names = (["lengths_ref", "page_table_ref", "carried", "q_ref", "k_hbm", "v_hbm"]
                     + (["k_scale_ref", "v_scale_ref"] if plan.quantized else [])
                     + ["o_ref", "k_buf", "v_buf", "sems", "m_ref", "l_ref", "acc_ref"])
        out = pl.pallas_call(
            with_ref_names(functools.partial(_paged_kernel, plan=plan), ref_names),
            out_shape=jax.ShapeDtypeStruct(q_grouped.shape, q.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=3,
                grid=(plan.cores, per_core),
                in_specs=in_specs,
                out_specs=seq_spec,
                scratch_shapes=[
                    pltpu.VMEM(buf_shape, k_pages.dtype),
                    pltpu.VMEM(buf_shape, v_pages.dtype),
                    pltpu.SemaphoreType.DMA((2, 2)),
                    pltpu.VMEM((kv_heads, group, LANES), jnp.float32),
                    pltpu.VMEM((kv_heads, group, LANES), jnp.float32),
                    pltpu.VMEM((kv_heads, group, head_dim), jnp.float32),
                ],
            ),
            # Sequences run in order within a core (a step prefetches the next one's first block); megacore
            # chips split the batch in two halves, one per TensorCore. Page ids are clamped above, so Mosaic's
            # bounds checks are off.
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                                 disable_bounds_checks=True),
            cost_estimate=cost_estimate(plan),
            interpret=interpret_params(interpret) if isinstance(interpret, bool) else interpret,
            name=name,
        )(lengths, jnp.clip(page_table, 0, plan.num_pages - 1).reshape(-1), jnp.zeros((2,), jnp.int32), *operands)
    return out.reshape(q.shape)


def paged_attention(
    q: jax.Array,  # [batch, q_heads, head_dim]
    k_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    page_table: jax.Array,  # [batch, pages_per_seq] int32
    lengths: jax.Array,  # [batch] int32
    *,
    k_scales: jax.Array | None = None,
    v_scales: jax.Array | None = None,
    sm_scale: float | None = None,
    block_sizes: PagedAttentionBlockSizes | None = None,
    chip: str | None = None,
    interpret: "bool | pltpu.InterpretParams" = False,
) -> jax.Array:  # [batch, q_heads, head_dim], q's dtype
    """Decode attention of one query token per sequence over a paged KV cache.

    Token t of sequence b is row ``t % page_size`` of page
    ``page_table[b, t // page_size]``; sequence b attends to its first
    ``lengths[b]`` tokens (0 gives zeros). Page-table entries past a
    sequence's length are never read.

    Args:
      q: float32 or bfloat16; q head h uses kv head ``h // (q_heads // kv_heads)``.
      k_pages, v_pages: the cache, in q's dtype, or int8 (fp8 on chips with
        fp8) with ``k_scales``/``v_scales`` (value = stored * scale).
      k_scales, v_scales: f32 [kv_heads, num_pages] (one scale per page) or
        [kv_heads, num_pages, page_size] (one per token); only for int8/fp8 pages.
      sm_scale: score scale; default ``1 / sqrt(head_dim)``.
      block_sizes: pages per compute block; default from the chip's token target.
      chip: TPU whose defaults and VMEM budget apply.
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU) instead of Mosaic; or the
        ``pltpu.InterpretParams`` to run it with (e.g. a race check on two cores).

    Shapes and dtypes are checked at trace time; page-table and length values
    are range-checked here when they are concrete arrays (not under an outer jit).
    """
    chip = resolve_chip(chip, interpret=interpret)
    if (k_pages.ndim == 4 and page_table.ndim == 2 and lengths.ndim == 1
            and page_table.shape[0] == lengths.shape[0]):
        check_values(page_table, lengths, num_pages=k_pages.shape[1], page_size=k_pages.shape[2])
    return _paged_attention_jit(q, k_pages, v_pages, page_table, lengths, k_scales, v_scales,
                                sm_scale=sm_scale, block_sizes=block_sizes, chip=chip, interpret=interpret)
