"""Per-row sampling options: broadcasting, checks and the exact semantics both the kernel and the reference use.

Semantics, row by row (``x`` are the logits, ``V`` the vocabulary size):

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


def row_options(*, batch: int, vocab: int, temperature, top_k, top_p, min_p, random: bool) -> RowOptions:
    """Broadcast and check the options; values are checked when concrete (not under an outer jit).

    ``random`` False (no key, no noise) makes every row greedy.
    """
    temp = _per_row("temperature", temperature, 1.0, batch, jnp.float32)
    k = _per_row("top_k", top_k, vocab, batch, jnp.int32)
    p = _per_row("top_p", top_p, 1.0, batch, jnp.float32)
    mp = _per_row("min_p", min_p, 0.0, batch, jnp.float32)
    _check_range("temperature", temp, lambda v: v >= 0, "must be >= 0 (0 means greedy)")
    _check_range("top_k", k, lambda v: v >= 1, "must be >= 1 (use the vocabulary size, or None, to disable)")
    _check_range("top_p", p, lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 disables it)")
    _check_range("min_p", mp, lambda v: (v >= 0) & (v <= 1), "must be in [0, 1] (0 disables it)")
    greedy = (temp == 0) | (not random)
    inv_t = jnp.where(greedy, 1.0, 1.0 / jnp.where(temp == 0, 1.0, temp)).astype(jnp.float32)
    return RowOptions(inv_temperature=inv_t, greedy=greedy, top_k=jnp.clip(k, 1, vocab), top_p=p, min_p=mp)
