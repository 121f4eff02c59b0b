"""GEMM: [batch, M, K] x [batch, K, N] with f32 accumulation and an optional fused epilogue.

Work model
----------
* MXU: ``2*M*N*K`` useful FLOPs per batch entry; issued FLOPs pad K and N to
  the MXU edge (128 or 256) and M to the sublane tile (8), times the passes of
  the dtype path (6 for fp32 emulated in bf16).
* VPU: converting operands without a native MXU path (per element, once:
  a lower bound; a tiled kernel that revisits a weight tile per M block
  converts it again), applying quantization scales, casting the f32
  accumulator to the output dtype, and the epilogue; all padded to the
  (8, 128) vreg tile.
* HBM: each operand, scale and output once (the ideal traffic of a kernel
  whose tiles fit VMEM); scales of quantized tensors are f32.
* Expected time only: one XLA op launch; the weight conversion (dequantization)
  sits on the critical path between the weights' DMA and the MXU, so its VPU
  time adds to the slowest unit's (``serial_vpu_ops``) -- this is what keeps
  int8 weights at ~1.3x, not 2x, of bf16 in an HBM-bound decode GEMM; the MXU
  share ramps with K and, on GPUs, loses to wave quantization
  (:mod:`perfmodel.model.efficiency`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from kernels.matmul.rules import (BLOCKWISE_PARTIAL_MAX_ROWS, DEFAULT_SCALE_BLOCK, blockwise_codes_on_bf16_mxu,
                                  int4_decode_on_int8_mxu, quantizes_in_bf16)
from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost
from perfmodel.model.efficiency import mxu_factor
from perfmodel.model.dtypes import DTYPES, SCALE_BYTES, is_quantized, matmul_path, parse_dtype
from perfmodel.model.elementwise import parse_epilogue
from perfmodel.model.shapes import Tiles, cdiv, chip_tiles, choice, fval, optional_size, round_up, sizes
from perfmodel.model.xla_ragged_dot import xla_ragged_dot_tiling

WEIGHT_SCALES = (None, "none", "per-channel", "per-block")
#: VPU ops per activation element of dynamic per-token int8 quantization: |x| and the running max (2), then
#: x * (1/scale), round, clip (2: min and max) and the narrowing convert (5) -- ESTIMATE, a count of the jnp ops
#: of kernels/quant.py, not a measurement.
DYNAMIC_QUANT_OPS_PER_ELEMENT = 7
#: The same with codes from a bf16 product on a bf16 VPU (:func:`quantizes_in_bf16`): |x| and the running max (2),
#: the bf16 multiply and the rounding, narrowing conversion (2) -- ESTIMATE from the compiled v6e loop (one 32 x 8192
#: group: 140 vmax + 128 vand + 128 vmul.bf16 + 64 vpack.c.bf16.s8 + 128 vcombine per 128 bf16 vregs), which runs
#: in about half the bundles of the f32 codes' (212 against 354).
DYNAMIC_QUANT_OPS_PER_ELEMENT_BF16 = 4


def mxu_issued_flops(m: Num, n: Num, k: Num, batch: Num, tiles: Tiles, passes: int = 1) -> np.ndarray:
    """FLOPs the MXU executes for [M,K]x[K,N]: K and N padded to the MXU edge, M to the sublane tile."""
    return 2.0 * batch * round_up(m, tiles.sublanes) * round_up(n, tiles.mxu) * round_up(k, tiles.mxu) * passes


def conversion_ops(rows: Num, cols: Num, count: Num, dtype: str, tiles: Tiles,
                   to: str = "bf16") -> tuple[np.ndarray, np.ndarray]:
    """(padded, unpadded) VPU ops to widen ``count`` arrays of [rows, cols] from dtype to MXU operand ``to``."""
    per = DTYPES[dtype].widen_ops(to)
    return count * tiles.vreg_elements(rows, cols) * per, count * np.asarray(rows) * cols * per


def resolve_weight_scale(rhs_dtype: str, weight_scale: str | None, scale_block: Num | None,
                         dtype_field: str = "rhs_dtype") -> tuple[str, np.ndarray]:
    """(scale kind, K-block) after defaults and checks: None -> per-channel for quantized weights, else none.
    ``dtype_field``: the name the caller's weight dtype goes by (in errors)."""
    choice("weight_scale", weight_scale, WEIGHT_SCALES)
    if weight_scale is None:
        weight_scale = "per-channel" if is_quantized(rhs_dtype) else "none"
    if weight_scale != "none" and not is_quantized(rhs_dtype):
        raise InputError(f"`weight_scale` {weight_scale}: weights of dtype {rhs_dtype} are not quantized; "
                         f"drop the flag or pick `{dtype_field}` int8/int4/fp8")
    if scale_block is not None and weight_scale != "per-block":
        raise InputError("`scale_block` applies only with `weight_scale` per-block")
    block = optional_size("scale_block", scale_block)
    return weight_scale, np.asarray(DEFAULT_SCALE_BLOCK) if block is None else block


def weight_scale_bytes(*, k: Num, n: Num, batch: Num, weight_scale: str, scale_block: Num) -> np.ndarray:
    """Bytes of f32 weight scales: one per output channel, or one per channel per K-block."""
    if weight_scale == "per-channel":
        return 1.0 * np.asarray(batch) * n * SCALE_BYTES
    if weight_scale == "per-block":
        return 1.0 * np.asarray(batch) * cdiv(k, scale_block) * n * SCALE_BYTES
    return np.zeros(())


def gemm(
    *,
    m: Num,
    n: Num,
    k: Num,
    batch: Num = 1,
    lhs_dtype: str = "bf16",
    rhs_dtype: str = "bf16",
    out_dtype: str = "bf16",
    weight_scale: str | None = None,
    scale_block: Num | None = None,
    epilogue: Sequence[str] | str = (),
    precision: str | None = None,
    quantize_activations: bool = False,
    chip: object | None = None,
) -> OpCost:
    """Cost of a (batched) GEMM; see the module docstring for what is counted.

    ``precision``: the dot's precision ("default", "high", "highest"; None = default), which sets the bf16
    passes of an fp32 matmul on a chip without an fp32 MXU rate (1, 3, 6; see
    :data:`perfmodel.model.dtypes.PRECISION_PASSES`).
    ``weight_scale``: None picks "per-channel" when rhs_dtype is quantized
    (int8/int4/fp8) and nothing otherwise; "per-block" uses ``scale_block``
    rows of K per scale (default 128). A quantized lhs carries one scale per
    row (per-token). ``quantize_activations``: the float lhs (read from HBM in ``lhs_dtype``) is quantized per
    token to int8 codes inside the kernel (dynamic activation quantization fused in, w8a8 / w4a8, as the bundled
    matmul's ``quantize_activations``): the int8 codes are the MXU operand, no lhs scales are read, and the VPU
    pays :data:`DYNAMIC_QUANT_OPS_PER_ELEMENT` per activation element. ``epilogue``: names from
    perfmodel.model.elementwise (bias, residual, relu, gelu, silu, ...). ``chip=None`` assumes native
    dtype paths and no padding (the counts for a pl.CostEstimate).
    """
    m, n, k, batch = sizes("m", m), sizes("n", n), sizes("k", k), sizes("batch", batch)
    lhs_read, rhs, out = parse_dtype(lhs_dtype, "`lhs_dtype`"), parse_dtype(rhs_dtype, "`rhs_dtype`"), parse_dtype(
        out_dtype, "`out_dtype`")
    if quantize_activations and is_quantized(lhs_read):
        raise InputError(f"`quantize_activations`: quantizes float activations to int8 codes in the kernel, but "
                         f"`lhs_dtype` {lhs_read} is quantized already; give the dtype read from HBM (e.g. "
                         f"`lhs_dtype` bf16) or drop `quantize_activations`")
    lhs = "int8" if quantize_activations else lhs_read  # the MXU's lhs operand
    weight_scale, block = resolve_weight_scale(rhs, weight_scale, scale_block)
    ep = parse_epilogue(epilogue)
    tiles = chip_tiles(chip)
    # Dynamically quantized activations against blockwise scales: the codes may go to the bf16 MXU instead.
    float_codes = (quantize_activations and weight_scale == "per-block"
                   and blockwise_codes_on_bf16_mxu(chip, m, block, out_dtype=out))
    # bf16 x int4 at decode: two int8 code planes of the activations on the int8 MXU (twice the rows issued).
    split = not quantize_activations and int4_decode_on_int8_mxu(
        chip, m, lhs_dtype=lhs, rhs_dtype=rhs, out_dtype=out, blockwise=weight_scale == "per-block",
        scale_block=block)
    path = matmul_path(chip, "bf16" if float_codes else "int8" if split else lhs, rhs, precision)

    useful = 2.0 * batch * m * n * k
    issued = mxu_issued_flops(2 * m if split else m, n, k, batch, tiles, path.passes)

    # Vector work as (padded, unpadded) pairs; padding = difference.
    out_padded, out_plain = batch * tiles.vreg_elements(m, n), batch * m * n
    vpu, vpu_plain = np.zeros(()), np.zeros(())
    if path.converts_lhs:
        p, u = conversion_ops(m, k, batch, lhs, tiles, path.lhs_fed)
        vpu, vpu_plain = vpu + p, vpu_plain + u
    serial = np.zeros(())
    if path.converts_rhs:
        p, u = conversion_ops(k, n, batch, rhs, tiles, path.rhs_fed)
        vpu, vpu_plain = vpu + p, vpu_plain + u
        serial = serial + p  # weights are dequantized between their DMA and the MXU: on the critical path
    notes = list(path.notes)
    if split:  # both planes' codes (the quantization's ops and as many again for the lo plane), the recombination
        vpu = vpu + (2 * DYNAMIC_QUANT_OPS_PER_ELEMENT * batch * tiles.vreg_elements(m, k) + 2 * out_padded)
        vpu_plain = vpu_plain + 2 * DYNAMIC_QUANT_OPS_PER_ELEMENT * batch * m * k + 2 * out_plain
        notes.append(f"{chip.name}: bf16 activations as two int8 code planes (hi, lo) stacked as rows on the int8 MXU "
                     f"(decode: loading int8 weight tiles into the MXU is twice as fast as bf16)")
    if float_codes:
        notes.append(f"{chip.name}: int8 activation codes held in bf16 against weights dequantized with their "
                     f"per-block scales, on the bf16 MXU (its {chip.cores.mxu_dim}-deep MXU is deeper than a scale "
                     f"block)")
    scale_bytes = weight_scale_bytes(k=k, n=n, batch=batch, weight_scale=weight_scale, scale_block=block)
    if weight_scale == "per-channel":
        vpu, vpu_plain = vpu + out_padded, vpu_plain + out_plain
    elif weight_scale == "per-block":
        groups = cdiv(k, block)
        if path.converts_rhs:  # scale folded into the dequantization of each weight element
            vpu, vpu_plain = vpu + batch * tiles.vreg_elements(k, n), vpu_plain + batch * k * n
            serial = serial + batch * tiles.vreg_elements(k, n)
        else:  # native quantized MXU path: each K-block's partial sum is scaled and added in f32
            vpu, vpu_plain = vpu + 2 * groups * out_padded, vpu_plain + 2 * groups * out_plain
            notes.append("per-block scales on a native quantized path: partial sums scaled per K block on the VPU")
    if quantize_activations:
        in_bf16 = quantizes_in_bf16(chip, lhs_read)
        ops = DYNAMIC_QUANT_OPS_PER_ELEMENT_BF16 if in_bf16 else DYNAMIC_QUANT_OPS_PER_ELEMENT
        vpu, vpu_plain = vpu + ops * batch * tiles.vreg_elements(m, k), vpu_plain + ops * batch * m * k
        notes.append("activations quantized per token in the kernel (max|x|, scale, round, clip)"
                     + (f"; {chip.name}: codes from a bf16 product on its bf16 VPU" if in_bf16 else ""))
    if is_quantized(lhs):
        if not quantize_activations:
            scale_bytes = scale_bytes + batch * m * SCALE_BYTES
        vpu, vpu_plain = vpu + out_padded, vpu_plain + out_plain
    if out != "fp32":
        vpu, vpu_plain = vpu + out_padded, vpu_plain + out_plain
    eup = np.zeros(())
    epilogue_bytes = np.zeros(())
    out_bytes = DTYPES[out].itemsize_bytes
    for e in ep:
        vpu, vpu_plain = vpu + e.vpu_ops * out_padded, vpu_plain + e.vpu_ops * out_plain
        eup = eup + e.eup_ops * out_padded
        if e.operand == "row":
            epilogue_bytes = epilogue_bytes + batch * n * out_bytes
        elif e.operand == "full":
            epilogue_bytes = epilogue_bytes + batch * m * n * out_bytes
    if ep:
        notes.append("epilogue fused: " + ", ".join(e.name for e in ep))
    if path.converts_rhs or path.converts_lhs:
        notes.append("conversion counted once per element (a lower bound; re-tiling converts again)")

    read = (batch * m * k * DTYPES[lhs_read].itemsize_bytes + batch * k * n * DTYPES[rhs].itemsize_bytes
            + scale_bytes + epilogue_bytes)
    write = batch * m * n * out_bytes
    return OpCost(
        name="gemm",
        mxu_flops=fval(issued),
        useful_flops=fval(useful),
        mxu_dtype=path.compute_dtype,
        vpu_ops=fval(vpu),
        vpu_padding_ops=fval(vpu - vpu_plain),
        serial_vpu_ops=fval(serial),
        eup_ops=fval(eup),
        hbm_read_bytes=fval(read),
        hbm_write_bytes=fval(write),
        launches=1,
        mxu_efficiency=fval(mxu_factor(chip, m=m, n=n, k=k, batch=batch)),
        notes=tuple(notes),
    )


# ----------------------------------------------------------------------------- grouped GEMM (mixture of experts)


def uniform_group_sizes(rows: int, groups: int) -> tuple[int, ...]:
    """``rows`` split over ``groups`` as evenly as whole rows allow: the first ``rows % groups`` groups get one
    more (e.g. 10 rows over 4 groups: 3, 3, 2, 2)."""
    rows, groups = int(sizes("m", rows, minimum=0)), int(sizes("groups", groups))
    light, heavy = divmod(rows, groups)
    return (light + 1,) * heavy + (light,) * (groups - heavy)


def group_size_list(group_sizes: Sequence[int] | str, field: str = "group_sizes") -> np.ndarray:
    """Group sizes (rows per group, >= 0, at least one group) from a sequence or text like ``"3,0,5"``."""
    if isinstance(group_sizes, str):
        try:
            group_sizes = [int(v) for v in group_sizes.split(",")]
        except ValueError:
            raise InputError(f"`{field}`: expected comma-separated whole numbers of rows, e.g. 512,0,1536, "
                             f"got {group_sizes!r}") from None
    arr = sizes(field, group_sizes, minimum=0).reshape(-1)
    if not np.any(arr > 0):
        raise InputError(f"`{field}`: every group is empty; give at least one group a row")
    return arr


def tile_visits(group_sizes: Sequence[int], block_m: int) -> int:
    """Row tiles a grouped matmul computes: each group's rows (consecutive, in order) cover whole ``block_m``-row
    tiles, and a tile that holds rows of several groups is computed once per group in it (empty groups: none).

    E.g. sizes 3, 0, 5 over 4-row tiles: rows 0-2 (tile 0), rows 3-7 (tiles 0 and 1): 3 visits.
    """
    ends = np.cumsum(np.asarray(group_sizes, dtype=np.int64))
    starts = ends - np.asarray(group_sizes, dtype=np.int64)
    used = ends > starts
    return int(np.sum(((ends - 1) // block_m - starts // block_m + 1)[used]))


def grouped_gemm(
    *,
    group_sizes: Sequence[int] | str,
    n: int,
    k: int | None = None,
    m: int | None = None,
    lhs_dtype: str = "bf16",
    rhs_dtype: str = "bf16",
    out_dtype: str = "bf16",
    weight_scale: str | None = None,
    scale_block: int | None = None,
    block_m: int | None = None,
    implementation: str = "kernel",
    ragged: str = "rows",
    chip: object | None = None,
) -> OpCost:
    """Grouped GEMM (mixture of experts): rows of ``lhs [m, k]`` sorted by group, group g's rows times
    ``rhs[g] [k, n]`` (megablox's gmm; the bundled ``kernels/grouped_matmul``). ``ragged`` "contraction": the
    groups split the contracting dimension instead (the weight gradient, megablox's tgmm): ``k`` rows sorted by
    group, out[g] = lhs[rows of g]^T @ rhs[rows of g], [m, n] per group (:func:`ragged_contraction`).

    ``implementation``: "kernel" (a grouped-GEMM kernel: megablox, tokamax, the bundled one) or "xla"
    (``jax.lax.ragged_dot`` as XLA lowers it: its own Mosaic ragged-dot kernel with the tiles XLA picks,
    :mod:`perfmodel.model.xla_ragged_dot`: every visited row tile computed at full width, lhs read once per
    column tile; a chip without that model is priced as a kernel, with a note).

    The work of a GEMM per non-empty group (:func:`gemm`, one batch entry per group of each size): each touched
    group's weights (and scales) are read once, an empty group costs nothing, each row of lhs is read and each
    row of the output written once. ``m``: rows of lhs and out (default: the sum of the sizes; rows past the
    groups are written as zeros). ``block_m``: the kernel's row tile: the MXU then issues ``block_m`` rows for
    every tile a group touches (:func:`tile_visits`; a tile straddling a group boundary is computed once per
    group, its other rows masked); None: each group padded to the sublane tile only.
    """
    if implementation not in ("kernel", "xla"):
        raise InputError(f"`implementation` '{implementation}': one of kernel (a grouped-GEMM kernel), xla "
                         "(jax.lax.ragged_dot lowered by XLA)", fields=("implementation",))
    if ragged not in RAGGED_DIMS:
        raise InputError(f"`ragged` '{ragged}': one of rows (the groups split lhs's rows), contraction (they "
                         "split the contracting dimension: a weight gradient)", fields=("ragged",))
    if ragged == "contraction":
        if block_m is not None:
            raise InputError("`block_m` is a row tile of the rows-ragged form; drop it with `ragged` contraction",
                             fields=("block_m", "ragged"))
        if m is None:
            raise InputError("`m`: with `ragged` contraction, the rows of each group's [m, n] output (lhs's "
                             "other dimension)", fields=("m",))
        return ragged_contraction(group_sizes=group_sizes, m=m, n=n, k=k, lhs_dtype=lhs_dtype,
                                  rhs_dtype=rhs_dtype, out_dtype=out_dtype, implementation=implementation, chip=chip)
    if k is None:
        raise InputError("`k`: the contraction of every group's GEMM", fields=("k",))
    if implementation == "xla" and block_m is not None:
        raise InputError("`block_m` is a grouped-GEMM kernel's row tile; with `implementation` xla, XLA picks "
                         "its own tiles (drop block_m)", fields=("block_m", "implementation"))
    rows = group_size_list(group_sizes)
    total = int(rows.sum())
    out_rows = total if m is None else int(sizes("m", m))
    if out_rows < total:
        raise InputError(f"`group_sizes` sum to {total} rows, more than `m`={out_rows}; "
                         "the groups must fit in lhs's rows (drop rows or raise m)")
    first, total_fields, notes = _sum_of_group_gemms(rows, lambda s, c: gemm(
        m=s, n=n, k=k, batch=c, lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype, out_dtype=out_dtype,
        weight_scale=weight_scale, scale_block=scale_block, chip=chip))
    extra_rows = out_rows - total
    if extra_rows:
        total_fields["hbm_write_bytes"] += extra_rows * n * DTYPES[parse_dtype(out_dtype)].itemsize_bytes
    if block_m is not None:
        block = int(sizes("block_m", block_m))
        visits = tile_visits(rows, block)
        tiles = chip_tiles(chip)
        path = matmul_path(chip, parse_dtype(lhs_dtype), parse_dtype(rhs_dtype))
        total_fields["mxu_flops"] = fval(mxu_issued_flops(visits * block, n, k, 1, tiles, path.passes))
        notes += (f"{visits} row tiles of {block} issued (tiles straddling groups computed once per group)",)
    efficiency = first.mxu_efficiency
    metrics = _group_metrics(rows)
    if implementation == "xla":
        lhs_b, rhs_b, out_b = (DTYPES[parse_dtype(d)].itemsize_bytes for d in (lhs_dtype, rhs_dtype, out_dtype))
        tiling = xla_ragged_dot_tiling(chip, m=out_rows, k=int(k), n=int(n), lhs_itemsize=lhs_b,
                                       rhs_itemsize=rhs_b, out_itemsize=out_b)
        if tiling is None:
            notes += ("implementation xla: no model of XLA's ragged-dot kernel for this chip; priced as a "
                      "grouped-GEMM kernel",)
        else:
            visits = tile_visits(rows, tiling.tile_m)
            path = matmul_path(chip, parse_dtype(lhs_dtype), parse_dtype(rhs_dtype))
            total_fields["mxu_flops"] = fval(mxu_issued_flops(
                visits * tiling.tile_m, tiling.n_tiles * tiling.tile_n, tiling.k_tiles * tiling.tile_k, 1,
                chip_tiles(chip), path.passes))
            # Every column tile reads all of lhs again; each group's weights are read once in all.
            total_fields["hbm_read_bytes"] += fval((tiling.n_tiles - 1) * total * int(k) * lhs_b)
            steps = visits * tiling.n_tiles * tiling.k_tiles
            metrics.update(tile_m=tiling.tile_m, tile_k=tiling.tile_k, tile_n=tiling.tile_n, grid_steps=steps)
            notes += (f"implementation xla: XLA's ragged-dot kernel, tiles {tiling.tile_m} x {tiling.tile_k} x "
                      f"{tiling.tile_n} (rows x K x columns): {visits} row-tile visits x {tiling.n_tiles} column "
                      f"tile(s) x {tiling.k_tiles} K tile(s), lhs read once per column tile",)
    return dataclasses.replace(first, name="grouped_gemm", notes=notes, **total_fields, mxu_efficiency=efficiency,
                               metrics=metrics)


def _sum_of_group_gemms(rows: np.ndarray, gemm_of: Any) -> tuple[OpCost, dict[str, Num], tuple[str, ...]]:
    """One GEMM per distinct non-empty group size (``gemm_of(size, count)``, the groups of that size as its
    batch), largest first: (the largest's cost, the additive fields summed over all, their notes)."""
    used, counts = np.unique(rows[rows > 0], return_counts=True)
    parts = [gemm_of(int(s), int(c)) for s, c in zip(used[::-1], counts[::-1])]
    fields = {f: sum(getattr(p, f) for p in parts) for f in _ADDITIVE_FIELDS}
    return parts[0], fields, tuple(dict.fromkeys(note for p in parts for note in p.notes))


def _group_metrics(rows: np.ndarray) -> dict[str, Num]:
    return {"groups": len(rows), "groups_touched": int(np.sum(rows > 0))}


#: What a grouped GEMM's group sizes split: lhs's rows (the forward), or the contracting dimension.
RAGGED_DIMS = ("rows", "contraction")


def ragged_contraction(
    *,
    group_sizes: Sequence[int] | str,
    m: int,
    n: int,
    k: int | None = None,
    lhs_dtype: str = "bf16",
    rhs_dtype: str = "bf16",
    out_dtype: str = "bf16",
    implementation: str = "kernel",
    chip: object | None = None,
) -> OpCost:
    """A grouped GEMM ragged along its contraction (an MoE weight gradient, megablox's tgmm): lhs [k, m] and rhs
    [k, n] with their k rows sorted by group; out[g] = lhs[rows of g]^T @ rhs[rows of g], [m, n] per group.
    ``k``: the rows (default and at most: the sum of the sizes).

    "kernel": one GEMM per non-empty group whose contraction is its rows (each reads its rows of both operands
    once and writes its [m, n]). "xla": XLA lowers it to one convolution over the rows with the group mask in its
    operands (libtpu's compiled program; ``vmatmul.mubr.f32``: the operands reach the MXU as f32), which writes
    every group's output, empty ones too. Its MXU work runs at
    :func:`perfmodel.model.efficiency.xla_ragged_contraction_share` of the bf16 peak and the output is written
    after it, not under it (``serial_hbm_bytes``): on tokamax's 7x timings, time at a fixed shape grows linearly
    in the rows from an intercept that is the output's HBM traffic (the calibration file names the points)."""
    from perfmodel.model.efficiency import unit_shares, xla_ragged_contraction_share

    rows = group_size_list(group_sizes)
    total = int(rows.sum())
    k_rows = total if k is None else int(sizes("k", k))
    if k_rows < total:
        raise InputError(f"`group_sizes` sum to {total} rows of the contraction, more than `k`={k_rows}; the "
                         "groups must fit in the operands' rows", fields=("group_sizes", "k"))
    m, n = int(sizes("m", m)), int(sizes("n", n))
    tpu = chip is None or getattr(chip, "kind", "tpu") == "tpu"
    if implementation == "kernel" or not tpu:
        if not np.any(rows > 0):
            raise InputError("`group_sizes`: every group is empty, so there is no work", fields=("group_sizes",))
        first, fields, notes = _sum_of_group_gemms(rows, lambda s, c: gemm(
            m=m, n=n, k=s, batch=c, lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype, out_dtype=out_dtype, chip=chip))
        notes += ("ragged contraction: one GEMM per group over its rows",)
        if not tpu:
            notes += ("implementation xla: XLA's ragged-contraction convolution is modelled on TPUs only; priced "
                      "as a kernel",)
        return dataclasses.replace(first, name="grouped_gemm", **fields, notes=notes, metrics=_group_metrics(rows))
    whole = gemm(m=m, n=n, k=k_rows, lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype, out_dtype=out_dtype, chip=chip)
    out_item = DTYPES[parse_dtype(out_dtype, "`out_dtype`")].itemsize_bytes
    out_bytes = float(len(rows) * m * n * out_item)
    share = float(xla_ragged_contraction_share(n))
    efficiency = whole.mxu_efficiency
    if chip is not None:
        chip_share = unit_shares(chip, "bf16")["mxu"]
        efficiency = min(share / chip_share, 1.0)
    return dataclasses.replace(
        whole, name="grouped_gemm", hbm_write_bytes=fval(out_bytes), serial_hbm_bytes=fval(out_bytes),
        mxu_efficiency=efficiency,
        notes=whole.notes + (f"implementation xla, ragged contraction: XLA's convolution over the rows, its MXU "
                             f"work at {share:.2f} of the bf16 peak (n = {n}), then the {len(rows)} groups' "
                             "outputs written (not overlapped)",),
        metrics={**_group_metrics(rows), "mxu_share": share})


#: The OpCost fields a grouped GEMM adds over its groups (the rest are the largest group's).
_ADDITIVE_FIELDS = ("mxu_flops", "useful_flops", "vpu_ops", "vpu_padding_ops", "serial_vpu_ops", "serial_hbm_bytes",
                    "eup_ops", "hbm_read_bytes", "hbm_write_bytes")
