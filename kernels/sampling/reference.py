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
from kernels.sampling.options import (
    RowOptions,
    adjusted_logits,
    check_token_counts,
    combined_bias,
    row_options,
)


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


def _prepare(logits, *, temperature, top_k, top_p, min_p, random: bool, token_counts, presence_penalty,
             frequency_penalty, repetition_penalty, logit_bias, allowed_mask, banned_mask):
    """(options, adjusted f32 logits, scaled logits z) as the semantics define them."""
    batch, vocab = logits.shape
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       random=random, presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                       repetition_penalty=repetition_penalty)
    if token_counts is not None:
        check_token_counts(token_counts, batch=batch, vocab=vocab)
    bias = combined_bias(batch=batch, vocab=vocab, logit_bias=logit_bias, allowed_mask=allowed_mask,
                         banned_mask=banned_mask)
    x = adjusted_logits(logits, bias=bias, token_counts=token_counts, presence=opts.presence_penalty[:, None],
                        frequency=opts.frequency_penalty[:, None], repetition=opts.repetition_penalty[:, None])
    return opts, x, _scaled(x, opts)


def sampling_reference(logits: jax.Array, *, temperature=1.0, top_k=None, top_p=None, min_p=None,
                       key: jax.Array | None = None, seeds: jax.Array | None = None, noise: jax.Array | None = None,
                       token_counts=None, presence_penalty=None, frequency_penalty=None, repetition_penalty=None,
                       logit_bias=None, allowed_mask=None, banned_mask=None) -> jax.Array:
    """[batch] int32 token ids, drawn as the kernel draws them (same noise, same semantics)."""
    batch, vocab = logits.shape
    random = key is not None or seeds is not None or noise is not None
    opts, _, z = _prepare(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, random=random,
                          token_counts=token_counts, presence_penalty=presence_penalty,
                          frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty,
                          logit_bias=logit_bias, allowed_mask=allowed_mask, banned_mask=banned_mask)
    greedy_ids = jnp.argmax(z, axis=1).astype(jnp.int32)
    if not random:
        return greedy_ids
    if noise is None:
        seeds = rng.row_seeds(key, batch) if seeds is None else jnp.asarray(seeds).astype(jnp.int32)
        noise = rng.hash_uniform(seeds[:, None], jnp.arange(vocab, dtype=jnp.int32)[None, :])
    perturbed = jnp.where(_kept(z, opts), z + rng.gumbel(noise.astype(jnp.float32)), -jnp.inf)
    drawn = jnp.argmax(perturbed, axis=1).astype(jnp.int32)
    return jnp.where(opts.greedy, greedy_ids, drawn)


def logprobs_reference(logits: jax.Array, ids: jax.Array, n: int, *, temperature=1.0, random: bool = True,
                       **adjustments) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(chosen [batch], top-n ids [batch, n], top-n log-probabilities [batch, n]) of ``log_softmax(z)`` (the
    adjusted, temperature-scaled logits; temperature 1 for greedy rows), top-n by a stable descending sort."""
    opts, _, z = _prepare(logits, temperature=temperature, top_k=None, top_p=None, min_p=None, random=random,
                          **{k: adjustments.get(k) for k in ("token_counts", "presence_penalty",
                                                             "frequency_penalty", "repetition_penalty",
                                                             "logit_bias", "allowed_mask", "banned_mask")})
    logp = jax.nn.log_softmax(z, axis=1)
    chosen = jnp.take_along_axis(logp, ids[:, None].astype(jnp.int32), axis=1)[:, 0]
    order = jnp.argsort(-z, axis=1, stable=True)[:, :n].astype(jnp.int32)
    return chosen, order, jnp.take_along_axis(logp, order, axis=1)
