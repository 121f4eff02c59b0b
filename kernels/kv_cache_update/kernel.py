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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import interpret_params, with_ref_names
from kernels.kv_cache_update.blocks import (
    DEFAULT_LAYOUT,
    HEAD_MAJOR_TOKENS_PER_BLOCK,
    KvCacheUpdateBlockSizes,
    check_layout,
    default_block_sizes,
    head_major_vmem_bytes,
    row_granule,
)
from kernels import perf, tiling
from kernels.perf import DEFAULT_CHIP
from kernels.quant import quantize_int8

_FLOAT_INPUTS = ("float32", "bfloat16")
#: slot_mapping value of a token that is not written.
PADDING_SLOT = -1


@dataclass(frozen=True, kw_only=True)
class KvCacheUpdatePlan:
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`, and
    :func:`make_pages_plan` for an int8 ``kv_pages``): they size the VMEM and SMEM checks, the pallas_call (grid,
    BlockSpecs, scratch, compiler params, cost estimate) and the kernel body. Hashable: the jitted functions and the
    bodies take it as a static argument."""

    #: "head-major", "token-major" or "combined" (kv_pages_update's int8 form included).
    layout: str
    num_tokens: int
    kv_heads: int
    head_dim: int
    num_pages: int
    page_size: int
    #: numpy dtype names of new_k / new_v and of the cache(s).
    new_dtype: str
    cache_dtype: str
    #: int8 cache(s): quantize on write, with f32 scales.
    quantize: bool
    #: Tokens per grid step, clamped to num_tokens.
    tokens_per_block: int
    #: The scoped-VMEM limit the call compiles with (None: the chip's default).
    vmem_limit_bytes: int | None

    @property
    def n_blocks(self) -> int:
        """Token blocks (the one grid axis)."""
        return tiling.cdiv(self.num_tokens, self.tokens_per_block)

    @property
    def padded_tokens(self) -> int:
        """num_tokens rounded up to whole blocks (the length of the scalar-prefetched per-token arrays)."""
        return tiling.round_up(self.num_tokens, self.tokens_per_block)

    @property
    def granule(self) -> int:
        """Head-major: rows of a cache page one DMA moves (:func:`row_granule` of the cache dtype)."""
        return row_granule(self.cache_dtype)

    def cost_estimate(self) -> pl.CostEstimate:
        """The call's CostEstimate (the module's :func:`cost_estimate` at the plan's sizes and layout)."""
        return cost_estimate(
            num_tokens=self.num_tokens, kv_heads=self.kv_heads, head_dim=self.head_dim, page_size=self.page_size,
            new_dtype=self.new_dtype, cache_dtype=self.cache_dtype, layout=self.layout,
        )



# ----- head-major: blocks of tokens in call order, each row written through its row granule -----

def _head_major_kernel(pages_ref: Any, rows_ref: Any, lead_ref: Any, full_ref: Any, *refs: Any,
                       plan: KvCacheUpdatePlan) -> None:
    # Scalar prefetch (SMEM, one entry per token, padded to whole blocks): pages_ref / rows_ref: its cache page
    # and row (-1 = skip); lead_ref: the block-local index of the block's first token on its row granule (whose
    # VMEM buffer assembles the granule); full_ref: 1 on a lead whose granule the block writes completely (no
    # read). Quantizing, the same two for the page scale rows.
    quantize, tokens_per_block, granule = plan.quantize, plan.tokens_per_block, plan.granule
    if quantize:
        scale_lead_ref, scale_full_ref = refs[:2]
        refs = refs[2:]
    n_caches = 4 if quantize else 2
    new_bufs = refs[:2]  # [tokens_per_block, kv_heads, head_dim]: the block's new K/V (pipelined VMEM blocks)
    outs = refs[2 + n_caches : 2 + 2 * n_caches]  # the aliased caches in HBM, written through these
    scratch = refs[2 + 2 * n_caches :]
    bufs = scratch[:n_caches]  # [tokens_per_block, kv_heads, granule, head_dim]; scales [.., kv_heads, 1, page]
    sems = scratch[-1]  # DMA semaphores: 0 granules in, 1 granules out
    base = pl.program_id(0) * tokens_per_block
    leads = ((lead_ref, full_ref),) * 2 + (((scale_lead_ref, scale_full_ref),) * 2 if quantize else ())

    def window(c: int, i: Any) -> Any:
        if c < 2:  # rows [r0, r0 + granule) of the token's page, every kv head
            r0 = pl.multiple_of(jax.lax.div(rows_ref[i], granule) * granule, granule)
            return outs[c].at[:, pages_ref[i], pl.ds(r0, granule), :]
        return outs[c].at[:, pl.ds(pages_ref[i], 1), :]  # the page's scale row, every kv head

    def each_token(fn: Any) -> None:
        def body(t: Any, carry: Any) -> Any:
            i = base + t

            @pl.when(rows_ref[i] >= 0)
            def _() -> None:
                fn(t, i)

            return carry

        jax.lax.fori_loop(0, tokens_per_block, body, 0, unroll=True)

    def fetch(action: str) -> Any:
        def fn(t: Any, i: Any) -> None:
            for c, (lead, full) in enumerate(leads):
                @pl.when(jnp.logical_and(lead[i] == t, full[i] == 0))
                def _() -> None:
                    getattr(pltpu.make_async_copy(window(c, i), bufs[c].at[t], sems.at[0]), action)()
        return fn

    def store(action: str) -> Any:
        def fn(t: Any, i: Any) -> None:
            for c, (lead, _) in enumerate(leads):
                @pl.when(lead[i] == t)
                def _() -> None:
                    getattr(pltpu.make_async_copy(bufs[c].at[t], window(c, i), sems.at[1]), action)()
        return fn

    def insert(t: Any, i: Any) -> None:
        row = rows_ref[i]
        if quantize:
            (kq, ks), (vq, vs) = (quantize_int8(new_bufs[c][t], axis=-1) for c in range(2))
            tokens = (kq, vq)
            for c, scale in ((2, ks), (3, vs)):  # scale [kv_heads, 1] into lane `row` of the page's scale row
                buf = bufs[c].at[scale_lead_ref[i]]
                kv_heads, _, page_size = buf.shape
                at = jax.lax.broadcasted_iota(jnp.int32, (kv_heads, 1, page_size), 2) == row
                buf[...] = jnp.where(at, jnp.broadcast_to(scale[:, :, None], buf.shape), buf[...])
        else:
            tokens = (new_bufs[0][t], new_bufs[1][t])
        for c in range(2):
            buf = bufs[c].at[lead_ref[i]]
            if granule == 1:
                buf[...] = tokens[c][:, None, :].astype(buf.dtype)
                continue
            # row-masked select in f32 (bf16/int8 widen and narrow back exactly): no sub-word sublane store
            at = jax.lax.broadcasted_iota(jnp.int32, buf.shape, 1) == jax.lax.rem(row, granule)
            new = jnp.broadcast_to(tokens[c].astype(jnp.float32)[:, None, :], buf.shape)
            buf[...] = jnp.where(at, new, buf[...].astype(jnp.float32)).astype(buf.dtype)

    each_token(fetch("start"))
    each_token(fetch("wait"))
    each_token(insert)
    each_token(store("start"))
    each_token(store("wait"))


def _granule_leads(keys: jax.Array, *, size: int, tokens_per_block: int) -> tuple[jax.Array, jax.Array]:
    """(lead, full) per token of ``keys`` (granule ids, -1 = skipped; a whole number of blocks): lead = the
    block-local index of the block's first token with the same key; full = 1 on a lead whose granule's ``size``
    rows are all written by tokens of that block (slots are distinct, so ``size`` tokens with one key cover it)."""
    blocks = keys.reshape(-1, tokens_per_block)
    same = blocks[:, :, None] == blocks[:, None, :]  # [blocks, t, t']: token t' on token t's granule
    lead = jnp.argmax(same, axis=-1).astype(jnp.int32)  # the first such t' (t itself at the latest)
    is_lead = lead == jnp.arange(tokens_per_block, dtype=jnp.int32)
    full = is_lead & (blocks >= 0) & (same.sum(axis=-1) == size)
    return lead.reshape(-1), full.astype(jnp.int32).reshape(-1)


def _head_major_plan(slot_mapping: jax.Array, *, page_size: int, granule: int, tokens_per_block: int,
                     quantize: bool) -> tuple[jax.Array, ...]:
    """Scalar-prefetch arrays of the head-major kernel, per token in call order, padded to whole blocks with
    skipped entries: (page, row, lead, full) and, quantizing, the page scale rows' (lead, full)."""
    num_tokens = slot_mapping.shape[0]
    padded = tiling.round_up(num_tokens, tokens_per_block)
    slots = jnp.pad(slot_mapping, (0, padded - num_tokens), constant_values=PADDING_SLOT)
    valid = slots >= 0
    pages = jnp.where(valid, slots // page_size, 0)
    rows = jnp.where(valid, slots % page_size, PADDING_SLOT)
    granules_per_page = tiling.cdiv(page_size, granule)
    keys = jnp.where(valid, pages * granules_per_page + rows // granule, PADDING_SLOT)
    plan = [pages, rows, *_granule_leads(keys, size=granule, tokens_per_block=tokens_per_block)]
    if quantize:
        plan += _granule_leads(jnp.where(valid, pages, PADDING_SLOT), size=page_size, tokens_per_block=tokens_per_block)
    return tuple(p.astype(jnp.int32) for p in plan)


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


# ----- input checks and the public wrapper -----

def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


@dataclass(frozen=True, kw_only=True)
class _CacheShapes:
    """Pages of a checked cache, and the scale-cache shape its layout needs (a list, the way errors print it)."""

    scales: list[int]
    num_pages: int
    page_size: int


def _cache_shapes(layout: str, k_cache: Any, kv_heads: int, head_dim: int) -> _CacheShapes:
    """The shapes k_cache must have for new tokens of [kv_heads, head_dim]; ValueError if it does not."""
    shape = tuple(getattr(k_cache, "shape", ()))
    if layout == "head-major":
        pattern = [kv_heads, "num_pages", "page_size", head_dim]
        ok = len(shape) == 4 and (shape[0], shape[3]) == (kv_heads, head_dim)
        pages, page_size = (shape[1], shape[2]) if ok else (0, 0)
        scales = [kv_heads, pages, page_size]
    elif layout == "combined":
        pattern = ["num_pages", "page_size", 2 * kv_heads, head_dim]
        ok = len(shape) == 4 and shape[2:] == (2 * kv_heads, head_dim)
        pages, page_size = (shape[0], shape[1]) if ok else (0, 0)
        scales = []
    else:
        pattern = ["num_pages", "page_size", kv_heads, head_dim]
        ok = len(shape) == 4 and shape[2:] == (kv_heads, head_dim)
        pages, page_size = (shape[0], shape[1]) if ok else (0, 0)
        scales = [pages, page_size, kv_heads, 1]
    if not ok:
        raise ValueError(f"k_cache: expected [{', '.join(map(str, pattern))}] (layout='{layout}') to match new_k, "
                         f"got shape {getattr(k_cache, 'shape', None)}")
    return _CacheShapes(scales=scales, num_pages=pages, page_size=page_size)


def _check_inputs(new_k: Any, new_v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any,
                  k_scale_cache: Any, v_scale_cache: Any, layout: str) -> tuple[bool, _CacheShapes]:
    """Validate shapes/dtypes (and slot values when concrete); returns whether the caches quantize, and their shapes."""
    check_layout(layout)
    if getattr(new_k, "ndim", None) != 3:
        raise ValueError(f"new_k: expected [num_tokens, kv_heads, head_dim], got shape {getattr(new_k, 'shape', None)}")
    if getattr(new_v, "shape", None) != new_k.shape or new_v.dtype != new_k.dtype:
        raise ValueError(f"new_v: {getattr(new_v, 'dtype', None)}{list(getattr(new_v, 'shape', []))} must match "
                         f"new_k's {new_k.dtype}{list(new_k.shape)}")
    if jnp.dtype(new_k.dtype).name not in _FLOAT_INPUTS:
        raise ValueError(f"new_k: dtype {jnp.dtype(new_k.dtype).name} not supported; use bfloat16 or float32")
    num_tokens, kv_heads, head_dim = new_k.shape
    if num_tokens == 0:
        raise ValueError("new_k: no tokens (num_tokens == 0)")
    shapes = _cache_shapes(layout, k_cache, kv_heads, head_dim)
    if layout == "combined":
        if v_cache is not None:
            raise ValueError("v_cache: layout='combined' keeps K and V in one cache (k_cache = kv_pages); "
                             "pass v_cache=None")
        if k_cache.dtype != new_k.dtype:
            raise ValueError(f"k_cache: dtype {k_cache.dtype} must equal new_k's ({new_k.dtype}) in "
                             "layout='combined' (no quantize on write); cast new_k/new_v or the cache, or write an "
                             "int8 cache with kv_pages_update(..., kv_scales=...)")
        for name, scale in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
            if scale is not None:
                raise ValueError(f"{name}: layout='combined' takes no scale caches; drop {name}")
    elif getattr(v_cache, "shape", None) != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: {getattr(v_cache, 'dtype', None)}{list(getattr(v_cache, 'shape', []))} must match "
                         f"k_cache's {k_cache.dtype}{list(k_cache.shape)}")
    quantize = k_cache.dtype == jnp.int8
    if not quantize and k_cache.dtype != new_k.dtype:
        raise ValueError(f"k_cache: dtype {k_cache.dtype} must equal new_k's ({new_k.dtype}) "
                         "or be int8 (quantize on write)")
    for name, scale in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        if not quantize and scale is not None:
            raise ValueError(f"{name}: only an int8 cache takes scales; k_cache is {k_cache.dtype}")
        if quantize and (scale is None or list(scale.shape) != shapes.scales or scale.dtype != jnp.float32):
            got = "None" if scale is None else f"{scale.dtype}{list(scale.shape)}"
            raise ValueError(f"{name}: an int8 cache needs a float32 scale cache of shape {shapes.scales} "
                             f"(layout='{layout}'), got {got}")
    if (getattr(slot_mapping, "shape", None) != (num_tokens,)
            or not jnp.issubdtype(slot_mapping.dtype, jnp.integer)):
        raise ValueError(f"slot_mapping: expected int32[{num_tokens}] (one slot per token), got "
                         f"{getattr(slot_mapping, 'dtype', None)}{list(getattr(slot_mapping, 'shape', []))}")
    if _is_concrete(slot_mapping):
        _check_slot_values(np.asarray(slot_mapping), shapes.num_pages * shapes.page_size)
    return bool(quantize), shapes


def _check_slot_values(slots: np.ndarray, num_slots: int) -> None:
    bad = np.flatnonzero((slots >= num_slots) | (slots < PADDING_SLOT))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"slot_mapping: token {t} has slot {int(slots[t])}, outside the cache's {num_slots} slots "
                         f"(num_pages * page_size); use 0..{num_slots - 1}, or {PADDING_SLOT} to skip the token")
    valid = slots[slots >= 0]
    values, counts = np.unique(valid, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"slot_mapping: slot {int(values[counts > 1][0])} is written by more than one token; "
                         "slots must be distinct")




def _check_smem(what: str, smem_bytes: int, spec: Any, num_tokens: int) -> None:
    smem = spec.memory.smem_bytes_per_core
    if smem is not None and smem_bytes > smem // 2:
        raise ValueError(f"slot_mapping: {num_tokens} tokens need {smem_bytes} B of SMEM ({what}), over half of "
                         f"{spec.name}'s {smem} B; split the update into smaller calls")


def _token_blocks(block_sizes: Any, spec: Any, *, kv_heads: int, head_dim: int, num_tokens: int, block_dtype: Any,
                  quantize: bool, combined: bool) -> tuple[int, int | None]:
    """Token-major and combined: (tokens_per_block, vmem_limit_bytes) of the blocks (the chip's tuned default unless
    given) after their VMEM check and the SMEM check of the padded slot mapping."""
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name)
    elif not isinstance(block_sizes, KvCacheUpdateBlockSizes):
        raise ValueError(f"block_sizes: expected a KvCacheUpdateBlockSizes, got {type(block_sizes).__name__}")
    vmem_limit = block_sizes.check(
        kv_heads=kv_heads, head_dim=head_dim, new_dtype=block_dtype, quantize=quantize, chip=spec,
        num_tokens=num_tokens, combined=combined,
    )
    tokens_per_block = min(block_sizes.tokens_per_block, num_tokens)
    _check_smem("padded to the token block", tiling.round_up(num_tokens, tokens_per_block) * 4, spec, num_tokens)
    return tokens_per_block, vmem_limit


def make_plan(new_k: Any, new_v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any, *, k_scale_cache: Any = None,
              v_scale_cache: Any = None, layout: str = DEFAULT_LAYOUT,
              block_sizes: KvCacheUpdateBlockSizes | None = None, chip: Any = DEFAULT_CHIP) -> KvCacheUpdatePlan:
    """Validate everything static about a :func:`kv_cache_update` call (ValueError naming the argument; slot values
    too when concrete) and fix its plan: tokens per grid step, the VMEM limit, and the SMEM check of the
    scalar-prefetched slots. Other arrays are read for their shapes and dtypes only."""
    quantize, shapes = _check_inputs(new_k, new_v, k_cache, v_cache, slot_mapping, k_scale_cache, v_scale_cache,
                                     layout)
    spec = tiling.tpu_chip(chip)
    num_tokens, kv_heads, head_dim = new_k.shape
    if layout == "head-major":
        if block_sizes is not None:
            raise ValueError("block_sizes: only layout='token-major' or 'combined' takes block sizes "
                             f"(head-major blocks are {HEAD_MAJOR_TOKENS_PER_BLOCK} tokens); drop block_sizes or pass "
                             "layout='token-major'")
        tokens_per_block = min(HEAD_MAJOR_TOKENS_PER_BLOCK, num_tokens)
        need = head_major_vmem_bytes(kv_heads=kv_heads, page_size=shapes.page_size, head_dim=head_dim,
                                     new_dtype=new_k.dtype, cache_dtype=k_cache.dtype, quantize=quantize,
                                     num_tokens=num_tokens)
        vmem_limit = tiling.compile_vmem_limit_bytes(need, spec,
                                                     f"layout='head-major' (pages of {shapes.page_size} tokens)",
                                                     fix="split the kv heads over several calls")
        plan_arrays = 6 if quantize else 4
        _check_smem("the head-major plan, padded to the token block",
                    plan_arrays * 4 * tiling.round_up(num_tokens, tokens_per_block), spec, num_tokens)
    else:
        tokens_per_block, vmem_limit = _token_blocks(
            block_sizes, spec, kv_heads=kv_heads, head_dim=head_dim, num_tokens=num_tokens, block_dtype=new_k.dtype,
            quantize=quantize, combined=layout == "combined",
        )
    return KvCacheUpdatePlan(
        layout=layout, num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim, num_pages=shapes.num_pages,
        page_size=shapes.page_size, new_dtype=jnp.dtype(new_k.dtype).name, cache_dtype=jnp.dtype(k_cache.dtype).name,
        quantize=quantize, tokens_per_block=tokens_per_block, vmem_limit_bytes=vmem_limit,
    )


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
    chip: str = DEFAULT_CHIP,
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
                    chip: str = DEFAULT_CHIP, interpret: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """:func:`kv_cache_update` with ``layout="combined"``: the updated ``kv_pages`` (donated, in place).

    An int8 ``kv_pages`` quantizes on write, per (token, head) over head_dim (kernels.quant.quantize_int8), with
    ``kv_scales`` ``[num_pages, page_size, 2 * kv_heads]`` f32 (K of head h at column 2h, V at 2h + 1: the per-token
    layout kernels.ragged_paged_attention reads): the result is then ``(kv_pages, kv_scales)``, both donated. The
    rows are quantized and interleaved before the kernel (one XLA fusion over the new tokens), the kernel copies each
    token's ``[2 * kv_heads, head_dim]`` int8 slab with one DMA, and the scales are scattered by XLA (64 B a token
    at 8 KV heads: a DMA each would write whole padded f32 tiles).
    """
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


def make_pages_plan(new_k: Any, new_v: Any, kv_pages: Any, slot_mapping: Any, *, kv_scales: Any,
                    block_sizes: KvCacheUpdateBlockSizes | None = None, chip: Any = DEFAULT_CHIP) -> KvCacheUpdatePlan:
    """:func:`make_plan` of a :func:`kv_pages_update` call with an int8 ``kv_pages`` (layout "combined", quantize on
    write): the same input checks with kv_pages taken at new_k's dtype, then ``kv_scales``; the token blocks are
    checked as blocks of int8 cache rows (the rows are quantized before the kernel)."""
    _check_inputs(new_k, new_v, _AsDtype(kv_pages, new_k.dtype), None,
                  slot_mapping, None, None, "combined")
    num_pages, page_size, combined, _ = kv_pages.shape
    want = [num_pages, page_size, combined]
    if kv_scales is None or list(kv_scales.shape) != want or kv_scales.dtype != jnp.float32:
        got = "None" if kv_scales is None else f"{jnp.dtype(kv_scales.dtype).name}{list(kv_scales.shape)}"
        raise ValueError(f"kv_scales: an int8 kv_pages needs float32 per-token scales {want}, got {got}")
    spec = tiling.tpu_chip(chip)
    num_tokens, kv_heads, head_dim = new_k.shape
    tokens_per_block, vmem_limit = _token_blocks(
        block_sizes, spec, kv_heads=kv_heads, head_dim=head_dim, num_tokens=num_tokens, block_dtype=kv_pages.dtype,
        quantize=False, combined=True,
    )
    return KvCacheUpdatePlan(
        layout="combined", num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim, num_pages=num_pages,
        page_size=page_size, new_dtype=jnp.dtype(new_k.dtype).name, cache_dtype=jnp.dtype(kv_pages.dtype).name,
        quantize=True, tokens_per_block=tokens_per_block, vmem_limit_bytes=vmem_limit,
    )


class _AsDtype:
    """kv_pages seen with another dtype (shape checks of the combined layout without its dtype rule)."""

    def __init__(self, array: Any, dtype: Any) -> None:
        self.shape, self.ndim, self.dtype = array.shape, array.ndim, dtype


def cost_estimate(*, num_tokens: int, kv_heads: int, head_dim: int, page_size: int, new_dtype: Any,
                  cache_dtype: Any, layout: str = "token-major") -> pl.CostEstimate:
    """The kernel's CostEstimate: perfmodel's KV-cache update model, algorithmic counts (chip=None).

    Counts every token of the call (padding tokens included: their number is not known under jit).
    Token-major and combined: the new rows' bytes; head-major: plus each token's row granule and page scale
    row read and written back (model layout "head-major", one granule per token: decode's traffic).
    """
    return perf.kv_cache_update_cost(
        num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
        kv_dtype=tiling.matmul_dtype_name(cache_dtype), src_dtype=tiling.matmul_dtype_name(new_dtype), chip=None,
        layout="head-major" if layout == "head-major" else "rows",
    )


# ----- token-major: blocks of tokens, one DMA per token -----

def _token_major_kernel(slots_ref: Any, *refs: Any, plan: KvCacheUpdatePlan) -> None:
    # slots_ref: [num_tokens_padded] int32 SMEM (scalar prefetch), -1 = skip
    tokens_per_block, quantize = plan.tokens_per_block, plan.quantize
    k_ref, v_ref = refs[:2]  # [tokens_per_block, kv_heads, head_dim] VMEM blocks of the new tokens
    n_caches = 4 if quantize else 2
    # refs[2 : 2 + n_caches]: the aliased cache inputs (HBM); written through the outputs below.
    outs = refs[2 + n_caches : 2 + 2 * n_caches]
    # outs: k_cache, v_cache [num_slots, kv_heads, head_dim] HBM; (quantize) k_scale, v_scale [num_slots, kv_heads, 1]
    scratch = refs[2 + 2 * n_caches :]
    sems = scratch[-1]  # [n_caches] DMA semaphores, one per destination cache
    if quantize:
        kq_ref, vq_ref, ks_ref, vs_ref = scratch[:4]  # [bt, kv_heads, head_dim] int8; [bt, kv_heads, 1] f32
        kq, ks = quantize_int8(k_ref[...], axis=-1)
        vq, vs = quantize_int8(v_ref[...], axis=-1)
        kq_ref[...], vq_ref[...], ks_ref[...], vs_ref[...] = kq, vq, ks, vs
        sources = (kq_ref, vq_ref, ks_ref, vs_ref)
    else:
        sources = (k_ref, v_ref)
    _copy_rows(slots_ref, tokens_per_block, lambda t, slot: [
        pltpu.make_async_copy(src.at[t], dst.at[slot], sems.at[c]) for c, (src, dst) in enumerate(zip(sources, outs))
    ])


def _copy_rows(slots_ref: Any, tokens_per_block: int, copies: Any) -> None:
    """Start ``copies(t, slot)`` (VMEM row t -> cache slot) for every valid token of this grid step's block, then
    wait for them all: every copy of a block is in flight together; the waits follow (one per copy, all the
    same size, on the semaphore it signals)."""
    base = pl.program_id(0) * tokens_per_block

    def for_valid_tokens(action: str) -> None:
        def body(t: Any, carry: Any) -> Any:
            slot = slots_ref[base + t]

            @pl.when(slot >= 0)
            def _() -> None:
                for copy in copies(t, slot):
                    getattr(copy, action)()

            return carry

        jax.lax.fori_loop(0, tokens_per_block, body, 0, unroll=True)

    for_valid_tokens("start")
    for_valid_tokens("wait")


# ----- combined: K and V interleaved in one cache, one DMA per token -----

def _combined_kernel(slots_ref: Any, k_ref: Any, v_ref: Any, kv_in_ref: Any, kv_ref: Any, rows_ref: Any,
                     sem: Any, *, plan: KvCacheUpdatePlan) -> None:
    # slots_ref: [num_tokens_padded] int32 SMEM (scalar prefetch), -1 = skip
    # k_ref, v_ref: [tokens_per_block, kv_heads, head_dim] VMEM blocks of the new tokens
    # kv_in_ref / kv_ref: the aliased cache [num_slots, 2 * kv_heads, head_dim] in HBM (written through kv_ref)
    # rows_ref: [tokens_per_block, 2 * kv_heads, head_dim] VMEM scratch: the block's cache rows, K/V interleaved
    del kv_in_ref
    for h in range(k_ref.shape[1]):  # one sublane per store: row 2h <- K of head h, 2h + 1 <- its V
        rows_ref[:, pl.ds(2 * h, 1), :] = k_ref[:, pl.ds(h, 1), :]
        rows_ref[:, pl.ds(2 * h + 1, 1), :] = v_ref[:, pl.ds(h, 1), :]
    _copy_rows(slots_ref, plan.tokens_per_block,
               lambda t, slot: [pltpu.make_async_copy(rows_ref.at[t], kv_ref.at[slot], sem.at[0])])


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


def _combined_rows_kernel(slots_ref: Any, rows_ref: Any, kv_in_ref: Any, kv_ref: Any, sem: Any, *,
                          plan: KvCacheUpdatePlan) -> None:
    # rows_ref: [tokens_per_block, 2 * kv_heads, head_dim] VMEM block of the new tokens' cache rows, K/V interleaved
    # kv_in_ref / kv_ref: the aliased cache [num_slots, 2 * kv_heads, head_dim] in HBM (written through kv_ref)
    del kv_in_ref
    _copy_rows(slots_ref, plan.tokens_per_block,
               lambda t, slot: [pltpu.make_async_copy(rows_ref.at[t], kv_ref.at[slot], sem.at[0])])


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
