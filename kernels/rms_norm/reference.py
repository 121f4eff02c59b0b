"""Pure-jnp reference of the fused residual-add + RMSNorm kernel (f32 math)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.quant import quantize_int8


def rms_norm_reference(
    x: jax.Array, residual: jax.Array, weight: jax.Array, *, eps: float = 1e-6, quantize: bool = False
) -> tuple[jax.Array, ...]:
    """y = x + residual (f32); out = y / sqrt(mean(y^2) + eps) * weight.

    Returns (out in x.dtype, y in residual.dtype), or with quantize
    (out as int8, per-row f32 scales [tokens], y).
    """
    y = x.astype(jnp.float32) + residual.astype(jnp.float32)
    ms = jnp.mean(jnp.square(y), axis=-1, keepdims=True)
    out = y / jnp.sqrt(ms + eps) * weight.astype(jnp.float32)[None, :]
    new_residual = y.astype(residual.dtype)
    if quantize:
        q, scale = quantize_int8(out, axis=-1)
        return q, scale[:, 0], new_residual
    return out.astype(x.dtype), new_residual
