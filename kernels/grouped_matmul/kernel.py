"""Grouped matmul for mixture of experts (Pallas/Mosaic): ``out[r] = lhs[r] @ rhs[g]`` for the rows r of group g.

``lhs [M, K]`` holds the tokens sorted by expert, ``group_sizes [G]`` how many rows each expert owns (in order),
``rhs [G, K, N]`` one weight matrix per expert. A *visit* is one (group, row tile) pair: a row tile whose rows
all belong to one group is visited once; a tile straddling group boundaries is visited once per group in it, and
each visit stores only its group's rows (the others are masked and kept; the output block stays in VMEM across the
visits of its tile, since its block index does not change between them). An empty group has no visit, so its
weights are never read.

Grid ``(panels, steps, K/bk)``, K innermost with an f32 accumulator. The column blocks are split into *panels* of
``cols`` blocks each (the ``"parallel"`` axis); within a panel the steps go row tile by row tile, and for each row
tile column by column over its visits. ``cols = 1`` (every column block a panel) is column-major: each column block
sweeps all visits, the lhs is read once per column block and consecutive visits of one group share their weight
block when K is one block. ``cols > 1`` is row-major within the panel: a row tile's lhs rows (resident, [bm, K])
are read once per panel, the weights once per visit. :func:`panel_columns` picks the order with fewer HBM bytes.

The visit list is built in the jitted wrapper from ``group_sizes`` (a few jnp ops over G and the visit count) and
passed by scalar prefetch: per step its group, the lhs row tile, the output tile, its column block in the panel
and its mode (compute; zero, for a tile wholly past the groups' rows, which are written as zeros). The arrays
have room for ``cols * (cdiv(M, bm) + G - 1)`` steps (every tile once, plus once more per group boundary inside a
tile, per column of the panel); the grid's step dimension is dynamic, the count the sizes need, so entries past it
(mode no-op) never run. A zero visit's lhs and rhs blocks are those
of the step before it, so it copies nothing but its output tile. Weights are read from ``rhs`` in place: no copy
per call.

The body has one copy of the K step (the first K step starts the sum with a select, the last K block masks the
columns past K with a dynamic bound), so the compiler schedules one dot region rather than one per step kind.

Quantized weights (int8 with per-channel ``rhs_scale [G, N]``; fp8 where the chip has an fp8 MXU path) are
converted to lhs's dtype tile by tile in VMEM, and the scale multiplies the f32 accumulator. Unaligned K is masked
in the last K block as the bundled matmul does; partial M and N blocks run out of bounds and Pallas drops the
writes past the array.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import perf, tiling
from kernels.common import interpret_params, with_ref_names
from kernels.grouped_matmul.blocks import GroupedMatmulBlockSizes, default_block_sizes
from kernels.matmul.body import mxu_operand
from kernels.matmul.plan import X_RESIDENT_MAX_BYTES, _check_fp8_support
from kernels.perf import DEFAULT_CHIP, resolve_chip

_FLOAT_INPUTS = ("float32", "bfloat16")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
#: Visit modes (the scalar-prefetch ``mode`` array).
COMPUTE, ZERO, NOOP = 0, 1, 2


def num_visits(m: int, groups: int, bm: int) -> int:
    """Room in the visit list: every row tile once, plus one per group boundary inside a tile (the most any sizes
    need)."""
    return tiling.cdiv(m, bm) + groups - 1


def visit_metadata(group_sizes: jax.Array, *, m: int, bm: int) -> dict[str, jax.Array]:
    """The visit list as int32 arrays (the scalar-prefetch operands): ``group``, ``lhs_tile``, ``out_tile``,
    ``mode`` (room for :func:`num_visits` visits), ``bounds`` ([G + 1]: group g owns rows
    bounds[g]..bounds[g + 1] - 1; bounds[G] is the rows the groups hold) and ``used`` (a scalar: the visits the
    sizes need, compute and zero; the grid runs these)."""
    groups = group_sizes.shape[0]
    visits = num_visits(m, groups, bm)
    sizes = group_sizes.astype(jnp.int32)
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    total = ends[-1]
    first = starts // bm
    tiles = jnp.where(sizes > 0, (ends - 1) // bm - first + 1, 0)  # row tiles each group touches
    visit_end = jnp.cumsum(tiles)
    computed = visit_end[-1]
    used_tiles = (total + bm - 1) // bm
    v = jnp.arange(visits, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(visit_end, v, side="right"), groups - 1).astype(jnp.int32)
    tile = first[group] + v - (visit_end[group] - tiles[group])
    # Zero and no-op visits keep the last compute visit's group and lhs tile (their blocks are not re-fetched).
    last = jnp.maximum(computed - 1, 0)
    last_group = jnp.where(computed > 0, group[last], 0)
    last_tile = jnp.where(computed > 0, tile[last], 0)
    compute = v < computed
    zero = ~compute & (v < computed + tiling.cdiv(m, bm) - used_tiles)
    return {
        "group": jnp.where(compute, group, last_group),
        "lhs_tile": jnp.where(compute, tile, last_tile),
        # No-op visits stay on the last tile written (the last tile of the output, whether computed or zeroed).
        "out_tile": jnp.where(compute, tile, jnp.where(zero, used_tiles + v - computed, tiling.cdiv(m, bm) - 1)),
        "mode": jnp.where(compute, COMPUTE, jnp.where(zero, ZERO, NOOP)).astype(jnp.int32),
        "bounds": jnp.concatenate([jnp.zeros((1,), jnp.int32), ends]),
        # Visits the sizes need (compute and zero): the grid's dynamic visit count.
        "used": (computed + tiling.cdiv(m, bm) - used_tiles).astype(jnp.int32),
    }


def step_metadata(meta: dict[str, jax.Array], *, cols: int) -> dict[str, jax.Array]:
    """The per-step tables of a panel of ``cols`` column blocks from :func:`visit_metadata`'s per-visit ones:
    row tile by row tile (a run of consecutive visits with one output tile), and within a run column by column
    over its visits; ``col`` is the step's column block within the panel and ``used`` the steps the sizes need
    (``cols`` x the visits). ``cols = 1``: the visits themselves, in order."""
    visits = meta["mode"].shape[0]
    if cols == 1:
        return {**meta, "col": jnp.zeros((visits,), jnp.int32)}
    v = jnp.arange(visits, dtype=jnp.int32)
    used = meta["used"]
    tile = meta["out_tile"]
    new_run = (v == 0) | (tile != jnp.roll(tile, 1))
    start = jax.lax.cummax(jnp.where(new_run, v, 0))
    run = jnp.cumsum(new_run.astype(jnp.int32)) - 1
    length = jnp.zeros((visits,), jnp.int32).at[run].add((v < used).astype(jnp.int32))[run]
    jl = jnp.arange(cols, dtype=jnp.int32)
    # Step of (visit v, column jl): cols steps per visit of the runs before v's, then jl's pass over v's run.
    step = cols * start[:, None] + jl[None, :] * length[:, None] + (v - start)[:, None]
    size = cols * visits
    step = jnp.where((v < used)[:, None], step, size)  # no-op visits: dropped
    # Steps past the used ones keep the last visit (a no-op, or the last step run: no copy) and the last column.
    source = jnp.full((size,), visits - 1, jnp.int32).at[step.ravel()].set(
        jnp.broadcast_to(v[:, None], step.shape).ravel(), mode="drop")
    col = jnp.full((size,), cols - 1, jnp.int32).at[step.ravel()].set(
        jnp.broadcast_to(jl[None, :], step.shape).ravel(), mode="drop")
    past = jnp.arange(size, dtype=jnp.int32) >= cols * used
    return {"group": meta["group"][source], "lhs_tile": meta["lhs_tile"][source],
            "out_tile": meta["out_tile"][source],
            "mode": jnp.where(past, NOOP, meta["mode"][source]).astype(jnp.int32),
            "col": col, "bounds": meta["bounds"], "used": (cols * used).astype(jnp.int32)}


def panel_columns(chip: Any, *, m: int, k: int, n: int, groups: int, blocks: GroupedMatmulBlockSizes,
                  lhs_itemsize: int, rhs_itemsize: int) -> int:
    """Column blocks per panel: 1 (column-major) unless row-major panels of ``cdiv(N/bn, cores)`` blocks (one
    per TensorCore, so megacore chips still split the columns) read fewer HBM bytes, the M rows split evenly over
    the groups: column-major reads the lhs once per column block and the weights once per visit (once per group
    when K is one block: consecutive visits of a group share the block); row-major reads the lhs once per panel
    and the weights once per visit."""
    n_j, n_k = tiling.cdiv(n, blocks.bn), tiling.cdiv(k, blocks.bk)
    cols = tiling.cdiv(n_j, chip.cores.cores_per_chip)
    if cols == 1:
        return 1
    sizes = perf.uniform_group_sizes(m, groups)
    visits = perf.tile_visits(sizes, blocks.bm)
    lhs, weights = m * k * lhs_itemsize, k * n * rhs_itemsize
    column_major = n_j * lhs + (sum(1 for s in sizes if s) if n_k == 1 else visits) * weights
    row_major = tiling.cdiv(n_j, cols) * lhs + visits * weights
    return cols if row_major < column_major else 1


@dataclass(frozen=True, kw_only=True)
class GroupedMatmulPlan(tiling.GemmGrid):
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the VMEM check, the pallas_call (grid, BlockSpecs, compiler params, cost estimate) and the kernel body.
    Hashable: the jitted function and the body take it as a static argument."""

    m: int
    k: int
    n: int
    #: Experts (rhs's G).
    groups: int
    #: numpy dtype names of lhs, rhs and the output.
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    #: The blocks clamped to the problem (:func:`effective_block_sizes`).
    blocks: GroupedMatmulBlockSizes
    #: Per-channel weight scales (rhs_scale given).
    scaled: bool
    #: Column blocks per panel (:func:`call_order`): 1 is column-major.
    cols: int
    #: The lhs row block [bm, n_k * bk] stays in VMEM across the K steps and visits.
    lhs_resident: bool
    #: The raised scoped-VMEM limit the call compiles with (None: the chip's default).
    vmem_limit_bytes: int | None

    @property
    def panels(self) -> int:
        """Panels of ``cols`` column blocks (grid axis 0, "parallel"); the last may be a tail of fewer."""
        return tiling.cdiv(self.n_j, self.cols)

    @property
    def k_tail(self) -> int | None:
        """Valid columns of the last K block when bk does not divide K (the kernel masks the rest), else None."""
        return None if self.k % self.blocks.bk == 0 else self.k - (self.n_k - 1) * self.blocks.bk

    @property
    def precision(self) -> Any:
        """The dot's precision: HIGHEST for f32 lhs (bf16 splits), else DEFAULT."""
        return jax.lax.Precision.HIGHEST if self.lhs_dtype == "float32" else jax.lax.Precision.DEFAULT


def _step_mode(plan: GroupedMatmulPlan, mode_ref: Any, col_ref: Any, p: Any, s: Any) -> Any:
    """Step s of panel p's mode: a no-op where its column is past the last column block (the last panel's tail)."""
    if plan.n_j % plan.cols == 0:
        return mode_ref[s]
    return jnp.where(p * plan.cols + col_ref[s] < plan.n_j, mode_ref[s], NOOP)


def _grouped_kernel(group_ref: Any, lhs_tile_ref: Any, out_tile_ref: Any, mode_ref: Any, col_ref: Any,
                    bounds_ref: Any, *refs: Any, plan: GroupedMatmulPlan) -> None:
    """One (panel, step, kk) grid step of ``plan``. Refs: lhs ([bm, bk], or the resident [bm, n_k * bk] row
    block), rhs [bk, bn] of the step's group, [rhs_scale [1, bn]], out [bm, bn], acc [bm, bn] f32."""
    n_k, bk, k_tail = plan.n_k, plan.blocks.bk, plan.k_tail
    lhs_ref, rhs_ref = refs[:2]
    scale_ref = refs[2] if plan.scaled else None
    o_ref, acc_ref = refs[-2:]
    v, kk = pl.program_id(1), pl.program_id(2)
    mode = _step_mode(plan, mode_ref, col_ref, pl.program_id(0), v)

    @pl.when(mode == COMPUTE)
    def _step() -> None:
        # One copy of the body for every K step (no per-step variants: the compiler schedules one region).
        if plan.lhs_resident:
            x = lhs_ref[:, pl.ds(pl.multiple_of(kk * bk, tiling.LANES), bk)]
        else:
            x = lhs_ref[...]
        # int8 -> lhs dtype (exact); fp8 maybe as is
        w = mxu_operand(rhs_ref[...], x.dtype, x.shape[0], rhs_ref.shape[-1])
        if k_tail is not None:  # columns past K in the last K block (garbage there times zero can be NaN)
            valid = jnp.where(kk == n_k - 1, k_tail, bk)
            x = jnp.where(jax.lax.broadcasted_iota(jnp.int32, x.shape, 1) < valid, x, jnp.zeros_like(x))
            w = jnp.where(jax.lax.broadcasted_iota(jnp.int32, w.shape, 0) < valid, w, jnp.zeros_like(w))
        product = jnp.dot(x, w, preferred_element_type=jnp.float32, precision=plan.precision)
        if n_k == 1:
            acc_ref[...] = product
        else:  # the first K step starts the sum (a select, not a zeroing pass: the scratch may hold NaN)
            acc_ref[...] = jnp.where(kk == 0, jnp.zeros_like(product), acc_ref[...]) + product

    @pl.when((kk == n_k - 1) & (mode != NOOP))
    def _store() -> None:
        g = group_ref[v]
        y = acc_ref[...]
        if scale_ref is not None:
            y = y * scale_ref[...]
        bm = o_ref.shape[0]
        rows = out_tile_ref[v] * bm + jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        mine = (rows >= bounds_ref[g]) & (rows < bounds_ref[g + 1]) & (mode == COMPUTE)
        # Rows of other groups keep what their visits store; rows past every group are zeros.
        kept = jnp.where(rows < bounds_ref[plan.groups], o_ref[...], jnp.zeros_like(o_ref))
        o_ref[...] = jnp.where(mine, y.astype(o_ref.dtype), kept)


def _name(dtype: Any) -> str:
    return jnp.dtype(dtype).name


def _check_inputs(lhs: Any, rhs: Any, group_sizes: Any, rhs_scale: Any, out_dtype: Any) -> None:
    if getattr(lhs, "ndim", None) != 2:
        raise ValueError(f"lhs: expected a 2-D [M, K] array (rows sorted by group), got shape "
                         f"{getattr(lhs, 'shape', None)}")
    if getattr(rhs, "ndim", None) != 3:
        raise ValueError(f"rhs: expected a 3-D [G, K, N] array (one [K, N] matrix per group), got shape "
                         f"{getattr(rhs, 'shape', None)}")
    if getattr(group_sizes, "ndim", None) != 1 or _name(group_sizes.dtype) != "int32":
        raise ValueError(f"group_sizes: expected a 1-D int32 array [G], got "
                         f"{getattr(group_sizes, 'dtype', None)}{list(getattr(group_sizes, 'shape', ()))}")
    (m, k), (g, rk, n) = lhs.shape, rhs.shape
    if rk != k:
        raise ValueError(f"rhs: shape {tuple(rhs.shape)} does not match lhs's K={k}; rhs must be [G, {k}, N]")
    if group_sizes.shape[0] != g:
        raise ValueError(f"group_sizes: {group_sizes.shape[0]} groups but rhs holds {g} ([G, K, N]); give one size "
                         "per group")
    if 0 in (m, k, n, g):
        raise ValueError(f"lhs, rhs: empty grouped matmul (M, K, N, G) = ({m}, {k}, {n}, {g}); every dimension "
                         "must be >= 1")
    ld, rd = _name(lhs.dtype), _name(rhs.dtype)
    if ld not in _FLOAT_INPUTS:
        raise ValueError(f"lhs: dtype {ld} not supported; use bfloat16 or float32 activations")
    quantized = rd == "int8" or rd in _FP8
    if not quantized and rd != ld:
        raise ValueError(f"rhs: dtype {rd} must match lhs ({ld}) or be int8 / float8_e4m3fn / float8_e5m2")
    if rd == "int8" and rhs_scale is None:
        raise ValueError(f"rhs_scale: int8 weights need per-channel scales, a float array of shape [G, N] = [{g}, {n}]")
    if rhs_scale is not None:
        if not quantized:
            raise ValueError(f"rhs_scale: only int8 / fp8 weights take scales; rhs is {rd}")
        if tuple(rhs_scale.shape) != (g, n) or not jnp.issubdtype(rhs_scale.dtype, jnp.floating):
            raise ValueError(f"rhs_scale: expected a float array of shape ({g}, {n}) (per group and output channel), "
                             f"got {rhs_scale.dtype}{list(rhs_scale.shape)}")
    if out_dtype is not None and _name(out_dtype) not in _FLOAT_INPUTS:
        raise ValueError(f"out_dtype: {_name(out_dtype)} not supported; use bfloat16 or float32")


def _check_sizes(group_sizes: Any, m: int) -> None:
    """Concrete sizes (not under an outer jit): none negative, and they fit lhs's M rows."""
    if isinstance(group_sizes, jax.core.Tracer):
        return
    sizes = np.asarray(group_sizes)
    if (sizes < 0).any():
        raise ValueError(f"group_sizes: sizes must be >= 0, got {sizes[sizes < 0][0]} at group "
                         f"{int(np.argmax(sizes < 0))}")
    if int(sizes.sum()) > m:
        raise ValueError(f"group_sizes: they sum to {int(sizes.sum())} rows but lhs has M={m}; the groups must fit "
                         "in lhs's rows")


def effective_block_sizes(blocks: GroupedMatmulBlockSizes, m: int, k: int, n: int,
                          rows: int) -> GroupedMatmulBlockSizes:
    """Blocks clamped to the problem: bm to M rounded up to ``rows``, bk/bn to K/N rounded up to 128."""
    return GroupedMatmulBlockSizes(bm=min(blocks.bm, tiling.round_up(m, rows)),
                                   bk=min(blocks.bk, tiling.round_up(k, tiling.LANES)),
                                   bn=min(blocks.bn, tiling.round_up(n, tiling.LANES)))


def grouped_matmul(
    *,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    rhs_scale: jax.Array | None = None,
    block_sizes: GroupedMatmulBlockSizes | None = None,
    chip: str | None = None,
    interpret: bool = False,
    out_dtype: Any = None,
) -> jax.Array:
    """Grouped matmul (mixture of experts): ``out[r] = lhs[r] @ (rhs[g] * rhs_scale[g])`` for the rows of group g.

    Args:
      lhs: [M, K] bfloat16 or float32 rows sorted by group (group 0's rows first).
      rhs: [G, K, N] one weight matrix per group: lhs's dtype, int8 (rhs_scale required) or fp8 (rhs_scale
        optional; chips with an fp8 MXU path only). Any K: the last K block is masked in the kernel.
      group_sizes: [G] int32 rows per group (>= 0, in lhs's order, summing to at most M; rows past them come out
        as zeros). Checked when concrete.
      rhs_scale: [G, N] float per-channel scales of int8 / fp8 weights.
      block_sizes: tile sizes; default from ``default_block_table()[chip]`` (tuned data) for the operand dtypes,
        its "... decode" entry when M <= 64.
      chip: TPU whose VMEM budget and fp8 support are checked (name, alias or spec path).
        None (default): the TPU the call runs on (kernels.perf.resolve_chip).
      interpret: run in Pallas TPU interpret mode (CPU) instead of compiling with Mosaic.
      out_dtype: output dtype (default lhs's).

    Returns:
      [M, N] array of out_dtype. Raises ValueError naming the argument on bad input.
    """
    chip = resolve_chip(chip, interpret=interpret)
    plan = make_plan(lhs, rhs, group_sizes, rhs_scale=rhs_scale, block_sizes=block_sizes, chip=chip,
                     out_dtype=out_dtype)
    return _grouped_jit(lhs, rhs, group_sizes, rhs_scale, plan=plan, interpret=interpret)


def make_plan(lhs: Any, rhs: Any, group_sizes: Any, *, rhs_scale: Any = None,
              block_sizes: GroupedMatmulBlockSizes | None = None, chip: Any = DEFAULT_CHIP,
              out_dtype: Any = None) -> GroupedMatmulPlan:
    """Validate a :func:`grouped_matmul` call (ValueError naming the argument) and fix its plan: the blocks (the
    chip's tuned defaults unless given, clamped to the problem), the grid order and the VMEM limit. lhs, rhs and
    rhs_scale are read for their shapes and dtypes (jax.ShapeDtypeStruct will do); ``group_sizes`` is an array or a
    tracer, its values checked when concrete."""
    _check_inputs(lhs, rhs, group_sizes, rhs_scale, out_dtype)
    (m, k), n = lhs.shape, rhs.shape[2]
    _check_sizes(group_sizes, m)
    spec = tiling.tpu_chip(chip)
    lhs_name, rhs_name = tiling.matmul_dtype_name(lhs.dtype), tiling.matmul_dtype_name(rhs.dtype)
    try:  # the bundled matmul's fp8 rule, its message naming this kernel's arguments
        _check_fp8_support(spec, lhs_name, rhs.dtype)
    except ValueError as exc:
        raise ValueError("rhs" + str(exc).removeprefix("w").replace("w_scale", "rhs_scale")) from None
    out_dtype = jnp.dtype(lhs.dtype if out_dtype is None else out_dtype)
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name, lhs_name, rhs_name, m=lhs.shape[0])
    elif not isinstance(block_sizes, GroupedMatmulBlockSizes):
        raise ValueError(f"block_sizes: expected a GroupedMatmulBlockSizes, got {type(block_sizes).__name__}")
    rows = max(tiling.sublane_multiple(lhs.dtype), tiling.sublane_multiple(out_dtype))
    blocks = effective_block_sizes(block_sizes, m, k, n, rows)
    order = call_order(spec, m=m, k=k, n=n, groups=rhs.shape[0], blocks=blocks, lhs_dtype=lhs.dtype,
                       rhs_dtype=rhs.dtype, out_dtype=out_dtype, scaled=rhs_scale is not None)
    return GroupedMatmulPlan(m=m, k=k, n=n, groups=rhs.shape[0], lhs_dtype=jnp.dtype(lhs.dtype).name,
                             rhs_dtype=jnp.dtype(rhs.dtype).name, out_dtype=out_dtype.name, blocks=blocks,
                             scaled=rhs_scale is not None, cols=order.cols, lhs_resident=order.lhs_resident,
                             vmem_limit_bytes=order.vmem_limit_bytes)


@dataclass(frozen=True, kw_only=True)
class CallOrder:
    """How a call walks its grid: column blocks per panel (:func:`panel_columns`), whether the lhs row block
    [bm, round_up(K, bk)] stays resident across the K steps and visits, and the VMEM limit to compile with."""

    cols: int
    lhs_resident: bool
    vmem_limit_bytes: int | None


def call_order(chip: Any, *, m: int, k: int, n: int, groups: int, blocks: GroupedMatmulBlockSizes, lhs_dtype: Any,
               rhs_dtype: Any, out_dtype: Any, scaled: bool) -> CallOrder:
    """The order of a call with (clamped) ``blocks``: row-major panels where :func:`panel_columns` says so and the
    resident lhs row block fits the chip's VMEM, else column-major with a small row block (decode) resident; the
    blocks' VMEM check (ValueError naming block_sizes when they do not fit)."""
    lhs_dtype = jnp.dtype(lhs_dtype)
    lhs_row = tiling.round_up(k, blocks.bk)
    n_k = tiling.cdiv(k, blocks.bk)

    def check(resident: bool) -> int | None:
        return blocks.check(lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype, out_dtype=out_dtype, scaled=scaled, chip=chip,
                            lhs_row=lhs_row if resident else None)

    cols = panel_columns(chip, m=m, k=k, n=n, groups=groups, blocks=blocks, lhs_itemsize=lhs_dtype.itemsize,
                         rhs_itemsize=jnp.dtype(rhs_dtype).itemsize)
    if cols > 1:
        try:
            return CallOrder(cols=cols, lhs_resident=n_k > 1, vmem_limit_bytes=check(n_k > 1))
        except ValueError:  # the resident row block does not fit: column-major, which streams it
            pass
    # A small row block (decode) stays resident across the K steps and a tile's visits instead of being re-read.
    resident = n_k > 1 and blocks.bm * lhs_row * lhs_dtype.itemsize <= X_RESIDENT_MAX_BYTES
    return CallOrder(cols=1, lhs_resident=resident, vmem_limit_bytes=check(resident))


def cost_estimate(plan: GroupedMatmulPlan) -> pl.CostEstimate:
    """The kernel's CostEstimate: perfmodel's grouped GEMM model (chip=None) with the M rows split evenly over
    the G groups (the sizes are data; the estimate is made at trace time)."""
    name = tiling.matmul_dtype_name
    return perf.grouped_gemm_cost(group_sizes=perf.uniform_group_sizes(plan.m, plan.groups), n=plan.n, k=plan.k,
                                  m=plan.m, lhs_dtype=name(plan.lhs_dtype), rhs_dtype=name(plan.rhs_dtype),
                                  out_dtype=name(plan.out_dtype),
                                  weight_scale="per-channel" if plan.scaled else "none", chip=None)


@functools.partial(jax.jit, static_argnames=("plan", "interpret"))
def _grouped_jit(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, rhs_scale: jax.Array | None, *,
                 plan: GroupedMatmulPlan, interpret: bool) -> jax.Array:
    m, n, groups, cols = plan.m, plan.n, plan.groups, plan.cols
    bm, bk, bn = plan.blocks.bm, plan.blocks.bk, plan.blocks.bn
    n_k, n_j = plan.n_k, plan.n_j
    meta = step_metadata(visit_metadata(group_sizes, m=m, bm=bm), cols=cols)
    last_k = n_k - 1

    def kk_of(p: Any, s: Any, kk: Any, mode_ref: Any, col_ref: Any) -> Any:
        # Zero / no-op steps stay on the previous step's K block (no copy).
        return jnp.where(_step_mode(plan, mode_ref, col_ref, p, s) == COMPUTE, kk, last_k)

    def col_of(p: Any, s: Any, col_ref: Any) -> Any:
        # The step's column block (the last panel's steps past N stay on its last block).
        return p * cols + col_ref[s] if n_j % cols == 0 else jnp.minimum(p * cols + col_ref[s], n_j - 1)

    def rhs_col_of(p: Any, s: Any, mode_ref: Any, col_ref: Any) -> Any:
        # Zero / no-op steps stay on the panel's last column block, the last compute step's (no copy).
        if cols == 1:
            return p
        computing = _step_mode(plan, mode_ref, col_ref, p, s) == COMPUTE
        return jnp.where(computing, col_of(p, s, col_ref), jnp.minimum(p * cols + cols - 1, n_j - 1))

    if plan.lhs_resident:
        lhs_spec = pl.BlockSpec((bm, n_k * bk), lambda p, s, kk, g, lt, ot, mode, c, b: (lt[s], 0))
    else:
        lhs_spec = pl.BlockSpec((bm, bk), lambda p, s, kk, g, lt, ot, mode, c, b: (lt[s], kk_of(p, s, kk, mode, c)))
    rhs_spec = pl.BlockSpec((pl.Squeezed(), bk, bn),
                            lambda p, s, kk, g, lt, ot, mode, c, b: (g[s], kk_of(p, s, kk, mode, c),
                                                                     rhs_col_of(p, s, mode, c)))
    operands, in_specs = [lhs, rhs], [lhs_spec, rhs_spec]
    if plan.scaled:
        operands.append(rhs_scale.astype(jnp.float32).reshape(groups, 1, n))
        in_specs.append(pl.BlockSpec((pl.Squeezed(), 1, bn),
                                     lambda p, s, kk, g, lt, ot, mode, c, b: (g[s], 0, rhs_col_of(p, s, mode, c))))
    kernel = functools.partial(_grouped_kernel, plan=plan)
    names = ["group_ref", "lhs_tile_ref", "out_tile_ref", "mode_ref", "col_ref", "bounds_ref", "lhs_ref", "rhs_ref"]
    names += ["rhs_scale_ref"] * plan.scaled + ["o_ref", "acc_ref"]
    call = pl.pallas_call(
        with_ref_names(kernel, names),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.dtype(plan.out_dtype)),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=6,
            grid=(plan.panels, meta["used"], n_k),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((bm, bn), lambda p, s, kk, g, lt, ot, mode, c, b: (ot[s], col_of(p, s, c))),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=plan.vmem_limit_bytes),
        cost_estimate=cost_estimate(plan),
        interpret=interpret_params(interpret),
        name="grouped_matmul",
    )
    with jax.named_scope(f"grouped_matmul[{plan.blocks.label()}]"):
        return call(meta["group"], meta["lhs_tile"], meta["out_tile"], meta["mode"], meta["col"], meta["bounds"],
                    *operands)
