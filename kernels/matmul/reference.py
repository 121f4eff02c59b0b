"""Pure-jnp reference of the matmul kernel (f32 math throughout)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

#: Epilogue activations by name. gelu is the tanh approximation (jax.nn.gelu's default).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "none": lambda y: y,
    "relu": lambda y: jnp.maximum(y, 0.0),
    "gelu": lambda y: jax.nn.gelu(y, approximate=True),
    "silu": jax.nn.silu,
}


def matmul_reference(
    x: jax.Array,
    w: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str = "none",
    w_scale: jax.Array | None = None,
    out_dtype=None,
) -> jax.Array:
    """activation((x @ (w * w_scale[None, :])) + bias) in f32, cast to out_dtype (default x.dtype)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    w32 = w.astype(jnp.float32)
    if w_scale is not None:
        w32 = w32 * w_scale.astype(jnp.float32)[None, :]
    y = jnp.dot(x.astype(jnp.float32), w32, precision=jax.lax.Precision.HIGHEST)
    if bias is not None:
        y = y + bias.astype(jnp.float32)[None, :]
    return ACTIVATIONS[activation](y).astype(out_dtype)
