"""Pure-jnp reference of ragged paged attention (f32 math, one sequence at a time).

Same layout and semantics as :func:`kernels.ragged_paged_attention.ragged_paged_attention`:
``kv_pages[page, row, 2h]`` is K of KV head ``h``, ``[.., 2h + 1]`` its V; sequence ``s`` owns
query rows ``cu_q_lens[s]:cu_q_lens[s+1]`` and the first ``kv_lens[s]`` positions of its
pages; query ``i`` of the sequence is at position ``p = kv_lens[s] - q_len + i`` and attends
to KV positions ``p - sliding_window < k <= p``. Scores ``sm_scale * q.k`` are soft-capped
(``c * tanh(x / c)``) when ``soft_cap`` is given; ``sinks[j]`` adds ``exp(sinks[j])`` to
head ``j``'s softmax denominator. An int8 / fp8 cache is dequantized first (``kv_scales``:
per token ``[num_pages, page_size, 2 * kv_heads]`` or per page ``[num_pages, 2 * kv_heads]``, column
``2h`` for K of head h, ``2h + 1`` for V). Rows past ``cu_q_lens[num_seqs]`` are zero. Needs
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
    kv_scales: jax.Array | None = None,  # [num_pages, page_size, 2 * kv_heads] or [num_pages, 2 * kv_heads] f32
) -> jax.Array:
    if kv_scales is not None:
        kv_pages = dequantize_kv_pages(kv_pages, kv_scales)
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


#: Largest finite float8_e4m3fn (the fp8 quantizer maps each slice's max |x| to it).
FP8_E4M3_MAX = 448.0
#: Scale layouts of a quantized combined cache (perfmodel.model.paged_attention.KV_SCALES names).
KV_SCALE_LAYOUTS = ("per-token", "per-page")


def quantize_kv_pages(kv_pages: jax.Array, *, dtype=jnp.int8, layout: str = "per-token") -> tuple[jax.Array, jax.Array]:
    """A bf16 / f32 combined cache ``[num_pages, page_size, 2 * kv_heads, head_dim]`` as (codes, f32 scales) in the
    layout :func:`kernels.ragged_paged_attention.ragged_paged_attention` reads: codes of kv_pages' shape in ``dtype``
    (int8: symmetric, :func:`kernels.quant.quantize_int8`; float8_e4m3fn: x / scale rounded to fp8, the slice's max
    |x| at 448), scales ``[num_pages, page_size, 2 * kv_heads]`` (``layout="per-token"``: one per K or V row of a
    head, over head_dim) or ``[num_pages, 2 * kv_heads]`` ("per-page": one per page and K or V of a head, over the
    page's tokens and head_dim). x ~= code * scale; an all-zero slice gets scale 0."""
    from kernels.quant import quantize_int8

    if layout not in KV_SCALE_LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {KV_SCALE_LAYOUTS}")
    name = jnp.dtype(dtype).name
    if name not in ("int8", "float8_e4m3fn"):
        raise ValueError(f"dtype={name} must be int8 or float8_e4m3fn")
    num_pages, page_size, combined, head_dim = kv_pages.shape
    # Per page: each K or V row of a head as one [page_size * head_dim] slice.
    x = kv_pages if layout == "per-token" else jnp.swapaxes(kv_pages, 1, 2).reshape(num_pages, combined, -1)
    if name == "int8":
        codes, scale = quantize_int8(x, axis=-1)
    else:
        x = x.astype(jnp.float32)
        amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
        scale = amax / FP8_E4M3_MAX
        codes = (x * jnp.where(amax > 0, FP8_E4M3_MAX / jnp.where(amax > 0, amax, 1.0), 0.0)).astype(dtype)
    if layout == "per-page":
        codes = jnp.swapaxes(codes.reshape(num_pages, combined, page_size, head_dim), 1, 2)
    return codes, scale[..., 0]


def dequantize_kv_pages(kv_pages: jax.Array, kv_scales: jax.Array) -> jax.Array:
    """f32 ``code * scale`` of a quantized combined cache, per-token or per-page scales (by rank)."""
    scales = kv_scales[:, :, :, None] if kv_scales.ndim == 3 else kv_scales[:, None, :, None]
    return kv_pages.astype(jnp.float32) * scales


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
