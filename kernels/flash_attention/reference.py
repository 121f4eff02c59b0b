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
    logit_soft_cap: float | None = None,
    sinks: jax.Array | None = None,  # [q_heads]
    q_segment_ids: jax.Array | None = None,  # [batch, q_len]
    kv_segment_ids: jax.Array | None = None,  # [batch, kv_len]
) -> jax.Array:  # [batch, q_heads, q_len, head_dim], f32
    """softmax(q k^T * sm_scale + mask) v with q head h reading kv head h // (q_heads // kv_heads).

    ``logit_soft_cap`` c: scores become c * tanh(score / c) before masking. ``sinks``: one extra logit per
    q head in the softmax denominator, with no value. Segment ids: a query sees only keys of its own segment;
    a query with no visible key outputs zeros."""
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    qg = q.astype(jnp.float32).reshape(batch, kv_heads, group, q_len, head_dim)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k.astype(jnp.float32), precision=hi) * scale
    if logit_soft_cap is not None:
        scores = logit_soft_cap * jnp.tanh(scores / logit_soft_cap)
    mask = attention_mask(q_len, kv_len, causal=causal, sliding_window=sliding_window)[None]  # [1|batch, q, k]
    if q_segment_ids is not None:
        mask = mask & (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])
    mask = mask[:, None, None]  # [batch, 1, 1, q, k]
    scores = jnp.where(mask, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, kv_heads, group, 1, 1)
        row_max = jnp.maximum(row_max, sink)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.exp(scores - row_max)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.exp(sink - row_max)
    probs = jnp.where(denom > 0, weights / jnp.where(denom > 0, denom, 1.0), 0.0)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", probs, v.astype(jnp.float32), precision=hi)
    return out.reshape(batch, q_heads, q_len, head_dim)
