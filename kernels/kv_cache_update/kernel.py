"""Paged KV-cache update for TPU (Pallas/Mosaic): scatter a step's new K/V tokens into their slots.

Two cache layouts (``layout=``); both take
* new_k, new_v: [num_tokens, kv_heads, head_dim] (bf16 or f32);
* slot_mapping: int32 [num_tokens]; slot = page * page_size + offset;
  -1 marks a padding token that is not written. Slots must be distinct;
* an int8 cache quantizes on write, symmetrically per (token, head) over
  head_dim, with f32 scales in k_scale_cache / v_scale_cache; dequantize as
  q * scale.

Head-major (default; what kernels.paged_attention and ragged_paged_attention read)
-------------------------------------------------------------------------------
* k_cache, v_cache: [kv_heads, num_pages, page_size, head_dim];
  scales [kv_heads, num_pages, page_size] (per token).
* A token's row of one head is one row of a (page_size, head_dim) page whose
  HBM tiling is (8, 128) 32-bit words: bf16 rows pair up in a word, int8 rows
  by four. Mosaic takes a DMA window whose sublane offset is a multiple of the
  rows per word (the row granule: 1 f32, 2 bf16, 4 int8) and refuses a one-row
  window of a packed dtype ("Offsets along tiled dimensions must be aligned to
  tiles"). So each row is written through its granule: read
  it into VMEM, insert the row (a row-masked select in f32), write it back.
  The scale caches the same way: a token's scale is one lane of its page's
  scale row [kv_heads, 1, page_size] (a one-sublane f32 window).
* Tokens stay in call order, in blocks of HEAD_MAJOR_TOKENS_PER_BLOCK (new K/V
  pipelined into VMEM as [block, kv_heads, head_dim] blocks). The wrapper
  scalar-prefetches per token its page, row (-1: skip), the block-local index of
  the block's first token on its granule (the "lead": that token's VMEM buffer
  assembles the granule, so two tokens of one granule never race) and whether
  the block writes the whole granule (then it is not read). The scale rows get
  their own lead/full.
* Grid (blocks,), "arbitrary"; the caches stay in HBM (ANY). A step starts
  every granule read of its leads, waits for all (one wait per copy), inserts
  the rows, starts every write-back and waits for all. A granule written by two
  blocks is read by the later one after the earlier wrote it back (sequential
  grid). The token loops are unrolled (about 20% fewer bundles on v5e).
* HBM traffic per token (decode, each token on its own granule): the new K/V,
  plus its K and V granules (2 bf16 / 4 int8 rows per head) read and written,
  and quantizing, the page scale rows read and written. Granules a block fills
  completely (prefill) are only written.

Token-major (``layout="token-major"``)
--------------------------------------
* k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim]: one token's
  [kv_heads, head_dim] slab is contiguous, so each token is one DMA whose
  offsets fall only on leading (untiled) dimensions. A cache row pads to the
  dtype's tile in HBM when kv_heads is below its sublane multiple (8 f32,
  16 bf16, 32 int8). Scales [num_pages, page_size, kv_heads, 1] (the trailing
  1 keeps each token's scales a whole (kv_heads, 1) tile).
* slot_mapping is scalar-prefetched into SMEM. Grid: one "parallel" axis over
  blocks of tokens_per_block tokens whose K/V slabs are pipelined into VMEM;
  the body starts one VMEM->HBM DMA per (valid token, cache) and then waits
  for all of them (one DMA semaphore per cache, all copies the same size). The
  caches stay in HBM (memory_space=ANY).

In both layouts the caches are aliased input->output (input_output_aliases)
and the jitted wrappers donate them, so the update is in place and the
caller's cache arrays are consumed.

This module holds the public wrappers (:func:`kv_cache_update`, :func:`kv_pages_update`) and the jitted
pallas_calls of each layout; the call's plan and input checks are in :mod:`kernels.kv_cache_update.plan`, the
kernel bodies in :mod:`kernels.kv_cache_update.body`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import interpret_params, with_ref_names
from kernels.kv_cache_update.blocks import DEFAULT_LAYOUT, KvCacheUpdateBlockSizes
from kernels.kv_cache_update.body import (
    _combined_kernel,
    _combined_rows_kernel,
    _head_major_kernel,
    _head_major_plan,
    _token_major_kernel,
)
from kernels.kv_cache_update.plan import PADDING_SLOT, KvCacheUpdatePlan, make_pages_plan, make_plan
from kernels.perf import resolve_chip
from kernels.quant import quantize_int8


# ----- the jitted pallas_calls, one per layout -----

@functools.partial(
    jax.jit,
    static_argnames=("plan", "interpret"),
    donate_argnames=("k_cache", "v_cache", "k_scale_cache", "v_scale_cache"),
)
def _head_major_jit(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    k_scale_cache: jax.Array | None,
    v_scale_cache: jax.Array | None,
    *,
    plan: KvCacheUpdatePlan,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    kv_heads, head_dim, page_size = plan.kv_heads, plan.head_dim, plan.page_size
    quantize, granule = plan.quantize, plan.granule
    caches = [k_cache, v_cache] + ([k_scale_cache, v_scale_cache] if quantize else [])
    prefetch = _head_major_plan(slot_mapping, page_size=page_size, granule=granule,
                                tokens_per_block=plan.tokens_per_block, quantize=quantize)
    hbm_spec = pl.BlockSpec(memory_space=pl.ANY)
    bt = plan.tokens_per_block
    token_spec = pl.BlockSpec((bt, kv_heads, head_dim), lambda i, *prefetch_refs: (i, 0, 0))
    scratch = [pltpu.VMEM((bt, kv_heads, granule, head_dim), jnp.dtype(plan.cache_dtype))] * 2
    if quantize:
        scratch += [pltpu.VMEM((bt, kv_heads, 1, page_size), jnp.float32)] * 2
    scratch.append(pltpu.SemaphoreType.DMA((2,)))
    first_cache_input = len(prefetch) + 2  # operands: the scalar prefetch, new_k, new_v, caches...
    cache_names = ["k_cache", "v_cache"] + (["k_scale_cache", "v_scale_cache"] if quantize else [])
    plan_names = ["pages_ref", "rows_ref", "lead_ref", "full_ref"] + (
        ["scale_lead_ref", "scale_full_ref"] if quantize else [])
    ref_names = (plan_names + ["new_k_ref", "new_v_ref"] + [f"{c}_in_ref" for c in cache_names]
                 + [f"{c}_ref" for c in cache_names] + [f"{c}_rows_buf" for c in cache_names] + ["sems"])
    call = pl.pallas_call(
        with_ref_names(functools.partial(_head_major_kernel, plan=plan), ref_names),
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in caches],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=(plan.n_blocks,),
            in_specs=[token_spec, token_spec] + [hbm_spec] * len(caches),
            out_specs=[hbm_spec] * len(caches),
            scratch_shapes=scratch,
        ),
        input_output_aliases={first_cache_input + c: c for c in range(len(caches))},
        # "arbitrary": a granule split over two blocks is read by the second only after the first wrote it back.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=plan.cost_estimate(),
        interpret=interpret_params(interpret),
        name="kv_cache_update",
    )
    with jax.named_scope("kv_cache_update[layout=head-major]"):
        return tuple(call(*prefetch, new_k, new_v, *caches))


@functools.partial(
    jax.jit,
    static_argnames=("plan", "interpret"),
    donate_argnames=("kv_pages",),
)
def _combined_jit(new_k: jax.Array, new_v: jax.Array, kv_pages: jax.Array, slot_mapping: jax.Array, *,
                  plan: KvCacheUpdatePlan, interpret: bool) -> jax.Array:
    kv_heads, head_dim, tokens_per_block = plan.kv_heads, plan.head_dim, plan.tokens_per_block
    flat = kv_pages.reshape(plan.num_pages * plan.page_size, 2 * kv_heads, head_dim)  # leading dims only: a bitcast
    slots = jnp.pad(slot_mapping, (0, plan.padded_tokens - plan.num_tokens), constant_values=PADDING_SLOT)
    token_spec = pl.BlockSpec((tokens_per_block, kv_heads, head_dim), lambda i, slots_ref: (i, 0, 0))
    hbm_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(
        with_ref_names(functools.partial(_combined_kernel, plan=plan),
                       ["slots_ref", "new_k_ref", "new_v_ref", "kv_pages_in_ref", "kv_pages_ref", "rows_buf",
                        "sem"]),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(plan.n_blocks,),
            in_specs=[token_spec, token_spec, hbm_spec],
            out_specs=hbm_spec,
            scratch_shapes=[pltpu.VMEM((tokens_per_block, 2 * kv_heads, head_dim), jnp.dtype(plan.cache_dtype)),
                            pltpu.SemaphoreType.DMA((1,))],
        ),
        input_output_aliases={3: 0},  # operands: slots (scalar prefetch), new_k, new_v, kv_pages
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=plan.cost_estimate(),
        interpret=interpret_params(interpret),
        name="kv_cache_update",
    )
    with jax.named_scope(f"kv_cache_update[layout=combined,tokens_per_block={tokens_per_block}]"):
        out = call(slots, new_k, new_v, flat)
    return out.reshape(kv_pages.shape)


@functools.partial(
    jax.jit,
    static_argnames=("plan", "interpret"),
    donate_argnames=("kv_pages", "kv_scales"),
)
def _combined_int8_jit(new_k: jax.Array, new_v: jax.Array, kv_pages: jax.Array, kv_scales: jax.Array,
                       slot_mapping: jax.Array, *, plan: KvCacheUpdatePlan,
                       interpret: bool) -> tuple[jax.Array, jax.Array]:
    num_tokens, kv_heads, head_dim = plan.num_tokens, plan.kv_heads, plan.head_dim
    tokens_per_block = plan.tokens_per_block
    num_slots = plan.num_pages * plan.page_size
    kq, ks = quantize_int8(new_k, axis=-1)  # [T, kv_heads, head_dim] int8, [T, kv_heads, 1] f32
    vq, vs = quantize_int8(new_v, axis=-1)
    rows = jnp.stack([kq, vq], axis=2).reshape(num_tokens, 2 * kv_heads, head_dim)
    scale_rows = jnp.stack([ks[..., 0], vs[..., 0]], axis=2).reshape(num_tokens, 2 * kv_heads)
    flat = kv_pages.reshape(num_slots, 2 * kv_heads, head_dim)  # leading dims only: a bitcast
    slots = jnp.pad(slot_mapping, (0, plan.padded_tokens - num_tokens), constant_values=PADDING_SLOT)
    row_spec = pl.BlockSpec((tokens_per_block, 2 * kv_heads, head_dim), lambda i, slots_ref: (i, 0, 0))
    hbm_spec = pl.BlockSpec(memory_space=pl.ANY)
    call = pl.pallas_call(
        with_ref_names(functools.partial(_combined_rows_kernel, plan=plan),
                       ["slots_ref", "rows_ref", "kv_pages_in_ref", "kv_pages_ref", "sem"]),
        out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(plan.n_blocks,),
            in_specs=[row_spec, hbm_spec], out_specs=hbm_spec, scratch_shapes=[pltpu.SemaphoreType.DMA((1,))]),
        input_output_aliases={2: 0},  # operands: slots (scalar prefetch), rows, kv_pages
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=plan.cost_estimate(),
        interpret=interpret_params(interpret),
        name="kv_cache_update",
    )
    with jax.named_scope(f"kv_cache_update[layout=combined,tokens_per_block={tokens_per_block}]"):
        out = call(slots, rows, flat)
    dropped = jnp.where(slot_mapping >= 0, slot_mapping, num_slots)  # padding tokens: out of range, not written
    scales = kv_scales.reshape(num_slots, 2 * kv_heads).at[dropped].set(scale_rows, mode="drop")
    return out.reshape(kv_pages.shape), scales.reshape(kv_scales.shape)


@functools.partial(
    jax.jit,
    static_argnames=("plan", "interpret"),
    donate_argnames=("k_cache", "v_cache", "k_scale_cache", "v_scale_cache"),
)
def _token_major_jit(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    k_scale_cache: jax.Array | None,
    v_scale_cache: jax.Array | None,
    *,
    plan: KvCacheUpdatePlan,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    kv_heads, head_dim, tokens_per_block, quantize = plan.kv_heads, plan.head_dim, plan.tokens_per_block, plan.quantize
    caches = [k_cache, v_cache] + ([k_scale_cache, v_scale_cache] if quantize else [])
    shapes = [c.shape for c in caches]
    flat = [c.reshape(c.shape[0] * c.shape[1], *c.shape[2:]) for c in caches]  # leading dims only: a bitcast
    slots = jnp.pad(slot_mapping, (0, plan.padded_tokens - plan.num_tokens), constant_values=PADDING_SLOT)
    token_spec = pl.BlockSpec((tokens_per_block, kv_heads, head_dim), lambda i, slots_ref: (i, 0, 0))
    hbm_spec = pl.BlockSpec(memory_space=pl.ANY)
    scratch = []
    if quantize:
        slab, scales = (tokens_per_block, kv_heads, head_dim), (tokens_per_block, kv_heads, 1)
        scratch = [pltpu.VMEM(slab, jnp.int8), pltpu.VMEM(slab, jnp.int8),
                   pltpu.VMEM(scales, jnp.float32), pltpu.VMEM(scales, jnp.float32)]
    scratch.append(pltpu.SemaphoreType.DMA((len(caches),)))
    first_cache_input = 3  # operands: slots (scalar prefetch), new_k, new_v, caches...
    cache_names = ["k_cache", "v_cache"] + (["k_scale_cache", "v_scale_cache"] if quantize else [])
    scratch_names = (["k_q_buf", "v_q_buf", "k_scale_buf", "v_scale_buf"] if quantize else []) + ["sems"]
    ref_names = (["slots_ref", "new_k_ref", "new_v_ref"] + [f"{c}_in_ref" for c in cache_names]
                 + [f"{c}_ref" for c in cache_names] + scratch_names)
    call = pl.pallas_call(
        with_ref_names(functools.partial(_token_major_kernel, plan=plan), ref_names),
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in flat],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(plan.n_blocks,),
            in_specs=[token_spec, token_spec] + [hbm_spec] * len(caches),
            out_specs=[hbm_spec] * len(caches),
            scratch_shapes=scratch,
        ),
        input_output_aliases={first_cache_input + c: c for c in range(len(caches))},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=plan.cost_estimate(),
        interpret=interpret_params(interpret),
        name="kv_cache_update",
    )
    with jax.named_scope(f"kv_cache_update[tokens_per_block={tokens_per_block}]"):
        outs = call(slots, new_k, new_v, *flat)
    return tuple(o.reshape(s) for o, s in zip(outs, shapes))


# ----- the public wrappers -----

def kv_cache_update(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    *,
    k_scale_cache: jax.Array | None = None,
    v_scale_cache: jax.Array | None = None,
    layout: str = DEFAULT_LAYOUT,
    block_sizes: KvCacheUpdateBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Write each new token's K/V into its paged cache slot, in place (see the module docstring for layouts).

    ``layout="head-major"`` (default): caches [kv_heads, num_pages, page_size,
    head_dim], scales [kv_heads, num_pages, page_size], as paged_attention reads
    them. ``layout="token-major"``: caches [num_pages, page_size, kv_heads,
    head_dim], scales [num_pages, page_size, kv_heads, 1]; only this layout
    takes ``block_sizes``.

    The caches (and scale caches) are donated: after the call the arrays passed in
    are consumed; use the returned ones.

    ``layout="combined"``: ``k_cache`` is the one cache [num_pages, page_size,
    2 * kv_heads, head_dim] that ragged_paged_attention reads (K of head h at row
    2h, V at 2h + 1), ``v_cache`` None, same dtype as new_k (no int8); takes
    ``block_sizes`` (the token-major defaults).

    Returns:
      (k_cache, v_cache), or for int8 caches (k_cache, v_cache, k_scale_cache, v_scale_cache);
      (kv_pages,) for layout="combined".
    """
    chip = resolve_chip(chip, interpret=interpret)
    plan = make_plan(new_k, new_v, k_cache, v_cache, slot_mapping, k_scale_cache=k_scale_cache,
                     v_scale_cache=v_scale_cache, layout=layout, block_sizes=block_sizes, chip=chip)
    slots = slot_mapping.astype(jnp.int32)
    if plan.layout == "head-major":
        return _head_major_jit(new_k, new_v, k_cache, v_cache, slots, k_scale_cache, v_scale_cache, plan=plan,
                               interpret=interpret)
    if plan.layout == "combined":
        return (_combined_jit(new_k, new_v, k_cache, slots, plan=plan, interpret=interpret),)
    return _token_major_jit(new_k, new_v, k_cache, v_cache, slots, k_scale_cache, v_scale_cache, plan=plan,
                            interpret=interpret)


def kv_pages_update(new_k: jax.Array, new_v: jax.Array, kv_pages: jax.Array, slot_mapping: jax.Array, *,
                    kv_scales: jax.Array | None = None, block_sizes: KvCacheUpdateBlockSizes | None = None,
                    chip: str | None = None, interpret: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """:func:`kv_cache_update` with ``layout="combined"``: the updated ``kv_pages`` (donated, in place).

    An int8 ``kv_pages`` quantizes on write, per (token, head) over head_dim (kernels.quant.quantize_int8), with
    ``kv_scales`` ``[num_pages, page_size, 2 * kv_heads]`` f32 (K of head h at column 2h, V at 2h + 1: the per-token
    layout kernels.ragged_paged_attention reads): the result is then ``(kv_pages, kv_scales)``, both donated. The
    rows are quantized and interleaved before the kernel (one XLA fusion over the new tokens), the kernel copies each
    token's ``[2 * kv_heads, head_dim]`` int8 slab with one DMA, and the scales are scattered by XLA (64 B a token
    at 8 KV heads: a DMA each would write whole padded f32 tiles).
    """
    chip = resolve_chip(chip, interpret=interpret)
    if kv_pages.dtype != jnp.int8:
        if kv_scales is not None:
            raise ValueError(f"kv_scales: a {jnp.dtype(kv_pages.dtype).name} kv_pages takes no scales; drop "
                             "kv_scales or pass an int8 kv_pages")
        (out,) = kv_cache_update(new_k, new_v, kv_pages, None, slot_mapping, layout="combined",
                                 block_sizes=block_sizes, chip=chip, interpret=interpret)
        return out
    plan = make_pages_plan(new_k, new_v, kv_pages, slot_mapping, kv_scales=kv_scales, block_sizes=block_sizes,
                           chip=chip)
    slots = jnp.asarray(slot_mapping, jnp.int32)
    return _combined_int8_jit(new_k, new_v, kv_pages, kv_scales, slots, plan=plan, interpret=interpret)
