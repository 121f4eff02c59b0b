"""Tiled GEMM for TPU (Pallas/Mosaic): out = act(x @ (w * w_scale) + bias).

Grid (M/bm, N/bn, K/bk) with K innermost ("arbitrary") so each (i, j) output
tile accumulates in an f32 VMEM scratch across the K steps; M and N are
"parallel" (megacore chips split them across TensorCores). The epilogue
(per-output-channel weight scale, bias, activation, cast) runs once, on the
last K step.

Weights may be int8 (with per-output-channel f32 scales) or fp8 (e4m3fn /
e5m2, scales optional; only on chips whose spec lists an fp8 MXU pair and
an fp8 matmul rate); the
kernel converts each weight tile to the activation dtype and applies the
scale to the f32 accumulator, which equals scaling the weights because the
scale is per output column.

Unaligned shapes: blocks are first clamped to the problem (bm to M rounded up
to the sublane tile, bk/bn to K/N rounded up to 128). Nothing is padded or
copied: the last K block runs past K and the kernel zeroes its x columns and
w rows past K (only on that step); the last M/N blocks run partly out of
bounds, Pallas drops their out-of-range writes, and garbage read there only
reaches dropped rows or columns of the output.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import DEFAULT_CHIP, interpret_params, with_ref_names
from kernels import tiling
from kernels.matmul.blocks import MatmulBlockSizes, default_block_sizes
from kernels.matmul.reference import ACTIVATIONS

_FLOAT_INPUTS = ("float32", "bfloat16")
_FP8 = ("float8_e4m3fn", "float8_e5m2")


def _matmul_kernel(*refs: Any, n_k: int, k_tail: int | None, activation: str, has_scale: bool, has_bias: bool,
                   precision: Any) -> None:
    x_ref = refs[0]  # [bm, bk] x dtype (bf16/f32)
    w_ref = refs[1]  # [bk, bn] w dtype (same as x, or int8/fp8)
    rest = list(refs[2:])
    scale_ref = rest.pop(0) if has_scale else None  # [1, bn] f32, per output channel
    bias_ref = rest.pop(0) if has_bias else None  # [1, bn] bias dtype
    o_ref, acc_ref = rest  # o_ref: [bm, bn] out dtype; acc_ref: [bm, bn] f32 VMEM scratch
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def step(valid_k: int | None) -> None:
        x = x_ref[...]
        w = w_ref[...]
        if w.dtype != x.dtype:
            w = w.astype(x.dtype)  # int8 / fp8 -> activation dtype (exact)
        if valid_k is not None:
            x, w = _mask_k_tail(x, w, valid_k)
        acc_ref[...] += jnp.dot(x, w, preferred_element_type=jnp.float32, precision=precision)

    _k_steps(step, k, n_k, k_tail)

    @pl.when(k == n_k - 1)
    def _epilogue() -> None:
        y = acc_ref[...]
        if scale_ref is not None:
            y = y * scale_ref[...]
        if bias_ref is not None:
            y = y + bias_ref[...].astype(jnp.float32)
        o_ref[...] = ACTIVATIONS[activation](y).astype(o_ref.dtype)


def _mask_k_tail(x: jax.Array, w: jax.Array, valid_k: int) -> tuple[jax.Array, jax.Array]:
    """Zero the columns of x and rows of w past K in the last K block (they hold whatever lies past the arrays'
    ends: both are masked, since garbage times zero can be NaN)."""
    col = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    row = jax.lax.broadcasted_iota(jnp.int32, w.shape, 0)
    return jnp.where(col < valid_k, x, jnp.zeros_like(x)), jnp.where(row < valid_k, w, jnp.zeros_like(w))


def _k_steps(step: Any, k: Any, n_k: int, k_tail: int | None) -> None:
    """Run ``step(valid_k)``: unmasked on full K blocks, masked to ``k_tail`` columns on the last when K is not
    a multiple of bk (two copies of the body; each grid step runs one)."""
    if k_tail is None:
        step(None)
        return
    if n_k > 1:
        pl.when(k < n_k - 1)(lambda: step(None))
    pl.when(k == n_k - 1)(lambda: step(k_tail))


def _dtype_name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def _check_inputs(x: Any, w: Any, bias: Any, w_scale: Any, activation: str, out_dtype: Any) -> None:
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected a 2-D [M, K] array, got shape {getattr(x, 'shape', None)}")
    if getattr(w, "ndim", None) != 2:
        raise ValueError(f"w: expected a 2-D [K, N] array, got shape {getattr(w, 'shape', None)}")
    m, k = x.shape
    if w.shape[0] != k:
        raise ValueError(f"w: shape {tuple(w.shape)} does not match x's K={k}; w must be [K, N] = [{k}, N]")
    n = w.shape[1]
    if 0 in (m, k, n):
        raise ValueError(f"x, w: empty matmul (M, K, N) = ({m}, {k}, {n}); every dimension must be >= 1")
    xd, wd = _dtype_name(x.dtype), _dtype_name(w.dtype)
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
        if tuple(w_scale.shape) != (n,) or not jnp.issubdtype(w_scale.dtype, jnp.floating):
            raise ValueError(f"w_scale: expected a float array of shape ({n},), got {w_scale.dtype}{list(w_scale.shape)}")
    if bias is not None and (tuple(bias.shape) != (n,) or not jnp.issubdtype(bias.dtype, jnp.floating)):
        raise ValueError(f"bias: expected a float array of shape ({n},), got {bias.dtype}{list(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation='{activation}' is not known; use one of {', '.join(ACTIVATIONS)}")
    if out_dtype is not None and _dtype_name(out_dtype) not in _FLOAT_INPUTS:
        raise ValueError(f"out_dtype: {_dtype_name(out_dtype)} not supported; use bfloat16 or float32")


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
    block_sizes: MatmulBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
    out_dtype: Any = None,
) -> jax.Array:
    """``activation(x @ (w * w_scale[None, :]) + bias)`` as one Pallas TPU kernel.

    Args:
      x: [M, K] bfloat16 or float32 activations.
      w: [K, N] weights: x's dtype, or int8 (w_scale required) or fp8 (w_scale optional).
      bias: optional [N] float vector added after scaling.
      activation: "none", "relu", "gelu" (tanh approximation) or "silu".
      w_scale: [N] per-output-channel scales of int8 / fp8 weights.
      block_sizes: tile sizes; default from ``default_block_table()[chip]`` (tuned data) for the operand dtypes.
      chip: TPU whose VMEM budget and fp8 support are checked (name, alias or spec path).
      interpret: run in Pallas TPU interpret mode (CPU) instead of compiling with Mosaic.
      out_dtype: output dtype (default x.dtype).

    Returns:
      [M, N] array of out_dtype. Raises ValueError naming the argument on bad input.
    """
    _check_inputs(x, w, bias, w_scale, activation, out_dtype)
    spec = tiling.tpu_chip(chip)
    x_name = tiling.matmul_dtype_name(x.dtype)
    w_name = tiling.matmul_dtype_name(w.dtype)
    _check_fp8_support(spec, x_name, w.dtype)
    out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, x_name, w_name)
    elif not isinstance(block_sizes, MatmulBlockSizes):
        raise ValueError(f"block_sizes: expected a MatmulBlockSizes, got {type(block_sizes).__name__}")
    epilogue_vectors = (w_scale is not None) + (bias is not None)
    vmem_limit = block_sizes.check(
        x_dtype=x.dtype, w_dtype=w.dtype, out_dtype=out_dtype, epilogue_vectors=epilogue_vectors, chip=spec
    )
    (m, k), n = x.shape, w.shape[1]
    rows = max(tiling.sublane_multiple(x.dtype), tiling.sublane_multiple(out_dtype))
    blocks = effective_block_sizes(block_sizes, m, k, n, rows)
    return _matmul_jit(
        x, w, bias, w_scale,
        blocks=blocks, activation=activation, out_dtype=out_dtype,
        vmem_limit_bytes=vmem_limit, interpret=interpret,
    )


def cost_estimate(
    *, m: int, k: int, n: int, x_dtype: Any, w_dtype: Any, out_dtype: Any, activation: str, has_bias: bool,
    has_scale: bool,
) -> pl.CostEstimate:
    """The kernel's CostEstimate: the perfmodel GEMM model's algorithmic counts (chip=None)."""
    from perfmodel.model.core import to_cost_estimate
    from perfmodel.model.gemm import gemm

    epilogue = (("bias",) if has_bias else ()) + ((activation,) if activation != "none" else ())
    cost = gemm(
        m=m, n=n, k=k,
        lhs_dtype=tiling.matmul_dtype_name(x_dtype), rhs_dtype=tiling.matmul_dtype_name(w_dtype),
        out_dtype=tiling.matmul_dtype_name(out_dtype), weight_scale="per-channel" if has_scale else "none",
        epilogue=epilogue, chip=None,
    )
    return to_cost_estimate(cost)


@functools.partial(
    jax.jit, static_argnames=("blocks", "activation", "out_dtype", "vmem_limit_bytes", "interpret")
)
def _matmul_jit(
    x: jax.Array,
    w: jax.Array,
    bias: jax.Array | None,
    w_scale: jax.Array | None,
    *,
    blocks: MatmulBlockSizes,
    activation: str,
    out_dtype: Any,
    vmem_limit_bytes: int | None,
    interpret: bool,
) -> jax.Array:
    (m, k), n = x.shape, w.shape[1]
    bm, bk, bn = blocks.bm, blocks.bk, blocks.bn
    # No padding copy: the last K block runs past K and the kernel masks it (k_tail valid columns).
    n_k = tiling.cdiv(k, bk)
    k_tail = None if k % bk == 0 else k - (n_k - 1) * bk
    operands = [x, w]
    in_specs = [
        pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
        pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
    ]
    vector_spec = pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))
    if w_scale is not None:
        operands.append(w_scale.astype(jnp.float32).reshape(1, n))
        in_specs.append(vector_spec)
    if bias is not None:
        operands.append(bias.reshape(1, n))
        in_specs.append(vector_spec)
    precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
    kernel = functools.partial(
        _matmul_kernel, n_k=n_k, k_tail=k_tail, activation=activation, has_scale=w_scale is not None,
        has_bias=bias is not None, precision=precision,
    )
    ref_names = ["x_ref", "w_ref"] + ["w_scale_ref"] * (w_scale is not None) + ["bias_ref"] * (bias is not None)
    kernel = with_ref_names(kernel, ref_names + ["o_ref", "acc_ref"])
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(tiling.cdiv(m, bm), tiling.cdiv(n, bn), n_k),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"), vmem_limit_bytes=vmem_limit_bytes
        ),
        cost_estimate=cost_estimate(
            m=m, k=k, n=n, x_dtype=x.dtype, w_dtype=w.dtype, out_dtype=out_dtype, activation=activation,
            has_bias=bias is not None, has_scale=w_scale is not None,
        ),
        interpret=interpret_params(interpret),
        name="matmul",
    )
    with jax.named_scope(f"matmul[{blocks.label()}]"):
        return call(*operands)
