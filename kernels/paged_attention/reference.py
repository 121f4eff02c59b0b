"""Pure-jnp reference of paged decode attention (f32 math) and KV-cache quantization helpers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

#: Largest finite value of each quantized KV dtype (the absmax a scale maps to).
QUANT_MAX: dict[str, float] = {"int8": 127.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def dequantize_pages(
    pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    scales: jax.Array | None,  # None, [kv_heads, num_pages] (per page) or [kv_heads, num_pages, page_size] (per token)
) -> jax.Array:  # [kv_heads, num_pages, page_size, head_dim] f32
    """value = stored * scale, broadcast per page or per token."""
    x = pages.astype(jnp.float32)
    if scales is None:
        return x
    s = scales.astype(jnp.float32)
    return x * (s[:, :, None, None] if s.ndim == 2 else s[..., None])


def quantize_pages(
    pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim], float
    *,
    dtype: str = "int8",
    per_token: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Symmetric absmax quantization of a KV cache: (stored pages, f32 scales).

    Scales are [kv_heads, num_pages, page_size] with ``per_token``, else
    [kv_heads, num_pages]; ``dequantize_pages`` inverts it up to rounding.
    """
    qmax = QUANT_MAX[dtype]
    x = pages.astype(jnp.float32)
    axes = (-1,) if per_token else (-2, -1)
    absmax = jnp.max(jnp.abs(x), axis=axes)
    scales = jnp.where(absmax > 0, absmax / qmax, 1.0)
    expanded = scales[..., None] if per_token else scales[..., None, None]
    y = x / expanded
    if dtype == "int8":
        stored = jnp.clip(jnp.round(y), -qmax, qmax).astype(jnp.int8)
    else:
        stored = y.astype(jnp.dtype(dtype))
    return stored, scales


def paged_attention_reference(
    q: jax.Array,  # [batch, q_heads, head_dim]
    k_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    page_table: jax.Array,  # [batch, pages_per_seq] int32
    lengths: jax.Array,  # [batch] int32
    *,
    k_scales: jax.Array | None = None,
    v_scales: jax.Array | None = None,
    sm_scale: float | None = None,
) -> jax.Array:  # [batch, q_heads, head_dim] f32
    """One query token per sequence against its first ``lengths[b]`` cached tokens.

    Token t of sequence b lives in page ``page_table[b, t // page_size]`` at
    row ``t % page_size``. A sequence of length 0 yields zeros.
    """
    batch, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    pages_per_seq = page_table.shape[1]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale

    def dense(pages, scales):  # -> [batch, kv_heads, pages_per_seq * page_size, head_dim]
        x = dequantize_pages(pages, scales)[:, page_table]  # [kv_heads, batch, pages_per_seq, page_size, head_dim]
        x = x.reshape(kv_heads, batch, pages_per_seq * page_size, head_dim)
        return x.transpose(1, 0, 2, 3)

    k, v = dense(k_pages, k_scales), dense(v_pages, v_scales)
    qg = q.astype(jnp.float32).reshape(batch, kv_heads, group, head_dim)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bhgd,bhtd->bhgt", qg, k, precision=hi) * scale
    visible = jnp.arange(pages_per_seq * page_size)[None, :] < lengths[:, None]  # [batch, tokens]
    scores = jnp.where(visible[:, None, None, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhgt,bhtd->bhgd", probs, v, precision=hi)
    out = jnp.where((lengths > 0)[:, None, None, None], out, 0.0)
    return out.reshape(batch, q_heads, head_dim)
