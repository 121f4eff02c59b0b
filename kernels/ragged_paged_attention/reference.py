"""Pure-jnp reference of ragged paged attention (f32 math, one sequence at a time).

Same layout and semantics as :func:`kernels.ragged_paged_attention.ragged_paged_attention`:
sequence ``s`` owns query rows ``cu_q_lens[s]:cu_q_lens[s+1]`` and the first
``kv_lens[s]`` positions of its pages; query ``i`` of the sequence attends to
KV positions ``<= kv_lens[s] - q_len + i``. Rows past ``cu_q_lens[num_seqs]``
are zero. Needs concrete lengths (it loops in Python); use it on small inputs.
"""

from __future__ import annotations

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
    total_tokens, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = q_heads // kv_heads
    scale = 1.0 / float(np.sqrt(head_dim)) if sm_scale is None else float(sm_scale)
    n = int(np.asarray(num_seqs).reshape(-1)[0])
    cu = np.asarray(cu_q_lens)
    lens = np.asarray(kv_lens)
    table = np.asarray(page_table)
    out = jnp.zeros((total_tokens, q_heads, head_dim), jnp.float32)
    for s in range(n):
        start, end, kv_len = int(cu[s]), int(cu[s + 1]), int(lens[s])
        q_len = end - start
        if q_len == 0:
            continue
        pages = table[s, : -(-kv_len // page_size)]
        # [kv_heads, kv_len, head_dim] -> one KV row per q head: [q_heads, kv_len, head_dim]
        k = k_pages[:, pages].reshape(kv_heads, -1, head_dim)[:, :kv_len].astype(jnp.float32)
        v = v_pages[:, pages].reshape(kv_heads, -1, head_dim)[:, :kv_len].astype(jnp.float32)
        k = jnp.repeat(k, group, axis=0)
        v = jnp.repeat(v, group, axis=0)
        qs = q[start:end].astype(jnp.float32)  # [q_len, q_heads, head_dim]
        scores = jnp.einsum("qhd,hkd->hqk", qs, k) * scale
        q_pos = kv_len - q_len + jnp.arange(q_len)[:, None]
        allowed = jnp.arange(kv_len)[None, :] <= q_pos  # [q_len, kv_len]
        scores = jnp.where(allowed[None], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        out = out.at[start:end].set(jnp.einsum("hqk,hkd->qhd", probs, v))
    return out.astype(q.dtype)
