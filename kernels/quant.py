"""Symmetric int8 quantization shared by the kernels (inside Pallas bodies) and their references.

q = clip(round(x * 127 / amax), -127, 127) with one f32 scale = amax / 127 per
slice along ``axis`` (x ~= q * scale). An all-zero slice gets scale 0 and q 0.
Rounding is half-to-even (jnp.round).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: Largest int8 code used; -128 is left out so the range is symmetric.
INT8_QMAX = 127


def quantize_int8(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """(q int8 like x, scale f32 with ``axis`` kept as size 1) such that x ~= q * scale."""
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    inv, scale = int8_scale(amax)
    return int8_codes(x, inv), scale


def int8_scale(amax: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(1 / scale with 0 for an all-zero slice, scale = amax / 127) from a slice's f32 max |x|."""
    inv = jnp.where(amax > 0, INT8_QMAX / jnp.where(amax > 0, amax, 1.0), 0.0)
    return inv, amax / INT8_QMAX


def int8_codes(x: jax.Array, inv: jax.Array) -> jax.Array:
    """int8 codes clip(round_half_even(x * inv), -127, 127) of f32 x (through int32, which Mosaic converts)."""
    return jnp.clip(jnp.round(x * inv), -INT8_QMAX, INT8_QMAX).astype(jnp.int32).astype(jnp.int8)
