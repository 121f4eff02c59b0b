"""Pure-jnp reference of the paged KV-cache update (a scatter by slot), in both cache layouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.kv_cache_update.blocks import DEFAULT_LAYOUT, check_layout
from kernels.quant import quantize_int8


def _scatter_token_major(cache: jax.Array, rows: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """cache [pages, page_size, ...] with rows[t] written at flat slot slot_mapping[t] (slot -1: skipped)."""
    pages, page_size = cache.shape[:2]
    flat = cache.reshape(pages * page_size, *cache.shape[2:])
    slots = jnp.where(slot_mapping >= 0, slot_mapping, pages * page_size)  # out of range -> dropped
    return flat.at[slots].set(rows.astype(cache.dtype), mode="drop").reshape(cache.shape)


def _scatter_head_major(cache: jax.Array, rows: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """cache [kv_heads, pages, page_size, ...] with rows[t, h] written at [h, slot // page_size, slot % page_size]."""
    pages, page_size = cache.shape[1:3]
    valid = slot_mapping >= 0
    page = jnp.where(valid, slot_mapping // page_size, pages)  # out of range -> dropped
    row = jnp.where(valid, slot_mapping % page_size, 0)
    return cache.at[:, page, row].set(jnp.moveaxis(rows, 0, 1).astype(cache.dtype), mode="drop")


def kv_cache_update_reference(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    *,
    k_scale_cache: jax.Array | None = None,
    v_scale_cache: jax.Array | None = None,
    layout: str = DEFAULT_LAYOUT,
) -> tuple[jax.Array, ...]:
    """Write token t of new_k/new_v [T, kv_heads, head_dim] at slot slot_mapping[t] = page * page_size + offset.

    Caches are [kv_heads, num_pages, page_size, head_dim] (``layout="head-major"``)
    or [num_pages, page_size, kv_heads, head_dim] ("token-major"), or with
    ``layout="combined"`` k_cache is the one cache [num_pages, page_size,
    2 * kv_heads, head_dim] (K of head h at row 2h, V at 2h + 1; v_cache is
    ignored, may be None) and the result is ``(kv_pages,)``. An int8 cache
    gets the tokens quantized per (token, head) with f32 scales written to the
    scale cache, [kv_heads, num_pages, page_size] or [num_pages, page_size, kv_heads, 1].
    """
    check_layout(layout)
    if layout == "combined":  # k_cache is kv_pages [pages, page_size, 2 * kv_heads, head_dim]; v_cache unused
        rows = jnp.stack([new_k, new_v], axis=2).reshape(new_k.shape[0], 2 * new_k.shape[1], new_k.shape[2])
        return (_scatter_token_major(k_cache, rows, slot_mapping),)
    head_major = layout == "head-major"
    scatter = _scatter_head_major if head_major else _scatter_token_major
    if k_cache.dtype != jnp.int8:
        return scatter(k_cache, new_k, slot_mapping), scatter(v_cache, new_v, slot_mapping)
    kq, ks = quantize_int8(new_k, axis=-1)  # ks: [T, kv_heads, 1]
    vq, vs = quantize_int8(new_v, axis=-1)
    if head_major:
        ks, vs = ks[..., 0], vs[..., 0]
    return (
        scatter(k_cache, kq, slot_mapping),
        scatter(v_cache, vq, slot_mapping),
        scatter(k_scale_cache, ks, slot_mapping),
        scatter(v_scale_cache, vs, slot_mapping),
    )


def kv_pages_update_reference(new_k: jax.Array, new_v: jax.Array, kv_pages: jax.Array,
                              slot_mapping: jax.Array, *, kv_scales: jax.Array | None = None
                              ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The combined layout's reference: ``kv_pages`` [pages, page_size, 2 * kv_heads, head_dim] with token t's
    K of head h at row 2h and its V at 2h + 1 of slot slot_mapping[t]. An int8 cache gets the rows quantized per
    (token, head) and their scales written to ``kv_scales`` [pages, page_size, 2 * kv_heads] (same columns):
    ``(kv_pages, kv_scales)``."""
    if kv_pages.dtype != jnp.int8:
        (out,) = kv_cache_update_reference(new_k, new_v, kv_pages, None, slot_mapping, layout="combined")
        return out
    kq, ks = quantize_int8(new_k, axis=-1)
    vq, vs = quantize_int8(new_v, axis=-1)
    (out,) = kv_cache_update_reference(kq, vq, kv_pages, None, slot_mapping, layout="combined")
    scales = jnp.stack([ks[..., 0], vs[..., 0]], axis=2)  # [T, kv_heads, 2] -> columns 2h, 2h + 1
    return out, _scatter_token_major(kv_scales, scales.reshape(scales.shape[0], -1), slot_mapping)
