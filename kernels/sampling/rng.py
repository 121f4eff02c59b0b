"""Counter-based uniform noise for the categorical draw (the same bits in the kernel and the reference).

Each element's uniform comes from a 32-bit integer hash of (row seed, vocab
index): two rounds of the "lowbias32" mixer (xor-shift / multiply, a
bijection on 32-bit words) keyed by the row's seed. Only int32 multiply,
xor, add and logical shifts are used, so the same function runs on jnp arrays
outside a kernel and on vectors inside a Pallas TPU kernel. Row seeds come
from a JAX PRNG key (:func:`row_seeds`), so draws are reproducible per key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

#: lowbias32 multipliers (as wrapped int32) and the golden-ratio increment.
_MIX_1 = 0x7FEB352D
_MIX_2 = 0x846CA68B - (1 << 32)
_GOLDEN = 0x9E3779B9 - (1 << 32)
#: Uniforms use the top 24 bits of the hash: u = (bits + 0.5) / 2**24, strictly inside (0, 1).
_MANTISSA_BITS = 24


def _lowbias32(x: jax.Array) -> jax.Array:
    x = x ^ lax.shift_right_logical(x, jnp.int32(16))
    x = x * jnp.int32(_MIX_1)
    x = x ^ lax.shift_right_logical(x, jnp.int32(15))
    x = x * jnp.int32(_MIX_2)
    return x ^ lax.shift_right_logical(x, jnp.int32(16))


def hash_bits(seed: jax.Array, index: jax.Array) -> jax.Array:
    """32 mixed bits (int32) of (``seed``, ``index``); also derives per-position seeds from a row's seed."""
    return _lowbias32(_lowbias32(index * jnp.int32(_GOLDEN) + seed) ^ seed)


def hash_uniform(seed: jax.Array, index: jax.Array) -> jax.Array:
    """f32 uniforms in (0, 1) for int32 ``seed`` (broadcast per row) and int32 vocab ``index``."""
    bits = hash_bits(seed, index)
    top = lax.shift_right_logical(bits, jnp.int32(32 - _MANTISSA_BITS))
    return (top.astype(jnp.float32) + 0.5) * (1.0 / (1 << _MANTISSA_BITS))


def gumbel(u: jax.Array) -> jax.Array:
    """Standard Gumbel noise from uniforms in (0, 1): -log(-log(u))."""
    return -jnp.log(-jnp.log(u))


def row_seeds(key: jax.Array, batch: int) -> jax.Array:
    """One int32 seed per row, drawn from a JAX PRNG key."""
    return lax.bitcast_convert_type(jax.random.bits(key, (batch,), jnp.uint32), jnp.int32)
