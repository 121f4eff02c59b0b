"""Static plan of a paged KV-cache update call: :class:`KvCacheUpdatePlan`, made once per call by :func:`make_plan`
(:func:`kernels.kv_cache_update.kernel.kv_cache_update`) or :func:`make_pages_plan` (an int8 ``kv_pages`` of
:func:`kernels.kv_cache_update.kernel.kv_pages_update`) after the input checks (shapes, dtypes, concrete slot
values) and the VMEM and SMEM checks of the chosen token blocks; plus the call's :func:`cost_estimate` and
:data:`PADDING_SLOT`, the slot_mapping value of a skipped token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

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


# ----- input checks -----

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
