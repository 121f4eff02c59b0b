"""Fused sampling: temperature, top-k, top-p, min-p and the draw in one Pallas TPU kernel.

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
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf
from kernels.common import interpret_params, with_ref_names
from kernels.perf import DEFAULT_CHIP
from kernels.sampling import rng
from kernels.sampling.blocks import SamplingBlockSizes, default_block_sizes
from kernels.sampling.options import adjusted_logits, check_token_counts, combined_bias, row_options
from kernels.tiling import LANES

#: Bisection steps that always suffice: each halves a range of at most 2**32 int32 keys.
MAX_BISECTION_STEPS = 32
#: Passes a threshold search may make: the bracket's probe (see :func:`_thresholds`), then the bisection.
MAX_SEARCH_PASSES = MAX_BISECTION_STEPS + 1
#: Columns of the packed per-row option arrays.
_F_INV_TEMP, _F_TOP_P, _F_MIN_P, _F_GREEDY, _F_PRESENCE, _F_FREQUENCY, _F_REPETITION = range(7)
_I_TOP_K, _I_SEED = range(2)
N_OPTS_F, N_OPTS_I = 7, 2
#: Widest lane group the passes fold a chunk into (see :func:`lane_group`).
LANE_GROUP = 256
#: Largest vocabulary: indices are reduced as exact f32 integers.
MAX_VOCAB = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Filters:
    """Which filters and inputs a call passed (static): the others are compiled out and left out of the cost
    estimate. ``logprobs`` None: no logprobs; 0: the chosen token's; n: also the n most likely tokens'."""

    top_k: bool
    top_p: bool
    min_p: bool
    penalties: bool = False
    bias: bool = False
    logprobs: int | None = None


class RowVocabGrid:
    """The row and vocabulary block counts of a sampling kernel's plan (a frozen dataclass with ``batch``,
    ``vocab``, ``block_b`` and ``block_v``): shared by :class:`SamplingPlan` and the rejection sampler's plan."""

    batch: int
    vocab: int
    block_b: int
    block_v: int

    @property
    def row_blocks(self) -> int:
        """Row blocks (a grid axis)."""
        return pl.cdiv(self.batch, self.block_b)

    @property
    def vocab_blocks(self) -> int:
        """Vocabulary blocks (the last grid axis, and the resident copy's leading dimension)."""
        return pl.cdiv(self.vocab, self.block_v)


@dataclass(frozen=True, kw_only=True)
class SamplingPlan(RowVocabGrid):
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the pallas_call (grid, BlockSpecs, scratch, compiler params, cost estimate) and the kernel body.
    Hashable: the jitted function and the body take it as a static argument."""

    batch: int
    vocab: int
    #: numpy dtype name of the logits (float32 or bfloat16).
    logits_dtype: str
    #: The draw: "greedy" (no key, seeds or noise), "key" (hashed per-row seeds) or "noise" (pre-drawn uniforms).
    mode: str
    filters: Filters
    #: Rows per grid step and vocabulary entries per grid step and pass chunk (the checked block sizes).
    block_b: int
    block_v: int

    @property
    def padded(self) -> int:
        """Padding rows of the last row block."""
        return self.row_blocks * self.block_b - self.batch

    @property
    def width(self) -> int:
        """Lanes the passes fold a chunk into (:func:`lane_group`)."""
        return lane_group(self.block_v)

    @property
    def n_top(self) -> int:
        """Top-n log-probabilities returned (0: none)."""
        return self.filters.logprobs or 0

    @property
    def resident(self) -> bool:
        """Whether phase 0 keeps the whole row block in VMEM for phase 1's passes."""
        return self.mode != "greedy" or self.n_top > 0

    @property
    def phases(self) -> int:
        """Grid phases (:func:`phases_of`)."""
        return phases_of(self.mode, self.n_top)

    @property
    def rows_dtype(self) -> str:
        """Dtype of the resident rows: f32 where penalties or a bias adjust the logits, else the logits'."""
        return "float32" if (self.filters.penalties or self.filters.bias) else self.logits_dtype


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
    chip: str = DEFAULT_CHIP,
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


def make_plan(logits, *, mode: str, filters: Filters, block_sizes: SamplingBlockSizes | None = None,
              chip: str = DEFAULT_CHIP) -> SamplingPlan:
    """The plan of a :func:`sampling` call whose arguments passed its checks (``mode`` and ``filters`` as it
    derives them): the chip's defaults fitted to the dtype and vocabulary unless ``block_sizes`` is given, then
    the blocks' checks (sublane tiling, the chip's scoped VMEM; ValueError naming the field). ``logits`` is read
    for its shape and dtype only (a jax.ShapeDtypeStruct will do)."""
    batch, vocab = logits.shape
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, logits_dtype=logits.dtype, vocab=vocab)
    block_sizes.validate(vocab=vocab, logits_dtype=logits.dtype, with_noise=mode == "noise", chip=chip,
                         greedy=mode == "greedy", penalties=filters.penalties,
                         bias=filters.bias, top_logprobs=filters.logprobs or 0)
    return SamplingPlan(batch=batch, vocab=vocab, logits_dtype=jnp.dtype(logits.dtype).name, mode=mode,
                        filters=filters, block_b=block_sizes.block_b, block_v=block_sizes.block_v)


def lane_group(block_v: int) -> int:
    """Lanes the passes fold a chunk into (per-row accumulators of this width): the widest of 256 / 128 dividing
    block_v. Wider groups give the VLIW more independent chains; narrower ones fewer live vregs."""
    return next(w for w in (LANE_GROUP, LANES) if block_v % w == 0)


def _packed_options(inv_temperature, top_p, min_p, greedy, presence, frequency, repetition, top_k, seeds, *,
                    padded: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """The per-row options as the kernel reads them: [rows, N_OPTS_F] f32 and [rows, N_OPTS_I] int32, with
    ``padded`` padding rows that are greedy with every filter off, so they never keep a search running."""
    opts_f = jnp.stack([inv_temperature, top_p, min_p, greedy.astype(jnp.float32), presence, frequency, repetition],
                       axis=1)
    opts_f = jnp.pad(opts_f, ((0, padded), (0, 0)), constant_values=1.0)
    opts_i = jnp.pad(jnp.stack([top_k, seeds], axis=1), ((0, padded), (0, 0)), constant_values=vocab)
    return opts_f, opts_i


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


def _sampling_kernel(opts_f_ref, opts_i_ref, logits_ref, *refs, plan: SamplingPlan):
    """The kernel body of ``plan``'s call. Refs (see ``_sampling`` for which are present):

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


def search_passes(logits, *, top_k=None, top_p=None, temperature=1.0, block_b: int = 16, block_v: int = 8192,
                  brackets: bool = True, capture: bool = True):
    """The passes the kernel's threshold searches make on ``logits`` [batch, vocab] (a diagnostic: the same
    ``_thresholds`` the kernel runs, in Pallas interpret mode on this host, over f32 rows with no penalties or
    bias). Returns ``(thresholds [batch] f32, passes [row blocks, 3] int32)``: per block of ``block_b`` rows, the
    passes over the resident rows made for top-k (the capture pass included) and for top-p (0 where the filter is
    off), and 1 where the block's thresholds came from the captured values alone. ``brackets=False`` hides the
    lane maxima (all -inf), so every search pass bisects; ``capture=False`` leaves the capture pass out: the
    searches as they were before each."""
    logits = jnp.asarray(logits, jnp.float32)
    batch, vocab = logits.shape
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=None,
                       random=True)
    filters = Filters(top_k=top_k is not None, top_p=top_p is not None, min_p=False)
    width = lane_group(block_v)
    row_blocks, vocab_blocks = pl.cdiv(batch, block_b), pl.cdiv(vocab, block_v)
    pad_b = row_blocks * block_b - batch
    rows = jnp.pad(logits, ((0, pad_b), (0, vocab_blocks * block_v - vocab)), constant_values=-jnp.inf)
    opts_f, opts_i = _packed_options(opts.inv_temperature, opts.top_p, opts.min_p, opts.greedy,
                                     opts.presence_penalty, opts.frequency_penalty, opts.repetition_penalty,
                                     opts.top_k, jnp.zeros_like(opts.top_k), padded=pad_b, vocab=vocab)
    z = rows * opts_f[:, _F_INV_TEMP:_F_INV_TEMP + 1]  # f32 resident rows hold z (_resident_z)
    lane_max = jnp.max(z.reshape(z.shape[0], -1, width), axis=1)  # phase 0's lane-wide maxima
    z_max = jnp.max(lane_max, axis=1, keepdims=True)
    if not brackets:
        lane_max = jnp.full_like(lane_max, -jnp.inf)
    rows = z.reshape(z.shape[0], vocab_blocks, block_v).transpose(1, 0, 2)

    def kernel(rows_ref, opts_f_ref, opts_i_ref, z_max_ref, lane_max_ref, cut_ref, passes_ref):
        # rows_ref [vocab_blocks, block_b, block_v] f32; opts [block_b, 7 / 2]; z_max [block_b, 1];
        # lane_max [block_b, width]; cut_ref [block_b, 1] f32; passes_ref [1, 3] int32 (SMEM)
        cut, k_passes, p_passes, captured_only = _thresholds(
            rows_ref, opts_f_ref, opts_i_ref, _column(opts_f_ref, _F_GREEDY) > 0.5, z_max_ref[...],
            lane_max_ref[...], vocab=vocab, filters=filters, width=width, capture=capture)
        cut_ref[...] = cut
        passes_ref[0, 0], passes_ref[0, 1], passes_ref[0, 2] = k_passes, p_passes, captured_only

    def row(width_):
        return pl.BlockSpec((block_b, width_), lambda i: (i, 0))

    cut, passes = pl.pallas_call(
        kernel, grid=(row_blocks,),
        in_specs=[pl.BlockSpec((vocab_blocks, block_b, block_v), lambda i: (0, i, 0)), row(N_OPTS_F),
                  row(N_OPTS_I), row(1), row(width)],
        out_specs=[row(1), pl.BlockSpec((1, 3), lambda i: (i, 0), memory_space=pltpu.SMEM)],
        out_shape=[jax.ShapeDtypeStruct((rows.shape[1], 1), jnp.float32),
                   jax.ShapeDtypeStruct((row_blocks, 3), jnp.int32)],
        interpret=True,
    )(rows, opts_f, opts_i, z_max, lane_max)
    return np.asarray(cut[:batch, 0]), np.asarray(passes)


def phases_of(mode: str, n_top: int) -> int:
    """Grid phases: 1 (streaming only) for a greedy call without top-n log-probabilities, else 2."""
    return 1 if mode == "greedy" and n_top == 0 else 2


def _column(ref, k: int) -> jax.Array:
    return ref[:, k:k + 1]


def _resident_z(rows: jax.Array, inv_t: jax.Array) -> jax.Array:
    """Scaled logits z of a block of the resident rows: f32 rows hold z itself (phase 0 stores ``x * inv_t``, so
    no pass multiplies again); rows in the logits' narrower dtype hold x, scaled here in f32."""
    return rows if rows.dtype == jnp.float32 else rows.astype(jnp.float32) * inv_t


def _fold_rows(rows_ref, inv_t_col, width: int, step, init):
    """One pass over the resident rows: ``step(z, cols, acc)`` on each [block_b, width] lane group of scaled logits
    ``z`` (vocab indices ``cols`` as exact f32 integers, one vector add from a scalar offset), chunk by chunk;
    lane-wide accumulators, so nothing spills."""
    vocab_blocks, block_b, block_v = rows_ref.shape
    inv_t = jnp.broadcast_to(inv_t_col, (block_b, width))
    lane_iota = lax.broadcasted_iota(jnp.int32, (block_b, width), 1).astype(jnp.float32)

    def chunk(c, acc):
        for g in range(block_v // width):
            z = _resident_z(rows_ref[c, :, pl.ds(g * width, width)], inv_t)
            acc = step(z, lane_iota + (c * block_v + g * width).astype(jnp.float32), acc)
        return acc

    return lax.fori_loop(0, vocab_blocks, chunk, init)


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


def _largest_key_reaching(values: jax.Array, weights: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the largest int32 key ``t`` with ``sum(weights where values >= _unkey(t)) >= target`` over a small
    lane-wide array (values / weights [block_b, width], target [block_b, 1]): 32 halvings of the key range, no
    pass over the rows. ``_key(-inf)`` where no value reaches the target (e.g. fewer than k values)."""
    lo = jnp.full(target.shape, _key(jnp.float32(-jnp.inf)), jnp.int32)
    hi = _key(jnp.max(values, axis=1, keepdims=True)) + 1

    def halve(_, state):
        lo, hi = state
        mid = _midpoint(lo, hi)
        above = values >= jnp.broadcast_to(_unkey(mid), values.shape)
        reached = jnp.sum(jnp.where(above, weights, 0.0), axis=1, keepdims=True) >= target
        return jnp.where(reached, mid, lo), jnp.where(reached, hi, mid)

    return lax.fori_loop(0, MAX_BISECTION_STEPS, halve, (lo, hi))[0]


#: z values per lane the capture pass keeps (see :func:`_thresholds`).
CAPTURE_SLOTS = 5


def _lane_top(rows_ref, inv_t, width: int) -> tuple[jax.Array, ...]:
    """One pass: each lane's CAPTURE_SLOTS largest z (duplicates kept), descending, as CAPTURE_SLOTS [block_b, width]
    arrays; -inf in the slots of a lane with fewer finite values."""
    _, block_b, _ = rows_ref.shape

    def step(z, cols, slots):
        out, carry = [], z
        for slot in slots:  # insert into a sorted list: each slot keeps the larger, passes the smaller down
            out.append(jnp.maximum(slot, carry))
            carry = jnp.minimum(slot, carry)
        return tuple(out)

    init = tuple(jnp.full((block_b, width), -jnp.inf, jnp.float32) for _ in range(CAPTURE_SLOTS))
    return _fold_rows(rows_ref, inv_t, width, step, init)


def _thresholds(rows_ref, opts_f_ref, opts_i_ref, greedy, z_max, lane_max, *, vocab: int, filters: Filters,
                width: int, capture: bool = True):
    """Per-row threshold max(top-k, top-p, min-p) on z, by bisection passes over the resident rows, and the passes
    each search made (int32 scalars).

    Filters the call did not pass (``filters``) are not compiled at all. Each pass folds the chunks into
    lane-wide [block_b, width] count (and mass) accumulators and reduces them across lanes once.

    Capture (with top-k, ``capture``): one pass keeps each lane's CAPTURE_SLOTS largest z. A lane's uncaptured
    elements are at most its last slot, so where a row's k-th largest captured value t* lies above every lane's
    last slot, the captured values >= t* are exactly the row's top-k set: t* is its threshold, and the top-p
    threshold is found on the captured values' masses. Where every top-k row of the block is so (and no row has
    top-p without top-k) no other pass runs; else the searches below run for the whole block.

    Brackets: phase 0's lane-wide maxima ``lane_max`` [block_b, width] are ``width`` distinct elements of each
    row, so the k-th largest of them has at least k elements at or above it, and the largest lane maximum whose
    lane maxima at or above it (inside the top-k set) carry the top-p mass has at least that mass above it. Each
    search's first pass probes that bracket instead of the midpoint of the whole float range; the probe is a pass
    like any other (the search moves on the count or mass it measures), so a bracket that misses costs one pass
    and never changes the threshold.
    """
    vocab_blocks, block_b, block_v = rows_ref.shape
    shape = (block_b, 1)
    inv_t = _column(opts_f_ref, _F_INV_TEMP)
    top_k = _column(opts_i_ref, _I_TOP_K).astype(jnp.float32)
    top_p = _column(opts_f_ref, _F_TOP_P)
    min_p = _column(opts_f_ref, _F_MIN_P)
    no_cut = jnp.full(shape, -jnp.inf, jnp.float32)
    all_count = jnp.full(shape, float(vocab_blocks * block_v), jnp.float32)  # -inf padding counts at -inf
    above_max = _key(z_max) + 1
    zero = jnp.zeros((block_b, width), jnp.float32)
    z_max_w = jnp.broadcast_to(z_max, (block_b, width))
    key_neg_inf = _key(jnp.float32(-jnp.inf))

    def count_and_mass(t, with_mass: bool):
        t_w = jnp.broadcast_to(t, (block_b, width))

        def step(z, cols, acc):
            above = z >= t_w
            if not with_mass:
                return acc + jnp.where(above, 1.0, 0.0)
            count, mass = acc
            return count + jnp.where(above, 1.0, 0.0), mass + jnp.where(above, jnp.exp(z - z_max_w), 0.0)

        acc = _fold_rows(rows_ref, inv_t, width, step, (zero, zero) if with_mass else zero)
        count, mass = acc if with_mass else (acc, zero)
        return jnp.sum(count, axis=1, keepdims=True), jnp.sum(mass, axis=1, keepdims=True)

    def mass_weights(values, cut):
        """exp(z - max) of the values at or above the per-row ``cut``, 0 elsewhere (the top-p mass they carry)."""
        above = values >= jnp.broadcast_to(cut, values.shape)
        return jnp.where(above, jnp.exp(values - jnp.broadcast_to(z_max, values.shape)), 0.0)

    def probe(it, bracket, lo, hi):
        """The candidate of pass ``it``: the bracket first where it lies inside (lo, hi), else the midpoint."""
        return jnp.where((it == 0) & (bracket > lo) & (bracket < hi), bracket, _midpoint(lo, hi))

    use_k = jnp.logical_not(greedy) & (top_k < float(vocab))

    def top_k_search():
        """Largest key lo with count(z >= lo) >= k; a row is done when its count is exactly k."""
        lo0 = jnp.full(shape, key_neg_inf, jnp.int32)
        bracket = _largest_key_reaching(lane_max, jnp.ones_like(lane_max), top_k)

        def k_pending(state):
            _, lo, hi, count_lo = state
            return use_k & (count_lo != top_k) & (lo + 1 < hi)

        def k_cond(state):
            return (state[0] < MAX_SEARCH_PASSES) & _any(k_pending(state))

        def k_body(state):
            it, lo, hi, count_lo = state
            pending = k_pending(state)
            mid = probe(it, bracket, lo, hi)
            count, _ = count_and_mass(_unkey(mid), with_mass=False)
            up = pending & (count >= top_k)
            down = pending & (count < top_k)
            return it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo)

        passes, k_lo, _, k_count = lax.while_loop(k_cond, k_body, (jnp.int32(0), lo0, above_max, all_count))
        t_k = jnp.where(use_k, _unkey(k_lo), no_cut)
        count_k = jnp.where(use_k, k_count, all_count)
        return t_k, count_k, passes

    use_p = jnp.logical_not(greedy) & (top_p < 1.0)

    def top_p_search(t_k, count_k):
        """Largest key lo with mass(z >= lo) >= top_p * mass(top-k set); a row is done when one element is
        left in [lo, hi)."""
        _, mass_k = count_and_mass(t_k, with_mass=True)
        target = top_p * mass_k
        bracket = _largest_key_reaching(lane_max, mass_weights(lane_max, t_k), target)

        def p_pending(state):
            _, lo, hi, count_lo, count_hi = state
            return use_p & (count_lo - count_hi > 1.0) & (lo + 1 < hi)

        def p_cond(state):
            return (state[0] < MAX_SEARCH_PASSES) & _any(p_pending(state))

        def p_body(state):
            it, lo, hi, count_lo, count_hi = state
            pending = p_pending(state)
            mid = probe(it, bracket, lo, hi)
            count, mass = count_and_mass(_unkey(mid), with_mass=True)
            up = pending & (mass >= target)
            down = pending & (mass < target)
            return (it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo),
                    jnp.where(down, count, count_hi))

        init = (jnp.int32(0), _key(t_k), above_max, count_k, jnp.zeros(shape, jnp.float32))
        passes, p_lo, _, _, _ = lax.while_loop(p_cond, p_body, init)
        return jnp.where(use_p, _unkey(p_lo), no_cut), passes

    def searched():
        """The pass-by-pass searches: (cut, top-k passes, top-p passes)."""
        cut, count, k_passes, p_passes = no_cut, all_count, jnp.int32(0), jnp.int32(0)
        if filters.top_k:
            cut, count, k_passes = top_k_search()
        if filters.top_p:
            def with_top_p():
                t_p, passes = top_p_search(cut, count)
                return jnp.maximum(cut, t_p), passes

            cut, p_passes = lax.cond(_any(use_p), with_top_p, lambda: (cut, jnp.int32(0)))
        return cut, k_passes, p_passes

    if filters.top_k and capture:
        # One pass keeps each lane's CAPTURE_SLOTS largest z; where every top-k row's k-th largest captured value
        # lies above every lane's last slot, the captured values hold the whole top-k set (a lane's uncaptured
        # elements are at most its last slot), so top-k and top-p are read off [block_b, slots * width] values.
        slots = _lane_top(rows_ref, inv_t, width)
        captured = jnp.concatenate(slots, axis=1)
        t_star = _unkey(_largest_key_reaching(captured, jnp.ones_like(captured), top_k))
        exact = jnp.max(slots[-1], axis=1, keepdims=True) < t_star
        ok = jnp.logical_not(use_k | use_p) | (use_k & exact)  # top-p without top-k: the set can be any size

        def from_captured():
            cut = jnp.where(use_k, t_star, no_cut)
            if filters.top_p:
                weights = mass_weights(captured, cut)
                target = top_p * jnp.sum(weights, axis=1, keepdims=True)
                t_p = _unkey(_largest_key_reaching(captured, weights, target))
                cut = jnp.maximum(cut, jnp.where(use_p, t_p, no_cut))
            return cut, jnp.int32(1), jnp.int32(0), jnp.int32(1)

        def by_passes():
            cut, k_passes, p_passes = searched()
            return cut, k_passes + 1, p_passes, jnp.int32(0)

        cut, k_passes, p_passes, captured_only = lax.cond(jnp.logical_not(_any(jnp.logical_not(ok))),
                                                          from_captured, by_passes)
    else:
        (cut, k_passes, p_passes), captured_only = searched(), jnp.int32(0)
    if filters.min_p:
        cut = jnp.maximum(cut, jnp.where(jnp.logical_not(greedy) & (min_p > 0.0), z_max + jnp.log(min_p), no_cut))
    return cut, k_passes, p_passes, captured_only
