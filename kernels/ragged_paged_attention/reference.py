"""Pure-jnp reference of ragged paged attention (f32 math, one sequence at a time).

Same layout and semantics as :func:`kernels.ragged_paged_attention.ragged_paged_attention`:
sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]`` and the first
``kv_lens[s]`` positions of its pages; query ``i`` of the sequence attends to
KV positions ``<= kv_lens[s] - q_len + i``. Rows past ``cu_q_lens[num_seqs]``
are zero. Needs concrete lengths (it loops over sequences in Python, one jitted
step per sequence); use it on small inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def ragged_paged_attention_reference(
    q: jax.Array,  # [total_tokens, q_heads, head_dim]
    k_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    v_pages: jax.Array,  # [kv_heads, num_pages, page_size, head_dim]
    kv_lens: jax.Array,  # [max_seqs] int32
    page_table: jax.Array,  # [max_seqs, pages_per_seq] int32
    cu_q_lens: jax.Array,  # [max_seqs + 1] int32
    num_seqs: jax.Array | int,  # [1] int32 or int
    *,
    sm_scale: float | None = None,
) -> jax.Array:
    head_dim = q.shape[2]
    scale = 1.0 / float(np.sqrt(head_dim)) if sm_scale is None else float(sm_scale)
    n = int(np.asarray(num_seqs).reshape(-1)[0])
    cu = np.asarray(cu_q_lens)
    max_q = max([int(cu[s + 1] - cu[s]) for s in range(n)], default=1)
    out = jnp.zeros(q.shape, jnp.float32)
    for s in range(n):
        out = _one_sequence(out, q, k_pages, v_pages, page_table[s], cu_q_lens[s], cu_q_lens[s + 1], kv_lens[s],
                            max_q=max(max_q, 1), scale=scale)
    return out.astype(q.dtype)


@functools.partial(jax.jit, static_argnames=("max_q", "scale"))
def _one_sequence(out, q, k_pages, v_pages, pages, q_start, q_end, kv_len, *, max_q: int, scale: float):
    """Attention of one sequence's rows q_start:q_end; written into out (f32). Shapes are padded to
    max_q query rows and the whole page-table row, so one compilation serves every sequence."""
    total_tokens, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    q_len = q_end - q_start
    i = jnp.arange(max_q)
    rows = jnp.where(i < q_len, q_start + i, total_tokens)  # out-of-range rows are dropped on write
    used = jnp.arange(pages.shape[0]) < (kv_len + page_size - 1) // page_size
    pages = jnp.where(used, pages, 0)  # entries past the context may be garbage
    # [kv_heads, L, head_dim] -> one KV row per q head: [q_heads, L, head_dim]
    k = jnp.repeat(k_pages[:, pages].reshape(kv_heads, -1, head_dim), q_heads // kv_heads, axis=0)
    v = jnp.repeat(v_pages[:, pages].reshape(kv_heads, -1, head_dim), q_heads // kv_heads, axis=0)
    qs = q[jnp.minimum(rows, total_tokens - 1)].astype(jnp.float32)  # [max_q, q_heads, head_dim]
    scores = jnp.einsum("qhd,hkd->hqk", qs, k.astype(jnp.float32)) * scale
    q_pos = kv_len - q_len + i[:, None]
    kv_pos = jnp.arange(k.shape[1])[None, :]
    allowed = (kv_pos <= q_pos) & (kv_pos < kv_len)  # [max_q, L]
    probs = jax.nn.softmax(jnp.where(allowed[None], scores, -jnp.inf), axis=-1)
    probs = jnp.where(allowed[None], probs, 0.0)  # rows past q_len have nothing allowed (NaN)
    return out.at[rows].set(jnp.einsum("hqk,hkd->qhd", probs, v.astype(jnp.float32)), mode="drop")
