"""Static plan of one matmul call (:class:`MatmulPlan`, built by :func:`make_plan`): the argument checks (each
a ValueError naming the argument; fp8 weights only on chips whose spec lists an fp8 MXU pair and an fp8 matmul
rate, int8 x int8 only on chips with an int8 MXU path faster than bf16), the blocks (the chip's tuned defaults
unless given, clamped to the problem: bm to M rounded up to the sublane tile, bk/bn to K/N rounded up to 128),
the code path the call takes (resident x row, per-token x codes and their lookahead, blockwise scale rows, a
dequantized w tile: :func:`call_variant`), its VMEM limit, and the ``pl.CostEstimate`` taken from perfmodel's
GEMM op model; the constants those decisions share with the kernel body live here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import perf, tiling
from kernels.matmul.blocks import MatmulBlockSizes, MatmulVariant, default_block_sizes
from kernels.matmul.reference import ACTIVATIONS, SCALE_BLOCK, scale_kind_of
from kernels.matmul.rules import (BLOCKWISE_PARTIAL_MAX_ROWS, blockwise_codes_on_bf16_mxu, has_bf16_vpu,
                                  has_fast_int8_mxu, int4_decode_on_int8_mxu, quantizes_in_bf16)
from kernels.perf import DEFAULT_CHIP
from kernels.quant import INT4_PACK_ROWS

_FLOAT_INPUTS = ("float32", "bfloat16")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
#: Largest x row block ([bm, K rounded up to bk]) kept resident in VMEM across the column blocks (decode GEMMs).
X_RESIDENT_MAX_BYTES = 2 << 20
#: Blockwise scales: up to this bm each 128-row group's partial product is scaled (bm x bn VPU work per group);
#: above it the w tile is dequantized once (bk x bn), which is cheaper when bm > 128 (weight-only; with
#: quantize_activations on chips where the codes go to the bf16 MXU, blockwise_codes_on_bf16_mxu). One number with the
#: op model's.
PARTIAL_SCALING_MAX_BM = BLOCKWISE_PARTIAL_MAX_ROWS
#: At bm <= PARTIAL_SCALING_MAX_BM the dot runs in column chunks whose f32 partial sum is at most this (16 vregs).
ACC_CHUNK_BYTES = 64 << 10
#: quantize_activations quantizes x QUANT_ROWS rows (the int8 sublane tile) at a time: its row blocks are whole groups.
QUANT_ROWS = 32


def scales_in_bf16(spec: Any) -> bool:
    """Whether int4 blockwise scales are multiplied in bf16 (on the widened codes) rather than f32 on ``spec`` (a
    ChipSpec): on chips with a bf16 VPU (kernels.matmul.rules.has_bf16_vpu, the spec's
    compiler.vpu_bf16_arithmetic). Compiled at the bench_matmul_variants problems, v6e's decode step drops from
    4,438 to 2,246 bundles and its 8192^3 prefill from 1.34 to 1.31 ms; v5e's decode step grows (3,411 -> 4,272)
    though its prefill shrinks, so it keeps f32."""
    return has_bf16_vpu(spec)


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
    #: The caller's quantize_activations: x quantized per token to int8 codes in the kernel (int8 x int8; w4a8 with
    #: int4).
    quantize_activations: bool
    #: Packed int4 weights (w_dtype="int4"), unpacked tile by tile in VMEM.
    int4: bool
    #: What the call adds to the plain kernel (and its VMEM): the resident x row, the x codes (quantize_activations's,
    #: or bf16 x int4's two code planes at decode: split_codes), the lookahead's shares, blockwise scale rows, a
    #: dequantized w tile.
    variant: MatmulVariant
    #: The x codes are made at every column block's first K step and the column blocks run "parallel"
    #: (:func:`quantizes_each_column_block`).
    each_j: bool
    #: quantize_activations's codes of bf16 x come from a bf16 product (:func:`quantizes_x_in_bf16`).
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
        """quantize_activations quantizes the next row block during the current one's steps, ``variant.x_share_rows``
        rows a step."""
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


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def _check_inputs(x: Any, w: Any, bias: Any, w_scale: Any, activation: str, out_dtype: Any, quantize_activations: bool,
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
    if quantize_activations and wd != "int8":
        raise ValueError(f"quantize_activations: the int8 MXU path needs int8 or packed int4 (w_dtype='int4') "
                         f"weights with w_scale; w is {wd}")
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
    """quantize_activations needs an int8 x int8 MXU path: the pair in the chip's spec and an int8 matmul rate above
    bf16's.

    tpu-v4 runs int8 at the bf16 rate and Mosaic takes int8 only as the right-hand operand there; tpu-7x has
    no int8 rate at all. Both are refused rather than silently run the converted path.
    """
    if has_fast_int8_mxu(chip):
        return
    rates = ", ".join(sorted(chip.compute.matmul_flops_per_s_per_chip))
    raise ValueError(
        f"quantize_activations: {chip.name} has no int8 x int8 MXU path faster than bf16 (matmul rates: {rates}); "
        "use quantize_activations=False (bf16 activations x int8 weights), fp8 weights where the chip has them, "
        "or a chip with an int8 MXU (tpu-v5e, tpu-v5p, tpu-v6e)"
    )


def effective_block_sizes(blocks: MatmulBlockSizes, m: int, k: int, n: int, rows: int) -> MatmulBlockSizes:
    """Blocks clamped to the problem: bm to M rounded up to ``rows``, bk/bn to K/N rounded up to 128."""
    return MatmulBlockSizes(
        bm=min(blocks.bm, tiling.round_up(m, rows)),
        bk=min(blocks.bk, tiling.round_up(k, tiling.LANES)),
        bn=min(blocks.bn, tiling.round_up(n, tiling.LANES)),
    )


def make_plan(x: Any, w: Any, *, bias: Any = None, activation: str = "none", w_scale: Any = None,
              quantize_activations: bool = False, w_dtype: str | None = None, block_sizes: MatmulBlockSizes | None =
              None, chip: Any = DEFAULT_CHIP, out_dtype: Any = None) -> MatmulPlan:
    """Validate everything static about a :func:`matmul` call (ValueError naming the argument) and fix its plan:
    the blocks (the chip's tuned defaults unless given, clamped to the problem), the variant and the VMEM limit.
    Arrays are read for their shapes and dtypes only (jax.ShapeDtypeStruct will do)."""
    if w_dtype not in (None, "int4"):
        raise ValueError(f"w_dtype='{w_dtype}' is not known; use None (w's own dtype) or 'int4' (packed)")
    int4 = w_dtype == "int4"
    _check_inputs(x, w, bias, w_scale, activation, out_dtype, quantize_activations, int4)
    spec = tiling.tpu_chip(chip)
    x_name = tiling.matmul_dtype_name(x.dtype)
    w_name = "int4" if int4 else tiling.matmul_dtype_name(w.dtype)
    _check_fp8_support(spec, x_name, w.dtype)
    if quantize_activations:
        _check_int8_mxu(spec)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    scale_kind = scale_kind_of(w_scale)
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, "int8" if quantize_activations else x_name, w_name, m=x.shape[0],
                                          blockwise=scale_kind == "per-block")
    elif not isinstance(block_sizes, MatmulBlockSizes):
        raise ValueError(f"block_sizes: expected a MatmulBlockSizes, got {type(block_sizes).__name__}")
    # bf16 x int4 at decode on an int8 MXU: x as two stacked int8 code planes (int4_decode_on_int8_mxu), run on the
    # quantize_activations machinery (x codes) with twice the code rows; row blocks of whole 32-row code groups only (a
    # smaller bm given for the bf16 path keeps it).
    split_x = int4 and not quantize_activations and block_sizes.bm % QUANT_ROWS == 0 and int4_decode_on_int8_mxu(
        spec, x.shape[0], lhs_dtype=x_name, rhs_dtype="int4", out_dtype=tiling.matmul_dtype_name(out_dtype),
        blockwise=scale_kind == "per-block")
    x_codes = quantize_activations or split_x
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
        quantize_activations=quantize_activations, int4=int4, variant=variant,
        each_j=x_codes and quantizes_each_column_block(spec, m, n, blocks),
        bf16_codes=quantize_activations and quantizes_x_in_bf16(spec, x.dtype),
        bf16_scaling=(scale_kind == "per-block" and scales_in_bf16(spec)
                      and (variant.float_codes or (int4 and not x_codes and x.dtype == jnp.bfloat16))),
        vmem_limit_bytes=vmem_limit,
    )


def quantizes_x_in_bf16(chip: Any, x_dtype: Any) -> bool:
    """Whether quantize_activations makes bf16 x's codes from a bf16 product (kernels.quant.int8_codes_bf16): on chips
    with a bf16 VPU (kernels.matmul.rules.quantizes_in_bf16, which the op model's count of the quantization's VPU ops
    asks too), where that is one multiply and one packing conversion per bf16 vreg instead of widening both halves
    to f32, multiplying and converting each (v6e, 8192^3 w8a8: the step's share of the next row block from about
    1,300 to 690 bundles; 715 -> 670 us with the amax pass's change). matmul_reference(bf16_codes=...) computes the
    same."""
    spec = chip if hasattr(chip, "name") else tiling.tpu_chip(chip)  # a ChipSpec, or a name / alias / path
    return quantizes_in_bf16(spec, tiling.matmul_dtype_name(x_dtype))


def call_variant(chip: Any, m: int, k: int, n: int, blocks: MatmulBlockSizes, *, x_codes: bool, int4: bool,
                 scale_kind: str, out_dtype: Any, x_itemsize: int, split_x: bool = False) -> MatmulVariant:
    """What a call at these (effective) blocks adds to the plain kernel's VMEM: the resident x row, the x codes
    (``x_codes``: quantize_activations's, two row blocks of them and the shared x fetch with lookahead), blockwise scale
    rows, a dequantized w tile. ``split_x``: bf16 x int4 as two stacked code planes of x (``x_codes`` then too)."""
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
    """quantize_activations quantizes the row block at every column block's first K step, and the column blocks run
    "parallel", when the chip has more than one TensorCore and there is one row block and several column blocks
    (decode on megacore chips: the cores split the weight's columns instead of one core reading all of it; the
    repeated quantization of the few rows is VPU work under the steps' weight DMAs)."""
    return chip.cores.cores_per_chip > 1 and tiling.cdiv(m, blocks.bm) == 1 and tiling.cdiv(n, blocks.bn) > 1


def lookahead_share_groups(groups: int, steps: int) -> int:
    """32-row groups of the next row block a lookahead step quantizes (and fetches): the fewest that divide the
    row block's ``groups`` and cover them in ``steps`` steps (a divisor, so the shares tile the row block)."""
    return next(d for d in range(tiling.cdiv(groups, steps), groups + 1) if groups % d == 0)


def _lookahead(chip: Any, m: int, n: int, k: int, blocks: MatmulBlockSizes) -> bool:
    """quantize_activations quantizes the next row block during the current one's steps (instead of all at once at the
    first step of each row block) when there is a next row block, a row block has at least 2 steps to spread
    it over, and the chip has one TensorCore (the row blocks then run in order; megacore chips split them)."""
    steps = tiling.cdiv(n, blocks.bn) * tiling.cdiv(k, blocks.bk)
    return tiling.cdiv(m, blocks.bm) > 1 and steps > 1 and chip.cores.cores_per_chip == 1


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
    """The kernel's CostEstimate: the perfmodel GEMM model's algorithmic counts (chip=None). quantize_activations:
    int8 x codes made from x's dtype (bf16 x int4's two code planes at decode are counted as the bf16 x int4
    GEMM)."""
    epilogue = (("bias",) if plan.has_bias else ()) + ((plan.activation,) if plan.activation != "none" else ())
    return perf.gemm_cost(
        m=plan.m, n=plan.n, k=plan.k,
        lhs_dtype=tiling.matmul_dtype_name(plan.x_dtype),
        rhs_dtype="int4" if plan.int4 else tiling.matmul_dtype_name(plan.w_dtype),
        quantize_activations=plan.quantize_activations,
        out_dtype=tiling.matmul_dtype_name(plan.out_dtype), weight_scale=plan.scale_kind,
        scale_block=SCALE_BLOCK if plan.blockwise else None,
        epilogue=epilogue, chip=None,
    )
