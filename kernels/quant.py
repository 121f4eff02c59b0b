"""Symmetric int8 quantization shared by the kernels (inside Pallas bodies) and their references.

q = clip(round(x * 127 / amax), -127, 127) with one f32 scale = amax / 127 per
slice along ``axis`` (x ~= q * scale). An all-zero slice gets scale 0 and q 0.
Rounding is half-to-even (jnp.round).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

#: Largest int8 code used; -128 is left out so the range is symmetric.
INT8_QMAX = 127


def quantize_int8(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """(q int8 like x, scale f32 with ``axis`` kept as size 1) such that x ~= q * scale."""
    x = x.astype(jnp.float32)
    inv, scale = int8_scale(_amax(x, axis))
    return int8_codes(x, inv), scale


def _amax(x: jax.Array, axis: int) -> jax.Array:
    """f32 max |x| along ``axis`` (kept as size 1)."""
    return jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis, keepdims=True)


def int8_scale(amax: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(1 / scale with 0 for an all-zero slice, scale = amax / 127) from a slice's f32 max |x|."""
    inv = jnp.where(amax > 0, INT8_QMAX / jnp.where(amax > 0, amax, 1.0), 0.0)
    return inv, amax / INT8_QMAX


def int8_codes(x: jax.Array, inv: jax.Array, *, clip: bool = True, dtype: Any = jnp.int8) -> jax.Array:
    """int8 codes clip(round_half_even(x * inv), -127, 127) of f32 x (through int32, which Mosaic converts), or
    the same whole numbers in a float ``dtype`` (bf16 holds every one of them exactly: a kernel feeding them to
    the bf16 MXU).

    ``clip=False`` drops the clip, which changes nothing when ``inv`` comes from :func:`int8_scale` of a max
    |x| over the same slice: |x * inv| <= amax * fl(127 / amax) <= 127 * (1 + 2^-23)^2 < 127.5, so the rounded
    code is within [-127, 127] already (one VPU op per element less in a kernel)."""
    q = jnp.round(x * inv)
    if clip:
        q = jnp.clip(q, -INT8_QMAX, INT8_QMAX)
    if jnp.dtype(dtype) != jnp.int8:
        return q.astype(dtype)
    return _narrow_to_int8(q)


def int8_scale_bf16(amax: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(inv, scale) for codes made from a bf16 product (:func:`int8_codes_bf16`): inv = 127 / amax rounded toward
    zero to bf16 (0 for an all-zero slice) and scale = 1 / inv in f32 (0 there), so that x ~= q * scale.

    Rounding inv down keeps |x * inv| <= 127 for every |x| <= amax; the codes then span at least 127 (1 - 2^-7)
    (bf16 holds 8 significant bits), and scale is at most that much (0.8%) above amax / 127."""
    inv, _ = int8_scale(amax.astype(jnp.float32))
    bits = jax.lax.bitcast_convert_type(inv, jnp.uint32) & jnp.uint32(0xFFFF0000)  # toward zero: drop 16 bits
    inv_down = jax.lax.bitcast_convert_type(bits, jnp.float32)
    scale = jnp.where(inv_down > 0, 1.0 / jnp.where(inv_down > 0, inv_down, 1.0), 0.0)
    return inv_down.astype(jnp.bfloat16), scale


def int8_codes_bf16(x: jax.Array, inv: jax.Array, *, dtype: Any = jnp.int8) -> jax.Array:
    """int8 codes round_half_even(bf16(x * inv)) of bf16 x and a bf16 ``inv`` from :func:`int8_scale_bf16`: the
    product is rounded to bf16 before the whole-number rounding, as a bf16 VPU computes it (one multiply and one
    packing conversion per bf16 vreg instead of widening both halves to f32, multiplying and converting each).

    Error: |q - x inv| <= 1/2 + half the bf16 spacing at |x inv|: 0.75 codes for |x inv| in [64, 127], 0.625 in
    [32, 64), 0.5625 in [16, 32) (0.5 for f32 codes, :func:`int8_codes`). |q| <= 127: x inv is within
    [-127, 127] and 127 is a bf16 number. ``dtype``: int8, or a float dtype holding the same whole numbers."""
    q = jnp.round(x.astype(jnp.bfloat16) * inv.astype(jnp.bfloat16))
    return q.astype(dtype)


def quantize_int8_bf16(x: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """:func:`quantize_int8` with codes from a bf16 product (:func:`int8_scale_bf16`, :func:`int8_codes_bf16`);
    x bf16 (max |x| is exact in bf16)."""
    inv, scale = int8_scale_bf16(_amax(x, axis))
    return int8_codes_bf16(x, inv), scale


def _narrow_to_int8(q: jax.Array) -> jax.Array:
    """Whole-number f32 values within +-127 as int8 (through int32, which Mosaic converts)."""
    return q.astype(jnp.int32).astype(jnp.int8)


def split_int8_codes(x: jax.Array, inv: jax.Array, lo_steps: int) -> tuple[jax.Array, jax.Array]:
    """Two int8 code planes of f32 x: hi = round(x * inv) and lo = round((x * inv - hi) * lo_steps), so that
    x = (hi + lo / lo_steps) / inv within 1 / (2 lo_steps inv). With inv from :func:`int8_scale` of max |x| over
    the same slice, |hi| <= 127 (as :func:`int8_codes` without clip) and |lo| <= lo_steps / 2 (<= 127 for
    lo_steps <= 254)."""
    v = x * inv
    hi = jnp.round(v)
    lo = jnp.round((v - hi) * lo_steps)
    return _narrow_to_int8(hi), _narrow_to_int8(lo)


#: int4 codes are two's complement nibbles in [-8, 7]; the symmetric quantizers use [-7, 7].
INT4_QMAX = 7
#: The packed K dimension is padded to a multiple of this (so every K block of a multiple of it is whole). Byte row
#: ``r`` of the packed array holds K row ``2r`` in its low nibble and K row ``2r + 1`` in its high nibble: the
#: order of ``jnp.int4`` in a TPU's sublane-packed layout, so a kernel reinterprets a [R, N] byte tile as [2R, N]
#: int4 codes (``pltpu.bitcast``) and widens them, with no shifts.
INT4_PACK_ROWS = 256


def pack_int4(codes: jax.Array) -> jax.Array:
    """[K, N] integer codes in [-8, 7] -> [round_up(K, 256) / 2, N] uint8, two per byte (nibble order above;
    K padded with zero codes). Done once when the weights are prepared, not per call."""
    k, n = codes.shape
    rows = -(-k // INT4_PACK_ROWS) * INT4_PACK_ROWS
    c = jnp.pad(codes.astype(jnp.int32), ((0, rows - k), (0, 0))).reshape(rows // 2, 2, n) & 0xF
    return (c[:, 0] | (c[:, 1] << 4)).astype(jnp.uint8)


def unpack_int4(packed: jax.Array, k: int) -> jax.Array:
    """[K, N] int32 codes of a :func:`pack_int4` array (the reference's unpacking; the kernel does it per tile)."""
    rows, n = packed.shape
    # Each nibble shifted to the top of an int32 and arithmetic-shifted back (sign-extended), whatever the byte's
    # own sign extension (uint8 or int8).
    v = packed.astype(jnp.int32)
    low, high = jax.lax.shift_right_arithmetic(v << 28, 28), jax.lax.shift_right_arithmetic(v << 24, 28)
    return jnp.stack([low, high], axis=1).reshape(rows * 2, n)[:k]


def quantize_int4(w: jax.Array, axis: int = 0) -> tuple[jax.Array, jax.Array]:
    """(codes int32 in [-7, 7], f32 scale with ``axis`` kept as size 1): w ~= codes * scale, amax / 7 per slice."""
    w = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=axis, keepdims=True)
    scale = amax / INT4_QMAX
    inv = jnp.where(amax > 0, INT4_QMAX / jnp.where(amax > 0, amax, 1.0), 0.0)
    return jnp.clip(jnp.round(w * inv), -INT4_QMAX, INT4_QMAX).astype(jnp.int32), scale
