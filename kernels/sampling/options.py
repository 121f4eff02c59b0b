"""Per-row sampling options: broadcasting, checks and the exact semantics both the kernel and the reference use.

Semantics, row by row (``x`` are the logits, ``V`` the vocabulary size):

0. Adjusted logits (when the call passes them): ``x = f32(x) + logit_bias``,
   with banned (or not allowed) tokens set to ``-inf``; then, for tokens seen
   before (``token_counts > 0``), the repetition penalty ``r`` divides a
   positive ``x`` by ``r`` and multiplies a negative one by ``r``; then
   ``x -= frequency_penalty * count + presence_penalty * (count > 0)``. Every
   later step, greedy included, sees the adjusted ``x``.
1. ``temperature == 0`` makes the row greedy: the token is ``argmax(x)`` (first
   index on ties) and the filters below are ignored. Otherwise the scaled
   logits are ``z = f32(x) * f32(1 / temperature)``.
2. top-k keeps the ``top_k`` largest ``z`` (``top_k >= V``: all).
3. top-p keeps, of the top-k set, the smallest prefix (by descending ``z``)
   whose probability mass, renormalised over the top-k set, reaches ``top_p``
   (``top_p == 1``: all). The most likely token is always kept.
4. min-p keeps tokens whose probability is at least ``min_p`` times the most
   likely token's (``min_p == 0``: all); it does not depend on renormalisation.
5. The token is drawn from the softmax of ``z`` over the kept set, by the
   Gumbel-max trick: ``argmax over kept of z + g`` with ``g = -log(-log(u))``
   for uniforms ``u`` (pre-drawn noise, or :mod:`kernels.sampling.rng` bits from a key).

Without a key or noise every row is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True, kw_only=True)
class RowOptions:
    """Sampling options broadcast to one value per row ([batch] arrays)."""

    inv_temperature: jax.Array  # f32: 1 / temperature (1 for greedy rows)
    greedy: jax.Array  # bool
    top_k: jax.Array  # int32, clamped to [1, vocab]
    top_p: jax.Array  # f32 in (0, 1]
    min_p: jax.Array  # f32 in [0, 1]
    presence_penalty: jax.Array  # f32
    frequency_penalty: jax.Array  # f32
    repetition_penalty: jax.Array  # f32 > 0 (1: off)


def _concrete(x) -> np.ndarray | None:
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _per_row(name: str, value, default, batch: int, dtype) -> jax.Array:
    if value is None:
        value = default
    arr = jnp.asarray(value)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != batch):
        raise ValueError(f"{name} must be a scalar or a [{batch}] array (one per row), got shape {arr.shape}")
    if dtype == jnp.int32 and not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer (or integer array), got dtype {arr.dtype}")
    return jnp.broadcast_to(arr.astype(dtype), (batch,))


def _check_range(name: str, arr: jax.Array, ok, text: str) -> None:
    values = _concrete(arr)
    if values is not None and not np.all(ok(values)):
        bad = values[~ok(values)][0]
        raise ValueError(f"{name}={bad} is out of range: {text}")


def row_options(*, batch: int, vocab: int, temperature, top_k, top_p, min_p, random: bool,
                presence_penalty=None, frequency_penalty=None, repetition_penalty=None) -> RowOptions:
    """Broadcast and check the options; values are checked when concrete (not under an outer jit).

    ``random`` False (no key, seeds or noise) makes every row greedy.
    """
    temp = _per_row("temperature", temperature, 1.0, batch, jnp.float32)
    k = _per_row("top_k", top_k, vocab, batch, jnp.int32)
    p = _per_row("top_p", top_p, 1.0, batch, jnp.float32)
    mp = _per_row("min_p", min_p, 0.0, batch, jnp.float32)
    _check_range("temperature", temp, lambda v: v >= 0, "must be >= 0 (0 means greedy)")
    _check_range("top_k", k, lambda v: v >= 1, "must be >= 1 (use the vocabulary size, or None, to disable)")
    _check_range("top_p", p, lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 disables it)")
    _check_range("min_p", mp, lambda v: (v >= 0) & (v <= 1), "must be in [0, 1] (0 disables it)")
    presence = _per_row("presence_penalty", presence_penalty, 0.0, batch, jnp.float32)
    frequency = _per_row("frequency_penalty", frequency_penalty, 0.0, batch, jnp.float32)
    repetition = _per_row("repetition_penalty", repetition_penalty, 1.0, batch, jnp.float32)
    for name, arr in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        _check_range(name, arr, np.isfinite, "must be finite (0 disables it)")
    _check_range("repetition_penalty", repetition, lambda v: np.isfinite(v) & (v > 0),
                 "must be > 0 and finite (1 disables it)")
    greedy = (temp == 0) | (not random)
    inv_t = jnp.where(greedy, 1.0, 1.0 / jnp.where(temp == 0, 1.0, temp)).astype(jnp.float32)
    return RowOptions(inv_temperature=inv_t, greedy=greedy, top_k=jnp.clip(k, 1, vocab), top_p=p, min_p=mp,
                      presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition)


def adjusted_logits(logits: jax.Array, *, bias=None, token_counts=None, presence=None, frequency=None,
                    repetition=None) -> jax.Array:
    """Step 0 of the semantics, elementwise in f32: bias (``-inf`` bans), then the penalties.

    One formula for the kernel (on each lane group, options as ``[block_b, 1]`` columns) and the reference (whole
    rows, options as ``[batch, 1]``); the penalties broadcast against ``logits`` and are needed with counts.
    """
    x = logits.astype(jnp.float32)
    if bias is not None:
        x = x + bias
    if token_counts is not None:
        counts = token_counts.astype(jnp.float32)
        seen = counts > 0.0
        x = jnp.where(seen, jnp.where(x > 0.0, x / repetition, x * repetition), x)
        x = x - (frequency * counts + presence * jnp.where(seen, 1.0, 0.0))
    return x


def combined_bias(*, batch: int, vocab: int, logit_bias=None, allowed_mask=None, banned_mask=None):
    """One additive [batch, vocab] f32 array from the bias and the masks (``-inf`` where a token is banned or
    not allowed), or None when the call passes none of them. Shapes and dtypes are checked."""
    if logit_bias is None and allowed_mask is None and banned_mask is None:
        return None
    for name, arr, kind in (("logit_bias", logit_bias, "float"), ("allowed_mask", allowed_mask, "bool"),
                            ("banned_mask", banned_mask, "bool")):
        if arr is None:
            continue
        if tuple(arr.shape) != (batch, vocab):
            raise ValueError(f"{name} must be shaped like logits [{batch}, {vocab}], got {list(arr.shape)}")
        ok = jnp.issubdtype(arr.dtype, jnp.floating) if kind == "float" else arr.dtype == jnp.bool_
        if not ok:
            raise ValueError(f"{name} must be a {kind} array, got dtype {arr.dtype}")
    bias = jnp.zeros((batch, vocab), jnp.float32) if logit_bias is None else logit_bias.astype(jnp.float32)
    if allowed_mask is not None:
        bias = jnp.where(allowed_mask, bias, -jnp.inf)
    if banned_mask is not None:
        bias = jnp.where(banned_mask, -jnp.inf, bias)
    return bias


def check_token_counts(token_counts, *, batch: int, vocab: int) -> None:
    if tuple(token_counts.shape) != (batch, vocab):
        raise ValueError(f"token_counts must be shaped like logits [{batch}, {vocab}], got {list(token_counts.shape)}")
    if not jnp.issubdtype(token_counts.dtype, jnp.integer):
        raise ValueError(f"token_counts must be an integer array (occurrences per token), got dtype "
                         f"{token_counts.dtype}")
