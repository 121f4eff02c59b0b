"""The static plan of one ragged paged attention call and the checks that build it: :class:`RaggedPagedAttentionPlan`
and :func:`make_plan`, which validates the arguments (shapes and dtypes of q, the combined K/V cache and the metadata;
KV scales of a quantized cache; the blocks; SMEM for the scalar-prefetched metadata; lengths, ``cu_q_lens`` and page
ids when concrete) and fixes the blocks, the score scale and how the kernel reads the cache; also the lengths the
static cost estimate assumes and that estimate. Layout and semantics: :mod:`kernels.ragged_paged_attention.kernel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from kernels import perf
from kernels.perf import DEFAULT_CHIP
from kernels.tiling import check_dtype, tpu_chip
from kernels.ragged_paged_attention.blocks import (
    LANES,
    QUANT_KV_DTYPES,
    KvRowLayout,
    RaggedPagedAttentionBlockSizes,
    default_block_sizes,
    kv_row_layout,
    sublane_multiple,
)

#: Bytes of one scalar-prefetched int32 (lengths, page ids, offsets).
INDEX_BYTES = 4
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
    without scales (the op model's names, perfmodel.model.paged_attention.KV_SCALES)."""
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
