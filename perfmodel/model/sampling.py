"""Sampling one token per sequence from [batch, vocab] logits.

Stages, each counted per logit element (padded to the (8, 128) vreg tile):
logit bias (reads a [batch, vocab] f32 bias; allowed / banned masks are folded
into it as -inf), penalties (reads a [batch, vocab] int32 count table), temperature, softmax,
top-k, top-p, min-p, then drawing the sample (exponential race: argmax of
p / E with E ~ Exp(1)) or, without temperature and filters, a greedy argmax.

Two algorithms for the top-k / top-p filters:

* ``"sort"``: sort each row descending (a bitonic network over the vocab
  padded to a power of two: log2(V)*(log2(V)+1)/2 compare-exchange stages,
  each moving values and indices), cumulative sum, mask, scatter back;
  each step a separate XLA op that round-trips HBM.
* ``"threshold"``: keep the row in VMEM and bisect for the cut-off (the k-th
  largest value, or the probability threshold whose tail mass is top_p):
  ``passes`` rounds of compare + masked count/sum; one HBM read of the
  logits when a block of rows fits the scoped VMEM limit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost, combine
from perfmodel.model.dtypes import DTYPES, INDEX_BYTES, parse_dtype
from perfmodel.model.shapes import chip_tiles, choice, flag_name, fval, sizes

METHODS = ("threshold", "sort")
#: Per element: presence test, repetition-penalty select and scale, frequency and presence subtractions.
PENALTY_VPU_OPS = 5
#: Bytes per element of the token-count table penalties read (int32).
PENALTY_TABLE_BYTES = 4
TEMPERATURE_VPU_OPS = 1
#: Softmax without normalising each element: max, subtract, sum (VPU) and exp (EUP).
SOFTMAX_VPU_OPS, SOFTMAX_EUP_OPS = 3, 1
#: Greedy argmax: compare, select value, select index.
ARGMAX_VPU_OPS = 3
#: One bisection pass: compare against the candidate, select, accumulate the count / mass.
BISECTION_VPU_OPS_PER_PASS = 3
#: One bitonic compare-exchange stage: compare, select value, select index.
SORT_VPU_OPS_PER_STAGE = 3
MIN_P_VPU_OPS = 2
#: Applying a filter mask: one select.
MASK_VPU_OPS = 1
#: Exponential race: uniform from hardware PRNG bits (shift, or, subtract), divide; log and reciprocal on the EUP;
#: then an argmax.
DRAW_VPU_OPS, DRAW_EUP_OPS = 3 + 1 + ARGMAX_VPU_OPS, 2
#: Extra HBM bytes per element of the sort path, as XLA runs it op by op: sort writes values + int32 indices (8),
#: cumsum reads values and writes the running sum (8), the mask reads the sum and writes the filtered values (8),
#: the scatter back reads values + indices and writes the row in vocab order (12).
SORT_PATH_HBM_BYTES_PER_ELEMENT = 8 + 8 + 8 + 12
#: Logit bias: one add per element (masks arrive folded into the bias as -inf).
BIAS_VPU_OPS = 1
BIAS_TABLE_BYTES = 4
#: Log-probabilities: an online log-sum-exp in the streaming pass (max, rescale, add; two exps on the EUP) ...
LOGSUMEXP_VPU_OPS, LOGSUMEXP_EUP_OPS = 4, 2
#: ... and one pass per top-n slot: the (value desc, index asc) successor test (4), compare, two selects.
TOP_N_VPU_OPS_PER_PASS = 7
#: Rows the threshold kernel keeps resident in VMEM at once (one sublane tile).
THRESHOLD_ROWS_PER_BLOCK = 8


def bitonic_stages(vocab: Num) -> np.ndarray:
    """Compare-exchange stages of a bitonic sort of vocab elements (padded to a power of two)."""
    lg = np.ceil(np.log2(np.maximum(np.asarray(vocab, dtype=float), 2)))
    return lg * (lg + 1) / 2


def default_passes(dtype: str) -> int:
    """Bisection passes to pin a threshold to one ulp: the dtype's bit width."""
    return DTYPES[dtype].bits


def sampling(
    *,
    batch: Num,
    vocab: Num,
    dtype: str = "fp32",
    temperature: bool = True,
    top_k: Num | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    penalties: bool = False,
    logit_bias: bool = False,
    logprobs: Num | None = None,
    draft_tokens: Num | None = None,
    method: str = "threshold",
    passes: Num | None = None,
    include_projection_hidden: Num | None = None,
    chip: object | None = None,
) -> OpCost:
    """Cost of sampling one token per row of [batch, vocab] logits (see the module docstring).

    ``passes``: bisection rounds of the threshold method (default: bits of
    ``dtype``). ``include_projection_hidden=H`` adds the [batch, H] x [H,
    vocab] bf16 projection that produces the logits (a separate part).
    ``logit_bias``: a [batch, vocab] f32 bias (and masks) is read and added;
    ``logprobs=n``: the chosen token's log-probability (a log-sum-exp in the
    streaming pass) and the top n (n passes). ``draft_tokens=K``: speculative
    decoding instead, verifying K draft tokens per row
    (:func:`rejection_sampling`; the filters do not apply).
    """
    if draft_tokens is not None:
        extra = [n for n, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p), ("logprobs", logprobs))
                 if v is not None] + [n for n, v in (("penalties", penalties), ("logit_bias", logit_bias),
                                                     ("include_projection_hidden", include_projection_hidden)) if v]
        if extra:
            raise InputError(f"{flag_name(extra[0])} does not apply with {flag_name('draft_tokens')}: the rejection "
                             "sampler takes the target and draft probabilities as they are; drop it",
                             fields=(extra[0], "draft_tokens"))
        return rejection_sampling(batch=batch, vocab=vocab, draft_tokens=draft_tokens, chip=chip)
    batch, vocab = sizes("batch", batch), sizes("vocab", vocab)
    dt = parse_dtype(dtype, "`dtype`")
    choice("method", method, METHODS)
    if top_k is not None:
        top_k = sizes("top_k", top_k)
        if np.any(top_k > vocab):
            raise InputError(f"`top_k` {np.max(top_k)} exceeds `vocab` {np.min(vocab)}; use a k <= vocab")
    for name, value, lo_open in (("top_p", top_p, True), ("min_p", min_p, False)):
        if value is not None and not (0.0 < value <= 1.0 if lo_open else 0.0 <= value < 1.0):
            rng = "(0, 1]" if lo_open else "[0, 1)"
            raise InputError(f"{flag_name(name)} must be in {rng}, got {value}")
    n_passes = sizes("passes", passes) if passes is not None else default_passes(dt)
    tiles = chip_tiles(chip)
    elems_pad = 1.0 * tiles.vreg_elements(batch, vocab)
    elems = 1.0 * batch * vocab
    item = DTYPES[dt].itemsize_bytes
    greedy = not temperature and top_k is None and top_p is None and min_p is None
    filtering = top_k is not None or top_p is not None

    vpu_per = 0.0  # ops per (padded) element
    eup_per = 0.0
    read = elems * item
    stages: list[str] = []
    if logit_bias:
        vpu_per += BIAS_VPU_OPS
        read = read + elems * BIAS_TABLE_BYTES
        stages.append("logit bias / masks")
    if penalties:
        vpu_per += PENALTY_VPU_OPS
        read = read + elems * PENALTY_TABLE_BYTES
        stages.append("penalties")
    if greedy:
        vpu_per += ARGMAX_VPU_OPS
        stages.append("greedy argmax")
    else:
        if temperature:
            vpu_per += TEMPERATURE_VPU_OPS
            stages.append("temperature")
        vpu_per += SOFTMAX_VPU_OPS
        eup_per += SOFTMAX_EUP_OPS
        stages.append("softmax")
        if filtering and method == "sort":
            scan_ops = 2 * math.log2(max(tiles.lanes, 1)) + 1
            vpu_per = vpu_per + SORT_VPU_OPS_PER_STAGE * bitonic_stages(vocab) + scan_ops + MASK_VPU_OPS
            read = read + elems * SORT_PATH_HBM_BYTES_PER_ELEMENT / 2
            stages.append("sort + cumsum + mask + scatter")
        elif filtering:
            rounds = (top_k is not None) + (top_p is not None)
            vpu_per = vpu_per + BISECTION_VPU_OPS_PER_PASS * n_passes * rounds + MASK_VPU_OPS
            lo, hi = int(np.min(n_passes)), int(np.max(n_passes))
            shown = f"{lo}" if lo == hi else f"{lo}-{hi}"
            stages.append(f"threshold bisection ({rounds} filter(s) x {shown} passes)")
        if min_p is not None:
            vpu_per += MIN_P_VPU_OPS
            stages.append("min-p")
        vpu_per += DRAW_VPU_OPS
        eup_per += DRAW_EUP_OPS
        stages.append("draw (exponential race)")
    write = 1.0 * batch * INDEX_BYTES
    if logprobs is not None:
        n_top = sizes("logprobs", logprobs, minimum=0)
        vpu_per = vpu_per + LOGSUMEXP_VPU_OPS + TOP_N_VPU_OPS_PER_PASS * n_top
        eup_per += LOGSUMEXP_EUP_OPS
        write = write + 1.0 * batch * (1 + 2 * n_top) * 4
        shown_n = f"{int(np.min(n_top))}" if np.min(n_top) == np.max(n_top) else f"{np.min(n_top)}-{np.max(n_top)}"
        stages.append(f"logprobs (chosen + top {shown_n})")
    notes = ["stages: " + ", ".join(stages)]
    if filtering and method == "sort":
        write = write + elems * SORT_PATH_HBM_BYTES_PER_ELEMENT / 2
        notes.append("sort path: each step is its own op and round-trips HBM; the bitonic network costs "
                     "log2(V)*(log2(V)+1)/2 stages")
    elif filtering and chip is not None:
        limit = chip.memory.vmem_default_scoped_limit_bytes_per_core or chip.memory.vmem_bytes_per_core
        if limit:
            # Rows that do not fit VMEM are re-read from HBM on every pass.
            rows_fit = THRESHOLD_ROWS_PER_BLOCK * vocab * item <= limit / 2
            rounds = (top_k is not None) + (top_p is not None)
            read = read + np.where(rows_fit, 0.0, elems * item * n_passes * rounds)
            if not np.all(rows_fit):
                notes.append("rows do not fit the scoped VMEM limit: every bisection pass re-reads the logits")
    vpu = vpu_per * elems_pad
    cost = OpCost(
        name="sampling",
        launches=1,
        vpu_ops=fval(vpu),
        vpu_padding_ops=fval(vpu_per * (elems_pad - elems)),
        eup_ops=fval(eup_per * elems_pad),
        hbm_read_bytes=fval(read),
        hbm_write_bytes=fval(write),
        notes=tuple(notes),
        metrics={"vpu_ops_per_logit": fval(vpu_per)},
    )
    if include_projection_hidden is None:
        return cost
    from perfmodel.model.gemm import gemm

    hidden = sizes("include_projection_hidden", include_projection_hidden)
    proj = gemm(m=batch, n=vocab, k=hidden, out_dtype=dt, chip=chip)
    proj = dataclasses.replace(proj, name="vocab projection")
    return combine("sampling+projection", [proj, cost], notes=cost.notes + proj.notes)


#: Rejection sampler, per element of each position's [batch, vocab] row: gather p(d) and q(d) (compare, two
#: selects, two adds), the residual max(p - q, 0) (subtract, max), its score (compare, select, add) and the
#: running argmax (ARGMAX_VPU_OPS), plus the noise hash (two rounds of a 5-op mixer and 4 ops to a float).
REJECTION_VPU_OPS = 5 + 2 + 3 + ARGMAX_VPU_OPS + 14
#: log of the residual and the two logs of the Gumbel noise.
REJECTION_EUP_OPS = 3


def rejection_sampling(*, batch: Num, vocab: Num, draft_tokens: Num, chip: object | None = None) -> OpCost:
    """Cost of verifying ``draft_tokens`` (K) speculative tokens per row: one pass over the f32 target
    probabilities of K + 1 positions and the draft probabilities of K (read once from HBM each), gathering
    p(d), q(d) and drawing from the residual; writes K + 1 tokens per row."""
    batch, vocab, k = sizes("batch", batch), sizes("vocab", vocab), sizes("draft_tokens", draft_tokens)
    tiles = chip_tiles(chip)
    positions = k + 1
    elems_pad = 1.0 * positions * tiles.vreg_elements(batch, vocab)
    elems = 1.0 * positions * batch * vocab
    f32 = DTYPES["fp32"].itemsize_bytes
    read = (2 * k + 1) * 1.0 * batch * vocab * f32
    return OpCost(
        name="rejection sampling",
        launches=1,
        vpu_ops=fval(REJECTION_VPU_OPS * elems_pad),
        vpu_padding_ops=fval(REJECTION_VPU_OPS * (elems_pad - elems)),
        eup_ops=fval(REJECTION_EUP_OPS * elems_pad),
        hbm_read_bytes=fval(read),
        hbm_write_bytes=fval(1.0 * batch * positions * INDEX_BYTES),
        notes=(f"reads the target probabilities of K+1 and the draft probabilities of K positions once; "
               f"{REJECTION_VPU_OPS} VPU + {REJECTION_EUP_OPS} EUP ops per element",),
        metrics={"vpu_ops_per_logit": fval(REJECTION_VPU_OPS)},
    )
