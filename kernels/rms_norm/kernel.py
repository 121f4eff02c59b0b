"""Fused residual add + RMSNorm (+ optional int8 quantization) for TPU (Pallas/Mosaic).

Per row of [tokens, hidden]: y = x + residual (in f32); out = y *
rsqrt(mean(y^2) + eps) * weight. The kernel also writes y (the residual
stream for the next layer) in residual's dtype, as a new buffer. With ``quantize=True``
out is stored as int8 with one f32 scale per row (out ~= q * scale).

Grid: one "parallel" axis over blocks of ``block_tokens`` whole rows. Tokens
need not divide the block: the last block runs partly out of bounds, rows are
independent, and Pallas drops the out-of-range writes. Hidden may be any size
(its block is the whole dimension).
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
from kernels.perf import DEFAULT_CHIP, resolve_chip
from kernels.quant import quantize_int8
from kernels.rms_norm.blocks import RmsNormBlockSizes, default_block_sizes

_FLOAT_INPUTS = ("float32", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class RmsNormPlan:
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the VMEM check, the pallas_call (grid, BlockSpecs, compiler params, cost estimate) and the kernel body.
    Hashable: the jitted function and the body take it as a static argument."""

    tokens: int
    hidden: int
    #: numpy dtype names of x, of residual (and the new residual) and of out (int8 when quantizing).
    x_dtype: str
    residual_dtype: str
    out_dtype: str
    eps: float
    #: out stored as int8 codes with one f32 scale per row.
    quantize: bool
    #: Rows per grid step: the blocks' block_tokens clamped to tokens rounded up to the row-blocked dtypes' sublane
    #: tile.
    block_tokens: int
    #: The raised scoped-VMEM limit the call compiles with (None: the chip's default).
    vmem_limit_bytes: int | None

    @property
    def n_blocks(self) -> int:
        """Row blocks (the one grid axis)."""
        return tiling.cdiv(self.tokens, self.block_tokens)


def _rms_norm_kernel(*refs: Any, plan: RmsNormPlan) -> None:
    """One grid step of ``plan``: refs x, residual, weight, then out (quantizing: q and scale), new residual."""
    x_ref, r_ref, w_ref = refs[:3]  # x_ref, r_ref: [bt, hidden]; w_ref: [1, hidden]
    if plan.quantize:
        q_ref, s_ref, y_ref = refs[3:]  # q_ref: [bt, hidden] int8; s_ref: [bt, 1] f32; y_ref: [bt, hidden]
    else:
        o_ref, y_ref = refs[3:]  # o_ref: [bt, hidden] x dtype; y_ref: [bt, hidden] residual dtype
    y = x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)
    y_ref[...] = y.astype(y_ref.dtype)
    ms = jnp.mean(y * y, axis=-1, keepdims=True)
    out = y * jax.lax.rsqrt(ms + plan.eps) * w_ref[...].astype(jnp.float32)
    if plan.quantize:
        q, scale = quantize_int8(out, axis=-1)
        q_ref[...] = q
        s_ref[...] = scale
    else:
        o_ref[...] = out.astype(o_ref.dtype)


def _check_inputs(x: Any, residual: Any, weight: Any, eps: Any) -> None:
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x: expected a 2-D [tokens, hidden] array, got shape {getattr(x, 'shape', None)}")
    if getattr(residual, "shape", None) != x.shape:
        raise ValueError(f"residual: shape {getattr(residual, 'shape', None)} must equal x's {x.shape}")
    tokens, hidden = x.shape
    if tokens == 0 or hidden == 0:
        raise ValueError(f"x: empty shape {x.shape}; tokens and hidden must be >= 1")
    if tuple(getattr(weight, "shape", ())) != (hidden,):
        raise ValueError(f"weight: expected shape ({hidden},), got {getattr(weight, 'shape', None)}")
    for name, arr in (("x", x), ("residual", residual)):
        if jnp.dtype(arr.dtype).name not in _FLOAT_INPUTS:
            raise ValueError(f"{name}: dtype {jnp.dtype(arr.dtype).name} not supported; use bfloat16 or float32")
    if not jnp.issubdtype(weight.dtype, jnp.floating):
        raise ValueError(f"weight: dtype {weight.dtype} must be floating point")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps={eps!r} must be a non-negative float (e.g. 1e-6)")


def rms_norm(
    x: jax.Array,
    residual: jax.Array,
    weight: jax.Array,
    *,
    eps: float = 1e-6,
    quantize: bool = False,
    block_sizes: RmsNormBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Fused ``y = x + residual; out = rms_norm(y) * weight`` as one Pallas TPU kernel.

    Args:
      x, residual: [tokens, hidden] bfloat16/float32 (same shape).
      weight: [hidden] float scale.
      eps: added to the mean square before the rsqrt.
      quantize: store out as int8 with per-row f32 scales.
      block_sizes: rows per grid step; default from ``DEFAULT_BLOCK_SIZES[chip]``
        (halved until it fits the chip's scoped VMEM for this hidden size).
      chip: TPU whose VMEM budget is checked.
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU).

    Returns:
      (out [tokens, hidden] in x.dtype, new_residual [tokens, hidden] in residual.dtype), or with
      quantize (out int8 [tokens, hidden], scales f32 [tokens], new_residual).
    """
    chip = resolve_chip(chip, interpret=interpret)
    plan = make_plan(x, residual, weight, eps=eps, quantize=quantize, block_sizes=block_sizes, chip=chip)
    return _rms_norm_jit(x, residual, weight, plan=plan, interpret=interpret)


def make_plan(x: Any, residual: Any, weight: Any, *, eps: float = 1e-6, quantize: bool = False,
              block_sizes: RmsNormBlockSizes | None = None, chip: Any = DEFAULT_CHIP) -> RmsNormPlan:
    """Validate everything static about a :func:`rms_norm` call (ValueError naming the argument) and fix its plan:
    the rows per grid step (the chip's tuned default fitted to the VMEM budget unless given, clamped to the
    problem) and the VMEM limit. Arrays are read for their shapes and dtypes only (jax.ShapeDtypeStruct will do)."""
    _check_inputs(x, residual, weight, eps)
    spec = tiling.tpu_chip(chip)
    tokens, hidden = x.shape
    out_dtype = jnp.dtype(jnp.int8 if quantize else x.dtype)
    dtypes = dict(hidden=hidden, x_dtype=x.dtype, residual_dtype=residual.dtype, out_dtype=out_dtype,
                  quantize=bool(quantize))
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name).fitted(**dtypes, chip=spec)
    elif not isinstance(block_sizes, RmsNormBlockSizes):
        raise ValueError(f"block_sizes: expected a RmsNormBlockSizes, got {type(block_sizes).__name__}")
    vmem_limit = block_sizes.check(**dtypes, chip=spec)
    rows = max(tiling.sublane_multiple(d) for d in (x.dtype, residual.dtype, out_dtype))
    return RmsNormPlan(
        tokens=tokens, hidden=hidden, x_dtype=jnp.dtype(x.dtype).name, residual_dtype=jnp.dtype(residual.dtype).name,
        out_dtype=out_dtype.name, eps=float(eps), quantize=bool(quantize),
        block_tokens=min(block_sizes.block_tokens, tiling.round_up(tokens, rows)), vmem_limit_bytes=vmem_limit,
    )


def cost_estimate(plan: RmsNormPlan) -> pl.CostEstimate:
    """The kernel's CostEstimate: perfmodel's fused residual-add RMSNorm model, algorithmic counts (chip=None).

    The model takes one activation dtype (x's) and prices quantize=True as an int8 output.
    """
    return perf.rms_norm_cost(
        tokens=plan.tokens, hidden=plan.hidden, dtype=tiling.matmul_dtype_name(plan.x_dtype), residual=True,
        out_dtype="int8" if plan.quantize else None, fused=True, chip=None,
    )


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _rms_norm_jit(
    x: jax.Array,
    residual: jax.Array,
    weight: jax.Array,
    *,
    plan: RmsNormPlan,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    tokens, hidden, block_tokens, quantize = plan.tokens, plan.hidden, plan.block_tokens, plan.quantize
    row_spec = pl.BlockSpec((block_tokens, hidden), lambda i: (i, 0))
    residual_out = jax.ShapeDtypeStruct((tokens, hidden), jnp.dtype(plan.residual_dtype))
    if quantize:
        out_shape = (
            jax.ShapeDtypeStruct((tokens, hidden), jnp.int8),
            jax.ShapeDtypeStruct((tokens, 1), jnp.float32),
            residual_out,
        )
        out_specs = (row_spec, pl.BlockSpec((block_tokens, 1), lambda i: (i, 0)), row_spec)
    else:
        out_shape = (jax.ShapeDtypeStruct((tokens, hidden), jnp.dtype(plan.out_dtype)), residual_out)
        out_specs = (row_spec, row_spec)
    out_names = ["q_ref", "scale_ref"] if quantize else ["o_ref"]
    ref_names = ["x_ref", "residual_ref", "weight_ref", *out_names, "new_residual_ref"]
    call = pl.pallas_call(
        with_ref_names(functools.partial(_rms_norm_kernel, plan=plan), ref_names),
        out_shape=out_shape,
        grid=(plan.n_blocks,),
        in_specs=[row_spec, row_spec, pl.BlockSpec((1, hidden), lambda i: (0, 0))],
        out_specs=out_specs,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=cost_estimate(plan),
        interpret=interpret_params(interpret),
        name="rms_norm",
    )
    with jax.named_scope(f"rms_norm[block_tokens={block_tokens}]"):
        outs = call(x, residual, weight.reshape(1, hidden))
    if quantize:
        q, scale, y = outs
        return q, scale[:, 0], y
    return outs
