"""Pure-jnp reference of fused sampling: full sort, cumulative sums, f32 math.

Implements the semantics of :mod:`kernels.sampling.options` the textbook way
(sort descending, mask the top-k ranks, cumulative renormalised mass for
top-p, probability ratio for min-p), as an independent check of the kernel's
sort-free threshold search.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.sampling import rng
from kernels.sampling.options import RowOptions, row_options


def _scaled(logits: jax.Array, opts: RowOptions) -> jax.Array:
    return logits.astype(jnp.float32) * opts.inv_temperature[:, None]


def _kept(z: jax.Array, opts: RowOptions) -> jax.Array:
    batch, vocab = z.shape
    order = jnp.argsort(-z, axis=1, stable=True)
    z_sorted = jnp.take_along_axis(z, order, axis=1)
    rank = jnp.arange(vocab)[None, :]
    keep = rank < opts.top_k[:, None]
    weights = jnp.where(keep, jnp.exp(z_sorted - z_sorted[:, :1]), 0.0)
    probs = weights / jnp.sum(weights, axis=1, keepdims=True)
    mass_before = jnp.cumsum(probs, axis=1) - probs
    # top_p == 1 keeps everything (a rounded cumulative sum can reach 1 before the last token).
    keep &= (mass_before < opts.top_p[:, None]) | (opts.top_p[:, None] >= 1.0)
    rows = jnp.arange(batch)[:, None]
    kept = jnp.zeros((batch, vocab), bool).at[rows, order].set(keep)
    full = jax.nn.softmax(z, axis=1)
    return kept & (full >= opts.min_p[:, None] * jnp.max(full, axis=1, keepdims=True))


def kept_mask_reference(logits: jax.Array, *, temperature=1.0, top_k=None, top_p=None, min_p=None) -> jax.Array:
    """[batch, vocab] bool: the tokens the filters keep (for rows that are not greedy)."""
    batch, vocab = logits.shape
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       random=True)
    return _kept(_scaled(logits, opts), opts)


def sampling_reference(logits: jax.Array, *, temperature=1.0, top_k=None, top_p=None, min_p=None,
                       key: jax.Array | None = None, noise: jax.Array | None = None) -> jax.Array:
    """[batch] int32 token ids, drawn as the kernel draws them (same noise, same semantics)."""
    batch, vocab = logits.shape
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       random=key is not None or noise is not None)
    z = _scaled(logits, opts)
    greedy_ids = jnp.argmax(z, axis=1).astype(jnp.int32)
    if key is None and noise is None:
        return greedy_ids
    if noise is None:
        seeds = rng.row_seeds(key, batch)
        noise = rng.hash_uniform(seeds[:, None], jnp.arange(vocab, dtype=jnp.int32)[None, :])
    perturbed = jnp.where(_kept(z, opts), z + rng.gumbel(noise.astype(jnp.float32)), -jnp.inf)
    drawn = jnp.argmax(perturbed, axis=1).astype(jnp.int32)
    return jnp.where(opts.greedy, greedy_ids, drawn)
