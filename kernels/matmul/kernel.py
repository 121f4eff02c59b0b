"""Tiled GEMM for TPU (Pallas/Mosaic): out = act(x @ (w * w_scale) + bias).

Grid (M/bm, N/bn, K/bk) with K innermost ("arbitrary") so each (i, j) output
tile accumulates in an f32 VMEM scratch across the K steps (no zeroing pass: the
first K step's product replaces it); M and N are "parallel" (megacore chips
split them across TensorCores). The epilogue (per-output-channel weight scale,
bias, activation, cast) runs on the product itself with one K step, on every
step's running sum with two, on the last K step with more (see _matmul_kernel).

Weights may be int8 (with per-output-channel f32 scales) or fp8 (e4m3fn /
e5m2, scales optional; only on chips whose spec lists an fp8 MXU pair and
an fp8 matmul rate); the
kernel converts each weight tile to the activation dtype and applies the
scale to the f32 accumulator, which equals scaling the weights because the
scale is per output column. int4 weights (``w_dtype="int4"``, two per byte, kernels/quant.py's nibble order)
are unpacked tile by tile into a bf16 VMEM tile; int8 x int8 (``quantize_x``) quantizes x per token in the
kernel (on single-core chips the next row block during the current one's steps) and runs the int8 MXU path
(blockwise scales at large bm on v6e: the codes in bf16 on the bf16 MXU, see matmul's docstring).

Unaligned shapes: blocks are first clamped to the problem (bm to M rounded up
to the sublane tile, bk/bn to K/N rounded up to 128). Nothing is padded or
copied: the last K block runs past K and the kernel zeroes its x columns and
w rows past K (only on that step); the last M/N blocks run partly out of
bounds, Pallas drops their out-of-range writes, and garbage read there only
reaches dropped rows or columns of the output.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import interpret_params, with_ref_names
from kernels import perf, tiling
from kernels.matmul.blocks import (MatmulBlockSizes, MatmulVariant, code_dtype, default_block_sizes, fp8_as_is,
                                   w_dequant_dtype)
from kernels.matmul.reference import ACTIVATIONS, SCALE_BLOCK, scale_kind_of
from kernels.matmul.rules import (BLOCKWISE_PARTIAL_MAX_ROWS, SPLIT_LO_STEPS, blockwise_codes_on_bf16_mxu,
                                  has_bf16_vpu, has_fast_int8_mxu, int4_decode_on_int8_mxu, quantizes_in_bf16)
from kernels.perf import DEFAULT_CHIP
from kernels.quant import (INT4_PACK_ROWS, int8_codes, int8_codes_bf16, int8_scale, int8_scale_bf16,
                          split_int8_codes)

_FLOAT_INPUTS = ("float32", "bfloat16")
#: Largest x row block ([bm, K rounded up to bk]) kept resident in VMEM across the column blocks (decode GEMMs).
X_RESIDENT_MAX_BYTES = 2 << 20
#: Blockwise scales: up to this bm each 128-row group's partial product is scaled (bm x bn VPU work per group);
#: above it the w tile is dequantized once (bk x bn), which is cheaper when bm > 128 (weight-only; with quantize_x
#: on chips where the codes go to the bf16 MXU, blockwise_codes_on_bf16_mxu). One number with the op model's.
PARTIAL_SCALING_MAX_BM = BLOCKWISE_PARTIAL_MAX_ROWS
#: At bm <= PARTIAL_SCALING_MAX_BM the dot runs in column chunks whose f32 partial sum is at most this (16 vregs).
ACC_CHUNK_BYTES = 64 << 10
#: quantize_x quantizes x QUANT_ROWS rows (the int8 sublane tile) at a time, in column chunks of at most this
#: many f32 bytes (16 vregs).
QUANT_CHUNK_BYTES = 64 << 10
QUANT_ROWS = 32
#: ... and unrolls its pass over the K blocks when the row has at most this many chunks (else a loop over them).
QUANT_UNROLL_CHUNKS = 16
_FP8 = ("float8_e4m3fn", "float8_e5m2")
#: int4 tiles with at most this many (256 K rows x INT4_UNPACK_COLS columns) units are unpacked straight line.
INT4_INLINE_MAX_UNITS = 64
INT4_UNPACK_COLS = 256


def scales_in_bf16(spec: Any) -> bool:
    """Whether int4 blockwise scales are multiplied in bf16 (on the widened codes) rather than f32 on ``spec`` (a
    ChipSpec): on chips with a bf16 VPU (kernels.matmul.rules.has_bf16_vpu, the spec's
    compiler.vpu_bf16_arithmetic). Compiled at the bench_matmul_variants problems, v6e's decode step drops from
    4,438 to 2,246 bundles and its 8192^3 prefill from 1.34 to 1.31 ms; v5e's decode step grows (3,411 -> 4,272)
    though its prefill shrinks, so it keeps f32."""
    return has_bf16_vpu(spec)


#: Up to this many K steps the epilogue runs on every step (branch-free), above it once, on the last K step.
EAGER_EPILOGUE_MAX_K_STEPS = 2


@dataclass(frozen=True, kw_only=True)
class MatmulPlan(tiling.GemmGrid):
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the VMEM check, the pallas_call (grid, BlockSpecs, scratch, compiler params, cost estimate) and the kernel
    body. Hashable: the jitted function and the body take it as a static argument."""

    m: int
    k: int
    n: int
    #: numpy dtype names of x, of w as stored (int4: its packed bytes) and of the output.
    x_dtype: str
    w_dtype: str
    out_dtype: str
    #: The blocks clamped to the problem (:func:`effective_block_sizes`; int4: bk within K rounded up to 256).
    blocks: MatmulBlockSizes
    activation: str
    #: "none", "per-channel" or "per-block" (kernels.matmul.reference.scale_kind_of).
    scale_kind: str
    has_bias: bool
    #: The caller's quantize_x: x quantized per token to int8 codes in the kernel (int8 x int8; w4a8 with int4).
    quantize_x: bool
    #: Packed int4 weights (w_dtype="int4"), unpacked tile by tile in VMEM.
    int4: bool
    #: What the call adds to the plain kernel (and its VMEM): the resident x row, the x codes (quantize_x's, or
    #: bf16 x int4's two code planes at decode: split_codes), the lookahead's shares, blockwise scale rows, a
    #: dequantized w tile.
    variant: MatmulVariant
    #: The x codes are made at every column block's first K step and the column blocks run "parallel"
    #: (:func:`quantizes_each_column_block`).
    each_j: bool
    #: quantize_x's codes of bf16 x come from a bf16 product (:func:`quantizes_x_in_bf16`).
    bf16_codes: bool
    #: Blockwise scales are multiplied in bf16 (:func:`scales_in_bf16`) on the float-codes or bf16 x int4 path.
    bf16_scaling: bool
    #: The raised scoped-VMEM limit the call compiles with (None: the chip's default).
    vmem_limit_bytes: int | None

    @property
    def k_tail(self) -> int | None:
        """Valid columns of the last K block when bk does not divide K (the kernel masks the rest), else None."""
        return None if self.k % self.blocks.bk == 0 else self.k - (self.n_k - 1) * self.blocks.bk

    @property
    def blockwise(self) -> bool:
        """One weight scale per 128 rows of K (w_scale [cdiv(K, 128), N])."""
        return self.scale_kind == "per-block"

    @property
    def x_resident(self) -> bool:
        """The whole x row block stays in VMEM across the column blocks (fetched once per row block)."""
        return self.variant.x_row is not None

    @property
    def lookahead(self) -> bool:
        """quantize_x quantizes the next row block during the current one's steps, ``variant.x_share_rows`` rows a
        step."""
        return self.variant.x_share_rows is not None

    @property
    def int_dot(self) -> bool:
        """The dot takes int8 x codes and returns int32 (not the float codes of the bf16 MXU route)."""
        return self.variant.x_codes and not self.variant.float_codes

    @property
    def int_acc(self) -> bool:
        """The accumulator holds int32 (int8 dots with per-channel scales; blockwise sums are scaled in f32)."""
        return self.variant.x_codes and not self.blockwise

    @property
    def code_rows(self) -> int:
        """Rows of the accumulator and of each K block's codes: twice bm with two code planes (split_codes)."""
        return 2 * self.blocks.bm if self.variant.split_codes else self.blocks.bm

    @property
    def col_chunk(self) -> int:
        """Columns per partial product (:func:`_col_chunk` of the code rows)."""
        return _col_chunk(self.code_rows, self.blocks.bn)

    @property
    def precision(self) -> Any:
        """The dots' precision: HIGHEST for f32 x (bf16 splits), except against the float codes."""
        if self.x_dtype == "float32" and not self.variant.float_codes:
            return jax.lax.Precision.HIGHEST
        return jax.lax.Precision.DEFAULT

    @property
    def semantics(self) -> tuple[str, str, str]:
        """Dimension semantics of (i, j, kk). With x codes j is sequential so that j == 0 quantizes the row block
        before the other column blocks use it (each_j: every column block quantizes it, j stays parallel);
        lookahead: the row blocks too (each quantizes the next)."""
        return ("arbitrary" if self.lookahead else "parallel",
                "arbitrary" if self.variant.x_codes and not self.each_j else "parallel", "arbitrary")


def _matmul_kernel(*refs: Any, plan: MatmulPlan) -> None:
    """One (i, j, kk) grid step of ``plan``. Refs in order: x, w, [w_scale], [bias], [x0], out, acc, then the
    scratch of the variant: with x codes, the codes of the x row and their scales (lookahead: the next row block's
    too); w_dequant (int4, blockwise at large bm) a dequantized w tile.

    No zeroing pass: the first K step's product replaces the accumulator (a select on k == 0 in the same code
    every step runs, so the dot stays in the unpredicated body). With one K step the product goes straight to
    the epilogue and the accumulator is never touched; with two the epilogue runs on every step's running sum
    (branch-free; the output block is written back after the last); with more, on the last K step. Unaligned K:
    the first and last K steps have their own copies (the last one masked, with the epilogue fused in)."""
    # x_ref: [bm, bk] x dtype; x_resident / x codes: [bm, n_k * bk], the whole row (fetched once per i);
    # lookahead: [share_rows, n_k * bk], the rows of the next row block this step quantizes.
    n_k, bk, k_tail, x_codes = plan.n_k, plan.blocks.bk, plan.k_tail, plan.variant.x_codes
    x_ref = refs[0]
    w_ref = refs[1]  # [bk, bn] w dtype (same as x, or int8/fp8); int4: [bk / 2, bn] packed bytes
    rest = list(refs[2:])
    scale_ref = rest.pop(0) if plan.scale_kind != "none" else None  # [1, bn] per-channel; [Gp, bn] per-block, f32
    bias_ref = rest.pop(0) if plan.has_bias else None  # [1, bn] bias dtype
    x0_ref = rest.pop(0) if plan.lookahead else None  # [bm, n_k * bk] x dtype: row block 0, single-buffered
    o_ref, acc_ref = rest[:2]  # o_ref: [bm, bn] out dtype; acc_ref: [bm, bn] f32 (int32: plan.int_acc)
    scratch = rest[2:]
    j, k = pl.program_id(1), pl.program_id(2)
    blockwise = plan.blockwise
    groups = bk // SCALE_BLOCK  # scale rows per K block
    bn = w_ref.shape[1]

    if x_codes:
        # [n_k, bm, bk] int8 codes and [bm, 1] f32 per-token scales of this row block; lookahead: the next row
        # block's too, separate buffers (so the scheduler can tell the quantization's stores from the dot's loads
        # and interleave them).
        xq_ref, xs_ref = scratch[:2]
        row_ref = x0_ref if plan.lookahead else x_ref  # the whole row block quantize_all reads
        n_groups = row_ref.shape[0] // QUANT_ROWS
        quantize = functools.partial(_quantize_group, n_k=n_k, bk=bk, k_tail=k_tail, split=plan.variant.split_codes,
                                     bf16_codes=plan.bf16_codes)

        def quantize_all() -> None:  # this row block, group by group
            def body(g: Any, carry: Any) -> Any:
                quantize(row_ref, xq_ref, xs_ref, g)
                return carry

            jax.lax.fori_loop(0, n_groups, body, 0)

        if plan.lookahead:
            xq_next, xs_next = scratch[2:4]
            i, s = pl.program_id(0), j * n_k + k
            pl.when((i == 0) & (s == 0))(quantize_all)  # row block 0, from its own single-buffered block

            @pl.when((i > 0) & (s == 0))
            def _take_next() -> None:  # the codes the previous row block's steps made
                for t in range(n_k):
                    xq_ref[t] = xq_next[t]
                xs_ref[...] = xs_next[...]

            # Every step s quantizes share min(s, shares - 1) of the next row block (x_ref, per_step 32-row
            # groups: lookahead_share_groups), straight line in the step body (packed around the dot); steps past
            # the last share quantize it again.
            per_step = x_ref.shape[0] // QUANT_ROWS
            first = jnp.minimum(s, n_groups // per_step - 1) * per_step
            for u in range(per_step):
                quantize(x_ref, xq_next, xs_next, first + u, src_group=u)
        elif plan.each_j:
            # One row block split by column blocks over the TensorCores (j "parallel"): each column block's first
            # K step quantizes the row itself (a core cannot tell which column block it runs first).
            pl.when(k == 0)(quantize_all)
        else:
            # Per-token quantization once per row block (j is "arbitrary", so j == 0 comes first for every i).
            pl.when((j == 0) & (k == 0))(quantize_all)

    def x_tile() -> jax.Array:
        if x_codes:
            return xq_ref[k]
        if plan.x_resident:
            return x_ref[:, pl.ds(pl.multiple_of(k * bk, tiling.LANES), bk)]
        return x_ref[...]

    # float_codes: quantize_x's codes are held in bf16 (exact) and meet a bf16 dequantized w tile on the bf16 MXU
    # (blockwise scales at large bm on chips whose MXU is deeper than a scale group: blockwise_codes_on_bf16_mxu).
    int_dot = plan.int_dot
    out_type = jnp.int32 if int_dot else jnp.float32
    # The dequantized tile carries the blockwise scales against float x (and float codes): int8 x int4 on the
    # int8 MXU unpacks plain int8 codes and scales each 128-row group's int32 partial sum, as int8 x int8 does.
    folds_scales = plan.variant.w_dequant and not int_dot
    tile_scales = scale_ref if blockwise and folds_scales else None
    partial_groups = blockwise and not folds_scales  # one scaled partial product per 128-row group
    # int4: unpack each column chunk straight line before its dot (static slices, so the scheduler overlaps the
    # next chunk's unpacking with this chunk's dot) when the tile is small enough to unroll; else one loop.
    int4_inline = plan.int4 and (bk // INT4_PACK_ROWS) * tiling.cdiv(bn, INT4_UNPACK_COLS) <= INT4_INLINE_MAX_UNITS
    # Few K steps: the epilogue runs on every step's running sum in the unpredicated body (the output block
    # is written back only after the last one), where it overlaps the dot instead of adding a predicated pass.
    eager = n_k <= EAGER_EPILOGUE_MAX_K_STEPS

    def epilogue(cols: slice, y: jax.Array) -> None:
        y = y.astype(jnp.float32)
        if plan.variant.split_codes:  # [2 bm, cols]: the hi plane's rows, then the lo plane's
            rows = y.shape[0] // 2
            y = y[:rows] + y[rows:] * (1.0 / SPLIT_LO_STEPS)
        if x_codes:
            y = y * xs_ref[...]  # per-token scale, [bm, 1]
        if plan.scale_kind == "per-channel":
            y = y * scale_ref[:, cols]
        if bias_ref is not None:
            y = y + bias_ref[:, cols].astype(jnp.float32)
        o_ref[:, cols] = ACTIVATIONS[plan.activation](y).astype(o_ref.dtype)

    def accumulate(cols: slice, part: jax.Array, first: Any) -> None:
        """acc[:, cols] = part on the first K step, += part after; ``first`` static, or traced (k == 0)."""
        if first is True:
            acc_ref[:, cols] = part
        elif first is False:
            acc_ref[:, cols] += part
        else:
            acc_ref[:, cols] = part + jnp.where(first, jnp.zeros_like(part), acc_ref[:, cols])

    def step(valid_k: int | None, first: Any) -> None:
        x = x_tile()
        if valid_k is not None and not x_codes:
            x = _mask_cols(x, valid_k)  # x codes: those past K are 0 already
        w_src, folded = w_ref, False
        if plan.variant.w_dequant:  # a dequantized w tile in x's dtype (x codes: int8): int4, blockwise at large bm
            w_src = scratch[-1]
            folded = folds_scales  # blockwise scales are in the tile; per-channel ones stay for the epilogue
            if plan.int4 and not int4_inline:
                _unpack_int4_tile(w_ref, w_src, tile_scales, k * groups,
                                  256 if bn % 256 == 0 else 128, plan.bf16_scaling)
            elif not plan.int4:
                for g in range(groups):
                    rows = slice(g * SCALE_BLOCK, (g + 1) * SCALE_BLOCK)
                    w_src[rows, :] = _dequantized(w_ref[rows, :], scale_ref[pl.ds(k * groups + g, 1), :],
                                                  w_src.dtype, plan.bf16_scaling)
        # Column chunks keep the live [bm, chunk] partial sums small at decode-sized bm (no spills).
        for c0 in range(0, bn, plan.col_chunk):
            cols = slice(c0, c0 + plan.col_chunk)
            if int4_inline:  # this chunk's columns, unpacked right before its dot
                _unpack_int4_cols(w_ref, w_src, tile_scales, k * groups, cols, plan.bf16_scaling)
            w = w_src[:, cols]
            if not int_dot:
                w = mxu_operand(w, x.dtype, x.shape[0], bn)
                if valid_k is not None:
                    w = _mask_rows(w, valid_k)  # garbage past K times a zeroed x column can be NaN
            if not blockwise or folded:
                part = jnp.dot(x, w, preferred_element_type=out_type, precision=plan.precision)
                if n_k == 1:
                    epilogue(cols, part)
                elif first is True:  # the first K step's own copy (unaligned K)
                    acc_ref[:, cols] = part
                elif first is False:  # the last K step's own copy (unaligned K): the epilogue fused in
                    epilogue(cols, acc_ref[:, cols] + part)
                elif eager:  # every step: the sum so far is stored and also run through the epilogue
                    total = part + jnp.where(first, jnp.zeros_like(part), acc_ref[:, cols])
                    acc_ref[:, cols] = total
                    epilogue(cols, total)
                else:
                    accumulate(cols, part, first)
                continue
            used = groups if valid_k is None else tiling.cdiv(valid_k, SCALE_BLOCK)
            for g in range(used):  # one partial product per scale group, scaled and summed in f32
                rows = slice(g * SCALE_BLOCK, (g + 1) * SCALE_BLOCK)
                part = jnp.dot(x[:, rows], w[rows, :], preferred_element_type=out_type, precision=plan.precision)
                part = part.astype(jnp.float32) * scale_ref[pl.ds(k * groups + g, 1), cols]
                accumulate(cols, part, first if g == 0 else False)
            if n_k == 1:
                epilogue(cols, acc_ref[:, cols])

    _k_steps(step, k, n_k, k_tail)

    if n_k > 1 and (partial_groups or (k_tail is None and not eager)):
        @pl.when(k == n_k - 1)
        def _epilogue() -> None:
            for c0 in range(0, bn, plan.col_chunk):
                cols = slice(c0, c0 + plan.col_chunk)
                epilogue(cols, acc_ref[:, cols])


def _quantize_group(x_ref: Any, xq_ref: Any, xs_ref: Any, group: Any, *, n_k: int, bk: int,
                    k_tail: int | None, src_group: Any = None, split: bool = False,
                    bf16_codes: bool = False) -> None:
    """Per-token int8 codes of QUANT_ROWS rows (``group``) of a row block into xq_ref[:, rows, :] and their
    scales into xs_ref[rows, :], read from x_ref's group ``src_group`` (default ``group``: x_ref holds the whole
    row block; lookahead: x_ref holds a share of its groups). ``split``: two code planes (kernels.quant.
    split_int8_codes), the hi codes at those rows of xq_ref and the lo codes half its rows further down.
    ``bf16_codes``: the codes of bf16 x come from a bf16 product (kernels.quant.int8_codes_bf16; bf16 VPUs).

    A max |x| pass over the whole row into a [rows, width] running max in x's dtype (folded to 128 lanes and
    one cross-lane max at the end) and a codes pass, each over [rows, width] chunks of at most
    QUANT_CHUNK_BYTES of f32 (nothing spills); the passes over the K blocks are unrolled when short
    (straight-line code, no nested loop)."""
    rows = QUANT_ROWS
    width = _quant_chunk(rows, bk)
    k_valid = (n_k - 1) * bk + k_tail if k_tail is not None else None
    unrolled = n_k * (bk // width) <= QUANT_UNROLL_CHUNKS
    r0 = pl.multiple_of(group * rows, rows)
    src = r0 if src_group is None else src_group * rows

    def over_k(body: Any, init: Any) -> Any:
        if not unrolled:
            return jax.lax.fori_loop(0, n_k, body, init)
        for t in range(n_k):
            init = body(t, init)
        return init

    def chunk(t: Any, c0: int) -> jax.Array:  # x's dtype
        start = t * bk + c0
        if not isinstance(start, int):
            start = pl.multiple_of(start, tiling.LANES)
        v = x_ref[pl.ds(src, rows), pl.ds(start, width)]
        if k_valid is not None:
            col = jax.lax.broadcasted_iota(jnp.int32, v.shape, 1) + start
            v = jnp.where(col < k_valid, v, jnp.zeros_like(v))
        return v

    def amax_of(t: Any, acc: jax.Array) -> jax.Array:
        # In x's dtype (abs and max are exact in bf16): no widening pass, half the vregs on a bf16 VPU. The
        # running max is as wide as a chunk (one max per vreg); a [rows, 128] one took a relayout per 128 lanes.
        for c0 in range(0, bk, width):
            acc = jnp.maximum(acc, jnp.abs(chunk(t, c0)))
        return acc

    wide = over_k(amax_of, jnp.zeros((rows, width), x_ref.dtype))
    lanes = wide[:, :tiling.LANES]
    for l0 in range(tiling.LANES, width, tiling.LANES):
        lanes = jnp.maximum(lanes, wide[:, l0:l0 + tiling.LANES])
    lanes = lanes.astype(jnp.float32)
    inv, scale = (int8_scale_bf16 if bf16_codes else int8_scale)(jnp.max(lanes, axis=1, keepdims=True))
    xs_ref[pl.ds(r0, rows), :] = scale

    def codes(t: Any, c: Any) -> Any:
        for c0 in range(0, bk, width):
            if bf16_codes:  # |x inv| <= 127 as for f32 codes: no clip
                q = int8_codes_bf16(chunk(t, c0), inv, dtype=xq_ref.dtype)
                xq_ref[t, pl.ds(r0, rows), c0:c0 + width] = q
                continue
            v = chunk(t, c0).astype(jnp.float32)
            if split:
                hi, lo = split_int8_codes(v, inv, SPLIT_LO_STEPS)
                xq_ref[t, pl.ds(r0, rows), c0:c0 + width] = hi
                xq_ref[t, pl.ds(r0 + xq_ref.shape[1] // 2, rows), c0:c0 + width] = lo
                continue
            # inv is 127 / max|x| of these very rows: no clip needed (kernels/quant.py int8_codes).
            xq_ref[t, pl.ds(r0, rows), c0:c0 + width] = int8_codes(v, inv, clip=False, dtype=xq_ref.dtype)
        return c

    over_k(codes, 0)


def _unpack_int4_rows(w_ref: Any, wd_ref: Any, scale_ref: Any, group: Any, q: Any, cols: slice,
                      bf16_scaling: bool = False) -> None:
    """K rows [128q, 128q + 128) of a packed int4 tile (its byte rows [64q, 64q + 64), kernels/quant.py's nibble
    order) into wd_ref[128q:128q + 128, cols] in x's dtype: the bytes reinterpreted as int4 codes (a bitcast of
    the sublane-packed vregs, no shifts) and widened; a blockwise scale (scale_ref row ``group``) multiplied in
    f32, or with ``bf16_scaling`` (chips with a bf16 VPU) in bf16 on the widened codes (exact) and the scale row
    rounded to bf16: one more rounding (rel 2^-9) for half the VALU work; per-channel scales are left to the
    epilogue. ``q`` static or traced."""
    half = SCALE_BLOCK // 2
    src = slice(q * half, (q + 1) * half) if isinstance(q, int) else pl.ds(pl.multiple_of(q * half, half), half)
    dst = (slice(q * SCALE_BLOCK, (q + 1) * SCALE_BLOCK) if isinstance(q, int)
           else pl.ds(pl.multiple_of(q * SCALE_BLOCK, SCALE_BLOCK), SCALE_BLOCK))
    codes = pltpu.bitcast(w_ref[src, cols], jnp.int4)  # [128, cols] int4
    if scale_ref is None:
        wd_ref[dst, cols] = codes.astype(wd_ref.dtype)  # exact: |code| <= 8
    else:
        wd_ref[dst, cols] = _dequantized(codes, scale_ref[pl.ds(group, 1), cols], wd_ref.dtype, bf16_scaling)


def _dequantized(codes: jax.Array, scale: jax.Array, dtype: Any, bf16_scaling: bool) -> jax.Array:
    """Integer weight codes [rows, cols] times their [1, cols] f32 scale row, in ``dtype``: multiplied in f32, or
    with ``bf16_scaling`` in bf16 on the widened codes (exact for int8 and int4) with the scale rounded to bf16
    (one more rounding, rel 2^-9, for half the VALU work on a bf16 VPU)."""
    if bf16_scaling:
        return (codes.astype(jnp.bfloat16) * scale.astype(jnp.bfloat16)).astype(dtype)
    return (codes.astype(jnp.float32) * scale).astype(dtype)


def _unpack_int4_cols(w_ref: Any, wd_ref: Any, scale_ref: Any, first_group: Any, cols: slice,
                      bf16_scaling: bool = False) -> None:
    """Unpack columns ``cols`` of a [bk / 2, bn] packed int4 tile into wd_ref[:, cols] (x's dtype), unrolled over
    the 128-row scale groups and INT4_UNPACK_COLS-wide pieces (:func:`_unpack_int4_rows`)."""
    for q in range(2 * w_ref.shape[0] // SCALE_BLOCK):
        for c0 in range(cols.start, cols.stop, INT4_UNPACK_COLS):
            piece = slice(c0, min(c0 + INT4_UNPACK_COLS, cols.stop))
            _unpack_int4_rows(w_ref, wd_ref, scale_ref, first_group + q, q, piece, bf16_scaling)


def _unpack_int4_tile(w_ref: Any, wd_ref: Any, scale_ref: Any, first_group: Any, col_chunk: int,
                      bf16_scaling: bool = False) -> None:
    """Unpack a [bk / 2, bn] tile of packed int4 bytes into wd_ref [bk, bn] (x's dtype) in a loop over its
    128-row scale groups, col_chunk columns at a time (:func:`_unpack_int4_rows`)."""
    bn = w_ref.shape[1]

    def group(q: Any, carry: Any) -> Any:
        for c0 in range(0, bn, col_chunk):
            _unpack_int4_rows(w_ref, wd_ref, scale_ref, first_group + q, q, slice(c0, c0 + col_chunk), bf16_scaling)
        return carry

    jax.lax.fori_loop(0, 2 * w_ref.shape[0] // SCALE_BLOCK, group, 0)


def mxu_operand(w: jax.Array, x_dtype: Any, bm: int, bn: int) -> jax.Array:
    """The weight tile (of a [bm, bn] block's step) as the dot takes it: unchanged in x's dtype, fp8 as is where
    blocks.fp8_as_is says so, else converted to x's dtype (int8 / fp8 -> bf16 / f32 is exact)."""
    if w.dtype == x_dtype or fp8_as_is(x_dtype, w.dtype, bm, bn):
        return w
    return w.astype(x_dtype)


def _mask_cols(x: jax.Array, valid_k: int) -> jax.Array:
    """Zero the columns of x past K in the last K block (they hold whatever lies past the array's end)."""
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    return jnp.where(col < valid_k, x, jnp.zeros_like(x))


def _mask_rows(w: jax.Array, valid_k: int) -> jax.Array:
    """Zero the rows of w past K in the last K block (garbage times a zeroed x column can be NaN)."""
    row = jax.lax.broadcasted_iota(jnp.int32, w.shape, 0)
    return jnp.where(row < valid_k, w, jnp.zeros_like(w))


def _k_steps(step: Any, k: Any, n_k: int, k_tail: int | None) -> None:
    """Run ``step(valid_k, first)``: unmasked on full K blocks, masked to ``k_tail`` columns on the last when K
    is not a multiple of bk (two copies of the body under pl.when; each grid step runs one). ``first`` says
    whether the step is the first K step: static where the copy settles it, else the traced k == 0."""
    if n_k == 1:
        step(k_tail, True)
    elif k_tail is None:
        step(None, k == 0)
    else:
        pl.when(k < n_k - 1)(lambda: step(None, True if n_k == 2 else k == 0))
        pl.when(k == n_k - 1)(lambda: step(k_tail, False))


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def _check_inputs(x: Any, w: Any, bias: Any, w_scale: Any, activation: str, out_dtype: Any, quantize_x: bool,
                  int4: bool = False) -> None:
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected a 2-D [M, K] array, got shape {getattr(x, 'shape', None)}")
    if getattr(w, "ndim", None) != 2:
        raise ValueError(f"w: expected a 2-D [K, N] array, got shape {getattr(w, 'shape', None)}")
    m, k = x.shape
    if int4:
        _check_int4(w, w_scale, k)
    elif w.shape[0] != k:
        raise ValueError(f"w: shape {tuple(w.shape)} does not match x's K={k}; w must be [K, N] = [{k}, N]")
    n = w.shape[1]
    if 0 in (m, k, n):
        raise ValueError(f"x, w: empty matmul (M, K, N) = ({m}, {k}, {n}); every dimension must be >= 1")
    xd, wd = _dtype_name(x.dtype), "int8" if int4 else _dtype_name(w.dtype)
    if xd not in _FLOAT_INPUTS:
        raise ValueError(f"x: dtype {xd} not supported; use bfloat16 or float32 activations")
    quantized = wd == "int8" or wd in _FP8
    if not quantized and wd != xd:
        raise ValueError(f"w: dtype {wd} must match x ({xd}) or be int8 / float8_e4m3fn / float8_e5m2 (quantized)")
    if wd == "int8" and w_scale is None:
        raise ValueError("w_scale: int8 weights need per-output-channel scales, a float array of shape [N]")
    if w_scale is not None:
        if not quantized:
            raise ValueError(f"w_scale: only int8 / fp8 weights take scales; w is {wd}")
        groups = tiling.cdiv(k, SCALE_BLOCK)
        if tuple(w_scale.shape) not in ((n,), (groups, n)) or not jnp.issubdtype(w_scale.dtype, jnp.floating):
            raise ValueError(f"w_scale: expected a float array of shape ({n},) (per channel) or ({groups}, {n}) "
                             f"(one per {SCALE_BLOCK} rows of K), got {w_scale.dtype}{list(w_scale.shape)}")
    if quantize_x and wd != "int8":
        raise ValueError(f"quantize_x: the int8 MXU path needs int8 or packed int4 (w_dtype='int4') weights with "
                         f"w_scale; w is {wd}")
    if bias is not None and (tuple(bias.shape) != (n,) or not jnp.issubdtype(bias.dtype, jnp.floating)):
        raise ValueError(f"bias: expected a float array of shape ({n},), got {bias.dtype}{list(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation='{activation}' is not known; use one of {', '.join(ACTIVATIONS)}")
    if out_dtype is not None and _dtype_name(out_dtype) not in _FLOAT_INPUTS:
        raise ValueError(f"out_dtype: {_dtype_name(out_dtype)} not supported; use bfloat16 or float32")


def _check_int4(w: Any, w_scale: Any, k: int) -> None:
    rows = tiling.round_up(k, INT4_PACK_ROWS) // 2
    if _dtype_name(w.dtype) not in ("uint8", "int8") or w.shape[0] != rows:
        raise ValueError(f"w: w_dtype='int4' takes two codes per byte, a uint8/int8 array of shape [{rows}, N] "
                         f"(K={k} rounded up to {INT4_PACK_ROWS}, halved), got {_dtype_name(w.dtype)}"
                         f"{list(w.shape)}; pack [K, N] codes with kernels.quant.pack_int4")
    if w_scale is None:
        raise ValueError("w_scale: int4 weights need scales, [N] per channel or [cdiv(K, 128), N] blockwise")


def _check_fp8_support(chip: Any, x_name: str, w_dtype: Any) -> None:
    """fp8 weights need an fp8 MXU path: a native 'x x fp8' or 'fp8 x fp8' pair AND an fp8 matmul rate.

    The rate matters: tpu-v5e's spec lists fp8 pairs (Mosaic accepts the operands) but no fp8 MXU
    rate, so fp8 would run no faster than bf16 there; such chips are refused.
    """
    if _dtype_name(w_dtype) not in _FP8:
        return
    native = chip.supports_matmul(x_name, "fp8") or chip.supports_matmul("fp8", "fp8")
    if native and chip.matmul_rate("fp8") is not None:
        return
    rates = ", ".join(sorted(chip.compute.matmul_flops_per_s_per_chip))
    raise ValueError(
        f"w: {_dtype_name(w_dtype)} weights need an fp8 MXU path, which {chip.name} lacks (matmul rates: {rates}); "
        "use int8 weights with w_scale, or a chip whose spec has an fp8 rate and pair (e.g. tpu-v6e)"
    )


def _check_int8_mxu(chip: Any) -> None:
    """quantize_x needs an int8 x int8 MXU path: the pair in the chip's spec and an int8 matmul rate above bf16's.

    tpu-v4 runs int8 at the bf16 rate and Mosaic takes int8 only as the right-hand operand there; tpu-7x has
    no int8 rate at all. Both are refused rather than silently run the converted path.
    """
    if has_fast_int8_mxu(chip):
        return
    rates = ", ".join(sorted(chip.compute.matmul_flops_per_s_per_chip))
    raise ValueError(
        f"quantize_x: {chip.name} has no int8 x int8 MXU path faster than bf16 (matmul rates: {rates}); "
        "use quantize_x=False (bf16 activations x int8 weights), fp8 weights where the chip has them, "
        "or a chip with an int8 MXU (tpu-v5e, tpu-v5p, tpu-v6e)"
    )


def effective_block_sizes(blocks: MatmulBlockSizes, m: int, k: int, n: int, rows: int) -> MatmulBlockSizes:
    """Blocks clamped to the problem: bm to M rounded up to ``rows``, bk/bn to K/N rounded up to 128."""
    return MatmulBlockSizes(
        bm=min(blocks.bm, tiling.round_up(m, rows)),
        bk=min(blocks.bk, tiling.round_up(k, tiling.LANES)),
        bn=min(blocks.bn, tiling.round_up(n, tiling.LANES)),
    )


def matmul(
    x: jax.Array,
    w: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str = "none",
    w_scale: jax.Array | None = None,
    quantize_x: bool = False,
    w_dtype: str | None = None,
    block_sizes: MatmulBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
    out_dtype: Any = None,
) -> jax.Array:
    """``activation(x @ (w * w_scale) + bias)`` as one Pallas TPU kernel.

    Args:
      x: [M, K] bfloat16 or float32 activations.
      w: [K, N] weights: x's dtype, or int8 (w_scale required) or fp8 (w_scale optional). Any K: the last K
        block is masked in the kernel, nothing is padded or copied.
      bias: optional [N] float vector added after scaling.
      activation: "none", "relu", "gelu" (tanh approximation) or "silu".
      w_scale: scales of int8 / fp8 weights: [N] per output channel, or [cdiv(K, 128), N] blockwise (one per
        128 rows of K per output channel).
      quantize_x: int8 x int8 on the int8 MXU: x is quantized per token (symmetric, max |x| / 127) inside the
        kernel, once per row block, the dot accumulates in int32 and the per-token and per-channel scales are
        applied in the epilogue (blockwise: each 128-row group's int32 partial sum is scaled in f32; at bm > 128
        on chips whose MXU is deeper than a scale group, v6e, the codes are held in bf16, exactly, against bf16
        weights dequantized with their scales, on the bf16 MXU: blockwise_codes_on_bf16_mxu). Needs
        int8 weights, or packed int4 ones with ``w_dtype="int4"`` (w4a8: unpacked to int8 codes in VMEM), and a
        chip with an int8 MXU path (tpu-v5e, v5p, v6e; ValueError on v4 and 7x).
      w_dtype: None (w's own dtype) or "int4": w holds two int4 codes per byte, [round_up(K, 256) / 2, N]
        uint8/int8 as kernels.quant.pack_int4 lays them out (byte row r: K row 2r in the low nibble, 2r + 1 in
        the high one); unpacked tile by tile in VMEM to x's dtype (int8 with quantize_x); w_scale required
        ([N] or [cdiv(K, 128), N]); bk a multiple of 256.
      block_sizes: tile sizes; default from ``default_block_table()[chip]`` (tuned data) for the MXU operand
        dtypes ("int8 x int8" with quantize_x), its "... decode" entry when M <= 64 (blocks.DECODE_MAX_M).
      chip: TPU whose VMEM budget and fp8 / int8 support are checked (name, alias or spec path).
      interpret: run in Pallas TPU interpret mode (CPU) instead of compiling with Mosaic.
      out_dtype: output dtype (default x.dtype).

    Returns:
      [M, N] array of out_dtype. Raises ValueError naming the argument on bad input.
    """
    plan = make_plan(x, w, bias=bias, activation=activation, w_scale=w_scale, quantize_x=quantize_x, w_dtype=w_dtype,
                     block_sizes=block_sizes, chip=chip, out_dtype=out_dtype)
    return _matmul_jit(x, w, bias, w_scale, plan=plan, interpret=interpret)


def make_plan(x: Any, w: Any, *, bias: Any = None, activation: str = "none", w_scale: Any = None,
              quantize_x: bool = False, w_dtype: str | None = None, block_sizes: MatmulBlockSizes | None = None,
              chip: Any = DEFAULT_CHIP, out_dtype: Any = None) -> MatmulPlan:
    """Validate everything static about a :func:`matmul` call (ValueError naming the argument) and fix its plan:
    the blocks (the chip's tuned defaults unless given, clamped to the problem), the variant and the VMEM limit.
    Arrays are read for their shapes and dtypes only (jax.ShapeDtypeStruct will do)."""
    if w_dtype not in (None, "int4"):
        raise ValueError(f"w_dtype='{w_dtype}' is not known; use None (w's own dtype) or 'int4' (packed)")
    int4 = w_dtype == "int4"
    _check_inputs(x, w, bias, w_scale, activation, out_dtype, quantize_x, int4)
    spec = tiling.tpu_chip(chip)
    x_name = tiling.matmul_dtype_name(x.dtype)
    w_name = "int4" if int4 else tiling.matmul_dtype_name(w.dtype)
    _check_fp8_support(spec, x_name, w.dtype)
    if quantize_x:
        _check_int8_mxu(spec)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    scale_kind = scale_kind_of(w_scale)
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, "int8" if quantize_x else x_name, w_name, m=x.shape[0],
                                          blockwise=scale_kind == "per-block")
    elif not isinstance(block_sizes, MatmulBlockSizes):
        raise ValueError(f"block_sizes: expected a MatmulBlockSizes, got {type(block_sizes).__name__}")
    # bf16 x int4 at decode on an int8 MXU: x as two stacked int8 code planes (int4_decode_on_int8_mxu), run on the
    # quantize_x machinery (x codes) with twice the code rows; row blocks of whole 32-row code groups only (a
    # smaller bm given for the bf16 path keeps it).
    split_x = int4 and not quantize_x and block_sizes.bm % QUANT_ROWS == 0 and int4_decode_on_int8_mxu(
        spec, x.shape[0], lhs_dtype=x_name, rhs_dtype="int4", out_dtype=tiling.matmul_dtype_name(out_dtype),
        blockwise=scale_kind == "per-block")
    x_codes = quantize_x or split_x
    (m, k), n = x.shape, w.shape[1]
    rows = max(tiling.sublane_multiple(x.dtype), tiling.sublane_multiple(out_dtype),
               tiling.sublane_multiple(jnp.int8) if x_codes else 1)
    blocks = effective_block_sizes(block_sizes, m, k, n, rows)
    if int4:
        if block_sizes.bk % INT4_PACK_ROWS:
            raise ValueError(f"block_sizes: bk={block_sizes.bk} must be a multiple of {INT4_PACK_ROWS} with int4 "
                             f"weights (the packed K dimension is padded to {INT4_PACK_ROWS} rows); e.g. bk=512")
        blocks = MatmulBlockSizes(bm=blocks.bm, bk=min(block_sizes.bk, tiling.round_up(k, INT4_PACK_ROWS)),
                                  bn=blocks.bn)
    variant = call_variant(spec, m, k, n, blocks, x_codes=x_codes, int4=int4, scale_kind=scale_kind,
                           out_dtype=out_dtype, x_itemsize=x.dtype.itemsize, split_x=split_x)
    vmem_limit = block_sizes.check(  # int4: the packed tile counted as [bk, bn] int8 (twice its bytes)
        x_dtype=x.dtype, w_dtype=jnp.int8 if int4 else w.dtype, out_dtype=out_dtype, chip=spec, variant=variant,
        epilogue_vectors=(scale_kind == "per-channel") + (bias is not None),
    )
    return MatmulPlan(
        m=m, k=k, n=n, x_dtype=jnp.dtype(x.dtype).name, w_dtype=jnp.dtype(w.dtype).name, out_dtype=out_dtype.name,
        blocks=blocks, activation=activation, scale_kind=scale_kind, has_bias=bias is not None,
        quantize_x=quantize_x, int4=int4, variant=variant,
        each_j=x_codes and quantizes_each_column_block(spec, m, n, blocks),
        bf16_codes=quantize_x and quantizes_x_in_bf16(spec, x.dtype),
        bf16_scaling=(scale_kind == "per-block" and scales_in_bf16(spec)
                      and (variant.float_codes or (int4 and not x_codes and x.dtype == jnp.bfloat16))),
        vmem_limit_bytes=vmem_limit,
    )


def quantizes_x_in_bf16(chip: Any, x_dtype: Any) -> bool:
    """Whether quantize_x makes bf16 x's codes from a bf16 product (kernels.quant.int8_codes_bf16): on chips with a
    bf16 VPU (kernels.matmul.rules.quantizes_in_bf16, which the op model's count of the quantization's VPU ops asks
    too), where that is one multiply and one packing conversion per bf16 vreg instead of
    widening both halves to f32, multiplying and converting each (v6e, 8192^3 w8a8: the step's share of the next row
    block from about 1,300 to 690 bundles; 715 -> 670 us with the amax pass's change). matmul_reference(
    bf16_codes=...) computes the same."""
    spec = chip if hasattr(chip, "name") else tiling.tpu_chip(chip)  # a ChipSpec, or a name / alias / path
    return quantizes_in_bf16(spec, tiling.matmul_dtype_name(x_dtype))


def call_variant(chip: Any, m: int, k: int, n: int, blocks: MatmulBlockSizes, *, x_codes: bool, int4: bool,
                 scale_kind: str, out_dtype: Any, x_itemsize: int, split_x: bool = False) -> MatmulVariant:
    """What a call at these (effective) blocks adds to the plain kernel's VMEM: the resident x row, the x codes
    (``x_codes``: quantize_x's, two row blocks of them and the shared x fetch with lookahead), blockwise scale rows,
    a dequantized w tile. ``split_x``: bf16 x int4 as two stacked code planes of x (``x_codes`` then too)."""
    x_row = tiling.round_up(k, blocks.bk)
    # A small row block (decode) stays resident across the column blocks instead of being re-read per (j, kk).
    resident = keeps_x_resident(x_codes=x_codes, n=n, bm=blocks.bm, bn=blocks.bn, x_row=x_row, itemsize=x_itemsize)
    # (bm not a multiple of the 32-row group: MatmulBlockSizes.check refuses it.)
    lookahead = x_codes and blocks.bm % QUANT_ROWS == 0 and _lookahead(chip, m, n, k, blocks)
    share_rows = None
    if lookahead:
        steps = tiling.cdiv(n, blocks.bn) * tiling.cdiv(k, blocks.bk)
        share_rows = lookahead_share_groups(blocks.bm // QUANT_ROWS, steps) * QUANT_ROWS
    blockwise = scale_kind == "per-block"
    float_codes = x_codes and blockwise and blockwise_codes_on_bf16_mxu(
        chip, blocks.bm, out_dtype=tiling.matmul_dtype_name(out_dtype))
    return MatmulVariant(
        x_row=x_row if resident else None, x_codes=x_codes, code_slots=2 if lookahead else 1, split_codes=split_x,
        float_codes=float_codes, x_share_rows=share_rows, scale_rows=_scale_rows(blocks.bk, k) if blockwise else 0,
        w_dequant=int4 or float_codes or (blockwise and not x_codes and blocks.bm > PARTIAL_SCALING_MAX_BM))


def keeps_x_resident(*, x_codes: bool, n: int, bm: int, bn: int, x_row: int, itemsize: int) -> bool:
    """Whether the x row block [bm, x_row] stays in VMEM across the column blocks (fetched once per row block):
    always with x codes (they are made from the whole row), else when there is more than one column block and the
    row block is at most X_RESIDENT_MAX_BYTES (decode GEMMs)."""
    return x_codes or (tiling.cdiv(n, bn) > 1 and bm * x_row * itemsize <= X_RESIDENT_MAX_BYTES)


def quantizes_each_column_block(chip: Any, m: int, n: int, blocks: MatmulBlockSizes) -> bool:
    """quantize_x quantizes the row block at every column block's first K step, and the column blocks run
    "parallel", when the chip has more than one TensorCore and there is one row block and several column blocks
    (decode on megacore chips: the cores split the weight's columns instead of one core reading all of it; the
    repeated quantization of the few rows is VPU work under the steps' weight DMAs)."""
    return chip.cores.cores_per_chip > 1 and tiling.cdiv(m, blocks.bm) == 1 and tiling.cdiv(n, blocks.bn) > 1


def lookahead_share_groups(groups: int, steps: int) -> int:
    """32-row groups of the next row block a lookahead step quantizes (and fetches): the fewest that divide the
    row block's ``groups`` and cover them in ``steps`` steps (a divisor, so the shares tile the row block)."""
    return next(d for d in range(tiling.cdiv(groups, steps), groups + 1) if groups % d == 0)


def _lookahead(chip: Any, m: int, n: int, k: int, blocks: MatmulBlockSizes) -> bool:
    """quantize_x quantizes the next row block during the current one's steps (instead of all at once at the
    first step of each row block) when there is a next row block, a row block has at least 2 steps to spread
    it over, and the chip has one TensorCore (the row blocks then run in order; megacore chips split them)."""
    steps = tiling.cdiv(n, blocks.bn) * tiling.cdiv(k, blocks.bk)
    return tiling.cdiv(m, blocks.bm) > 1 and steps > 1 and chip.cores.cores_per_chip == 1


def _quant_chunk(rows: int, bk: int) -> int:
    """Columns of x quantized at a time: [rows, width] f32 of at most QUANT_CHUNK_BYTES, a multiple of 128 dividing
    bk."""
    width = max(tiling.LANES, QUANT_CHUNK_BYTES // (4 * rows) // tiling.LANES * tiling.LANES)
    while bk % width:
        width -= tiling.LANES
    return width


def _col_chunk(bm: int, bn: int) -> int:
    """Columns per partial product: the whole bn at large bm; at decode-sized bm, chunks whose [bm, chunk] f32
    partial sum is at most ACC_CHUNK_BYTES (multiples of 256, the widest MXU; at least 256)."""
    if bm > PARTIAL_SCALING_MAX_BM:
        return bn
    chunk = max(256, ACC_CHUNK_BYTES // (4 * bm) // 256 * 256)
    return bn if bn % chunk else min(bn, chunk)


def _scale_rows(bk: int, k: int) -> int:
    """Rows of the per-block scale block: whole K blocks of groups, rounded up to the 8-row f32 tile (the block
    runs past the array's cdiv(K, 128) rows; rows past K are never used)."""
    return tiling.round_up(tiling.cdiv(k, bk) * (bk // SCALE_BLOCK), tiling.SUBLANES_32BIT)


def cost_estimate(plan: MatmulPlan) -> pl.CostEstimate:
    """The kernel's CostEstimate: the perfmodel GEMM model's algorithmic counts (chip=None). quantize_x: int8 x
    codes made from x's dtype (bf16 x int4's two code planes at decode are counted as the bf16 x int4 GEMM)."""
    epilogue = (("bias",) if plan.has_bias else ()) + ((plan.activation,) if plan.activation != "none" else ())
    x_name = tiling.matmul_dtype_name(plan.x_dtype)
    return perf.gemm_cost(
        m=plan.m, n=plan.n, k=plan.k,
        lhs_dtype="int8" if plan.quantize_x else x_name,
        rhs_dtype="int4" if plan.int4 else tiling.matmul_dtype_name(plan.w_dtype),
        lhs_source_dtype=x_name if plan.quantize_x else None,
        out_dtype=tiling.matmul_dtype_name(plan.out_dtype), weight_scale=plan.scale_kind,
        scale_block=SCALE_BLOCK if plan.blockwise else None,
        epilogue=epilogue, chip=None,
    )


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _matmul_jit(x: jax.Array, w: jax.Array, bias: jax.Array | None, w_scale: jax.Array | None, *, plan: MatmulPlan,
                interpret: bool) -> jax.Array:
    m, k, n = plan.m, plan.k, plan.n
    bm, bk, bn = plan.blocks.bm, plan.blocks.bk, plan.blocks.bn
    # No padding copy: the last K block runs past K and the kernel masks it (plan.k_tail valid columns).
    n_i, n_k = plan.n_i, plan.n_k
    operands = [x, w]
    share_rows = plan.variant.x_share_rows
    if plan.lookahead:
        # Row block i + 1 arrives in shares of share_rows rows, one per step of row block i (the step that
        # quantizes it; steps past the last share keep it, and so does the last row block, which has no next
        # one), so no step fetches a whole row block. Row block 0 is its own single-buffered operand, fetched
        # once before the first step.
        shares, last_share = bm // share_rows, tiling.cdiv(m, share_rows) - 1

        def x_index(i: Any, j: Any, kk: Any) -> tuple[Any, int]:
            share = jnp.where(i + 1 < n_i, jnp.minimum(j * n_k + kk, shares - 1), shares - 1)
            return jnp.minimum(jnp.minimum(i + 1, n_i - 1) * shares + share, last_share), 0

        x_spec = pl.BlockSpec((share_rows, n_k * bk), x_index)
        x0_spec = pl.BlockSpec((bm, n_k * bk), lambda i, j, kk: (0, 0), pipeline_mode=pl.Buffered(1))
    elif plan.x_resident:
        # The whole row block, fetched once per i (its block index does not change with j or kk).
        x_spec = pl.BlockSpec((bm, n_k * bk), lambda i, j, kk: (i, 0))
    else:
        x_spec = pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk))
    w_rows = bk // 2 if plan.int4 else bk  # int4: two K rows per byte
    in_specs = [x_spec, pl.BlockSpec((w_rows, bn), lambda i, j, kk: (kk, j))]
    vector_spec = pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))
    if plan.scale_kind == "per-channel":
        operands.append(w_scale.astype(jnp.float32).reshape(1, n))
        in_specs.append(vector_spec)
    elif plan.scale_kind == "per-block":
        # All of K's scale rows for this column block (resident across kk); each step reads its groups.
        operands.append(w_scale.astype(jnp.float32))
        in_specs.append(pl.BlockSpec((plan.variant.scale_rows, bn), lambda i, j, kk: (0, j)))
    if plan.has_bias:
        operands.append(bias.reshape(1, n))
        in_specs.append(vector_spec)
    if plan.lookahead:
        operands.append(x)
        in_specs.append(x0_spec)
    code_rows = plan.code_rows  # split codes: the hi plane's rows, then the lo plane's
    scratch = [pltpu.VMEM((code_rows, bn), jnp.int32 if plan.int_acc else jnp.float32)]
    scratch_names = ["acc_ref"]
    if plan.variant.x_codes:
        codes = [pltpu.VMEM((n_k, code_rows, bk), jnp.dtype(code_dtype(float_codes=plan.variant.float_codes))),
                 pltpu.VMEM((bm, 1), jnp.float32)]
        scratch += codes
        scratch_names += ["xq_ref", "x_scale_ref"]
        if plan.lookahead:  # the next row block's, quantized ahead
            scratch += codes
            scratch_names += ["xq_next_ref", "x_scale_next_ref"]
    if plan.variant.w_dequant:  # in x's dtype; x codes: int8 codes (int4), bf16 (float_codes)
        scratch.append(pltpu.VMEM((bk, bn), jnp.dtype(w_dequant_dtype(plan.x_dtype, x_codes=plan.variant.x_codes,
                                                                      float_codes=plan.variant.float_codes))))
        scratch_names.append("w_dequant_ref")
    ref_names = (["x_ref", "w_ref"] + ["w_scale_ref"] * (w_scale is not None) + ["bias_ref"] * plan.has_bias
                 + ["x0_ref"] * plan.lookahead)
    kernel = with_ref_names(functools.partial(_matmul_kernel, plan=plan), ref_names + ["o_ref"] + scratch_names)
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(plan.out_dtype)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(n_i, plan.n_j, n_k),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=scratch,
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=plan.semantics,
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=cost_estimate(plan),
        interpret=interpret_params(interpret),
        name="matmul",
    )
    with jax.named_scope(f"matmul[{plan.blocks.label()}]"):
        return call(*operands)
