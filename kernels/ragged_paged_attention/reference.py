"""Pure-jnp reference of ragged paged attention (f32 math, one sequence at a time).

Same layout and semantics as :func:`kernels.ragged_paged_attention.ragged_paged_attention`:
``kv_pages[page, row, 2h]`` is K of KV head ``h``, ``[.., 2h + 1]`` its V; sequence ``s`` owns
query rows ``cu_q_lens[s]:cu_q_lens[s+1]`` and the first ``kv_lens[s]`` positions of its
pages; query ``i`` of the sequence is at position ``p = kv_lens[s] - q_len + i`` and attends
to KV positions ``p - sliding_window < k <= p``. Scores ``sm_scale * q.k`` are soft-capped
(``c * tanh(x / c)``) when ``soft_cap`` is given; ``sinks[j]`` adds ``exp(sinks[j])`` to
head ``j``'s softmax denominator. Rows past ``cu_q_lens[num_seqs]`` are zero. Needs
concrete lengths (it loops over sequences in Python, one jitted step per sequence); use it
on small inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def ragged_paged_attention_reference(
    q: jax.Array,  # [total_tokens, q_heads, head_dim]
    kv_pages: jax.Array,  # [num_pages, page_size, 2 * kv_heads, head_dim]
    kv_lens: jax.Array,  # [max_seqs] int32
    page_table: jax.Array,  # [max_seqs, pages_per_seq] int32
    cu_q_lens: jax.Array,  # [max_seqs + 1] int32
    num_seqs: jax.Array | int,  # [1] int32 or int
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,  # [q_heads]
) -> jax.Array:
    head_dim = q.shape[2]
    scale = 1.0 / float(np.sqrt(head_dim)) if sm_scale is None else float(sm_scale)
    n = int(np.asarray(num_seqs).reshape(-1)[0])
    cu = np.asarray(cu_q_lens)
    max_q = max([int(cu[s + 1] - cu[s]) for s in range(n)], default=1)
    sink_logits = jnp.full((q.shape[1],), -jnp.inf, jnp.float32) if sinks is None else sinks.astype(jnp.float32)
    out = jnp.zeros(q.shape, jnp.float32)
    for s in range(n):
        out = _one_sequence(out, q, kv_pages, page_table[s], cu_q_lens[s], cu_q_lens[s + 1], kv_lens[s], sink_logits,
                            max_q=max(max_q, 1), scale=scale, window=sliding_window,
                            soft_cap=None if soft_cap is None else float(soft_cap))
    return out.astype(q.dtype)


def split_kv_pages(kv_pages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The combined cache as separate ``[kv_heads, num_pages, page_size, head_dim]`` K and V (head-major)."""
    return jnp.moveaxis(kv_pages[:, :, 0::2], 2, 0), jnp.moveaxis(kv_pages[:, :, 1::2], 2, 0)


def combine_kv_pages(k_pages: jax.Array, v_pages: jax.Array) -> jax.Array:
    """Head-major ``[kv_heads, num_pages, page_size, head_dim]`` K and V as one combined cache."""
    kv = jnp.stack([k_pages, v_pages], axis=1)  # [kv_heads, 2, pages, page_size, d]
    kv_heads, _, num_pages, page_size, head_dim = kv.shape
    return jnp.transpose(kv, (2, 3, 0, 1, 4)).reshape(num_pages, page_size, 2 * kv_heads, head_dim)


@functools.partial(jax.jit, static_argnames=("max_q", "scale", "window", "soft_cap"))
def _one_sequence(out, q, kv_pages, pages, q_start, q_end, kv_len, sink_logits, *, max_q: int, scale: float,
                  window: int | None, soft_cap: float | None):
    """Attention of one sequence's rows q_start:q_end; written into out (f32). Shapes are padded to
    max_q query rows and the whole page-table row, so one compilation serves every sequence."""
    total_tokens, q_heads, head_dim = q.shape
    _, page_size, combined, _ = kv_pages.shape
    kv_heads = combined // 2
    q_len = q_end - q_start
    i = jnp.arange(max_q)
    rows = jnp.where(i < q_len, q_start + i, total_tokens)  # out-of-range rows are dropped on write
    used = jnp.arange(pages.shape[0]) < (kv_len + page_size - 1) // page_size
    pages = jnp.where(used, pages, 0)  # entries past the context may be garbage
    kv = kv_pages[pages].reshape(-1, kv_heads, 2, head_dim)  # [L, kv_heads, (K, V), head_dim]
    # One KV row per q head: [q_heads, L, head_dim]
    k = jnp.repeat(jnp.moveaxis(kv[:, :, 0], 1, 0), q_heads // kv_heads, axis=0).astype(jnp.float32)
    v = jnp.repeat(jnp.moveaxis(kv[:, :, 1], 1, 0), q_heads // kv_heads, axis=0).astype(jnp.float32)
    qs = q[jnp.minimum(rows, total_tokens - 1)].astype(jnp.float32)  # [max_q, q_heads, head_dim]
    scores = jnp.einsum("qhd,hkd->hqk", qs, k) * scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    q_pos = kv_len - q_len + i[:, None]
    kv_pos = jnp.arange(k.shape[1])[None, :]
    allowed = (kv_pos <= q_pos) & (kv_pos < kv_len)  # [max_q, L]
    if window is not None:
        allowed &= kv_pos > q_pos - window
    scores = jnp.where(allowed[None], scores, -jnp.inf)
    # The sink joins the softmax as one more logit per head, with no value.
    m = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), sink_logits[:, None, None])
    e = jnp.where(allowed[None], jnp.exp(scores - m), 0.0)
    denom = jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink_logits[:, None, None] - m)
    probs = e / denom  # rows past q_len have nothing allowed: 0 / (0 + 0) -> NaN, dropped on write
    return out.at[rows].set(jnp.einsum("hqk,hkd->qhd", jnp.nan_to_num(probs), v), mode="drop")
