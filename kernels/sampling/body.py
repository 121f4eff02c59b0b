"""The Pallas kernel body of the fused sampling call (:func:`_sampling_kernel`: phase 0 streams the logits,
applies penalties and bias, and keeps the row maxima and the resident copy; phase 1 runs the threshold search of
:mod:`kernels.sampling.search` and the Gumbel-max draw) and the top-n log-probability passes it ends with
(:func:`_top_n`)."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.sampling import rng
from kernels.sampling.options import adjusted_logits
from kernels.sampling.plan import (
    _F_FREQUENCY,
    _F_GREEDY,
    _F_INV_TEMP,
    _F_PRESENCE,
    _F_REPETITION,
    _I_SEED,
    MAX_VOCAB,
    SamplingPlan,
)
from kernels.sampling.search import _column, _fold_rows, _resident_z, _thresholds
from kernels.tiling import LANES


def _top_n(rows_ref, opts_f_ref, n: int, *, vocab: int, width: int):
    """The n largest z per row (first index on ties), one pass each: ([block_b, n] f32 indices, [block_b, n] z)."""
    _, block_b, _ = rows_ref.shape
    inv_t = _column(opts_f_ref, _F_INV_TEMP)
    slot = lax.broadcasted_iota(jnp.int32, (block_b, n), 1)
    neg_inf = jnp.full((block_b, width), -jnp.inf, jnp.float32)
    big = jnp.full((block_b, width), float(MAX_VOCAB), jnp.float32)

    def one(r, state):
        prev_z, prev_i, ids, zs = state
        prev_z_w, prev_i_w = jnp.broadcast_to(prev_z, (block_b, width)), jnp.broadcast_to(prev_i, (block_b, width))

        def step(z, cols, acc):
            best, index = acc
            after = (z < prev_z_w) | ((z == prev_z_w) & (cols > prev_i_w))  # after the previous in (z desc, index)
            better = after & (z > best)  # best starts at -inf, so -inf entries are never taken
            return jnp.where(better, z, best), jnp.where(better, cols, index)

        best, index = _fold_rows(rows_ref, inv_t, width, step, (neg_inf, big))
        top = jnp.max(best, axis=1, keepdims=True)
        first = jnp.min(jnp.where(best == top, index, float(MAX_VOCAB)), axis=1, keepdims=True)
        return top, first, jnp.where(slot == r, first, ids), jnp.where(slot == r, top, zs)

    init = (jnp.full((block_b, 1), jnp.inf, jnp.float32), jnp.full((block_b, 1), -1.0, jnp.float32),
            jnp.zeros((block_b, n), jnp.float32), jnp.full((block_b, n), -jnp.inf, jnp.float32))
    _, _, ids, zs = lax.fori_loop(0, n, one, init)
    return ids, zs


def _sampling_kernel(opts_f_ref, opts_i_ref, logits_ref, *refs, plan: SamplingPlan):
    """The kernel body of ``plan``'s call. Refs (see ``kernel._sampling`` for which are present):

    opts_f_ref [block_b, 7] f32: 1/temperature, top_p, min_p, greedy (1.0 / 0.0), presence, frequency, repetition;
    opts_i_ref [block_b, 2] int32: top_k (clamped to vocab), seed;
    logits_ref / counts_ref / bias_ref [block_b, block_v]: vocab block j (phase 0), the last block, unused (phase 1);
    noise_ref [block_b, block_v] f32 uniforms: vocab block j (phase 1);
    outputs ids_ref [block_b, 1] int32, thr_ref [block_b, 1] f32, lp_ref [block_b, 1] f32, top_ids_ref /
    top_lp_ref [block_b, n];
    scratch rows_ref [vocab_blocks, block_b, block_v]: the adjusted row block (-inf padded); lane-wide
    [block_b, width] f32 state: running max of z, its first index, sum of exp(z - max) (phase 0), best
    z + gumbel, its index and its z (the draw); per-row [block_b, 1] f32: max of z, its first index, log-sum-exp
    of z, the threshold of the kept set.
    """
    vocab, mode, filters, width = plan.vocab, plan.mode, plan.filters, plan.width
    refs = list(refs)
    counts_ref = refs.pop(0) if filters.penalties else None
    bias_ref = refs.pop(0) if filters.bias else None
    noise_ref = refs.pop(0) if mode == "noise" else None
    ids_ref, thr_ref = refs.pop(0), refs.pop(0)
    lp_ref = refs.pop(0) if filters.logprobs is not None else None
    n_top = plan.n_top
    top_ids_ref, top_lp_ref = (refs.pop(0), refs.pop(0)) if n_top else (None, None)
    rows_ref, max_v_ref, arg_v_ref, sum_v_ref, max_ref, arg_ref, lse_ref, cut_ref = refs[:8]
    best_v_ref, pick_v_ref, bestz_v_ref = refs[8:11] if mode != "greedy" else (None, None, None)
    phase, j = pl.program_id(1), pl.program_id(2)
    block_b, block_v = logits_ref.shape
    groups = block_v // width
    last = pl.num_programs(2) - 1
    opt = functools.partial(_column, opts_f_ref)
    inv_t = jnp.broadcast_to(opt(_F_INV_TEMP), (block_b, width))
    greedy = opt(_F_GREEDY) > 0.5
    lane_iota = lax.broadcasted_iota(jnp.int32, (block_b, width), 1)
    lane_iota_f = lane_iota.astype(jnp.float32)
    with_lse = filters.logprobs is not None
    neg_inf = jnp.full((block_b, width), -jnp.inf, jnp.float32)
    big = jnp.full((block_b, width), float(MAX_VOCAB), jnp.float32)

    def cols_of(block, g):
        """int32 vocab indices of lane group g of vocab block ``block``."""
        return lane_iota + (block * block_v + g * width)

    def first_max(values, index):
        """(max, its first index) per row of lane-wide state whose lanes each hold their first occurrence."""
        top = jnp.max(values, axis=1, keepdims=True)
        return top, jnp.min(jnp.where(values == top, index, float(MAX_VOCAB)), axis=1, keepdims=True)

    def _finish(pick, threshold, z_pick):
        """Write the outputs of the row block (greedy rows take the argmax) and the top-n log-probabilities."""
        pick = jnp.where(greedy, arg_ref[...], pick)
        ids_ref[...] = pick.astype(jnp.int32)
        thr_ref[...] = jnp.where(greedy, max_ref[...], threshold)
        if lp_ref is not None:
            lp_ref[...] = jnp.where(greedy, max_ref[...], z_pick) - lse_ref[...]
        if n_top:
            # 128-lane groups: the top-n state (best z, its index, the previous pick) is twice a count's, and at
            # 256 lanes it spilled (7x: 291 spills per chunk at 830 bundles, 78 at 791 at 128 lanes; v4 862 -> 551)
            top_ids, top_z = _top_n(rows_ref, opts_f_ref, n_top, vocab=vocab, width=LANES)
            top_ids_ref[...] = jnp.where(top_z == -jnp.inf, -1, top_ids.astype(jnp.int32))
            top_lp_ref[...] = top_z - lse_ref[...]

    @pl.when(phase == 0)
    def _load():
        @pl.when(j == 0)
        def _():
            max_v_ref[...] = neg_inf
            arg_v_ref[...] = jnp.zeros_like(big)
            sum_v_ref[...] = jnp.zeros_like(big)

        top_v, arg_v, sum_v = max_v_ref[...], arg_v_ref[...], sum_v_ref[...]
        if filters.penalties:
            penalty = dict(presence=opt(_F_PRESENCE), frequency=opt(_F_FREQUENCY), repetition=opt(_F_REPETITION))
        for g in range(groups):
            lanes = pl.ds(g * width, width)
            offset = j * block_v + g * width
            x = adjusted_logits(logits_ref[:, lanes], bias=None if bias_ref is None else bias_ref[:, lanes],
                                token_counts=None if counts_ref is None else counts_ref[:, lanes],
                                **(penalty if filters.penalties else {}))
            x = jnp.where(lane_iota < vocab - offset, x, -jnp.inf)
            z = x * inv_t
            if plan.phases == 2:  # the passes of phase 1 read the resident copy (see _resident_z)
                rows_ref[j, :, lanes] = (z if rows_ref.dtype == jnp.float32 else x).astype(rows_ref.dtype)
            better = z > top_v  # strict: each lane keeps its first occurrence
            new_top = jnp.where(better, z, top_v)
            if with_lse:  # online sum of exp(z - running max), rescaled when the max grows
                scale = jnp.where(new_top == -jnp.inf, 0.0, jnp.exp(top_v - new_top))
                term = jnp.where(new_top == -jnp.inf, 0.0, jnp.exp(z - new_top))
                sum_v = sum_v * scale + term
            arg_v = jnp.where(better, lane_iota_f + offset.astype(jnp.float32), arg_v)
            top_v = new_top
        max_v_ref[...], arg_v_ref[...] = top_v, arg_v
        if with_lse:
            sum_v_ref[...] = sum_v

        @pl.when(j == last)
        def _():
            top, index = first_max(top_v, arg_v)
            max_ref[...], arg_ref[...] = top, index
            if with_lse:
                lse_ref[...] = top + jnp.log(jnp.sum(sum_v * jnp.exp(top_v - top), axis=1, keepdims=True))
            if plan.phases == 1:
                _finish(index, top, top)

    if plan.phases == 1:
        return

    if mode == "greedy":  # top-n log-probabilities of a greedy call: one phase-1 step does them
        @pl.when((phase == 1) & (j == 0))
        def _():
            _finish(arg_ref[...], max_ref[...], max_ref[...])
        return

    @pl.when((phase == 1) & (j == 0))
    def _search():
        cut_ref[...], _, _, _ = _thresholds(rows_ref, opts_f_ref, opts_i_ref, greedy, max_ref[...], max_v_ref[...],
                                         vocab=vocab, filters=filters, width=width)
        best_v_ref[...] = neg_inf
        pick_v_ref[...] = jnp.zeros_like(big)
        bestz_v_ref[...] = neg_inf

    @pl.when(phase == 1)
    def _draw():
        cut = jnp.broadcast_to(cut_ref[...], (block_b, width))
        seed = jnp.broadcast_to(opts_i_ref[:, _I_SEED:_I_SEED + 1], (block_b, width))
        best, pick, best_z = best_v_ref[...], pick_v_ref[...], bestz_v_ref[...]
        for g in range(groups):
            lanes = pl.ds(g * width, width)
            cols = cols_of(j, g)
            z = _resident_z(rows_ref[j, :, lanes], inv_t)
            u = noise_ref[:, lanes] if mode == "noise" else rng.hash_uniform(seed, cols)
            score = jnp.where(z >= cut, z + rng.gumbel(u), -jnp.inf)
            better = score > best
            best = jnp.where(better, score, best)
            pick = jnp.where(better, cols.astype(jnp.float32), pick)
            best_z = jnp.where(better, z, best_z)
        best_v_ref[...], pick_v_ref[...], bestz_v_ref[...] = best, pick, best_z

        @pl.when(j == last)
        def _():
            top, index = first_max(best, pick)
            z_pick = jnp.max(jnp.where((best == top) & (pick == index), best_z, -jnp.inf), axis=1, keepdims=True)
            _finish(index, cut_ref[...], z_pick)
