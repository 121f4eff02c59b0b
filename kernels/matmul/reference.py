"""Pure-jnp reference of the matmul kernel (f32 math throughout)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from kernels.quant import quantize_int8, quantize_int8_bf16, unpack_int4
from kernels.matmul.rules import DEFAULT_SCALE_BLOCK

#: Epilogue activations by name. gelu is the tanh approximation (jax.nn.gelu's default).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "none": lambda y: y,
    "relu": lambda y: jnp.maximum(y, 0.0),
    "gelu": lambda y: jax.nn.gelu(y, approximate=True),
    "silu": jax.nn.silu,
}

#: Rows of K per blockwise (sub-channel) weight scale: w_scale [cdiv(K, 128), N]. The op model's default.
SCALE_BLOCK = DEFAULT_SCALE_BLOCK


def scale_kind_of(w_scale: Any) -> str:
    """'none', 'per-channel' ([N]) or 'per-block' ([cdiv(K, SCALE_BLOCK), N]): the op model's names."""
    if w_scale is None:
        return "none"
    return "per-channel" if w_scale.ndim == 1 else "per-block"


def _scaled_weights(w: jax.Array, w_scale: jax.Array | None) -> jax.Array:
    w32 = w.astype(jnp.float32)
    kind = scale_kind_of(w_scale)
    if kind == "per-channel":
        return w32 * w_scale.astype(jnp.float32)[None, :]
    if kind == "per-block":
        per_row = jnp.repeat(w_scale.astype(jnp.float32), SCALE_BLOCK, axis=0)[: w.shape[0]]
        return w32 * per_row
    return w32


def matmul_reference(
    x: jax.Array,
    w: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str = "none",
    w_scale: jax.Array | None = None,
    quantize_activations: bool = False,
    w_dtype: str | None = None,
    out_dtype=None,
    bf16_codes: bool = False,
) -> jax.Array:
    """activation((x @ (w * w_scale)) + bias) in f32, cast to out_dtype (default x.dtype).

    ``w_scale``: [N] per output channel or [cdiv(K, 128), N] per 128 rows of K. ``quantize_activations``: x is first
    quantized per token to int8 (kernels/quant.py) and the product is (q @ w) * x_scale, as the kernel's
    int8 x int8 path computes it (exact integer sums). ``w_dtype="int4"``: w is packed two codes per byte
    (kernels/quant.py's pack_int4) and is unpacked to [K, N] codes first. ``bf16_codes`` (with quantize_activations and
    bf16 x): the codes come from a bf16 product (kernels/quant.py's quantize_int8_bf16), as the kernel makes
    them on chips with a bf16 VPU (kernels.matmul.quantizes_x_in_bf16).
    """
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if w_dtype == "int4":
        w = unpack_int4(w, x.shape[1])
    x32 = x.astype(jnp.float32)
    x_scale = None
    if quantize_activations:
        if bf16_codes and x.dtype != jnp.bfloat16:
            raise ValueError(f"bf16_codes: x must be bfloat16 (got {x.dtype}); f32 x is quantized in f32")
        q, x_scale = quantize_int8_bf16(x, axis=-1) if bf16_codes else quantize_int8(x32, axis=-1)
        x32 = q.astype(jnp.float32)
    y = jnp.dot(x32, _scaled_weights(w, w_scale), precision=jax.lax.Precision.HIGHEST)
    if x_scale is not None:
        y = y * x_scale
    if bias is not None:
        y = y + bias.astype(jnp.float32)[None, :]
    return ACTIVATIONS[activation](y).astype(out_dtype)
