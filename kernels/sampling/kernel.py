"""Fused sampling: temperature, top-k, top-p, min-p and the draw in one Pallas TPU kernel.

This module holds the public entry point :func:`sampling` (argument checks, the :class:`Sampled` result), the
jitted ``_sampling`` that builds the pallas_call, and its cost estimate. The call's static plan and the packed
option layout are in :mod:`kernels.sampling.plan`, the threshold searches in :mod:`kernels.sampling.search`, the
kernel body in :mod:`kernels.sampling.body`.

Semantics are those of :mod:`kernels.sampling.options` (row-wise options,
``temperature == 0`` greedy, top-k then top-p on the top-k renormalised
distribution then min-p, Gumbel-max draw).

No sort. Every filter is a *threshold* on the scaled logits ``z``: the kept
set is ``{z >= t}``. top-k and top-p thresholds are found by bisection on the
order-preserving int32 image of f32 (so each step halves a range of float
values exactly and, after the bracket's probe, the search ends within 32 steps);
each step is one pass over the row block that counts (top-k) or counts and sums
``exp(z - max)`` (top-p) above the candidate. A search stops for a row as soon as its kept set
is exact: the count equals k (top-k), or only one element lies between the
bounds (top-p). Before any search, one *capture* pass keeps each lane's
CAPTURE_SLOTS (5) largest z: where that provably holds every top-k row's whole
top-k set (each row's k-th largest captured value lies above every lane's last
slot), both thresholds
are read off the captured values with no further pass (``_thresholds``); else
the searches run, each first probing a bracket read off phase 0's lane-wide
maxima instead of the middle of the float range. min-p is a closed-form
threshold, ``max + log(min_p)``.

Passes over the logits, per block of ``block_b`` rows:

* phase 0, streamed from HBM in ``block_v`` blocks (1 pass): row max and argmax
  of ``z``, and a copy of the rows into VMEM (z itself where the copy is f32, else the
  logits in their dtype);
* phase 1, over the VMEM copy: the capture pass (with top-k), then, unless the
  captured values decide, top-k bisection (at most 33 passes, only while
  some row has ``top_k < vocab``), one pass for the top-k set's mass (only
  when a row has ``top_p < 1``), top-p bisection (at most 33 passes), then the
  draw (1 pass; with pre-drawn noise it streams the noise from HBM).

So the logits leave HBM once; the kernel makes at most 1 + 1 + 33 + 1 + 33 + 1 = 70
passes over them in all, 2 when no row filters and 1 for a greedy-only call.
Ties at a threshold are all kept (the sort-based reference keeps the first k).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf
from kernels.common import interpret_params, with_ref_names
from kernels.perf import resolve_chip
from kernels.sampling import rng
from kernels.sampling.blocks import SamplingBlockSizes
from kernels.sampling.body import _sampling_kernel
from kernels.sampling.options import check_token_counts, combined_bias, row_options
from kernels.sampling.plan import (
    MAX_VOCAB,
    N_OPTS_F,
    N_OPTS_I,
    Filters,
    SamplingPlan,
    _packed_options,
    make_plan,
)
from kernels.sampling.search import MAX_SEARCH_PASSES


@jax.tree_util.register_dataclass
@dataclass(frozen=True, kw_only=True)
class Sampled:
    """What a call with ``logprobs`` returns ([batch] arrays; top-n ones [batch, n]).

    Log-probabilities are of the adjusted, temperature-scaled distribution before the filters
    (``log_softmax(z)``, temperature 1 for greedy rows). A top-n slot past the row's finite logits has id -1
    and log-probability -inf.
    """

    ids: jax.Array  # int32
    threshold: jax.Array  # f32 cut-off on z of the kept set
    logprob: jax.Array  # f32: the chosen token's
    top_ids: jax.Array  # int32 [batch, n], most likely first (first index on ties)
    top_logprobs: jax.Array  # f32 [batch, n]


#: Most top-n log-probabilities one call returns (each is one pass over the resident rows).
MAX_TOP_LOGPROBS = 64


def sampling(
    logits: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    top_k: int | jax.Array | None = None,
    top_p: float | jax.Array | None = None,
    min_p: float | jax.Array | None = None,
    key: jax.Array | None = None,
    seeds: jax.Array | None = None,
    noise: jax.Array | None = None,
    token_counts: jax.Array | None = None,
    presence_penalty: float | jax.Array | None = None,
    frequency_penalty: float | jax.Array | None = None,
    repetition_penalty: float | jax.Array | None = None,
    logit_bias: jax.Array | None = None,
    allowed_mask: jax.Array | None = None,
    banned_mask: jax.Array | None = None,
    logprobs: int | None = None,
    return_threshold: bool = False,
    block_sizes: SamplingBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array] | Sampled:
    """Sample one token per row of ``logits`` [batch, vocab] (f32 or bf16).

    Options are scalars or [batch] arrays (see :mod:`kernels.sampling.options`).
    Randomness: ``key`` (a JAX PRNG key: per-row seeds drawn from it), ``seeds``
    ([batch] int32, one per request: a row's draw depends only on its logits and
    its seed) - the kernel hashes the seed with the vocab index
    (:mod:`kernels.sampling.rng`, no noise array in HBM) - or ``noise`` (uniforms
    in (0, 1), [batch, vocab] f32); none of them means greedy. Rows with
    ``temperature == 0`` are greedy in any case.

    Adjustments (before temperature): ``token_counts`` ([batch, vocab] int, the
    tokens seen so far) with the ``presence_penalty`` / ``frequency_penalty`` /
    ``repetition_penalty`` options; ``logit_bias`` ([batch, vocab] float, added)
    and ``allowed_mask`` / ``banned_mask`` ([batch, vocab] bool).

    Returns [batch] int32 token ids; with ``return_threshold`` also the [batch]
    f32 threshold ``t`` on the scaled logits (kept set: ``z >= t``); with
    ``logprobs=n`` a :class:`Sampled` (ids, threshold, the chosen token's
    log-probability and the top-n ids and log-probabilities).
    Raises ValueError naming the argument for bad shapes, dtypes, ranges
    (checked when concrete) or block sizes.
    """
    chip = resolve_chip(chip, interpret=interpret)
    if logits.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {logits.shape}")
    batch, vocab = logits.shape
    if logits.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    if vocab >= MAX_VOCAB:
        raise ValueError(f"logits vocab={vocab} must be below {MAX_VOCAB} (indices are reduced as f32)")
    given = [name for name, v in (("key", key), ("seeds", seeds), ("noise", noise)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} are alternatives; pass one of key, seeds, noise (or none for greedy)")
    if noise is not None and (noise.shape != logits.shape or noise.dtype != jnp.float32):
        raise ValueError(f"noise must be float32 uniforms shaped like logits {logits.shape}, "
                         f"got {noise.dtype}{list(noise.shape)}")
    if seeds is not None:
        seeds = jnp.asarray(seeds)
        if seeds.shape != (batch,) or not jnp.issubdtype(seeds.dtype, jnp.integer):
            raise ValueError(f"seeds must be a [{batch}] integer array (one per row), got {seeds.dtype}"
                             f"{list(seeds.shape)}")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool)
                                 or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise ValueError(f"logprobs={logprobs!r} must be an int in [0, {MAX_TOP_LOGPROBS}] (top-n; 0: the chosen "
                         "token's only)")
    penalties = [n for n, v in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty),
                                ("repetition_penalty", repetition_penalty)) if v is not None]
    if penalties and token_counts is None:
        raise ValueError(f"{penalties[0]} needs token_counts ([batch, vocab] occurrences of each token so far)")
    if token_counts is not None:
        check_token_counts(token_counts, batch=batch, vocab=vocab)
    bias = combined_bias(batch=batch, vocab=vocab, logit_bias=logit_bias, allowed_mask=allowed_mask,
                         banned_mask=banned_mask)
    mode = "greedy" if not given else ("noise" if noise is not None else "key")
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       random=mode != "greedy", presence_penalty=presence_penalty,
                       frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty)
    filters = Filters(top_k=top_k is not None, top_p=top_p is not None, min_p=min_p is not None,
                      penalties=token_counts is not None, bias=bias is not None, logprobs=logprobs)
    plan = make_plan(logits, mode=mode, filters=filters, block_sizes=block_sizes, chip=chip)
    if mode == "key":
        seeds = rng.row_seeds(key, batch) if seeds is None else seeds.astype(jnp.int32)
    else:
        seeds = jnp.zeros((batch,), jnp.int32)
    counts = None if token_counts is None else token_counts.astype(jnp.int32)
    out = _sampling(logits, noise, counts, bias, opts.inv_temperature, opts.greedy, opts.top_k, opts.top_p,
                    opts.min_p, opts.presence_penalty, opts.frequency_penalty, opts.repetition_penalty, seeds,
                    plan=plan, interpret=interpret)
    ids, threshold = out[0], out[1]
    if logprobs is not None:
        n = logprobs
        top_ids = out[3] if n else jnp.zeros((batch, 0), jnp.int32)
        top_lp = out[4] if n else jnp.zeros((batch, 0), jnp.float32)
        return Sampled(ids=ids, threshold=threshold, logprob=out[2], top_ids=top_ids, top_logprobs=top_lp)
    return (ids, threshold) if return_threshold else ids


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _sampling(logits, noise, counts, bias, inv_temperature, greedy, top_k, top_p, min_p, presence, frequency,
              repetition, seeds, *, plan: SamplingPlan, interpret: bool):
    batch, vocab, mode, filters = plan.batch, plan.vocab, plan.mode, plan.filters
    block_b, block_v = plan.block_b, plan.block_v
    row_blocks, vocab_blocks = plan.row_blocks, plan.vocab_blocks
    width = plan.width
    n_top = plan.n_top
    opts_f, opts_i = _packed_options(inv_temperature, top_p, min_p, greedy, presence, frequency, repetition, top_k,
                                     seeds, padded=plan.padded, vocab=vocab)
    last = vocab_blocks - 1

    # Phase 0 streams the vocabulary; phase 1 holds the last block (no refetch).
    streamed = pl.BlockSpec((block_b, block_v), lambda i, p, j: (i, j * (1 - p) + last * p))
    in_specs = [pl.BlockSpec((block_b, N_OPTS_F), lambda i, p, j: (i, 0)),
                pl.BlockSpec((block_b, N_OPTS_I), lambda i, p, j: (i, 0)), streamed]
    operands = [opts_f, opts_i, logits]
    names = ["opts_f_ref", "opts_i_ref", "logits_ref"]
    for name, arr in (("counts_ref", counts), ("bias_ref", bias)):
        if arr is not None:
            in_specs.append(streamed)
            operands.append(arr)
            names.append(name)
    if mode == "noise":
        # Phase 0 holds block 0 (fetched once, then used by phase 1's first step).
        in_specs.append(pl.BlockSpec((block_b, block_v), lambda i, p, j: (i, j * p)))
        operands.append(noise)
        names.append("noise_ref")
    column = pl.BlockSpec((block_b, 1), lambda i, p, j: (i, 0))
    out_specs = [column, column]
    out_shape = [jax.ShapeDtypeStruct((batch, 1), jnp.int32), jax.ShapeDtypeStruct((batch, 1), jnp.float32)]
    names += ["ids_ref", "thr_ref"]
    if filters.logprobs is not None:
        out_specs.append(column)
        out_shape.append(jax.ShapeDtypeStruct((batch, 1), jnp.float32))
        names.append("lp_ref")
        if n_top:
            top = pl.BlockSpec((block_b, n_top), lambda i, p, j: (i, 0))
            out_specs += [top, top]
            out_shape += [jax.ShapeDtypeStruct((batch, n_top), jnp.int32),
                          jax.ShapeDtypeStruct((batch, n_top), jnp.float32)]
            names += ["top_ids_ref", "top_lp_ref"]
    lanes = pltpu.VMEM((block_b, width), jnp.float32)
    row = pltpu.VMEM((block_b, 1), jnp.float32)
    scratch = [pltpu.VMEM((vocab_blocks if plan.resident else 1, block_b, block_v), jnp.dtype(plan.rows_dtype))]
    names.append("rows_ref")
    scratch += [lanes] * 3 + [row] * 4
    names += ["max_v_ref", "arg_v_ref", "sum_v_ref", "max_ref", "arg_ref", "lse_ref", "cut_ref"]
    if mode != "greedy":
        scratch += [lanes] * 3
        names += ["best_v_ref", "pick_v_ref", "bestz_v_ref"]
    kernel = with_ref_names(functools.partial(_sampling_kernel, plan=plan), names)
    call = pl.pallas_call(
        kernel,
        grid=(row_blocks, plan.phases, vocab_blocks),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary")),
        interpret=interpret_params(interpret),
        cost_estimate=_cost_estimate(plan),
        name="sampling",
    )
    with jax.named_scope(f"sampling_bb{block_b}_bv{block_v}_{mode}"):
        outs = call(*operands)
    return tuple(o[:, 0] if o.shape[1] == 1 and k < 3 else o for k, o in enumerate(outs))


def _cost_estimate(plan: SamplingPlan):
    """pl.CostEstimate from perfmodel's sampling model (threshold method, worst-case bisection passes).

    The model assumes hardware random bits; with pre-drawn noise the kernel also
    reads the [batch, vocab] f32 noise, which is added to ``bytes_accessed``.
    """
    batch, vocab, mode, filters = plan.batch, plan.vocab, plan.mode, plan.filters
    random = mode != "greedy"
    estimate = perf.sampling_cost(batch=batch, vocab=vocab, dtype=plan.logits_dtype, temperature=random,
                                  top_k=vocab if random and filters.top_k else None,
                                  top_p=1.0 if random and filters.top_p else None,
                                  min_p=0.0 if random and filters.min_p else None, penalties=filters.penalties,
                                  logit_bias=filters.bias, logprobs=filters.logprobs,
                                  method="threshold", passes=MAX_SEARCH_PASSES)
    if mode != "noise":
        return estimate
    return pl.CostEstimate(flops=estimate.flops, transcendentals=estimate.transcendentals,
                           bytes_accessed=estimate.bytes_accessed + batch * vocab * np.dtype(np.float32).itemsize)
