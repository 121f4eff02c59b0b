"""Flash attention (prefill) as a Pallas TPU kernel.

Grid ``(batch, kv_heads, q_blocks, kv_steps)``. One grid step holds the
``[group, block_q, head_dim]`` queries of every q head that shares a kv head
(grouped-query attention) and one ``[block_kv, head_dim]`` K and V block, so
each K/V block is fetched once per kv head and reused by the whole group, with
no copy of K/V in HBM. The last grid axis walks the K/V blocks one query
block needs, carrying the online-softmax statistics (running max ``m``,
running sum ``l``) and the unnormalised output ``acc`` in f32 VMEM scratch.

Block skipping: for each query block the kernel knows the first and last K/V
block holding a key any of its queries may see (causal diagonal, sliding
window). The kv-step axis is only as long as the widest such range, step ``j``
handles block ``first + j``, and the K/V index map clamps to ``last`` so a
step past the range re-uses the resident block (no DMA) and its body is
skipped with ``pl.when``. Blocks wholly inside the visible region run an
unmasked body; only edge blocks (diagonal, window edge, ragged tail) build
the mask, and their compute slices with no visible key are skipped too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf
from kernels.common import interpret_params, with_ref_names
from kernels.flash_attention.blocks import FlashAttentionBlockSizes, default_block_sizes
from kernels.perf import resolve_chip
from kernels.tiling import (FLOAT_DTYPES, LANES, SUBLANES_32BIT, check_dtype, div, scoped_vmem_limit_bytes,
                            tpu_chip)

#: Finite "minus infinity" for masked scores: exp() of it underflows to 0
#: without the inf - inf = NaN a true -inf would give in the max update.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
#: Initial running max: finite and above MASK_VALUE, so a masked score's probability exp(MASK_VALUE - m) is exactly
#: 0 even while a row has seen no visible key (no NaN, no select on the probabilities).
M_INIT = 0.5 * MASK_VALUE
LOG2_E = 1.0 / math.log(2.0)


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """Static facts of one call: shapes, effective tiles, masking mode."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    block_q: int
    block_kv: int
    block_kv_compute: int
    causal: bool
    #: 0 when there is no sliding window.
    window: int
    sm_scale: float
    dtype_name: str
    #: 0 when scores are not capped (else cap * tanh(score / cap)).
    soft_cap: float = 0.0
    #: Whether each q head has a sink logit (an extra softmax term with no value).
    sinks: bool = False
    #: Whether segment ids restrict attention to keys of the query's own segment (packed sequences).
    segments: bool = False

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def fold_scale(self) -> bool:
        """Whether the kernel keeps raw q.k scores and folds sm_scale into the exponent (exp2((s - m) * scale *
        log2 e): one multiply per score instead of two). Needs sm_scale > 0 (the row max commutes with the
        scale) and no soft-cap (which needs the scaled score)."""
        return self.sm_scale > 0 and not self.soft_cap

    @property
    def exp2_factor(self) -> float:
        """Factor turning a difference of kernel scores into a base-2 exponent."""
        return (self.sm_scale if self.fold_scale else 1.0) * LOG2_E

    @property
    def offset(self) -> int:
        """Position of query 0 in the key sequence (causal: queries are the last q_len positions)."""
        return self.kv_len - self.q_len if self.causal else 0

    @property
    def q_blocks(self) -> int:
        return pl.cdiv(self.q_len, self.block_q)

    @property
    def kv_blocks(self) -> int:
        return pl.cdiv(self.kv_len, self.block_kv)

    @property
    def kv_steps(self) -> int:
        """Length of the kv-step grid axis: the widest K/V block range of any query block."""
        spans = [int(last) - int(first) + 1 for first, last in
                 (kv_block_range(self, qi, np) for qi in range(self.q_blocks))]
        return max(spans)


def query_span(plan: _Plan, qi: Any, xp: Any) -> tuple[Any, Any]:
    """Positions of the first and last query of query block ``qi``."""
    q_lo = plan.offset + qi * plan.block_q
    q_hi = plan.offset + xp.minimum((qi + 1) * plan.block_q, plan.q_len) - 1
    return q_lo, q_hi


def key_span(plan: _Plan, qi: Any, xp: Any) -> tuple[Any, Any]:
    """First and last key position any query of block ``qi`` may see."""
    q_lo, q_hi = query_span(plan, qi, xp)
    lo = xp.maximum(q_lo - plan.window + 1, 0) if plan.window else 0
    hi = q_hi if plan.causal else plan.kv_len - 1
    return lo, hi


def kv_block_range(plan: _Plan, qi: Any, xp: Any) -> tuple[Any, Any]:
    """First and last K/V block query block ``qi`` needs (``xp`` is np for static use, jnp in the kernel)."""
    lo, hi = key_span(plan, qi, xp)
    return div(lo, plan.block_kv), div(hi, plan.block_kv)


def _block_needs_mask(plan: _Plan, qi: Any, kb: Any) -> Any:
    """Whether K/V block ``kb`` holds a key some query of block ``qi`` must not see (False: statically never)."""
    q_lo, q_hi = query_span(plan, qi, jnp)
    k_lo = kb * plan.block_kv
    k_hi = k_lo + plan.block_kv - 1
    if plan.segments:  # segment boundaries are data: every visited block is masked
        return True
    conds = []
    if plan.causal:
        conds.append(k_hi > q_lo)
    if plan.window:
        conds.append(k_lo <= q_hi - plan.window)
    if plan.kv_len % plan.block_kv:
        conds.append(kb == plan.kv_blocks - 1)
    if not conds:
        return False
    return functools.reduce(jnp.logical_or, conds)


def _lanes(x: Any, width: int) -> Any:
    """A lane-replicated ``[rows, LANES]`` statistic widened (or narrowed) to ``[rows, width]``: whole lane tiles
    are repeated (no cross-lane broadcast), a narrower width is a lane slice."""
    if width % LANES == 0:
        return x if width == LANES else jnp.tile(x, (1, width // LANES))
    if width < LANES:
        return x[:, :width]
    return jnp.broadcast_to(x[:, 0:1], (x.shape[0], width))


def _flash_kernel(*refs, plan: _Plan):
    # Inputs: q [group, block_q, head_dim] (the q heads of one kv head), k and v [block_kv, head_dim], then
    # optionally sinks [group, SUBLANES, LANES] f32 (each head's sink logit, replicated) and the segment ids
    # q [block_q, LANES] / kv [SUBLANES, block_kv] int32 (replicated over lanes / sublanes). Output o like q.
    # Scratch: m, l [group, block_q, LANES] f32 (running row max and softmax denominator, replicated over
    # lanes) and acc [group, block_q, head_dim] f32 (unnormalised output).
    q_ref, k_ref, v_ref = refs[:3]
    extra = list(refs[3:-4])
    sinks_ref = extra.pop(0) if plan.sinks else None
    seg_refs = (extra.pop(0), extra.pop(0)) if plan.segments else None
    o_ref, m_ref, l_ref, acc_ref = refs[-4:]
    qi, step = pl.program_id(2), pl.program_id(3)
    first, last = kv_block_range(plan, qi, jnp)
    kb = first + step
    refs = (q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, seg_refs)

    @pl.when(step == 0)
    def _init():
        if sinks_ref is None:
            m_ref[...] = jnp.full_like(m_ref, M_INIT)
            l_ref[...] = jnp.zeros_like(l_ref)
        else:  # the sink joins the softmax as a key of logit `sink` and no value: m = sink, l = exp(0)
            for g in range(plan.group):
                m_ref[g] = jnp.broadcast_to(sinks_ref[g, 0:1, :], m_ref.shape[1:])
            l_ref[...] = jnp.ones_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    in_range = kb <= last
    needs_mask = _block_needs_mask(plan, qi, kb)
    if needs_mask is False:
        pl.when(in_range)(functools.partial(_attend_block, *refs, plan=plan, qi=qi, kb=kb, masked=False))
    elif needs_mask is True:
        pl.when(in_range)(functools.partial(_attend_block, *refs, plan=plan, qi=qi, kb=kb, masked=True))
    else:
        for masked in (False, True):
            cond = jnp.logical_and(in_range, needs_mask if masked else jnp.logical_not(needs_mask))
            pl.when(cond)(functools.partial(_attend_block, *refs, plan=plan, qi=qi, kb=kb, masked=masked))

    @pl.when(step == pl.num_programs(3) - 1)
    def _finalize():
        def head(g, carry):
            l = l_ref[g]
            # A row with no visible key (segment ids) has l = 0 (or only its sink): its output is 0.
            inv = jnp.where(l == 0.0, 0.0, 1.0 / l)
            o_ref[g] = (acc_ref[g] * _lanes(inv, plan.head_dim)).astype(o_ref.dtype)
            return carry

        jax.lax.fori_loop(0, plan.group, head, 0)


def _attend_block(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, seg_refs, *, plan: _Plan, qi: Any, kb: Any,
                  masked: bool) -> None:
    """Fold K/V block ``kb`` into the running softmax, one compute slice at a time."""
    bkc = plan.block_kv_compute
    n_slices = plan.block_kv // bkc
    key_lo, key_hi = key_span(plan, qi, jnp)

    def slice_body(c, carry):
        slice_lo = kb * plan.block_kv + c * bkc
        body = functools.partial(_attend_slice, q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, seg_refs,
                                 plan=plan, qi=qi, c=c, slice_lo=slice_lo, masked=masked)
        if masked and n_slices > 1:
            # Skip slices of an edge block that hold no visible key at all (a single slice is the whole block,
            # which holds a visible key whenever it is visited: no branch).
            visible = (slice_lo <= key_hi) & (slice_lo + bkc - 1 >= key_lo) & (slice_lo < plan.kv_len)
            pl.when(visible)(body)
        else:
            body()
        return carry

    if n_slices == 1:
        slice_body(0, 0)
    else:
        jax.lax.fori_loop(0, n_slices, slice_body, 0)


def _visible(plan: _Plan, qi: Any, slice_lo: Any, shape: tuple[int, int], seg_refs: Any, c: Any) -> Any:
    """[block_q, bkc] bool: which keys of the slice starting at key ``slice_lo`` each query of block ``qi`` sees.

    Query row r sits at position q_lo + r and key column j at slice_lo + j, so every positional condition is
    one compare of ``j - r`` (or ``j``) with a scalar."""
    q_lo, _ = query_span(plan, qi, jnp)
    col = jax.lax.broadcasted_iota(jnp.int32, shape, 1)  # key position - slice_lo
    # Per-row thresholds are computed on one lane tile and widened by whole tiles, so each condition costs one
    # compare per score vreg: key j is visible to row r when j <= r + (q_lo - slice_lo) (causal), and
    # j > r + (q_lo - slice_lo) - window.
    row = jax.lax.broadcasted_iota(jnp.int32, (shape[0], LANES), 0) + (q_lo - slice_lo)
    conds = []
    if plan.causal:
        conds.append(col <= _lanes(row, shape[1]))
    if plan.window:
        conds.append(col > _lanes(row - plan.window, shape[1]))
    if plan.kv_len % plan.block_kv:
        conds.append(col < plan.kv_len - slice_lo)
    if seg_refs is not None:
        q_seg_ref, kv_seg_ref = seg_refs
        q_seg = _lanes(q_seg_ref[...], shape[1])  # [block_q, bkc]
        cols = pl.ds(pl.multiple_of(c * shape[1], shape[1]), shape[1]) if plan.block_kv > shape[1] else slice(None)
        kv_seg = kv_seg_ref[0:1, cols]  # [1, bkc]
        conds.append(q_seg == kv_seg)
    if not conds:
        return None
    return functools.reduce(jnp.logical_and, conds)


def _attend_slice(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, seg_refs, *, plan: _Plan, qi: Any, c: Any,
                  slice_lo: Any, masked: bool) -> None:
    bkc = plan.block_kv_compute
    rows = pl.ds(pl.multiple_of(c * bkc, bkc), bkc) if plan.block_kv > bkc else slice(None)
    score_shape = (q_ref.shape[1], bkc)  # [block_q, bkc]

    def head(g, carry):
        k = k_ref[rows, :]  # [bkc, head_dim]
        v = v_ref[rows, :]  # [bkc, head_dim]
        precision = jax.lax.Precision.HIGHEST if k.dtype == jnp.float32 else None
        s = jax.lax.dot_general(q_ref[g], k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32,
                                precision=precision)  # [block_q, bkc]
        if plan.sm_scale != 1.0 and not plan.fold_scale:
            s = s * plan.sm_scale
        if plan.soft_cap:
            s = plan.soft_cap * jnp.tanh(s * (1.0 / plan.soft_cap))
        if masked:
            visible = _visible(plan, qi, slice_lo, score_shape, seg_refs, c)
            if visible is not None:
                s = jnp.where(visible, s, MASK_VALUE)
            if plan.kv_len % plan.block_kv:
                # Rows past the end of K/V hold whatever the edge DMA left there (NaN in
                # interpret mode); a zero probability times NaN is still NaN, so zero them.
                v_pos = slice_lo + jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)
                v = jnp.where(v_pos < plan.kv_len, v, jnp.zeros_like(v))
        m_prev = m_ref[g]  # [block_q, LANES]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [block_q, LANES]
        alpha = jnp.exp2((m_prev - m_next) * plan.exp2_factor)  # [block_q, LANES]
        # Masked scores sit at MASK_VALUE < M_INIT <= m_next: their probability underflows to exactly 0.
        p = jnp.exp2((s - _lanes(m_next, bkc)) * plan.exp2_factor)  # [block_q, bkc]
        l_ref[g] = alpha * l_ref[g] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[g] = m_next
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32, precision=precision)  # [block_q, head_dim]
        acc_ref[g] = acc_ref[g] * _lanes(alpha, plan.head_dim) + pv
        return carry

    # The group's q heads take turns on the resident K/V slice.
    if plan.group == 1:
        head(0, 0)
    else:
        jax.lax.fori_loop(0, plan.group, head, 0)


def _check_inputs(q: Any, k: Any, v: Any, *, causal: bool, sliding_window: int | None) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name}: expected rank 4 [batch, heads, seq_len, head_dim], got shape {x.shape}")
    if v.shape != k.shape:
        raise ValueError(f"v: shape {v.shape} must equal k's shape {k.shape}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k: batch {k.shape[0]} does not match q's batch {q.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"k: head_dim {k.shape[3]} does not match q's head_dim {q.shape[3]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"k: kv_heads={k.shape[1]} does not divide q_heads={q.shape[1]}; "
            "each kv head must serve a whole group of q heads"
        )
    if min(q.shape) == 0 or min(k.shape) == 0:
        raise ValueError(f"q, k: empty shapes {q.shape}, {k.shape}; every dimension must be >= 1")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k, v: dtypes {k.dtype}, {v.dtype} must equal q's dtype {q.dtype}")
    if sliding_window is not None and (
        not isinstance(sliding_window, int) or isinstance(sliding_window, bool) or sliding_window < 1
    ):
        raise ValueError(f"sliding_window: must be a positive int or None, got {sliding_window!r}")
    if sliding_window is not None and not causal:
        raise ValueError("sliding_window: needs causal=True (a window bounds how far back a query looks)")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(
            f"q: q_len={q.shape[2]} > kv_len={k.shape[2]}; with causal=True the queries "
            "are the last q_len positions of the key sequence, so q_len must be <= kv_len"
        )


def _check_features(q: Any, k: Any, *, logit_soft_cap: float | None, sinks: Any, q_segment_ids: Any,
                    kv_segment_ids: Any) -> None:
    if logit_soft_cap is not None and (
        isinstance(logit_soft_cap, bool) or not isinstance(logit_soft_cap, (int, float))
        or not math.isfinite(logit_soft_cap) or logit_soft_cap <= 0
    ):
        raise ValueError(f"logit_soft_cap: must be a positive finite number or None, got {logit_soft_cap!r}")
    if sinks is not None:
        if tuple(sinks.shape) != (q.shape[1],):
            raise ValueError(f"sinks: expected shape ({q.shape[1]},) (one logit per q head), got {tuple(sinks.shape)}")
        if not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(f"sinks: expected a float array, got dtype {sinks.dtype}")
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids, kv_segment_ids: give both or neither")
    if q_segment_ids is not None:
        for name, ids, length in (("q_segment_ids", q_segment_ids, q.shape[2]),
                                  ("kv_segment_ids", kv_segment_ids, k.shape[2])):
            if tuple(ids.shape) != (q.shape[0], length):
                raise ValueError(f"{name}: expected shape ({q.shape[0]}, {length}) [batch, seq_len], got "
                                 f"{tuple(ids.shape)}")
            if not jnp.issubdtype(ids.dtype, jnp.integer):
                raise ValueError(f"{name}: expected an integer array, got dtype {ids.dtype}")


def make_plan(q: Any, k: Any, v: Any, *, causal: bool, sliding_window: int | None, sm_scale: float | None,
              block_sizes: FlashAttentionBlockSizes | None, chip: str, logit_soft_cap: float | None = None,
              sinks: Any = None, q_segment_ids: Any = None, kv_segment_ids: Any = None) -> _Plan:
    """Validate everything static about a call and fix its tiling (ValueError naming the argument)."""
    spec = tpu_chip(chip)
    _check_inputs(q, k, v, causal=causal, sliding_window=sliding_window)
    _check_features(q, k, logit_soft_cap=logit_soft_cap, sinks=sinks, q_segment_ids=q_segment_ids,
                    kv_segment_ids=kv_segment_ids)
    check_dtype("q", q.dtype, FLOAT_DTYPES, spec)
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, kv_len = k.shape[1], k.shape[2]
    shape = dict(q_dtype=q.dtype, kv_dtype=k.dtype, head_dim=head_dim, group=q_heads // kv_heads, q_len=q_len,
                 kv_len=kv_len)
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, **shape, vmem_limit=scoped_vmem_limit_bytes(spec))
    elif not isinstance(block_sizes, FlashAttentionBlockSizes):
        raise ValueError(f"block_sizes: expected FlashAttentionBlockSizes, got {type(block_sizes).__name__}")
    block_sizes.validate(**shape, spec=spec)
    bq, bk, bkc = block_sizes.effective(q_len=q_len, kv_len=kv_len)
    return _Plan(
        batch=batch, q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim,
        block_q=bq, block_kv=bk, block_kv_compute=bkc, causal=bool(causal), window=sliding_window or 0,
        sm_scale=float(1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale),
        dtype_name=np.dtype(q.dtype).name, soft_cap=float(logit_soft_cap or 0.0), sinks=sinks is not None,
        segments=q_segment_ids is not None,
    )


def cost_estimate(plan: _Plan) -> pl.CostEstimate:
    """The pl.CostEstimate of this call, from perfmodel's attention op model (chip=None: algorithmic work)."""
    return perf.flash_attention_cost(
        batch=plan.batch, q_heads=plan.q_heads, kv_heads=plan.kv_heads, q_len=plan.q_len,
        kv_len=plan.kv_len, head_dim=plan.head_dim, dtype=plan.dtype_name, causal=plan.causal,
        sliding_window=plan.window or None, block_q=plan.block_q, block_kv=plan.block_kv,
        soft_cap=bool(plan.soft_cap), sinks=plan.sinks, segment_ids=plan.segments, chip=None,
    )


@functools.partial(jax.jit, static_argnames=("causal", "sliding_window", "sm_scale", "logit_soft_cap",
                                             "block_sizes", "chip", "interpret"))
def flash_attention(
    q: jax.Array,  # [batch, q_heads, q_len, head_dim]
    k: jax.Array,  # [batch, kv_heads, kv_len, head_dim]
    v: jax.Array,  # [batch, kv_heads, kv_len, head_dim]
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    logit_soft_cap: float | None = None,
    sinks: jax.Array | None = None,  # [q_heads]
    q_segment_ids: jax.Array | None = None,  # [batch, q_len]
    kv_segment_ids: jax.Array | None = None,  # [batch, kv_len]
    block_sizes: FlashAttentionBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
) -> jax.Array:  # [batch, q_heads, q_len, head_dim], q's dtype
    """Prefill attention: softmax(q k^T * sm_scale + mask) v over whole sequences.

    Args:
      q, k, v: queries and keys/values; ``kv_heads`` must divide ``q_heads``
        (grouped-query attention: q head ``h`` uses kv head ``h // (q_heads // kv_heads)``).
        All three share one dtype: float32 or bfloat16.
      causal: each query sees keys at or before its position. Queries are the
        last ``q_len`` positions of the key sequence (``q_len <= kv_len``).
      sliding_window: with ``causal``, a query sees only its w most recent
        keys, itself included (key position > query position - w).
      sm_scale: score scale; default ``1 / sqrt(head_dim)``.
      logit_soft_cap: c > 0 caps the scaled scores as ``c * tanh(score / c)`` (Gemma 2), before masking.
      sinks: one logit per q head that joins every row's softmax denominator with no value (attention sinks,
        as in gpt-oss): the output is scaled by ``sum_j e^s_j / (e^sink + sum_j e^s_j)``.
      q_segment_ids, kv_segment_ids: packed sequences: a query sees only keys with its segment id (on top of
        the causal / window mask). A query with no visible key at all outputs zeros.
      block_sizes: tile sizes; default: the tuned defaults of ``chip``.
      chip: TPU whose block defaults and VMEM budget apply.
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU) instead of Mosaic.
    """
    chip = resolve_chip(chip, interpret=interpret)
    plan = make_plan(q, k, v, causal=causal, sliding_window=sliding_window, sm_scale=sm_scale,
                     block_sizes=block_sizes, chip=chip, logit_soft_cap=logit_soft_cap, sinks=sinks,
                     q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    group, bq, bk = plan.group, plan.block_q, plan.block_kv

    def q_index_map(b, kvh, qi, step):  # q heads kvh*group .. kvh*group + group - 1
        return b, kvh, qi, 0

    def kv_block(qi, step):
        first, last = kv_block_range(plan, qi, jnp)
        return jnp.minimum(first + step, last)

    def kv_index_map(b, kvh, qi, step):
        return b, kvh, kv_block(qi, step), 0

    in_specs = [
        pl.BlockSpec((None, group, bq, plan.head_dim), q_index_map),
        pl.BlockSpec((None, None, bk, plan.head_dim), kv_index_map),
        pl.BlockSpec((None, None, bk, plan.head_dim), kv_index_map),
    ]
    operands, names = [q, k, v], ["q_ref", "k_ref", "v_ref"]
    if sinks is not None:
        # [kv_heads, group, SUBLANES, LANES]: each head's sink replicated over one (sublane, lane) tile.
        # In the kernel's score units: raw q.k when it folds the scale into the exponent.
        sink_scores = sinks.astype(jnp.float32) * (1.0 / plan.sm_scale if plan.fold_scale else 1.0)
        tiles = jnp.broadcast_to(sink_scores.reshape(plan.kv_heads, group, 1, 1),
                                 (plan.kv_heads, group, SUBLANES_32BIT, LANES))
        in_specs.append(pl.BlockSpec((None, group, SUBLANES_32BIT, LANES), lambda b, kvh, qi, step: (kvh, 0, 0, 0)))
        operands.append(tiles)
        names.append("sinks_ref")
    if q_segment_ids is not None:
        # q ids replicated over lanes, kv ids over sublanes: the compare needs no cross-lane broadcast.
        q_ids = jnp.broadcast_to(q_segment_ids.astype(jnp.int32)[:, :, None], (plan.batch, plan.q_len, LANES))
        kv_ids = jnp.broadcast_to(kv_segment_ids.astype(jnp.int32)[:, None, :],
                                  (plan.batch, SUBLANES_32BIT, plan.kv_len))
        in_specs += [pl.BlockSpec((None, bq, LANES), lambda b, kvh, qi, step: (b, qi, 0)),
                     pl.BlockSpec((None, SUBLANES_32BIT, bk), lambda b, kvh, qi, step: (b, 0, kv_block(qi, step)))]
        operands += [q_ids, kv_ids]
        names += ["q_segment_ids_ref", "kv_segment_ids_ref"]
    names += ["o_ref", "m_ref", "l_ref", "acc_ref"]

    name = f"flash_attention_bq{bq}_bkv{bk}_bkvc{plan.block_kv_compute}"
    with jax.named_scope(name):
        return pl.pallas_call(
            with_ref_names(functools.partial(_flash_kernel, plan=plan), names),
            out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                grid=(plan.batch, plan.kv_heads, plan.q_blocks, plan.kv_steps),
                in_specs=in_specs,
                out_specs=pl.BlockSpec((None, group, bq, plan.head_dim), q_index_map),
                scratch_shapes=[
                    pltpu.VMEM((group, bq, LANES), jnp.float32),
                    pltpu.VMEM((group, bq, LANES), jnp.float32),
                    pltpu.VMEM((group, bq, plan.head_dim), jnp.float32),
                ],
            ),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
                # Every block index is in range by construction (q and output: the grid; K/V and kv segment ids:
                # clamped to the query block's last visible K/V block), so Mosaic's per-DMA address checks
                # (a scalar chain and a halt per DMA, 24-59 bundles a step) are off.
                disable_bounds_checks=True,
            ),
            cost_estimate=cost_estimate(plan),
            interpret=interpret_params(interpret),
            name=name,
        )(*operands)
