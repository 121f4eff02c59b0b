"""The matmul kernel body, one (i, j, kk) grid step (:func:`_matmul_kernel`), and its in-kernel helpers: the
per-token quantization of x to int8 codes (:func:`_quantize_group`), the unpacking of int4 weight tiles and
the dequantization of blockwise-scaled ones in VMEM, the masking of the last K block past K, and the K-step
copies of the body (first, middle, last). Each output tile accumulates in an f32 (int32 with int8 codes and
per-channel scales) VMEM scratch across the K steps with no zeroing pass; int8 / fp8 weight tiles are converted
to x's dtype (or meet x's int8 codes on the int8 MXU) and the per-output-channel scale multiplies the
accumulator, which equals scaling the weights; the epilogue (scales, bias, activation, cast) runs on the product
itself with one K step, on every step's running sum with two, on the last K step with more."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import tiling
from kernels.matmul.blocks import fp8_as_is
from kernels.matmul.plan import QUANT_ROWS, MatmulPlan
from kernels.matmul.reference import ACTIVATIONS, SCALE_BLOCK
from kernels.matmul.rules import SPLIT_LO_STEPS
from kernels.quant import INT4_PACK_ROWS, int8_codes, int8_codes_bf16, int8_scale, int8_scale_bf16, split_int8_codes

#: quantize_activations quantizes each QUANT_ROWS-row group of x in column chunks of at most this many f32 bytes (16
#: vregs).
QUANT_CHUNK_BYTES = 64 << 10
#: ... and unrolls its pass over the K blocks when the row has at most this many chunks (else a loop over them).
QUANT_UNROLL_CHUNKS = 16
#: int4 tiles with at most this many (256 K rows x INT4_UNPACK_COLS columns) units are unpacked straight line.
INT4_INLINE_MAX_UNITS = 64
INT4_UNPACK_COLS = 256
#: Up to this many K steps the epilogue runs on every step (branch-free), above it once, on the last K step.
EAGER_EPILOGUE_MAX_K_STEPS = 2


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

    # float_codes: quantize_activations's codes are held in bf16 (exact) and meet a bf16 dequantized w tile on the bf16
    # MXU (blockwise scales at large bm on chips whose MXU is deeper than a scale group: blockwise_codes_on_bf16_mxu).
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


def _quant_chunk(rows: int, bk: int) -> int:
    """Columns of x quantized at a time: [rows, width] f32 of at most QUANT_CHUNK_BYTES, a multiple of 128 dividing
    bk."""
    width = max(tiling.LANES, QUANT_CHUNK_BYTES // (4 * rows) // tiling.LANES * tiling.LANES)
    while bk % width:
        width -= tiling.LANES
    return width
