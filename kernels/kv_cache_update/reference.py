"""Pure-jnp reference of the paged KV-cache update (a scatter by slot)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.matmul.quant import quantize_int8


def _scatter(cache: jax.Array, rows: jax.Array, slot_mapping: jax.Array) -> jax.Array:
    """cache [pages, page_size, ...] with rows[t] written at flat slot slot_mapping[t] (slot -1: skipped)."""
    pages, page_size = cache.shape[:2]
    flat = cache.reshape(pages * page_size, *cache.shape[2:])
    slots = jnp.where(slot_mapping >= 0, slot_mapping, pages * page_size)  # out of range -> dropped
    return flat.at[slots].set(rows.astype(cache.dtype), mode="drop").reshape(cache.shape)


def kv_cache_update_reference(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    *,
    k_scale_cache: jax.Array | None = None,
    v_scale_cache: jax.Array | None = None,
) -> tuple[jax.Array, ...]:
    """Write token t of new_k/new_v [T, kv_heads, head_dim] at slot slot_mapping[t] = page * page_size + offset.

    Caches are [num_pages, page_size, kv_heads, head_dim]. An int8 cache gets the
    tokens quantized per (token, head) with scales written to the matching
    [num_pages, page_size, kv_heads, 1] f32 scale cache.
    """
    if k_cache.dtype != jnp.int8:
        return _scatter(k_cache, new_k, slot_mapping), _scatter(v_cache, new_v, slot_mapping)
    kq, ks = quantize_int8(new_k, axis=-1)
    vq, vs = quantize_int8(new_v, axis=-1)
    return (
        _scatter(k_cache, kq, slot_mapping),
        _scatter(v_cache, vq, slot_mapping),
        _scatter(k_scale_cache, ks, slot_mapping),
        _scatter(v_scale_cache, vs, slot_mapping),
    )
