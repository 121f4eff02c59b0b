"""The bundled matmul's code-path rules: which MXU route a call takes on a chip (jax-free).

The kernel (kernels/matmul/kernel.py) picks its route with these, and perfmodel's GEMM model
(perfmodel.model.gemm) prices the same route by asking the same functions, so the two cannot disagree. A chip is
any object with a ChipSpec's fields (``compiler.vpu_bf16_arithmetic``, ``cores.mxu_dim``, ``matmul_rate``,
``supports_matmul``); dtypes are canonical names ("bf16", "int8", "int4", ...), as perfmodel.model.dtypes parses
them and kernels.tiling.matmul_dtype_name gives them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: K-block of per-block scales when none is given.
DEFAULT_SCALE_BLOCK = 128
#: Blockwise weight scales at up to this many rows (a decode-sized row block): the bundled matmul scales each scale
#: group's partial product (rows x N VPU work per group); above it, the weight tile once (K x N).
BLOCKWISE_PARTIAL_MAX_ROWS = 128


def has_bf16_vpu(chip: object | None) -> bool:
    """Whether the chip's VPU does bf16 elementwise arithmetic in bf16 (its spec's ``compiler.vpu_bf16_arithmetic``:
    the compiler emits vmul.bf16 / vmax.bf16 for bf16 operands on v6e and 7x; on v2-v5p bf16 elementwise math is
    widened to f32). False without a chip or where the spec leaves it null (GPUs)."""
    compiler = getattr(chip, "compiler", None)
    return bool(compiler is not None and compiler.vpu_bf16_arithmetic)


def quantizes_in_bf16(chip: object | None, source_dtype: str) -> bool:
    """Whether dynamic per-token int8 quantization of ``source_dtype`` activations makes its codes from a bf16
    product (bf16 activations on a chip with a bf16 VPU, :func:`has_bf16_vpu`): the bundled matmul's
    quantize_activations (kernels.quant.int8_codes_bf16) and the op model's count of its VPU ops both ask this."""
    return has_bf16_vpu(chip) and source_dtype == "bf16"


def has_fast_int8_mxu(chip: object) -> bool:
    """Whether the chip has an int8 x int8 MXU path faster than bf16 (the spec's pair and an int8 rate above
    bf16's): v5e, v5p, v6e; not v4 (int8 at the bf16 rate) or 7x (no int8 rate). The bundled matmul's
    quantize_activations check and :func:`int4_decode_on_int8_mxu` both ask this."""
    int8, bf16 = chip.matmul_rate("int8"), chip.matmul_rate("bf16")
    return bool(chip.supports_matmul("int8", "int8") and int8 is not None and (bf16 is None or int8 > bf16))


def _mxu_deeper_than(chip: object, scale_block: Any) -> bool:
    """Whether the chip's MXU array (cores.mxu_dim; 128 when the spec gives none) is deeper than a scale group, so
    that a group's partial dot fills only part of it."""
    mxu = getattr(getattr(chip, "cores", None), "mxu_dim", None) or 128
    return bool(mxu > np.max(scale_block))


#: bf16 activations against int4 weights at up to this many rows (decode) may run as two int8 code planes of the
#: activations on the int8 MXU (:func:`int4_decode_on_int8_mxu`).
SPLIT_X_MAX_ROWS = 64
#: The second code plane's step: lo = round((x / s - hi) * SPLIT_LO_STEPS), within +-127 since |x / s - hi| <= 1/2.
SPLIT_LO_STEPS = 254


def int4_decode_on_int8_mxu(chip: object | None, rows: Any, *, lhs_dtype: str, rhs_dtype: str, out_dtype: str,
                            blockwise: bool = False, scale_block: Any = DEFAULT_SCALE_BLOCK) -> bool:
    """Whether bf16 activations x int4 weights run as two int8 code planes of the activations stacked as rows, on
    the int8 MXU: per token s = max|x| / 127, hi = round(x / s), lo = round((x / s - hi) * 254), so
    x = s (hi + lo / 254) within max|x| / 64516 per element (the output's own bf16 rounding, rel 2^-9, is far
    coarser); the [2 rows, K] codes meet the int4 codes widened to int8 in one dot, out = s (top + bottom / 254).

    At decode a dot is bound by loading the weight tile into the MXU, which takes int8 twice as fast as bf16, and
    the doubled rows cost little (v5e: a 64-row bf16 x int4 step was 1.50x its packed tile's HBM time). True for
    bf16 x int4 with a bf16 output at up to :data:`SPLIT_X_MAX_ROWS` rows on chips with an int8 x int8 MXU path
    faster than bf16 (v5e, v5p, v6e), except with blockwise scales on an MXU deeper than a scale group (v6e):
    there each group's int8 partial product half fills the array and is scaled on the VPU (compiled, v6e
    64x4096x1024 blockwise steps: 2,246 bundles on the bf16 MXU, 3,799 split)."""
    if chip is None or not bool(np.all(np.asarray(rows) <= SPLIT_X_MAX_ROWS)):
        return False
    if blockwise and _mxu_deeper_than(chip, scale_block):
        return False
    if (lhs_dtype, rhs_dtype, out_dtype) != ("bf16", "int4", "bf16"):
        return False
    return has_fast_int8_mxu(chip)


def blockwise_codes_on_bf16_mxu(chip: object | None, rows: Any, scale_block: Any = DEFAULT_SCALE_BLOCK, *,
                                out_dtype: str = "bf16") -> bool:
    """Whether int8 x int8 (dynamically quantized activations) with blockwise weight scales runs as the int8 codes
    held in bf16 (exact: whole numbers up to 127) against bf16 weights dequantized with their scales, on the bf16
    MXU, rather than one int8 partial product per scale group scaled in f32.

    True for a bf16 output (its own rounding, rel 2^-9, is as coarse as the dequantized weights'; an f32 output
    keeps the exact int32 sums) on chips whose MXU is deeper than a scale group (v6e: 256 against 128 rows), for
    row blocks above :data:`BLOCKWISE_PARTIAL_MAX_ROWS`: a group's int8 dot fills half the array's depth there, so
    the int8 path runs at about the bf16 rate anyway (ESTIMATE from the array shape), and scaling the partial
    products costs
    about 3 VPU ops per output per group, about 3x the int8 MXU time at v6e's rates. Compiled at 8192^3 on v6e
    (libtpu 0.0.42.1): the partial products took 2.43 ms (4.06x the int8 MXU floor); the bf16 route is
    kernels/README.md's table. The bundled matmul and this model both take the rule from here."""
    if chip is None or out_dtype != "bf16":
        return False
    return _mxu_deeper_than(chip, scale_block) and bool(np.all(np.asarray(rows) > BLOCKWISE_PARTIAL_MAX_ROWS))
