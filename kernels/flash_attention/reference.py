"""Pure-jnp reference of prefill attention (f32 math, full score matrix)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def attention_mask(q_len: int, kv_len: int, *, causal: bool, sliding_window: int | None) -> jax.Array:
    """[q_len, kv_len] bool: which key each query may attend to.

    Causal: queries are the last ``q_len`` positions of the ``kv_len``-long
    sequence (query i sits at position ``kv_len - q_len + i``) and see keys at
    or before their position. Window w (causal only): the w most recent keys,
    self included.
    """
    offset = kv_len - q_len if causal else 0
    q_pos = offset + jnp.arange(q_len)[:, None]
    k_pos = jnp.arange(kv_len)[None, :]
    mask = jnp.ones((q_len, kv_len), dtype=bool)
    if causal:
        mask &= k_pos <= q_pos
    if sliding_window is not None:
        mask &= q_pos - k_pos < sliding_window
    return mask


def flash_attention_reference(
    q: jax.Array,  # [batch, q_heads, q_len, head_dim]
    k: jax.Array,  # [batch, kv_heads, kv_len, head_dim]
    v: jax.Array,  # [batch, kv_heads, kv_len, head_dim]
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
) -> jax.Array:  # [batch, q_heads, q_len, head_dim], f32
    """softmax(q k^T * sm_scale + mask) v with q head h reading kv head h // (q_heads // kv_heads)."""
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    qg = q.astype(jnp.float32).reshape(batch, kv_heads, group, q_len, head_dim)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k.astype(jnp.float32), precision=hi) * scale
    mask = attention_mask(q_len, kv_len, causal=causal, sliding_window=sliding_window)
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", probs, v.astype(jnp.float32), precision=hi)
    return out.reshape(batch, q_heads, q_len, head_dim)
