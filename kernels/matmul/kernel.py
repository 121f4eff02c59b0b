"""Tiled GEMM for TPU (Pallas/Mosaic): out = act(x @ (w * w_scale) + bias), the public wrapper :func:`matmul`
and its jitted pallas_call. Grid (M/bm, N/bn, K/bk) with K innermost ("arbitrary") so each (i, j) output tile
accumulates in VMEM across the K steps; M and N are "parallel" (megacore chips split them across TensorCores)
unless x is quantized in the kernel (:attr:`MatmulPlan.semantics`). Weights are x's dtype, int8 or fp8 with
scales, or packed int4 (``w_dtype="int4"``, unpacked tile by tile in VMEM); ``quantize_activations`` quantizes x per
token to int8 codes in the kernel for the int8 MXU. Unaligned shapes are neither padded nor copied: the last K
block runs past K and the body (kernels/matmul/body.py) zeroes its x columns and w rows past K, the last M/N
blocks run partly out of bounds, Pallas drops their out-of-range writes, and garbage read there only reaches
dropped rows or columns of the output. The plan (kernels/matmul/plan.py) fixes everything static first."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import interpret_params, with_ref_names
from kernels import tiling
from kernels.matmul.blocks import MatmulBlockSizes, code_dtype, w_dequant_dtype
from kernels.matmul.body import _matmul_kernel
from kernels.matmul.plan import MatmulPlan, cost_estimate, make_plan
from kernels.perf import resolve_chip


def matmul(
    x: jax.Array,
    w: jax.Array,
    *,
    bias: jax.Array | None = None,
    activation: str = "none",
    w_scale: jax.Array | None = None,
    quantize_activations: bool = False,
    w_dtype: str | None = None,
    block_sizes: MatmulBlockSizes | None = None,
    chip: str | None = None,
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
      quantize_activations: int8 x int8 on the int8 MXU: x is quantized per token (symmetric, max |x| / 127) inside the
        kernel, once per row block, the dot accumulates in int32 and the per-token and per-channel scales are
        applied in the epilogue (blockwise: each 128-row group's int32 partial sum is scaled in f32; at bm > 128
        on chips whose MXU is deeper than a scale group, v6e, the codes are held in bf16, exactly, against bf16
        weights dequantized with their scales, on the bf16 MXU: blockwise_codes_on_bf16_mxu). Needs
        int8 weights, or packed int4 ones with ``w_dtype="int4"`` (w4a8: unpacked to int8 codes in VMEM), and a
        chip with an int8 MXU path (tpu-v5e, v5p, v6e; ValueError on v4 and 7x).
      w_dtype: None (w's own dtype) or "int4": w holds two int4 codes per byte, [round_up(K, 256) / 2, N]
        uint8/int8 as kernels.quant.pack_int4 lays them out (byte row r: K row 2r in the low nibble, 2r + 1 in
        the high one); unpacked tile by tile in VMEM to x's dtype (int8 with quantize_activations); w_scale required
        ([N] or [cdiv(K, 128), N]); bk a multiple of 256.
      block_sizes: tile sizes; default from ``default_block_table()[chip]`` (tuned data) for the MXU operand
        dtypes ("int8 x int8" with quantize_activations), its "... decode" entry when M <= 64 (blocks.DECODE_MAX_M).
      chip: TPU whose VMEM budget and fp8 / int8 support are checked (name, alias or spec path).
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU) instead of compiling with Mosaic.
      out_dtype: output dtype (default x.dtype).

    Returns:
      [M, N] array of out_dtype. Raises ValueError naming the argument on bad input.
    """
    chip = resolve_chip(chip, interpret=interpret)
    plan = make_plan(x, w, bias=bias, activation=activation, w_scale=w_scale,
                     quantize_activations=quantize_activations, w_dtype=w_dtype, block_sizes=block_sizes, chip=chip,
                     out_dtype=out_dtype)
    return _matmul_jit(x, w, bias, w_scale, plan=plan, interpret=interpret)


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
