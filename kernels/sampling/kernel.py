"""Fused sampling: temperature, top-k, top-p, min-p and the draw in one Pallas TPU kernel.

Semantics are those of :mod:`kernels.sampling.options` (row-wise options,
``temperature == 0`` greedy, top-k then top-p on the top-k renormalised
distribution then min-p, Gumbel-max draw).

No sort. Every filter is a *threshold* on the scaled logits ``z``: the kept
set is ``{z >= t}``. top-k and top-p thresholds are found by bisection on the
order-preserving int32 image of f32 (so each step halves a range of float
values exactly and the search ends after at most 32 steps); each step is one
pass over the row block that counts (top-k) or counts and sums ``exp(z - max)``
(top-p) above the candidate. A search stops for a row as soon as its kept set
is exact: the count equals k (top-k), or only one element lies between the
bounds (top-p). min-p is a closed-form threshold, ``max + log(min_p)``.

Passes over the logits, per block of ``block_b`` rows:

* phase 0, streamed from HBM in ``block_v`` blocks (1 pass): row max and argmax
  of ``z``, and a copy of the rows into VMEM (in the logits' dtype);
* phase 1, over the VMEM copy: top-k bisection (at most 32 passes, only while
  some row has ``top_k < vocab``), one pass for the top-k set's mass (only
  when a row has ``top_p < 1``), top-p bisection (at most 32 passes), then the
  draw (1 pass; with pre-drawn noise it streams the noise from HBM).

So the logits leave HBM once; the kernel makes at most 1 + 32 + 1 + 32 + 1 = 67
passes over them in all, 2 when no row filters and 1 for a greedy-only call.
Ties at a threshold are all kept (the sort-based reference keeps the first k).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import DEFAULT_CHIP, interpret_params, with_ref_names
from kernels.sampling import rng
from kernels.sampling.blocks import SamplingBlockSizes, default_block_sizes
from kernels.sampling.options import row_options

#: Bisection steps that always suffice: each halves a range of at most 2**32 int32 keys.
MAX_BISECTION_STEPS = 32
#: Columns of the packed per-row option arrays.
_F_INV_TEMP, _F_TOP_P, _F_MIN_P, _F_GREEDY = range(4)
_I_TOP_K, _I_SEED = range(2)
#: Largest vocabulary: indices are reduced as exact f32 integers.
MAX_VOCAB = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Filters:
    """Which filters a call passed (static): the others are compiled out and left out of the cost estimate."""

    top_k: bool
    top_p: bool
    min_p: bool


def sampling(
    logits: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    top_k: int | jax.Array | None = None,
    top_p: float | jax.Array | None = None,
    min_p: float | jax.Array | None = None,
    key: jax.Array | None = None,
    noise: jax.Array | None = None,
    return_threshold: bool = False,
    block_sizes: SamplingBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Sample one token per row of ``logits`` [batch, vocab] (f32 or bf16).

    Options are scalars or [batch] arrays (see :mod:`kernels.sampling.options`).
    Randomness: ``key`` (a JAX PRNG key; the kernel hashes per-row seeds with
    :mod:`kernels.sampling.rng`, no noise array in HBM) or ``noise`` (uniforms
    in (0, 1), [batch, vocab] f32); neither means greedy.

    Returns [batch] int32 token ids; with ``return_threshold`` also the [batch]
    f32 threshold ``t`` on the scaled logits (kept set: ``f32(x) * f32(1/T) >= t``).
    Raises ValueError naming the argument for bad shapes, dtypes, ranges
    (checked when concrete) or block sizes.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {logits.shape}")
    batch, vocab = logits.shape
    if logits.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    if vocab >= MAX_VOCAB:
        raise ValueError(f"logits vocab={vocab} must be below {MAX_VOCAB} (indices are reduced as f32)")
    if key is not None and noise is not None:
        raise ValueError("key and noise are alternatives; pass one of them (or neither for greedy)")
    if noise is not None and (noise.shape != logits.shape or noise.dtype != jnp.float32):
        raise ValueError(f"noise must be float32 uniforms shaped like logits {logits.shape}, "
                         f"got {noise.dtype}{list(noise.shape)}")
    mode = "greedy" if key is None and noise is None else ("noise" if noise is not None else "key")
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       random=mode != "greedy")
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, logits_dtype=logits.dtype, vocab=vocab)
    block_sizes.validate(vocab=vocab, logits_dtype=logits.dtype, with_noise=mode == "noise", chip=chip,
                         greedy=mode == "greedy", top_p=top_p is not None)
    seeds = rng.row_seeds(key, batch) if mode == "key" else jnp.zeros((batch,), jnp.int32)
    filters = Filters(top_k=top_k is not None, top_p=top_p is not None, min_p=min_p is not None)
    ids, threshold = _sampling(logits, noise, opts.inv_temperature, opts.greedy, opts.top_k, opts.top_p, opts.min_p,
                               seeds, mode=mode, filters=filters, block_sizes=block_sizes, chip=chip,
                               interpret=interpret)
    return (ids, threshold) if return_threshold else ids


@functools.partial(jax.jit, static_argnames=("mode", "filters", "block_sizes", "chip", "interpret"))
def _sampling(logits, noise, inv_temperature, greedy, top_k, top_p, min_p, seeds, *, mode: str, filters: Filters,
              block_sizes: SamplingBlockSizes, chip: str, interpret: bool):
    batch, vocab = logits.shape
    block_b, block_v = block_sizes.block_b, block_sizes.block_v
    row_blocks, vocab_blocks = pl.cdiv(batch, block_b), pl.cdiv(vocab, block_v)
    padded = row_blocks * block_b - batch
    # Padding rows are greedy with every filter off, so they never keep a search running.
    opts_f = jnp.stack([inv_temperature, top_p, min_p, greedy.astype(jnp.float32)], axis=1)
    opts_f = jnp.pad(opts_f, ((0, padded), (0, 0)), constant_values=1.0)
    opts_i = jnp.pad(jnp.stack([top_k, seeds], axis=1), ((0, padded), (0, 0)), constant_values=vocab)
    phases = 1 if mode == "greedy" else 2
    last = vocab_blocks - 1

    in_specs = [
        pl.BlockSpec((block_b, 4), lambda i, p, j: (i, 0)),
        pl.BlockSpec((block_b, 2), lambda i, p, j: (i, 0)),
        # Phase 0 streams the vocabulary; phase 1 holds the last block (no refetch).
        pl.BlockSpec((block_b, block_v), lambda i, p, j: (i, j * (1 - p) + last * p)),
    ]
    operands = [opts_f, opts_i, logits]
    if mode == "noise":
        # Phase 0 holds block 0 (fetched once, then used by phase 1's first step).
        in_specs.append(pl.BlockSpec((block_b, block_v), lambda i, p, j: (i, j * p)))
        operands.append(noise)
    out_spec = pl.BlockSpec((block_b, 1), lambda i, p, j: (i, 0))
    ref_names = (["opts_f_ref", "opts_i_ref", "logits_ref"] + ["noise_ref"] * (mode == "noise")
                 + ["ids_ref", "thr_ref", "rows_ref", "max_ref", "arg_ref", "cut_ref", "best_ref", "pick_ref"])
    kernel = with_ref_names(functools.partial(_sampling_kernel, vocab=vocab, mode=mode, filters=filters), ref_names)
    call = pl.pallas_call(
        kernel,
        grid=(row_blocks, phases, vocab_blocks),
        in_specs=in_specs,
        out_specs=[out_spec, out_spec],
        out_shape=[jax.ShapeDtypeStruct((batch, 1), jnp.int32), jax.ShapeDtypeStruct((batch, 1), jnp.float32)],
        scratch_shapes=[
            pltpu.VMEM((vocab_blocks if mode != "greedy" else 1, block_b, block_v), logits.dtype),
            pltpu.VMEM((block_b, 1), jnp.float32),
            pltpu.VMEM((block_b, 1), jnp.float32),
            pltpu.VMEM((block_b, 1), jnp.float32),
            pltpu.VMEM((block_b, 1), jnp.float32),
            pltpu.VMEM((block_b, 1), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=interpret_params(interpret),
        cost_estimate=_cost_estimate(batch, vocab, logits.dtype, mode, filters),
        name="sampling",
    )
    with jax.named_scope(f"sampling_bb{block_b}_bv{block_v}_{mode}"):
        ids, threshold = call(*operands)
    return ids[:, 0], threshold[:, 0]


def _cost_estimate(batch: int, vocab: int, dtype, mode: str, filters: Filters):
    """pl.CostEstimate from perfmodel's sampling model (threshold method, worst-case bisection passes).

    The model assumes hardware random bits; with pre-drawn noise the kernel also
    reads the [batch, vocab] f32 noise, which is added to ``bytes_accessed``.
    """
    from perfmodel.model.core import to_cost_estimate
    from perfmodel.model.sampling import sampling as sampling_model

    random = mode != "greedy"
    cost = sampling_model(batch=batch, vocab=vocab, dtype=np.dtype(dtype).name, temperature=random,
                          top_k=vocab if random and filters.top_k else None,
                          top_p=1.0 if random and filters.top_p else None,
                          min_p=0.0 if random and filters.min_p else None,
                          method="threshold", passes=MAX_BISECTION_STEPS)
    estimate = to_cost_estimate(cost)
    if mode != "noise":
        return estimate
    return pl.CostEstimate(flops=estimate.flops, transcendentals=estimate.transcendentals,
                           bytes_accessed=estimate.bytes_accessed + batch * vocab * np.dtype(np.float32).itemsize)


def _key(x: jax.Array) -> jax.Array:
    """Order-preserving int32 image of f32 (an involution: _key(_key(x)) as bits == x)."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ (lax.shift_right_arithmetic(bits, jnp.int32(31)) & jnp.int32(0x7FFFFFFF))


def _unkey(k: jax.Array) -> jax.Array:
    bits = k ^ (lax.shift_right_arithmetic(k, jnp.int32(31)) & jnp.int32(0x7FFFFFFF))
    return lax.bitcast_convert_type(bits, jnp.float32)


def _midpoint(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """floor((lo + hi) / 2) without int32 overflow."""
    one = jnp.int32(1)
    return lax.shift_right_arithmetic(lo, one) + lax.shift_right_arithmetic(hi, one) + (lo & hi & one)


def _any(flags: jax.Array) -> jax.Array:
    return jnp.max(jnp.where(flags, 1.0, 0.0)) > 0.0


def _sampling_kernel(
    opts_f_ref,  # VMEM [block_b, 4] f32: 1/temperature, top_p, min_p, greedy (1.0 / 0.0)
    opts_i_ref,  # VMEM [block_b, 2] int32: top_k (clamped to vocab), seed
    logits_ref,  # VMEM [block_b, block_v]: vocab block j (phase 0); the last block, unused (phase 1)
    *refs,
    vocab: int,
    mode: str,
    filters: Filters,
):
    if mode == "noise":
        noise_ref, *refs = refs  # VMEM [block_b, block_v] f32 uniforms: vocab block j (phase 1)
    (
        ids_ref,  # VMEM [block_b, 1] int32 output: drawn token
        thr_ref,  # VMEM [block_b, 1] f32 output: threshold on z of the kept set
        rows_ref,  # VMEM scratch [vocab_blocks, block_b, block_v] logits dtype: the row block (-inf padded)
        max_ref,  # VMEM scratch [block_b, 1] f32: running max of z
        arg_ref,  # VMEM scratch [block_b, 1] f32: its first index (exact integer)
        cut_ref,  # VMEM scratch [block_b, 1] f32: threshold of the kept set
        best_ref,  # VMEM scratch [block_b, 1] f32: best z + gumbel so far
        pick_ref,  # VMEM scratch [block_b, 1] f32: its index
    ) = refs
    phase, j = pl.program_id(1), pl.program_id(2)
    block_b, block_v = logits_ref.shape
    last = pl.num_programs(2) - 1
    inv_t = opts_f_ref[:, _F_INV_TEMP:_F_INV_TEMP + 1]
    greedy = opts_f_ref[:, _F_GREEDY:_F_GREEDY + 1] > 0.5

    def columns(block):
        return block * block_v + lax.broadcasted_iota(jnp.int32, (block_b, block_v), 1)

    def first_index_of_max(values, cols):
        top = jnp.max(values, axis=1, keepdims=True)
        index = jnp.min(jnp.where(values == top, cols.astype(jnp.float32), float(MAX_VOCAB)), axis=1, keepdims=True)
        return top, index

    def merge_max(top_ref, index_ref, top, index):
        """Keep the running (max, first index); later blocks win only when strictly greater."""
        better = top > top_ref[...]
        index_ref[...] = jnp.where(better, index, index_ref[...])
        top_ref[...] = jnp.where(better, top, top_ref[...])

    @pl.when(phase == 0)
    def _load():
        cols = columns(j)
        raw = logits_ref[...]
        raw = jnp.where(cols < vocab, raw, jnp.full_like(raw, -jnp.inf))
        if mode != "greedy":
            rows_ref[j] = raw
        top, index = first_index_of_max(raw.astype(jnp.float32) * inv_t, cols)

        @pl.when(j == 0)
        def _():
            max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
            arg_ref[...] = jnp.zeros(arg_ref.shape, jnp.float32)

        merge_max(max_ref, arg_ref, top, index)

        if mode == "greedy":
            @pl.when(j == last)
            def _():
                ids_ref[...] = arg_ref[...].astype(jnp.int32)
                thr_ref[...] = max_ref[...]

    if mode == "greedy":
        return

    @pl.when((phase == 1) & (j == 0))
    def _search():
        cut_ref[...] = _thresholds(rows_ref, opts_f_ref, opts_i_ref, inv_t, greedy, max_ref[...], vocab=vocab,
                                   filters=filters)
        best_ref[...] = jnp.full(best_ref.shape, -jnp.inf, jnp.float32)
        pick_ref[...] = jnp.zeros(pick_ref.shape, jnp.float32)

    @pl.when(phase == 1)
    def _draw():
        cols = columns(j)
        z = rows_ref[j].astype(jnp.float32) * inv_t
        if mode == "noise":
            u = noise_ref[...]
        else:
            u = rng.hash_uniform(opts_i_ref[:, _I_SEED:_I_SEED + 1], cols)
        kept = (z >= cut_ref[...]) & (cols < vocab)
        top, index = first_index_of_max(jnp.where(kept, z + rng.gumbel(u), -jnp.inf), cols)
        merge_max(best_ref, pick_ref, top, index)

        @pl.when(j == last)
        def _():
            ids_ref[...] = jnp.where(greedy, arg_ref[...], pick_ref[...]).astype(jnp.int32)
            thr_ref[...] = jnp.where(greedy, max_ref[...], cut_ref[...])


def _thresholds(rows_ref, opts_f_ref, opts_i_ref, inv_t, greedy, z_max, *, vocab: int, filters: Filters):
    """Per-row threshold max(top-k, top-p, min-p) on z, by bisection passes over the resident rows.

    Filters the call did not pass (``filters``) are not compiled at all.
    """
    vocab_blocks, block_b, block_v = rows_ref.shape
    shape = (block_b, 1)
    top_k = opts_i_ref[:, _I_TOP_K:_I_TOP_K + 1].astype(jnp.float32)
    top_p = opts_f_ref[:, _F_TOP_P:_F_TOP_P + 1]
    min_p = opts_f_ref[:, _F_MIN_P:_F_MIN_P + 1]
    no_cut = jnp.full(shape, -jnp.inf, jnp.float32)
    all_count = jnp.full(shape, float(vocab_blocks * block_v), jnp.float32)  # -inf padding counts at -inf
    above_max = _key(z_max) + 1

    def over_rows(step, init):
        """One pass: fold step(z_chunk, acc) over the vocabulary chunks of the resident rows."""
        return lax.fori_loop(0, vocab_blocks, lambda c, acc: step(rows_ref[c].astype(jnp.float32) * inv_t, acc),
                             init)

    def count_and_mass(t, with_mass: bool):
        zero = jnp.zeros((block_b, block_v), jnp.float32)

        def step(z, acc):
            count, mass = acc
            above = z >= t
            count = count + jnp.where(above, 1.0, 0.0)
            if with_mass:
                mass = mass + jnp.where(above, jnp.exp(z - z_max), 0.0)
            return count, mass

        count, mass = over_rows(step, (zero, zero))
        return jnp.sum(count, axis=1, keepdims=True), jnp.sum(mass, axis=1, keepdims=True)

    def top_k_search():
        """Largest key lo with count(z >= lo) >= k; a row is done when its count is exactly k."""
        use_k = jnp.logical_not(greedy) & (top_k < float(vocab))
        lo0 = jnp.full(shape, _key(jnp.float32(-jnp.inf)), jnp.int32)

        def k_pending(state):
            _, lo, hi, count_lo = state
            return use_k & (count_lo != top_k) & (lo + 1 < hi)

        def k_cond(state):
            return (state[0] < MAX_BISECTION_STEPS) & _any(k_pending(state))

        def k_body(state):
            it, lo, hi, count_lo = state
            pending = k_pending(state)
            mid = _midpoint(lo, hi)
            count, _ = count_and_mass(_unkey(mid), with_mass=False)
            up = pending & (count >= top_k)
            down = pending & (count < top_k)
            return it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo)

        _, k_lo, _, k_count = lax.while_loop(k_cond, k_body, (jnp.int32(0), lo0, above_max, all_count))
        t_k = jnp.where(use_k, _unkey(k_lo), no_cut)
        count_k = jnp.where(use_k, k_count, all_count)
        return t_k, count_k

    use_p = jnp.logical_not(greedy) & (top_p < 1.0)

    def top_p_search(t_k, count_k):
        """Largest key lo with mass(z >= lo) >= top_p * mass(top-k set); a row is done when one element is
        left in [lo, hi)."""
        _, mass_k = count_and_mass(t_k, with_mass=True)
        target = top_p * mass_k

        def p_pending(state):
            _, lo, hi, count_lo, count_hi = state
            return use_p & (count_lo - count_hi > 1.0) & (lo + 1 < hi)

        def p_cond(state):
            return (state[0] < MAX_BISECTION_STEPS) & _any(p_pending(state))

        def p_body(state):
            it, lo, hi, count_lo, count_hi = state
            pending = p_pending(state)
            mid = _midpoint(lo, hi)
            count, mass = count_and_mass(_unkey(mid), with_mass=True)
            up = pending & (mass >= target)
            down = pending & (mass < target)
            return (it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo),
                    jnp.where(down, count, count_hi))

        init = (jnp.int32(0), _key(t_k), above_max, count_k, jnp.zeros(shape, jnp.float32))
        _, p_lo, _, _, _ = lax.while_loop(p_cond, p_body, init)
        return jnp.where(use_p, _unkey(p_lo), no_cut)

    cut, count = no_cut, all_count
    if filters.top_k:
        cut, count = top_k_search()
    if filters.top_p:
        cut = lax.cond(_any(use_p), lambda: jnp.maximum(cut, top_p_search(cut, count)), lambda: cut)
    if filters.min_p:
        cut = jnp.maximum(cut, jnp.where(jnp.logical_not(greedy) & (min_p > 0.0), z_max + jnp.log(min_p), no_cut))
    return cut
