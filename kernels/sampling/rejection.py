"""Speculative-decoding rejection sampler as a Pallas TPU kernel, and its jnp reference.

K draft tokens ``d_k`` were drawn from the draft model's probabilities ``q_k``; the target model scored the K
positions and one more (``p_0 .. p_K``). Position k accepts ``d_k`` with probability ``min(1, p_k(d_k) /
q_k(d_k))``; at the first rejection the token is redrawn from the residual ``max(p_k - q_k, 0)`` (renormalised)
and the rest are dropped; if all K are accepted a bonus token is drawn from ``p_K``. The output then follows the
target distribution exactly (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", https://arxiv.org/abs/2211.17192, Algorithm 1 / Theorem 1).

The kernel does the [batch, vocab] work of every position at once (positions are independent until the
first rejection): for each (position, row) one streaming pass over the vocabulary gathers ``p_k(d_k)`` and
``q_k(d_k)`` and draws from the residual by Gumbel-max (``argmax log(r) + g``, the noise from
:mod:`kernels.sampling.rng`), into lane-wide state. The wrapper then finds the first rejection per row (a
[batch, K] scan). Probabilities are read once from HBM: the call is HBM-bound.

Layout: probabilities are position-major, ``draft_probs [K, batch, vocab]`` and ``target_probs [K + 1, batch,
vocab]`` (the per-step [batch, vocab] outputs stacked, no transpose); ``draft_token_ids [batch, K]``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf
from kernels.common import interpret_params, with_ref_names
from kernels.perf import DEFAULT_CHIP, resolve_chip
from kernels.sampling import rng
from kernels.sampling.blocks import SamplingBlockSizes, default_block_sizes
from kernels.sampling.plan import MAX_VOCAB, RowVocabGrid, lane_group
from kernels.tiling import check_vmem, tpu_chip

#: Vocab index whose hash gives a position's acceptance uniform (never a token's index).
_ACCEPT_INDEX = -1


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class Verified:
    """Result of :func:`rejection_sample`."""

    #: [batch, K + 1] int32: the accepted draft tokens, then the resampled (or bonus) token, then -1.
    tokens: jax.Array
    #: [batch] int32: draft tokens accepted (0..K); the row emits num_accepted + 1 tokens.
    num_accepted: jax.Array


@dataclass(frozen=True, kw_only=True)
class RejectionPlan(RowVocabGrid):
    """Static facts of one :func:`rejection_sample` call, made once from its arguments, the chip and the blocks
    (:func:`make_plan`): they size the pallas_call (grid, BlockSpecs, scratch, compiler params, cost estimate)
    and the kernel body. Hashable: the jitted function and the body take it as a static argument."""

    batch: int
    vocab: int
    #: Draft tokens per row (K); position K is the bonus position (no draft).
    draft_tokens: int
    #: Rows per grid step and vocabulary entries per grid step (the checked block sizes).
    block_b: int
    block_v: int

    @property
    def positions(self) -> int:
        """K + 1 positions (the first grid axis)."""
        return self.draft_tokens + 1

    @property
    def width(self) -> int:
        """Lanes the kernel folds a block into (:func:`kernels.sampling.plan.lane_group`)."""
        return lane_group(self.block_v)


def _check(draft_token_ids, draft_probs, target_probs) -> tuple[int, int, int]:
    if target_probs.ndim != 3:
        raise ValueError(f"target_probs must be [K + 1, batch, vocab], got shape {target_probs.shape}")
    k1, batch, vocab = target_probs.shape
    k = k1 - 1
    if k < 1:
        raise ValueError(f"target_probs must have K + 1 >= 2 positions (K draft tokens and the bonus), got {k1}")
    if tuple(draft_probs.shape) != (k, batch, vocab):
        raise ValueError(f"draft_probs must be [K, batch, vocab] = [{k}, {batch}, {vocab}], got "
                         f"{list(draft_probs.shape)}")
    if tuple(draft_token_ids.shape) != (batch, k) or not jnp.issubdtype(draft_token_ids.dtype, jnp.integer):
        raise ValueError(f"draft_token_ids must be a [batch, K] = [{batch}, {k}] integer array, got "
                         f"{draft_token_ids.dtype}{list(draft_token_ids.shape)}")
    for name, arr in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if arr.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 probabilities, got {arr.dtype}")
    if vocab >= MAX_VOCAB:
        raise ValueError(f"vocab={vocab} must be below {MAX_VOCAB} (indices are reduced as f32)")
    return k, batch, vocab


def _position_seeds(key, seeds, batch: int, k1: int) -> jax.Array:
    """[K + 1, batch] int32 seeds: each row's seed (from ``key`` or ``seeds``) mixed with the position."""
    if (key is None) == (seeds is None):
        raise ValueError("pass exactly one of key (a JAX PRNG key) or seeds ([batch] int32, one per request)")
    if seeds is not None:
        seeds = jnp.asarray(seeds)
        if seeds.shape != (batch,) or not jnp.issubdtype(seeds.dtype, jnp.integer):
            raise ValueError(f"seeds must be a [{batch}] integer array (one per row), got {seeds.dtype}"
                             f"{list(seeds.shape)}")
        row = seeds.astype(jnp.int32)
    else:
        row = rng.row_seeds(key, batch)
    return rng.hash_bits(row[None, :], jnp.arange(k1, dtype=jnp.int32)[:, None])


def _combine(draft_token_ids, p_d, q_d, resampled, seeds) -> Verified:
    """First rejection per row from the gathered probabilities ([K + 1, batch] each) and the residual draws."""
    k = draft_token_ids.shape[1]
    u = rng.hash_uniform(seeds[:k], jnp.int32(_ACCEPT_INDEX))  # [K, batch]
    accept = u * q_d[:k] < p_d[:k]  # probability min(1, p / q)
    num = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=0), axis=0).astype(jnp.int32)  # leading accepts
    pos = jnp.arange(k + 1, dtype=jnp.int32)[None, :]
    drafts = jnp.pad(draft_token_ids.astype(jnp.int32), ((0, 0), (0, 1)))
    last = jnp.take_along_axis(resampled.T, num[:, None], axis=1)  # the residual draw (the bonus when all pass)
    tokens = jnp.where(pos < num[:, None], drafts, jnp.where(pos == num[:, None], last, -1))
    return Verified(tokens=tokens.astype(jnp.int32), num_accepted=num)


#: f32 [block_b, block_v] temporaries Mosaic keeps beyond the greedy sampling footprint (measured on tpu-v5e).
REJECTION_EXTRA_CHUNKS = 1.5


def rejection_vmem_bytes(blocks: SamplingBlockSizes, *, vocab: int) -> int:
    """VMEM of one grid step: the greedy sampling footprint with one more f32 stream (target and draft
    probabilities, double-buffered), plus Mosaic's temporaries (3.79 MB measured vs 4.08 MB here at 16 x 8192)."""
    base = blocks.vmem_bytes(vocab=vocab, logits_dtype=jnp.float32, with_noise=True, greedy=True)
    return int(base + REJECTION_EXTRA_CHUNKS * blocks.block_b * blocks.block_v * 4)


def rejection_sample(draft_token_ids: jax.Array, draft_probs: jax.Array, target_probs: jax.Array, *,
                     key: jax.Array | None = None, seeds: jax.Array | None = None,
                     block_sizes: SamplingBlockSizes | None = None, chip: str | None = None,
                     interpret: bool = False) -> Verified:
    """Verify K draft tokens per row against the target model (see the module docstring for the layout).

    Randomness: ``key`` or per-request ``seeds``. Raises ValueError naming the argument for bad shapes or
    dtypes. Block sizes: the sampling kernel's (``block_b`` rows x ``block_v`` vocabulary entries per step).
    """
    chip = resolve_chip(chip, interpret=interpret)
    k, batch, vocab = _check(draft_token_ids, draft_probs, target_probs)
    seeds_kb = _position_seeds(key, seeds, batch, k + 1)
    plan = make_plan(target_probs, block_sizes=block_sizes, chip=chip)
    p_d, q_d, resampled = _rejection(draft_token_ids.astype(jnp.int32), draft_probs, target_probs, seeds_kb,
                                     plan=plan, interpret=interpret)
    return _combine(draft_token_ids, p_d, q_d, resampled, seeds_kb)


def make_plan(target_probs, *, block_sizes: SamplingBlockSizes | None = None,
              chip: str = DEFAULT_CHIP) -> RejectionPlan:
    """The plan of a :func:`rejection_sample` call whose arrays and randomness passed its checks: the sampling
    kernel's defaults for f32 and the vocabulary unless ``block_sizes`` is given, then the chip's scoped-VMEM
    check (ValueError). ``target_probs`` [K + 1, batch, vocab] is read for its shape only."""
    k1, batch, vocab = target_probs.shape
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, logits_dtype=jnp.float32, vocab=vocab)
    check_vmem(rejection_vmem_bytes(block_sizes, vocab=vocab), tpu_chip(chip),
               f"block_sizes (block_b={block_sizes.block_b}, block_v={block_sizes.block_v})",
               fix="use a smaller block_b or block_v")
    return RejectionPlan(batch=batch, vocab=vocab, draft_tokens=k1 - 1, block_b=block_sizes.block_b,
                         block_v=block_sizes.block_v)


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _rejection(draft_token_ids, draft_probs, target_probs, seeds_kb, *, plan: RejectionPlan, interpret: bool):
    k1, batch, vocab, k = plan.positions, plan.batch, plan.vocab, plan.draft_tokens
    block_b, block_v = plan.block_b, plan.block_v
    row_blocks, vocab_blocks = plan.row_blocks, plan.vocab_blocks
    width = plan.width
    # Per (position, row): the draft token (-1 at the bonus position: nothing to gather) and the seed.
    drafts = jnp.concatenate([draft_token_ids.T, jnp.full((1, batch), -1, jnp.int32)], axis=0)
    opts = jnp.stack([drafts, seeds_kb], axis=2)  # [K + 1, batch, 2]
    column = pl.BlockSpec((None, block_b, 1), lambda p, i, j: (p, i, 0))
    kernel = with_ref_names(functools.partial(_rejection_kernel, plan=plan),
                            ["opts_ref", "target_ref", "draft_ref", "pd_ref", "qd_ref", "pick_ref",
                             "pd_v_ref", "qd_v_ref", "best_v_ref", "pick_v_ref"])
    lanes = pltpu.VMEM((block_b, width), jnp.float32)
    call = pl.pallas_call(
        kernel,
        grid=(k1, row_blocks, vocab_blocks),
        in_specs=[pl.BlockSpec((None, block_b, 2), lambda p, i, j: (p, i, 0)),
                  pl.BlockSpec((None, block_b, block_v), lambda p, i, j: (p, i, j)),
                  # The bonus position has no draft: it holds the last draft block (no new fetch per step).
                  pl.BlockSpec((None, block_b, block_v), lambda p, i, j: (
                      jnp.minimum(p, k - 1), i, j + (vocab_blocks - 1 - j) * (p == k).astype(jnp.int32)))],
        out_specs=[column, column, column],
        out_shape=[jax.ShapeDtypeStruct((k1, batch, 1), jnp.float32), jax.ShapeDtypeStruct((k1, batch, 1),
                                                                                            jnp.float32),
                   jax.ShapeDtypeStruct((k1, batch, 1), jnp.int32)],
        scratch_shapes=[lanes] * 4,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret_params(interpret),
        cost_estimate=_cost_estimate(plan),
        name="rejection_sample",
    )
    with jax.named_scope(f"rejection_sample_bb{block_b}_bv{block_v}"):
        p_d, q_d, pick = call(opts, target_probs, draft_probs)
    return p_d[..., 0], q_d[..., 0], pick[..., 0]


def _cost_estimate(plan: RejectionPlan):
    """pl.CostEstimate from perfmodel's rejection-sampling model."""
    return perf.rejection_sampling_cost(batch=plan.batch, vocab=plan.vocab, draft_tokens=plan.draft_tokens)


def _rejection_kernel(opts_ref, target_ref, draft_ref, pd_ref, qd_ref, pick_ref, pd_v_ref, qd_v_ref, best_v_ref,
                      pick_v_ref, *, plan: RejectionPlan):
    """The kernel body of ``plan``'s call. opts_ref [block_b, 2] int32 (draft token, seed) of position p;
    target_ref / draft_ref [block_b, block_v] probabilities of vocab block j; outputs [block_b, 1]: p(d), q(d), the
    residual draw; lane-wide state."""
    vocab, bonus, width = plan.vocab, plan.draft_tokens, plan.width
    p, j = pl.program_id(0), pl.program_id(2)
    block_b, block_v = target_ref.shape
    lane_iota = lax.broadcasted_iota(jnp.int32, (block_b, width), 1)
    draft = jnp.broadcast_to(opts_ref[:, 0:1], (block_b, width))
    seed = jnp.broadcast_to(opts_ref[:, 1:2], (block_b, width))
    is_bonus = p == bonus

    @pl.when(j == 0)
    def _():
        pd_v_ref[...] = jnp.zeros((block_b, width), jnp.float32)
        qd_v_ref[...] = jnp.zeros((block_b, width), jnp.float32)
        best_v_ref[...] = jnp.full((block_b, width), -jnp.inf, jnp.float32)
        pick_v_ref[...] = jnp.zeros((block_b, width), jnp.float32)

    pd, qd, best, pick = pd_v_ref[...], qd_v_ref[...], best_v_ref[...], pick_v_ref[...]
    for g in range(block_v // width):
        lanes = pl.ds(g * width, width)
        cols = lane_iota + (j * block_v + g * width)
        valid = cols < vocab
        tp = jnp.where(valid, target_ref[:, lanes], 0.0)
        dp = jnp.where(valid & jnp.logical_not(is_bonus), draft_ref[:, lanes], 0.0)
        hit = cols == draft
        pd = pd + jnp.where(hit, tp, 0.0)
        qd = qd + jnp.where(hit, dp, 0.0)
        residual = jnp.maximum(tp - dp, 0.0)
        score = jnp.where(residual > 0.0, jnp.log(residual) + rng.gumbel(rng.hash_uniform(seed, cols)), -jnp.inf)
        better = score > best
        best = jnp.where(better, score, best)
        pick = jnp.where(better, cols.astype(jnp.float32), pick)
    pd_v_ref[...], qd_v_ref[...], best_v_ref[...], pick_v_ref[...] = pd, qd, best, pick

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        pd_ref[...] = jnp.sum(pd, axis=1, keepdims=True)
        qd_ref[...] = jnp.sum(qd, axis=1, keepdims=True)
        top = jnp.max(best, axis=1, keepdims=True)
        first = jnp.min(jnp.where(best == top, pick, float(MAX_VOCAB)), axis=1, keepdims=True)
        pick_ref[...] = first.astype(jnp.int32)


def rejection_sample_reference(draft_token_ids: jax.Array, draft_probs: jax.Array, target_probs: jax.Array, *,
                               key: jax.Array | None = None, seeds: jax.Array | None = None) -> Verified:
    """The same algorithm on whole rows in jnp, with the same noise (token for token equal to the kernel)."""
    k, batch, vocab = _check(draft_token_ids, draft_probs, target_probs)
    seeds_kb = _position_seeds(key, seeds, batch, k + 1)
    drafts = draft_token_ids.T.astype(jnp.int32)  # [K, batch]
    p_d = jnp.take_along_axis(target_probs[:k], drafts[..., None], axis=2)[..., 0]
    q_d = jnp.take_along_axis(draft_probs, drafts[..., None], axis=2)[..., 0]
    q_full = jnp.concatenate([draft_probs, jnp.zeros((1, batch, vocab), jnp.float32)], axis=0)
    residual = jnp.maximum(target_probs - q_full, 0.0)
    noise = rng.hash_uniform(seeds_kb[..., None], jnp.arange(vocab, dtype=jnp.int32)[None, None, :])
    score = jnp.where(residual > 0.0, jnp.log(residual) + rng.gumbel(noise), -jnp.inf)
    resampled = jnp.argmax(score, axis=2).astype(jnp.int32)
    pad = jnp.zeros((1, batch), jnp.float32)
    return _combine(draft_token_ids, jnp.concatenate([p_d, pad]), jnp.concatenate([q_d, pad]), resampled, seeds_kb)


__all__ = ["Verified", "rejection_sample", "rejection_sample_reference"]
