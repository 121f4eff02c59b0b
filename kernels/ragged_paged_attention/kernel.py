"""Ragged paged attention: one mixed prefill + decode batch over a combined K/V paged cache (Pallas TPU).

Layout (JAX's / vLLM's combined cache, K and V of every KV head of a token in one page row):

* ``q``          ``[total_tokens, q_heads, head_dim]``: the query tokens of every
  sequence, concatenated; sequence ``s`` owns rows ``cu_q_lens[s]:cu_q_lens[s+1]``.
* ``kv_pages``   ``[num_pages, page_size, 2 * kv_heads, head_dim]``: row ``2h`` of a
  token is K of KV head ``h``, row ``2h + 1`` its V (interleaved). A page is one
  contiguous block of HBM, so one DMA moves it for every head.
* ``page_table`` ``[max_seqs, pages_per_seq]`` int32: page ids of each sequence.
* ``kv_lens``    ``[max_seqs]`` int32: context length of each sequence, the new
  tokens included (their K/V must already be in the cache).
* ``cu_q_lens``  ``[max_seqs + 1]`` int32, ``cu_q_lens[0] == 0``, non-decreasing.
* ``num_seqs``   ``[1]`` int32: how many leading entries of the three above are live.

Query ``i`` of a sequence with ``q_len`` new tokens and ``kv_len`` context is at
position ``p = kv_len - q_len + i`` and sees KV positions ``max(0, p - window + 1) .. p``
(``window`` infinite unless ``sliding_window`` is given). Query head ``j`` reads KV
head ``j // (q_heads // kv_heads)`` (GQA). Scores are ``sm_scale * q.k``, then
``soft_cap * tanh(score / soft_cap)`` with a soft cap; a sink logit per q head
(``sinks``) joins each row's softmax denominator without a value. Rows from
``cu_q_lens[num_seqs]`` to ``total_tokens`` (padding) come out as zeros.

Grid design
-----------
The grid is ``(cdiv(total_tokens, block_q),)``, "parallel". Step ``b`` owns the
aligned q block ``b * block_q : (b + 1) * block_q`` of the flat token axis for
**all** heads: q and the output are viewed as ``[total_tokens, q_heads * head_dim]``
(a free reshape) and pipelined by Pallas. Inside a step a dynamic loop visits the
sequences that own a row of the block (range ``seq_lo[b] .. seq_hi[b]``, computed in
the wrapper) and, per sequence, the KV blocks its rows see (from the sliding
window's first block to the last causal one). A KV block is ``block_kv // page_size``
pages, each copied HBM -> VMEM by one DMA holding K and V of every head, all on one
semaphore; a full block is awaited by one wait sized to the block (a partial last
block page by page). Blocks are double-buffered: the step's next (sequence, KV
block) is fetched while the current one is scored. In VMEM a bf16 / f32 block keeps
each token's 32-bit rows padded to a stride whose strided loads hit distinct VMEM
banks (9 words for 8 bf16 KV heads; blocks.kv_row_layout), the page DMAs writing
around the padding. Per KV head (unrolled), K and V are strided loads of the block
(bf16 K and V of a head share one 32-bit word: truncated to 16 bits, V shifted down
first), the ``G = q_heads // kv_heads`` heads of the group are
stacked into one ``(G * block_q, head_dim)`` LHS, and an online softmax runs in f32
VMEM scratch. Page ids are clamped into the cache by the wrapper, so the kernel
runs with Mosaic's bounds checks off.
"""

from __future__ import annotations

import functools
import math
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
from kernels.tiling import check_dtype, tpu_chip
from kernels.ragged_paged_attention.blocks import (
    LANES,
    QUANT_KV_DTYPES,
    STATS_LANES,
    KvRowLayout,
    RaggedPagedAttentionBlockSizes,
    default_block_sizes,
    kv_row_layout,
    sublane_multiple,
)

#: Bytes of one scalar-prefetched int32 (lengths, page ids, offsets).
INDEX_BYTES = 4
#: Finite "minus infinity" for masked scores (keeps exp() and max() NaN-free).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
#: KV tokens scored at once inside a KV block. Whole blocks: 128-token chunks, which would keep a chunk's
#: K, V and scores in registers, measured slower on v5e (4x the row reductions, more spills).
COMPUTE_TOKENS = 1 << 20
#: KV cache dtypes the kernel reads (K/V rows split by strided loads; bf16 pairs by 32-bit shifts).
KV_DTYPES = ("float32", "bfloat16")
# QUANT_KV_DTYPES (blocks.py): int8 / float8_e4m3fn caches with ``kv_scales``; four 8-bit rows share a 32-bit word,
# split by shifts. fp8 only on chips whose spec lists an fp8 matmul rate (kernels.tiling.check_dtype, the rule the
# matmul kernel follows).
#: Query dtypes a quantized cache takes (its codes are widened to q's dtype for the MXU, or fed as they are where
#: the MXU takes them: :func:`native_kv_operand`).
QUANT_Q_DTYPES = ("bfloat16", "float32")
#: Head dims under one vreg's 128 lanes the kernel takes: two heads share a 128-lane window of q and the output
#: (loaded whole and split, stored as one window); K/V pages keep their 64-lane rows (Mosaic pads them in VMEM).
HALF_LANE_HEAD_DIMS = (64,)


@dataclass(frozen=True, kw_only=True)
class RaggedPagedAttentionPlan:
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the pallas_call (grid, BlockSpecs, scratch, compiler params, cost estimate) and drive the kernel body.
    Hashable: the jitted function and the body take it as a static argument."""

    total_tokens: int
    q_heads: int
    head_dim: int
    kv_heads: int
    num_pages: int
    page_size: int
    max_seqs: int
    pages_per_seq: int
    #: numpy dtype names of q (and the output) and of kv_pages.
    q_dtype: str
    kv_dtype: str
    sm_scale: float
    sliding_window: int | None
    soft_cap: float | None
    #: The validated blocks (the chip's defaults fitted to the dtype and page size unless given).
    blocks: RaggedPagedAttentionBlockSizes
    #: Layout of kv_scales (:func:`kv_scale_layout`): 'none' for a bf16 / f32 cache, else 'per-token' / 'per-page'.
    kv_scale: str
    #: The MXU takes the cache's 8-bit codes as they are (:func:`native_kv_operand`).
    native_codes: bool
    #: bf16 K/V split through 32-bit rows (False in interpret mode, which cannot bitcast a ref).
    packed_pairs: bool

    @property
    def group(self) -> int:
        """q heads per KV head (GQA)."""
        return self.q_heads // self.kv_heads

    @property
    def quantized(self) -> bool:
        """An int8 / fp8 cache read with kv_scales."""
        return self.kv_scale != "none"

    @property
    def pages_per_block(self) -> int:
        """Pages of one KV block."""
        return self.blocks.pages_per_block(self.page_size)

    @property
    def layout(self) -> KvRowLayout | None:
        """VMEM row layout of a bf16 / f32 cache's KV block; None for a quantized cache (unpadded rows)."""
        return None if self.quantized else kv_row_layout(np.dtype(self.kv_dtype), self.kv_heads)


def ragged_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_table: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array | int,
    *,
    sm_scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: jax.Array | None = None,
    kv_scales: jax.Array | None = None,
    block_sizes: RaggedPagedAttentionBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
) -> jax.Array:
    """Causal GQA attention of a ragged batch of sequences over a combined K/V paged cache.

    Args:
      q: ``[total_tokens, q_heads, head_dim]`` queries of all sequences, concatenated.
      kv_pages: ``[num_pages, page_size, 2 * kv_heads, head_dim]``, K of head h at row 2h, V at 2h + 1.
      kv_lens: ``[max_seqs]`` int32 context lengths (new tokens included).
      page_table: ``[max_seqs, pages_per_seq]`` int32 page ids.
      cu_q_lens: ``[max_seqs + 1]`` int32 cumulative query lengths.
      num_seqs: ``[1]`` int32 array (or an int): live sequences.
      sm_scale: score scale; ``1 / sqrt(head_dim)`` when None.
      sliding_window: a query sees its ``sliding_window`` most recent positions (itself included); None: all.
      soft_cap: logit soft cap ``c``: scores become ``c * tanh(score / c)``; None: off.
      sinks: ``[q_heads]`` float sink logits (one extra softmax term per head, no value); None: off.
      kv_scales: f32 scales of an int8 / float8_e4m3fn ``kv_pages`` (K or V = code * scale), interleaved like the
        pages (column ``2h`` scales K of KV head h, ``2h + 1`` its V): ``[num_pages, page_size, 2 * kv_heads]``
        per token, or ``[num_pages, 2 * kv_heads]`` per page. Required for a quantized cache, refused otherwise.
      block_sizes: tile sizes; the chip's defaults when None.
      chip: TPU whose defaults and scoped-VMEM budget apply.
      interpret: run in Pallas TPU interpret mode (CPU).

    Returns:
      ``[total_tokens, q_heads, head_dim]`` in q's dtype; padding rows are zero.

    Shapes, dtypes and block sizes are checked always; page ids, lengths and
    ``cu_q_lens`` are checked when they are concrete (not under an outer jit).
    Under a jit, page ids are clamped into the cache. Raises ValueError naming the argument at fault.
    """
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(-1)
    plan = make_plan(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sm_scale=sm_scale,
                     sliding_window=sliding_window, soft_cap=soft_cap, sinks=sinks, kv_scales=kv_scales,
                     block_sizes=block_sizes, chip=chip, interpret=interpret)
    return _ragged_paged_attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks, kv_scales,
                                   plan=plan, interpret=interpret)


def make_plan(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, *, sm_scale: float | None = None,
              sliding_window: int | None = None, soft_cap: float | None = None, sinks=None, kv_scales=None,
              block_sizes: RaggedPagedAttentionBlockSizes | None = None, chip: str = DEFAULT_CHIP,
              interpret: bool = False) -> RaggedPagedAttentionPlan:
    """Validate a :func:`ragged_paged_attention` call (ValueError naming the argument) and fix its plan: the blocks
    (the chip's defaults unless given), the scale, and how the kernel reads the cache. Shapes, dtypes and blocks are
    checked always; page ids, lengths and ``cu_q_lens`` when they are concrete."""
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(-1)
    _check_shapes(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks)
    _check_kv_scales(kv_pages, kv_scales, chip)
    if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
        raise ValueError(f"sliding_window={sliding_window!r} must be a positive int (tokens) or None")
    if soft_cap is not None and not float(soft_cap) > 0:
        raise ValueError(f"soft_cap={soft_cap!r} must be a positive number or None")
    page_size = kv_pages.shape[1]
    kv_heads = kv_pages.shape[2] // 2
    group = q.shape[1] // kv_heads
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, q_dtype=q.dtype, page_size=page_size)
    block_sizes.validate(q_dtype=q.dtype, kv_dtype=kv_pages.dtype, page_size=page_size, q_heads_per_kv_head=group,
                         kv_heads=kv_heads, head_dim=q.shape[2], chip=chip)
    _check_smem(page_table, q.shape[0], block_sizes.block_q, chip)
    _check_values(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs)
    scale = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    num_pages = kv_pages.shape[0]
    return RaggedPagedAttentionPlan(
        total_tokens=q.shape[0], q_heads=q.shape[1], head_dim=q.shape[2], kv_heads=kv_heads, num_pages=num_pages,
        page_size=page_size, max_seqs=page_table.shape[0], pages_per_seq=page_table.shape[1],
        q_dtype=np.dtype(q.dtype).name, kv_dtype=np.dtype(kv_pages.dtype).name, sm_scale=scale,
        sliding_window=sliding_window, soft_cap=None if soft_cap is None else float(soft_cap), blocks=block_sizes,
        kv_scale=kv_scale_layout(kv_scales),
        native_codes=kv_scales is not None and native_kv_operand(q.dtype, kv_pages.dtype, chip),
        packed_pairs=not (interpret or _interpret_mode_forced()))


def _interpret_mode_forced() -> bool:
    """Whether ``pltpu.force_tpu_interpret_mode`` is active (perfmodel's traffic recorder): the interpreter
    cannot bitcast a ref in jax 0.10.2, so the kernel then splits bf16 K/V with plain strided loads."""
    try:
        from jax._src import config as jax_config

        return jax_config.pallas_tpu_interpret_mode_context_manager.value is not None
    except AttributeError:  # a jax without the switch cannot force it
        return False


def check_kv_pages(kv_pages, *, q_heads: int, head_dim: int) -> tuple[int, int]:
    """Validate a combined K/V cache against the queries; returns (kv_heads, page_size). ValueError naming it."""
    if kv_pages.ndim != 4:
        raise ValueError(f"kv_pages: expected rank 4 [num_pages, page_size, 2 * kv_heads, head_dim], "
                         f"got shape {kv_pages.shape}")
    _, page_size, combined, kv_head_dim = kv_pages.shape
    if combined % 2:
        raise ValueError(f"kv_pages: dimension 2 ({combined}) must be 2 * kv_heads (K and V rows interleaved)")
    kv_heads = combined // 2
    if q_heads % kv_heads:
        raise ValueError(f"kv_pages: kv_heads={kv_heads} must divide q's q_heads={q_heads} (GQA)")
    if kv_head_dim != head_dim:
        raise ValueError(f"kv_pages: head_dim {kv_head_dim} does not match q's head_dim {head_dim}")
    if np.dtype(kv_pages.dtype).name not in KV_DTYPES + QUANT_KV_DTYPES:
        raise ValueError(f"kv_pages: dtype {np.dtype(kv_pages.dtype).name} is not supported; use one of "
                         f"{KV_DTYPES + QUANT_KV_DTYPES}")
    return kv_heads, page_size


def _check_shapes(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks) -> None:
    if q.ndim != 3:
        raise ValueError(f"q must be [total_tokens, q_heads, head_dim], got shape {q.shape}")
    _, q_heads, head_dim = q.shape
    check_kv_pages(kv_pages, q_heads=q_heads, head_dim=head_dim)
    if is_quantized(kv_pages.dtype):
        if np.dtype(q.dtype).name not in QUANT_Q_DTYPES:
            raise ValueError(f"q: dtype {np.dtype(q.dtype).name} cannot read {np.dtype(kv_pages.dtype).name} "
                             f"kv_pages; use one of {QUANT_Q_DTYPES}")
    elif q.dtype != kv_pages.dtype:
        raise ValueError(f"kv_pages dtype {np.dtype(kv_pages.dtype).name} must equal q's "
                         f"{np.dtype(q.dtype).name}")
    if head_dim not in HALF_LANE_HEAD_DIMS and head_dim % LANES:
        raise ValueError(f"q head_dim={head_dim} must be 64 or a multiple of {LANES} (lane tiling of the head "
                         f"slices); pad the heads to {-(-head_dim // LANES) * LANES}")
    _, page_size, combined, _ = kv_pages.shape
    sub = sublane_multiple(kv_pages.dtype)
    if (page_size * combined) % sub:
        raise ValueError(f"kv_pages: page_size * 2 * kv_heads = {page_size * combined} rows must be a multiple of "
                         f"{sub} for {np.dtype(kv_pages.dtype).name} pages (a page is whole sublane tiles); "
                         f"use page_size a multiple of {sub // math.gcd(sub, combined)}")
    if page_table.ndim != 2:
        raise ValueError(f"page_table must be [max_seqs, pages_per_seq], got shape {page_table.shape}")
    max_seqs = page_table.shape[0]
    if kv_lens.shape != (max_seqs,):
        raise ValueError(f"kv_lens shape {kv_lens.shape} must be ({max_seqs},) to match page_table")
    if cu_q_lens.shape != (max_seqs + 1,):
        raise ValueError(f"cu_q_lens shape {cu_q_lens.shape} must be ({max_seqs + 1},) (max_seqs + 1)")
    if num_seqs.shape != (1,):
        raise ValueError(f"num_seqs must be an int or a [1] array, got shape {num_seqs.shape}")
    for name, arr in (("kv_lens", kv_lens), ("page_table", page_table), ("cu_q_lens", cu_q_lens)):
        if arr.dtype != jnp.int32:
            raise ValueError(f"{name} must be int32, got {arr.dtype}")
    if sinks is not None and sinks.shape != (q_heads,):
        raise ValueError(f"sinks shape {sinks.shape} must be ({q_heads},) (one logit per q head)")


def is_quantized(kv_dtype) -> bool:
    """Whether a cache of this dtype holds codes with scales (int8, fp8)."""
    return np.dtype(kv_dtype).name in QUANT_KV_DTYPES


def kv_scale_layout(kv_scales) -> str:
    """'per-token' ([num_pages, page_size, 2 * kv_heads]) or 'per-page' ([num_pages, 2 * kv_heads]) by rank; 'none'
    without scales (the op model's names, perfmodel.model.attention.KV_SCALES)."""
    if kv_scales is None:
        return "none"
    return "per-token" if len(kv_scales.shape) == 3 else "per-page"


def native_kv_operand(q_dtype, kv_dtype, chip: str) -> bool:
    """Whether the MXU takes the cache's codes as they are against bf16 queries (fp8 where the chip's spec lists a
    native 'bf16 x fp8' pair: v5p, v6e, 7x); otherwise they are widened to q's dtype on the VPU first."""
    from kernels.tiling import matmul_dtype_name

    kv_name = matmul_dtype_name(kv_dtype)
    return (np.dtype(q_dtype).name == "bfloat16" and kv_name == "fp8"
            and tpu_chip(chip).supports_matmul("bf16", kv_name))


def _check_kv_scales(kv_pages, kv_scales, chip: str) -> None:
    dtype = np.dtype(kv_pages.dtype).name
    if not is_quantized(dtype):
        if kv_scales is not None:
            raise ValueError(f"kv_scales: {dtype} kv_pages take no scales; drop kv_scales or pass int8 / "
                             "float8_e4m3fn kv_pages")
        return
    check_dtype("kv_pages", kv_pages.dtype, QUANT_KV_DTYPES, tpu_chip(chip))
    num_pages, page_size, combined, _ = kv_pages.shape
    if combined % 4 and combined != 2:
        raise ValueError(f"kv_pages: {dtype} pages need kv_heads 1 or even (four 8-bit K/V rows share a 32-bit "
                         f"word, split by shifts), got kv_heads={combined // 2}; pad the KV heads to "
                         f"{combined // 2 + 1}")
    per_token, per_page = [num_pages, page_size, combined], [num_pages, combined]
    if kv_scales is None:
        raise ValueError(f"kv_scales: {dtype} kv_pages need float32 scales, {per_token} (per token) or {per_page} "
                         "(per page); quantize with kernels.ragged_paged_attention.quantize_kv_pages")
    if list(kv_scales.shape) not in (per_token, per_page) or kv_scales.dtype != jnp.float32:
        raise ValueError(f"kv_scales: {np.dtype(kv_scales.dtype).name}{list(kv_scales.shape)} must be float32 "
                         f"{per_token} (per token) or {per_page} (per page) for kv_pages {list(kv_pages.shape)}")


def scalar_prefetch_bytes(*, max_seqs: int, pages_per_seq: int, total_tokens: int, block_q: int) -> int:
    """SMEM the scalar-prefetched metadata takes: kv_lens, page table, cu_q_lens, per-q-block sequence ranges."""
    num_blocks = -(-total_tokens // block_q)
    return INDEX_BYTES * (max_seqs + max_seqs * pages_per_seq + max_seqs + 1 + 2 * num_blocks)


def _check_smem(page_table, total_tokens: int, block_q: int, chip: str) -> None:
    smem = tpu_chip(chip).memory.smem_bytes_per_core
    need = scalar_prefetch_bytes(max_seqs=page_table.shape[0], pages_per_seq=page_table.shape[1],
                                 total_tokens=total_tokens, block_q=block_q)
    if smem is not None and need > smem:
        raise ValueError(f"page_table {list(page_table.shape)} with the other scalar-prefetched metadata needs "
                         f"{need} B of SMEM, over the {smem} B of {chip}; split the batch or shorten pages_per_seq")


def _concrete(x) -> np.ndarray | None:
    """x as a numpy array, or None when it is traced (checks are skipped then)."""
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _check_values(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs) -> None:
    values = [_concrete(x) for x in (kv_lens, page_table, cu_q_lens, num_seqs)]
    if any(v is None for v in values):
        return
    lens, table, cu, n = values
    n = int(n[0])
    max_seqs, pages_per_seq = table.shape
    num_pages, page_size = kv_pages.shape[0], kv_pages.shape[1]
    if not 0 <= n <= max_seqs:
        raise ValueError(f"num_seqs={n} must be in [0, {max_seqs}] (rows of page_table)")
    if cu[0] != 0:
        raise ValueError(f"cu_q_lens[0] must be 0, got {cu[0]}")
    q_lens = np.diff(cu[: n + 1])
    if np.any(q_lens < 0):
        raise ValueError(f"cu_q_lens must be non-decreasing over the first num_seqs+1={n + 1} entries")
    if cu[n] > q.shape[0]:
        raise ValueError(f"cu_q_lens[num_seqs]={cu[n]} exceeds q's total_tokens={q.shape[0]}")
    lens = lens[:n]
    if np.any(lens < q_lens):
        s = int(np.argmax(lens < q_lens))
        raise ValueError(f"kv_lens[{s}]={lens[s]} is smaller than the sequence's query length {q_lens[s]}; "
                         "kv_lens must count the new tokens too")
    if np.any(lens > pages_per_seq * page_size):
        s = int(np.argmax(lens > pages_per_seq * page_size))
        raise ValueError(f"kv_lens[{s}]={lens[s]} needs more than pages_per_seq={pages_per_seq} pages "
                         f"of {page_size} tokens")
    for s in range(n):
        used = table[s, : -(-int(lens[s]) // page_size)]
        bad = (used < 0) | (used >= num_pages)
        if np.any(bad):
            p = int(np.argmax(bad))
            raise ValueError(f"page_table[{s}, {p}]={used[p]} points outside the cache "
                             f"(kv_pages has {num_pages} pages)")


def _sequence_ranges(cu_q_lens, num_seqs, *, total_tokens: int, block_q: int):
    """Per q block: first and one-past-last sequence that owns one of its rows."""
    num_blocks = pl.cdiv(total_tokens, block_q)
    live = jnp.arange(cu_q_lens.shape[0] - 1) < num_seqs[0]
    block_start = jnp.arange(num_blocks, dtype=jnp.int32)[:, None] * block_q
    block_end = jnp.minimum(block_start + block_q, total_tokens)
    ends_before = live[None, :] & (cu_q_lens[None, 1:] <= block_start)
    starts_before_end = live[None, :] & (cu_q_lens[None, :-1] < block_end)
    return (jnp.sum(ends_before, axis=1, dtype=jnp.int32), jnp.sum(starts_before_end, axis=1, dtype=jnp.int32))


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _ragged_paged_attention(q, kv_pages, kv_lens, page_table, cu_q_lens, num_seqs, sinks, kv_scales, *,
                            plan: RaggedPagedAttentionPlan, interpret: bool):
    total_tokens, q_heads, head_dim = plan.total_tokens, plan.q_heads, plan.head_dim
    num_pages, page_size, kv_heads = plan.num_pages, plan.page_size, plan.kv_heads
    combined = 2 * kv_heads
    group = plan.group
    block_q, block_kv = plan.blocks.block_q, plan.blocks.block_kv
    rows = group * block_q
    seq_lo, seq_hi = _sequence_ranges(cu_q_lens, num_seqs, total_tokens=total_tokens, block_q=block_q)
    # Validated on the way in: every page id the kernel may copy lies inside the cache (bounds checks off).
    safe_table = jnp.clip(page_table, 0, num_pages - 1).reshape(-1)
    layout = plan.layout
    if plan.quantized:  # a page's tokens x (K, V of every head) as one [page_size * 2 * kv_heads, head_dim] slab
        kv_hbm = kv_pages.reshape(num_pages, page_size * combined, head_dim)
        kv_scratch = pltpu.VMEM((2, block_kv * combined, head_dim), kv_pages.dtype)
    else:  # [num_pages, page_size, words, pack, head_dim]: a token's 32-bit rows (the same bytes, a free view)
        kv_hbm = kv_pages.reshape(num_pages, page_size, layout.words, layout.pack, head_dim)
        kv_scratch = pltpu.VMEM((2, block_kv, layout.stride, layout.pack, head_dim), kv_pages.dtype)
    # Sink logits, lane-replicated: one [1, STATS_LANES] row per q head (-inf-like when off: no extra term).
    sink_rows = jnp.broadcast_to(
        (jnp.full((q_heads,), MASK_VALUE, jnp.float32) if sinks is None else sinks.astype(jnp.float32))[:, None],
        (q_heads, STATS_LANES))

    scale_inputs, scale_specs, scale_scratch, scale_names = [], [], [], []
    if plan.quantized:
        scale_inputs = [block_scales(kv_scales, page_table, kv_lens, page_size=page_size, block_kv=block_kv)]
        scale_specs = [pl.BlockSpec(memory_space=pl.ANY)]
        scale_scratch = [pltpu.VMEM((2, combined, block_kv), jnp.float32), pltpu.SemaphoreType.DMA((2,))]
        scale_names = ["kv_scales", "scale_buf", "scale_sems"]

    qo_spec = pl.BlockSpec((block_q, q_heads * head_dim), lambda b, *_: (b, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(pl.cdiv(total_tokens, block_q),),
        in_specs=[qo_spec, pl.BlockSpec((q_heads, STATS_LANES), lambda b, *_: (0, 0)),
                  pl.BlockSpec(memory_space=pl.ANY), *scale_specs],
        out_specs=qo_spec,
        scratch_shapes=[
            kv_scratch,
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.VMEM((kv_heads, rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, rows, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, rows, head_dim), jnp.float32),
            pltpu.VMEM((kv_heads, group, head_dim), jnp.float32),
            pltpu.VMEM((kv_heads, group, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, group, STATS_LANES), jnp.float32),
            pltpu.VMEM((kv_heads, group, head_dim), jnp.float32),
            *scale_scratch,
        ],
    )
    kernel = functools.partial(_ragged_paged_attention_kernel, plan=plan)
    names = ["kv_lens", "page_table", "cu_q_lens", "seq_lo", "seq_hi", "q", "sinks", "kv_pages"]
    names += scale_names[:1] + ["o", "kv_buf", "sems", "m", "l", "acc", "q1", "m1", "l1", "acc1"] + scale_names[1:]
    kernel = with_ref_names(kernel, tuple(names))
    call = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((total_tokens, q_heads * head_dim), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), disable_bounds_checks=True),
        interpret=interpret_params(interpret),
        cost_estimate=cost_estimate(plan),
        name="ragged_paged_attention",
    )
    with jax.named_scope(f"ragged_paged_attention_bq{block_q}_bkv{block_kv}"):
        out = call(kv_lens, safe_table, cu_q_lens, seq_lo, seq_hi,
                   q.reshape(total_tokens, q_heads * head_dim), sink_rows, kv_hbm, *scale_inputs)
    return out.reshape(total_tokens, q_heads, head_dim)


def block_scales(kv_scales, page_table, kv_lens, *, page_size: int, block_kv: int):
    """The scales the kernel reads, gathered by the page table (an XLA gather before the kernel): ``[max_seqs *
    blocks_per_seq, 2 * kv_heads, block_kv]`` f32, row ``s * blocks_per_seq + j`` holding KV block j of sequence
    s with tokens on lanes (row 2h scales K of head h, 2h + 1 its V), so one DMA per KV block brings every head's
    scales and each head's is a lane vector that folds into its scores (K) and probabilities (V). Per-page scales
    are repeated over their page's tokens. Tokens past a sequence's context get scale 0 (the cache may hold
    anything there, NaN included)."""
    max_seqs, pages_per_seq = page_table.shape
    num_pages, combined = kv_scales.shape[0], kv_scales.shape[-1]
    pages_per_block = block_kv // page_size
    blocks = -(-pages_per_seq // pages_per_block)
    table = jnp.pad(jnp.clip(page_table, 0, num_pages - 1), ((0, 0), (0, blocks * pages_per_block - pages_per_seq)))
    scales = kv_scales[table]  # [max_seqs, pages, page_size, 2 * kv_heads] or [max_seqs, pages, 2 * kv_heads]
    if kv_scales.ndim == 2:
        scales = jnp.broadcast_to(scales[:, :, None], (max_seqs, table.shape[1], page_size, combined))
    scales = scales.reshape(max_seqs, blocks, block_kv, combined)
    position = jnp.arange(blocks * block_kv, dtype=jnp.int32).reshape(1, blocks, block_kv, 1)
    scales = jnp.where(position < kv_lens.reshape(-1, 1, 1, 1), scales, 0.0)
    scales = jnp.swapaxes(scales, 2, 3)[..., token_order(block_kv, combined // 2)]  # the kernel's token order
    return scales.reshape(max_seqs * blocks, combined, block_kv)


def assumed_lengths(*, total_tokens: int, max_seqs: int, pages_per_seq: int, num_pages: int,
                    page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The (query_lens, context_lens) the static cost estimate assumes.

    XLA needs the estimate at trace time, before lengths are known: the
    ``total_tokens`` are split evenly over ``min(max_seqs, total_tokens)``
    sequences whose contexts share the cache evenly (capped at
    ``pages_per_seq`` pages, and at least their query length).
    """
    n = max(1, min(max_seqs, total_tokens))
    q_lens = np.full(n, total_tokens // n, np.int64)
    q_lens[: total_tokens % n] += 1
    share_tokens = min(pages_per_seq, num_pages // n) * page_size
    return q_lens, np.maximum(q_lens, share_tokens)


def cost_estimate(plan: RaggedPagedAttentionPlan) -> pl.CostEstimate:
    """pl.CostEstimate from perfmodel's ragged paged attention model at the assumed lengths."""
    q_lens, kv_lens = assumed_lengths(total_tokens=plan.total_tokens, max_seqs=plan.max_seqs,
                                      pages_per_seq=plan.pages_per_seq, num_pages=plan.num_pages,
                                      page_size=plan.page_size)
    return perf.ragged_paged_attention_cost(
        query_lens=q_lens, context_lens=kv_lens, q_heads=plan.q_heads, kv_heads=plan.kv_heads,
        head_dim=plan.head_dim, page_size=plan.page_size, kv_dtype=plan.kv_dtype, q_dtype=plan.q_dtype,
        block_q=plan.blocks.block_q, block_kv=plan.blocks.block_kv, kv_scale=plan.kv_scale)


def _lanes(stats, width: int):
    """A lane-replicated ``[rows, STATS_LANES]`` statistic as ``[rows, width]`` (tiled, or its first lanes)."""
    if width >= STATS_LANES:
        return jnp.tile(stats, (1, width // STATS_LANES))
    return stats[:, :width]


def _head_windows(q_heads: int, head_dim: int) -> list[list[int]]:
    """q heads grouped by the 128-lane window of ``[.., q_heads * head_dim]`` they sit in: one head per window
    (or several windows) at head_dim >= 128, two per window at head_dim 64 (the last alone if q_heads is odd)."""
    per = max(1, LANES // head_dim)
    return [list(range(j, min(j + per, q_heads))) for j in range(0, q_heads, per)]


def _load_head(x_ref, j: int, head_dim: int):
    """Columns of q head j of a ``[rows, q_heads * head_dim]`` ref; below 128 lanes, the aligned window holding
    them is loaded and the head sliced out of the value (no unaligned lane loads)."""
    if head_dim >= LANES:
        return x_ref[:, j * head_dim:(j + 1) * head_dim]
    start = j * head_dim // LANES * LANES
    width = min(LANES, x_ref.shape[1] - start)
    offset = j * head_dim - start
    return x_ref[:, start:start + width][:, offset:offset + head_dim]


def _store_heads(o_ref, heads: dict, mine, head_dim: int) -> None:
    """Write ``heads`` (q head -> ``[rows, head_dim]`` value) into ``o_ref`` where ``mine(width)`` (a
    ``[rows, width]`` bool mask) holds, one aligned lane window at a time (heads sharing a 128-lane window are
    concatenated first)."""
    for window in _head_windows(len(heads), head_dim):
        cols = slice(window[0] * head_dim, (window[-1] + 1) * head_dim)
        vals = [heads[j].astype(o_ref.dtype) for j in window]
        val = jnp.concatenate(vals, axis=1) if len(vals) > 1 else vals[0]
        o_ref[:, cols] = jnp.where(mine(val.shape[1]), val, o_ref[:, cols])


def _word_rows(kv_buf, slot: int):
    """Slot ``slot`` of the padded ``[2, block_kv, stride, pack, head_dim]`` KV buffer as ``[block_kv * stride,
    head_dim]`` 32-bit rows (row ``stride * t + w``: word w of token t)."""
    _, block_kv, stride, _, head_dim = kv_buf.shape
    return kv_buf.bitcast(jnp.uint32).at[slot].reshape(block_kv * stride, head_dim)


def _split_kv(kv_buf, slot, h: int, layout, start: int, tokens: int, *, packed_pairs: bool):
    """K and V of KV head ``h`` for tokens ``start .. start + tokens`` of slot ``slot`` of the padded KV buffer
    (``[2, block_kv, stride, pack, head_dim]``, :class:`~kernels.ragged_paged_attention.blocks.KvRowLayout`):
    two ``[tokens, head_dim]``.

    K is row ``2h`` of a token, V row ``2h + 1``: value ``r % pack`` of 32-bit word ``r // pack``. One strided
    load of the 32-bit view (stride: the padded token, so the loaded rows sit in distinct VMEM banks) fetches a
    head's words for the tokens; a bf16 word holds K in its low half and V in its high half, split by a
    truncation to 16 bits (V shifted down first) and a bitcast. ``packed_pairs`` False reads the values by
    indexing instead (interpret mode, which cannot bitcast a ref in jax 0.10.2; same values)."""
    if not packed_pairs:
        return tuple(kv_buf[slot, pl.ds(start, tokens), r // layout.pack, r % layout.pack, :]
                     for r in (2 * h, 2 * h + 1))
    rows = _word_rows(kv_buf, slot)
    stride = layout.stride

    def words(r):
        return rows[pl.ds(r + stride * start, tokens, stride=stride), :]

    if layout.pack == 1:
        return pltpu.bitcast(words(2 * h), kv_buf.dtype), pltpu.bitcast(words(2 * h + 1), kv_buf.dtype)
    pairs = words(h)
    return (pltpu.bitcast(pairs.astype(jnp.uint16), kv_buf.dtype),
            pltpu.bitcast((pairs >> 16).astype(jnp.uint16), kv_buf.dtype))


def _split_quantized_kv(kv_ref, h: int, kv_heads: int, start: int, tokens: int, dtype, *, packed: bool):
    """K and V codes of KV head ``h`` for tokens ``start .. start + tokens`` of an 8-bit ``[block_kv * 2 * kv_heads,
    head_dim]`` block, widened exactly to ``dtype`` (bf16 or f32; fp8 codes stay fp8 when ``dtype`` is theirs):
    two ``[tokens, head_dim]``.

    Four 8-bit rows share a 32-bit word (row ``4w + i`` in byte i), so with an even ``kv_heads`` the rows ``2h``
    (K) and ``2h + 1`` (V) of a token are bytes ``2 * (h % 2)`` and ``2 * (h % 2) + 1`` of word ``h // 2`` of the
    token's ``kv_heads / 2`` words: one strided load of the 32-bit view fetches both, and shifts move each byte to
    the top and back (arithmetic for int8's sign; fp8's byte is placed in the top of a 16-bit half and read as
    its bit pattern). With one KV head a word holds two tokens (K, V of token 2r, then of 2r + 1): the block's
    words load unstrided and K (V) comes out as the even tokens followed by the odd ones (:func:`token_order`;
    the scores' positions and the scales follow the same order). ``packed`` False (interpret mode, which cannot
    bitcast a ref in jax 0.10.2) loads the 8-bit rows with a stride instead (same values, same order)."""
    stride = 2 * kv_heads
    first = 2 * h + stride * start
    if not packed:
        if kv_heads == 1:  # evens then odds, as the packed path produces them
            k, v = (jnp.concatenate([kv_ref[pl.ds(first + i + 2 * parity, tokens // 2, stride=4), :]
                                     for parity in (0, 1)], axis=0) for i in (0, 1))
        else:
            k = kv_ref[pl.ds(first, tokens, stride=stride), :]
            v = kv_ref[pl.ds(first + 1, tokens, stride=stride), :]
        if dtype == kv_ref.dtype:
            return k, v
        return k.astype(jnp.float32).astype(dtype), v.astype(jnp.float32).astype(dtype)
    if kv_heads == 1:
        words = kv_ref.bitcast(jnp.uint32)[pl.ds(start // 2, tokens // 2), :]
    else:
        words = kv_ref.bitcast(jnp.uint32)[pl.ds(h // 2 + kv_heads // 2 * start, tokens, stride=kv_heads // 2), :]
    byte = 2 * (h % 2)
    if kv_ref.dtype == jnp.int8:
        def code(b):  # signed byte b, sign-extended: shift it to the top, arithmetic shift back
            top = pltpu.bitcast(words << (24 - 8 * b), jnp.int32)
            return lax.shift_right_arithmetic(top, 24).astype(jnp.float32).astype(dtype)
    else:
        def code(b):  # fp8 byte b -> its uint8 value -> the fp8 bit pattern (widened unless the MXU takes it)
            raw = lax.shift_right_logical(words << (24 - 8 * b), jnp.uint32(24)).astype(jnp.uint8)
            codes = pltpu.bitcast(raw, kv_ref.dtype)
            return codes if dtype == kv_ref.dtype else codes.astype(jnp.float32).astype(dtype)
    if kv_heads == 1:  # bytes 0, 1: K, V of the even tokens; 2, 3: of the odd ones
        return (jnp.concatenate([code(0), code(2)], axis=0), jnp.concatenate([code(1), code(3)], axis=0))
    return code(byte), code(byte + 1)


def token_order(tokens: int, kv_heads: int) -> np.ndarray:
    """Order of a KV block's tokens in the scores of an 8-bit cache: natural, or with one KV head (two tokens per
    32-bit word) the even tokens then the odd ones."""
    if kv_heads != 1:
        return np.arange(tokens)
    return np.concatenate([np.arange(0, tokens, 2), np.arange(1, tokens, 2)])


def _ragged_paged_attention_kernel(
    # Scalar prefetch (SMEM).
    kv_lens_ref,  # [max_seqs] int32
    page_table_ref,  # [max_seqs * pages_per_seq] int32 (flattened page table, ids clamped into the cache)
    cu_q_lens_ref,  # [max_seqs + 1] int32
    seq_lo_ref,  # [num_q_blocks] int32: first sequence with a row in the q block
    seq_hi_ref,  # [num_q_blocks] int32: one past the last such sequence
    # Inputs.
    q_ref,  # VMEM [block_q, q_heads * head_dim]: every q head of the tokens of q block b
    sinks_ref,  # VMEM [q_heads, STATS_LANES] f32: sink logit per q head, lane-replicated
    kv_hbm_ref,  # HBM [num_pages, page_size, words, pack, head_dim] (layout), quantized [num_pages, page_size * 2 * kv_heads, head_dim]
    *refs,  # (quantized) scales_hbm_ref, then o_ref, the scratch below, (quantized) scale_buf, scale_sems
    plan: RaggedPagedAttentionPlan,
):
    sm_scale, group, kv_heads, page_size = plan.sm_scale, plan.group, plan.kv_heads, plan.page_size
    pages_per_block, pages_per_seq = plan.pages_per_block, plan.pages_per_seq
    sliding_window, soft_cap, packed_pairs = plan.sliding_window, plan.soft_cap, plan.packed_pairs
    quantized, native_codes, layout = plan.quantized, plan.native_codes, plan.layout
    # scales_hbm_ref: HBM [max_seqs * blocks_per_seq, 2 * kv_heads, block_kv] f32 (block_scales), quantized only.
    # o_ref: VMEM [block_q, q_heads * head_dim]. Scratch:
    # kv_buf: VMEM [2, block_kv, stride, pack, head_dim]: two slots of one KV block (all heads), each token's
    # 32-bit rows padded to the layout's stride; quantized [2, block_kv * 2 * kv_heads, head_dim] (unpadded);
    # sems: DMA semaphores [2], one per slot;
    # m_ref, l_ref: VMEM [kv_heads, group * block_q, STATS_LANES] f32: running row max / sum of exp (lane-replicated);
    # acc_ref: VMEM [kv_heads, group * block_q, head_dim] f32: unnormalised output;
    # q1_ref: VMEM [kv_heads, group, head_dim] f32: a one-row (decode) sequence's query, heads stacked per group;
    # m1_ref, l1_ref: VMEM [kv_heads, group, STATS_LANES] f32, acc1_ref [kv_heads, group, head_dim]: its state;
    # scale_buf: VMEM [2, 2 * kv_heads, block_kv] f32: the KV block's scales per slot, scale_sems: DMA semaphores [2].
    scales_hbm_ref, refs = (refs[0], refs[1:]) if quantized else (None, refs)
    o_ref, kv_buf, sems, m_ref, l_ref, acc_ref, q1_ref, m1_ref, l1_ref, acc1_ref = refs[:10]
    scale_buf, scale_sems = refs[10:] if quantized else (None, None)
    block_q = q_ref.shape[0]
    compute_dtype = q_ref.dtype if quantized else kv_buf.dtype  # the MXU's operand dtype
    block_start = pl.program_id(0) * block_q
    head_dim = acc_ref.shape[2]
    block_kv = pages_per_block * page_size
    page_rows = page_size * 2 * kv_heads

    def row_span(s):
        """(first, last) positions of sequence s's query rows in this q block, and whether it has any."""
        q_start, q_end, kv_len = cu_q_lens_ref[s], cu_q_lens_ref[s + 1], kv_lens_ref[s]
        first_row = jnp.maximum(q_start, block_start)
        last_row = jnp.minimum(q_end, block_start + block_q) - 1
        offset = kv_len - q_end  # position of row r is offset + r
        return offset + first_row, offset + last_row, (last_row >= first_row) & (offset + last_row >= 0)

    def kv_block_range(s):
        """[lo, hi) KV blocks sequence s's rows in this q block see (empty if it has none)."""
        first_pos, last_pos, has_rows = row_span(s)
        hi = jnp.where(has_rows, lax.div(jnp.maximum(last_pos, 0), block_kv) + 1, 0)
        if sliding_window is None:
            return jnp.int32(0), hi
        lo = lax.div(jnp.maximum(first_pos - sliding_window + 1, 0), block_kv)
        return jnp.minimum(lo, hi), hi

    def pages_in_block(s, j):
        """Pages of block j that hold tokens of sequence s (the block's pages past its context are skipped)."""
        num_pages = lax.div(kv_lens_ref[s] + page_size - 1, page_size)
        return jnp.clip(num_pages - j * pages_per_block, 0, pages_per_block)

    def page_slots(slot, first_token, tokens):
        """The VMEM destination of ``tokens`` tokens of a slot's block (the padding rows left out)."""
        if layout is None:
            return kv_buf.at[slot, pl.ds(first_token * 2 * kv_heads, tokens * 2 * kv_heads)]
        return kv_buf.at[slot, pl.ds(first_token, tokens), pl.ds(0, layout.words)]

    def page_copy(s, j, i, slot):
        page = jnp.minimum(j * pages_per_block + i, pages_per_seq - 1)
        page_id = page_table_ref[s * pages_per_seq + page]
        return pltpu.make_async_copy(kv_hbm_ref.at[page_id], page_slots(slot, i * page_size, page_size),
                                     sems.at[slot])

    blocks_per_seq = -(-pages_per_seq // pages_per_block)

    def scale_copy(s, j, slot):
        return pltpu.make_async_copy(scales_hbm_ref.at[s * blocks_per_seq + j], scale_buf.at[slot],
                                     scale_sems.at[slot])

    def start_fetch(s, j, slot):
        count = pages_in_block(s, j)
        if quantized:  # every head's scales of the block: one DMA
            scale_copy(s, j, slot).start()
        for i in range(pages_per_block):  # unrolled: one DMA per page, every head's K and V

            @pl.when(i < count)
            def _():
                page_copy(s, j, i, slot).start()

    def wait_fetch(s, j, slot):
        count = pages_in_block(s, j)
        if quantized:
            scale_copy(s, j, slot).wait()

        @pl.when(count == pages_per_block)
        def _():  # one wait sized to the whole block
            pltpu.make_async_copy(page_slots(1 - slot, 0, block_kv), page_slots(slot, 0, block_kv),
                                  sems.at[slot]).wait()

        @pl.when(count < pages_per_block)
        def _():  # a partial last block: one wait per fetched page
            def wait_page(i, carry):
                pltpu.make_async_copy(kv_hbm_ref.at[0], page_slots(slot, 0, page_size), sems.at[slot]).wait()
                return carry

            lax.fori_loop(0, count, wait_page, 0)

            def zero_page(i, carry):  # unfetched pages: zeros, never stale data (NaN in a fresh buffer)
                if layout is None:
                    kv_buf[slot, pl.ds(pl.multiple_of(i * page_rows, page_rows), page_rows), :] = jnp.zeros(
                        (page_rows, kv_buf.shape[2]), kv_buf.dtype)
                elif packed_pairs:  # through the 32-bit row view
                    rows = page_size * layout.stride
                    _word_rows(kv_buf, slot)[pl.ds(pl.multiple_of(i * rows, rows), rows), :] = jnp.zeros(
                        (rows, head_dim), jnp.uint32)
                else:
                    kv_buf[slot, pl.ds(i * page_size, page_size)] = jnp.zeros(
                        (page_size, *kv_buf.shape[2:]), kv_buf.dtype)
                return carry

            lax.fori_loop(count, pages_per_block, zero_page, 0)

    def softmax_block(qh, h, j, slot, q_pos, m_at, l_at, acc_at):
        """KV block j of KV head h in the online softmax of the stacked query rows qh at positions q_pos
        ([rows, 1] or a scalar), state in m_at, l_at, acc_at. The block is scored in chunks of COMPUTE_TOKENS
        so that one chunk's K, V and scores stay in vector registers. Rows past the context hold finite
        values (the tail of the sequence's last page, or zeros where a partial block fetched no page), so
        masked scores (p = 0) contribute nothing."""  # noqa: D401
        m, l, acc = m_at[...], l_at[...], acc_at[...]
        qh = qh.astype(compute_dtype)
        chunk = min(COMPUTE_TOKENS, block_kv)
        assert not (quantized and kv_heads == 1) or chunk == block_kv  # token_order spans the whole block
        for c in range(block_kv // chunk):
            if quantized:
                k, v = _split_quantized_kv(kv_buf.at[slot], h, kv_heads, c * chunk, chunk,
                                           kv_buf.dtype if native_codes else compute_dtype, packed=packed_pairs)
                tokens = pl.ds(c * chunk, chunk)
                # K's scale folds into the scores (with sm_scale), V's into the probabilities: [1, chunk] rows.
                k_scale = scale_buf[slot, pl.ds(2 * h, 1), tokens] * sm_scale
                v_scale = scale_buf[slot, pl.ds(2 * h + 1, 1), tokens]
            else:
                k, v = _split_kv(kv_buf, slot, h, layout, c * chunk, chunk, packed_pairs=packed_pairs)
                k_scale = sm_scale
            scores = lax.dot_general(qh, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * k_scale
            if soft_cap is not None:
                scores = soft_cap * jnp.tanh(scores * (1.0 / soft_cap))
            iota = lax.broadcasted_iota(jnp.int32, (1, chunk), 1)
            if quantized and kv_heads == 1:  # token_order: evens, then odds
                iota = jnp.where(iota < chunk // 2, 2 * iota, 2 * iota - (chunk - 1))
            kv_pos = j * block_kv + c * chunk + iota
            scores = jnp.where(window_mask(q_pos, kv_pos), scores, MASK_VALUE)
            m_next = jnp.maximum(m, jnp.max(scores, axis=1, keepdims=True))
            p = jnp.exp(scores - jnp.tile(m_next, (1, chunk // STATS_LANES)))
            alpha = jnp.exp(m - m_next)
            l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
            pv = jnp.dot((p * v_scale if quantized else p).astype(compute_dtype), v,
                         preferred_element_type=jnp.float32)
            acc = acc * _lanes(alpha, head_dim) + pv
            m = m_next
        m_at[...], l_at[...], acc_at[...] = m, l, acc

    def window_mask(q_pos, kv_pos):
        visible = kv_pos <= q_pos
        if sliding_window is not None:
            visible &= kv_pos > q_pos - sliding_window
        return visible

    def attend(s, j, slot):
        """Block path: every row of the q block, the group's heads stacked ([group * block_q] rows)."""
        q_end, kv_len = cu_q_lens_ref[s + 1], kv_lens_ref[s]
        q_pos = block_start + (kv_len - q_end) + lax.broadcasted_iota(jnp.int32, (block_q, 1), 0)
        q_pos = jnp.concatenate([q_pos] * group, axis=0) if group > 1 else q_pos  # [group * block_q, 1]
        for h in range(kv_heads):
            cols = [_load_head(q_ref, h * group + g, head_dim) for g in range(group)]
            qh = jnp.concatenate(cols, axis=0) if group > 1 else cols[0]
            softmax_block(qh, h, j, slot, q_pos, m_ref.at[h], l_ref.at[h], acc_ref.at[h])

    def attend_one(j, slot, q_pos):
        """One-row path (a decode token, or a prefill's single row in this block) at position q_pos: only the
        group's ``group`` query rows."""
        for h in range(kv_heads):
            softmax_block(q1_ref[h], h, j, slot, q_pos, m1_ref.at[h], l1_ref.at[h], acc1_ref.at[h])

    def sink_rows(h, rows_per_head):
        """Initial running max of KV head h's stacked rows: each q head's sink logit (MASK_VALUE when off)."""
        return jnp.concatenate([jnp.broadcast_to(sinks_ref[pl.ds(h * group + g, 1), :], (rows_per_head, STATS_LANES))
                                for g in range(group)], axis=0)

    def start_sequence():
        """Online-softmax state for a new sequence: the sink logit (or nothing) as the running max, sum 1."""
        for h in range(kv_heads):
            m_ref[h] = sink_rows(h, block_q)
            l_ref[h] = jnp.ones(l_ref.shape[1:], jnp.float32)
            acc_ref[h] = jnp.zeros(acc_ref.shape[1:], jnp.float32)

    def start_one(row):
        """One-row path: gather row ``row`` of the q block for every head (a masked sublane sum: rows past the
        batch may hold anything, NaN included) and reset the state."""
        mine = lax.broadcasted_iota(jnp.int32, (block_q, 1), 0) == row
        q_row = jnp.sum(jnp.where(mine, q_ref[...].astype(jnp.float32), 0.0), axis=0, keepdims=True)
        for h in range(kv_heads):
            heads = [q_row[:, (h * group + g) * head_dim:(h * group + g + 1) * head_dim] for g in range(group)]
            q1_ref[h] = jnp.concatenate(heads, axis=0) if group > 1 else heads[0]
            m1_ref[h] = sink_rows(h, 1)
            l1_ref[h] = jnp.ones(l1_ref.shape[1:], jnp.float32)
            acc1_ref[h] = jnp.zeros(acc1_ref.shape[1:], jnp.float32)

    def finish(s):
        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]

        def mine(width):
            token = block_start + lax.broadcasted_iota(jnp.int32, (block_q, width), 0)
            return (token >= q_start) & (token < q_end)

        heads = {}
        for h in range(kv_heads):
            out = acc_ref[h] * _lanes(1.0 / l_ref[h], head_dim)
            for g in range(group):
                heads[h * group + g] = out[g * block_q:(g + 1) * block_q]
        _store_heads(o_ref, heads, mine, head_dim)

    def finish_one(row):

        def mine(width):
            return lax.broadcasted_iota(jnp.int32, (block_q, width), 0) == row

        heads = {}
        for h in range(kv_heads):
            out = acc1_ref[h] * _lanes(1.0 / l1_ref[h], head_dim)
            for g in range(group):
                heads[h * group + g] = jnp.broadcast_to(out[g:g + 1], (block_q, head_dim))
        _store_heads(o_ref, heads, mine, head_dim)

    def sequence(s, slot):
        lo, hi = kv_block_range(s)
        # Sequence s - 1 of this step (if it had KV blocks) already fetched our first block.
        prev_lo, prev_hi = kv_block_range(jnp.maximum(s - 1, 0))
        prefetched = (s > seq_lo) & (prev_hi > prev_lo)

        @pl.when((hi > lo) & jnp.logical_not(prefetched))
        def _():
            start_fetch(s, lo, slot)

        q_start, q_end = cu_q_lens_ref[s], cu_q_lens_ref[s + 1]
        first_row = jnp.maximum(q_start, block_start)
        one_row = jnp.minimum(q_end, block_start + block_q) - first_row == 1

        @pl.when(one_row)
        def _():
            start_one(first_row - block_start)

        @pl.when(jnp.logical_not(one_row))
        def _():
            start_sequence()

        def kv_block(j, slot):
            # Prefetch the step's next (sequence, KV block): the next block of s, else the first of s + 1.
            more_here = j + 1 < hi
            following = jnp.minimum(s + 1, seq_hi - 1)  # clamped: SMEM reads stay in bounds
            next_lo, next_hi = kv_block_range(following)
            has_next = more_here | ((s + 1 < seq_hi) & (next_hi > next_lo))

            @pl.when(has_next)
            def _():
                start_fetch(jnp.where(more_here, s, following), jnp.where(more_here, j + 1, next_lo), 1 - slot)

            wait_fetch(s, j, slot)

            @pl.when(one_row)
            def _():
                attend_one(j, slot, kv_lens_ref[s] - q_end + first_row)

            @pl.when(jnp.logical_not(one_row))
            def _():
                attend(s, j, slot)

            return 1 - slot

        slot = lax.fori_loop(lo, hi, kv_block, slot)

        @pl.when((hi > lo) & one_row)
        def _():
            finish_one(first_row - block_start)

        @pl.when((hi > lo) & jnp.logical_not(one_row))
        def _():
            finish(s)

        return slot

    o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)
    seq_lo = seq_lo_ref[pl.program_id(0)]
    seq_hi = seq_hi_ref[pl.program_id(0)]
    lax.fori_loop(seq_lo, seq_hi, sequence, jnp.int32(0))
