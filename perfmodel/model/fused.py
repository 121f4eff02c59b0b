"""Fused elementwise ops and their unfused equivalents.

Each function models one op in two forms, chosen with ``fused``:

* fused: one kernel reads every input once and writes every output once;
* unfused: each elementwise step is its own kernel (what eager code or a
  fusion boundary produces), so intermediates round-trip HBM.

The VPU / EUP work is the same in both forms; only HBM traffic differs
(``metrics["kernels"]`` says how many launches the form takes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost, combine
from perfmodel.model.dtypes import DTYPES, SCALE_BYTES, parse_dtype
from perfmodel.model.elementwise import EPILOGUES
from perfmodel.model.shapes import chip_tiles, choice, fval, sizes

#: RMSNorm per element: square, sum, multiply by rsqrt, multiply by the weight (+1 residual add).
RMS_NORM_VPU_OPS = 4
#: A layer norm's mean on top: its sum and the subtraction.
LAYER_NORM_EXTRA_VPU_OPS = 2
#: The norm's backward per element (dx, dscale): x_norm = x * rstd, g = dout * weight, g * x_norm, its sum over
#: the row, the weight gradient's sum over the tokens, dx = (g - mean(g * x_norm) * x_norm) * rstd (3).
RMS_NORM_BACKWARD_VPU_OPS = 8
#: A layer norm's backward on top: x - mean, the row sum of g, the offset gradient's sum, dx - mean(g).
LAYER_NORM_BACKWARD_EXTRA_VPU_OPS = 4
#: RoPE per element: x*cos, rotate-half (lane roll and negate), *sin, add.
ROPE_VPU_OPS = 5
GLU_KINDS = {"swiglu": "silu", "geglu": "gelu"}
#: Where a norm's normalized axis lies in the array: the minor (lane) axis, or a leading one.
NORMALIZED_AXES = ("last", "leading")


def _cast_ops(*dtypes: str) -> int:
    """VPU casts per element to compute in f32: one per non-f32 input/output."""
    return sum(1 for d in dtypes if d != "fp32")


def _elementwise_cost(*, name: str, elements: Num, elements_padded: Num, vpu_per: float, eup: Num,
                      read: Num, write: Num, kernels: int, fused: bool, notes: tuple[str, ...] = (),
                      xlu: Num = 0.0) -> OpCost:
    form = "fused: one kernel" if fused else f"unfused: {kernels} kernels, intermediates round-trip HBM"
    return OpCost(
        name=name,
        vpu_ops=fval(vpu_per * np.asarray(elements_padded, dtype=float)),
        vpu_padding_ops=fval(vpu_per * (np.asarray(elements_padded, dtype=float) - elements)),
        eup_ops=fval(eup),
        xlu_ops=fval(xlu),
        hbm_read_bytes=fval(read),
        hbm_write_bytes=fval(write),
        notes=(form,) + notes,
        launches=1 if fused else kernels,
        metrics={"kernels": 1 if fused else kernels},
    )


def _row_groups(tokens: Num, sublanes: int, item: int = 4) -> np.ndarray:
    """Vregs one column of lanes takes over ``tokens`` rows: a vreg holds ``sublanes`` rows of 32-bit values,
    twice that of 16-bit ones (packed)."""
    per = sublanes * max(1, 4 // item)
    return np.ceil(np.asarray(tokens, dtype=float) / per)


def _norm_xlu_ops(tokens: Num, hidden: Num, tiles: Any, *, broadcasts: int, sums: int,
                  sums_16bit: int = 0) -> np.ndarray:
    """XLU vreg pushes of a pass over [tokens, hidden] rows that reduces ``sums`` per-row statistics over the
    hidden (lane) axis and applies ``broadcasts`` of them: a row sum folds the row's vregs on the VPU, then
    transposes what is left (one vreg per row group) through the XLU to add it across lanes; a per-row value is
    lane-broadcast into one vreg per row group, which every vreg of those rows reuses. So the count does not grow
    with hidden: it is most of the cost of a norm whose rows fill about one vreg row (hidden = lanes) and a
    sliver of a wide one. A sum over a 16-bit input one vreg wide (XLA's mean pass over bf16 x, hidden = lanes)
    transposes packed vregs: half the pushes; a wider one is summed in f32 first. Narrower rows (hidden < lanes)
    take none: XLA lays such an axis on sublanes and sums it on the VPU. Read off XLA's layer norm and RMS norm
    (libtpu 0.0.42.1, deviceless, on 7x): the compiled loops, the software pipeline's fill and drain iterations
    aside (:func:`perfmodel.compiler.bundles.bundle_weights`), push exactly these counts at x [384, 384, 128]
    (layer and RMS norm) and [384, 384, 256] (layer norm), 22% more at [192, 192, 512] (its mean and variance
    passes push more per row group); at hidden 64, none."""
    if not tiles.sublanes:  # the normalized axis is not the lane axis
        return np.zeros_like(np.asarray(tokens, dtype=float) * np.asarray(hidden, dtype=float))
    groups = _row_groups(tokens, tiles.sublanes)
    packed = np.where(np.asarray(hidden) <= tiles.lanes, _row_groups(tokens, tiles.sublanes, 2), groups)
    count = groups * (broadcasts + sums) + packed * sums_16bit
    return np.where(np.asarray(hidden) >= tiles.lanes, count, 0.0)


def rms_norm(
    *,
    tokens: Num,
    hidden: Num,
    dtype: str = "bf16",
    residual: bool = True,
    out_dtype: str | None = None,
    fused: bool = True,
    subtract_mean: bool = False,
    backward: bool = False,
    normalized_axis: str = "last",
    chip: object | None = None,
) -> OpCost:
    """(Residual add +) RMSNorm over [tokens, hidden]; ``subtract_mean``: a layer norm (the mean taken off first);
    ``backward``: its gradient instead (:func:`_norm_backward`); ``normalized_axis`` "last" (the lane axis) or
    "leading": a leading axis of the array (tokamax's ``axis=0`` over [hidden, ...]), whose row sums add whole
    vregs on the VPU, so nothing goes through the XLU.

    Fused: read x (and the residual) and the weight, write the output (and the
    updated residual). Unfused, as XLA compiles it, kernels in sequence: the add
    writes the sum; a layer norm's mean pass reads it and writes one f32 mean per
    token; the reduction pass reads it (and the mean) and writes one f32 rms per
    token; the normalising pass reads the sum, the statistics and the weight and
    writes the output (XLA runs ``(x - mean(x)) * rsqrt(var + eps)`` in f32).
    Row sums and per-row broadcasts go through the XLU (:func:`_norm_xlu_ops`).
    """
    tokens, hidden = sizes("tokens", tokens), sizes("hidden", hidden)
    dt = parse_dtype(dtype, "`dtype`")
    out_dt = dt if out_dtype is None else parse_dtype(out_dtype, "`out_dtype`")
    tiles = chip_tiles(chip)
    elems = 1.0 * tokens * hidden
    padded = 1.0 * tiles.vreg_elements(tokens, hidden)
    item, out_item = DTYPES[dt].itemsize_bytes, DTYPES[out_dt].itemsize_bytes
    act = elems * item
    weight = hidden * item
    lane_axis = choice("normalized_axis", normalized_axis, NORMALIZED_AXES) == "last"
    notes = _lane_reduction_note(hidden, tiles.lanes, chip) if lane_axis else ()
    if not lane_axis:
        tiles = dataclasses.replace(tiles, sublanes=0)  # no cross-lane work: _norm_xlu_ops counts none
    if backward:
        return _norm_backward(tokens=tokens, hidden=hidden, elems=elems, padded=padded, item=item,
                              out_item=out_item, cast_ops=_cast_ops(dt, dt, out_dt), residual=residual,
                              subtract_mean=subtract_mean, fused=fused, tiles=tiles, notes=notes)
    stats = 1 + subtract_mean  # per-row statistics: rstd (and the mean)
    norm = "layer-norm" if subtract_mean else "rms-norm"
    name = norm if not residual else f"add+{norm}"
    cast = _cast_ops(dt, out_dt)
    if fused:
        vpu_per = RMS_NORM_VPU_OPS + residual + cast + LAYER_NORM_EXTRA_VPU_OPS * subtract_mean
        return _elementwise_cost(name=name, elements=elems, elements_padded=padded, vpu_per=vpu_per,
                                 eup=1.0 * tokens, read=act * (1 + residual) + weight,
                                 write=elems * out_item + act * residual, kernels=1, fused=True, notes=notes,
                                 xlu=_norm_xlu_ops(tokens, hidden, tiles, broadcasts=stats, sums=stats))
    row = tokens * 4.0  # one f32 statistic per token
    passes = []
    if residual:
        passes.append(_pass("residual add", elems, padded, 1, 0.0, 2 * act, act))
    if subtract_mean:
        # XLA sums a 16-bit x as it is read (packed vregs), any other as f32
        passes.append(_pass("mean pass", elems, padded, LAYER_NORM_EXTRA_VPU_OPS / 2, 0.0, act, row,
                            _norm_xlu_ops(tokens, hidden, tiles, broadcasts=0, sums=int(item != 2),
                                          sums_16bit=int(item == 2))))
    # squares and sums (x - mean) for a layer norm: its mean broadcast, its subtraction
    passes.append(_pass("reduction pass", elems, padded, RMS_NORM_VPU_OPS / 2 + subtract_mean, 0.0,
                        act + row * subtract_mean, row,
                        _norm_xlu_ops(tokens, hidden, tiles, broadcasts=subtract_mean, sums=1)))
    passes.append(_pass("normalising pass", elems, padded, RMS_NORM_VPU_OPS / 2 + cast, 1.0 * tokens,
                        act + row * stats + weight, elems * out_item,
                        _norm_xlu_ops(tokens, hidden, tiles, broadcasts=stats, sums=0)))
    return _in_sequence(name, passes, notes)


def _pass(name: str, elements: Num, padded: Num, vpu_per: float, eup: Num, read: Num, write: Num,
          xlu: Num = 0.0) -> OpCost:
    """One kernel of an unfused op (an XLA fusion); the whole op's notes say what it is."""
    cost = _elementwise_cost(name=name, elements=elements, elements_padded=padded, vpu_per=vpu_per, eup=eup,
                             read=read, write=write, kernels=1, fused=True, xlu=xlu)
    return dataclasses.replace(cost, notes=())


def _in_sequence(name: str, passes: list[OpCost], notes: tuple[str, ...]) -> OpCost:
    kernels = len(passes)
    return combine(name, passes, (f"unfused: {kernels} kernels, intermediates round-trip HBM",) + notes,
                   in_sequence=True, metrics={"kernels": kernels})


def _lane_reduction_note(hidden: Num, lanes: int, chip: object | None) -> tuple[str, ...]:
    """A norm whose rows fill one or two vreg rows (lanes <= hidden <= 2 lanes), where the XLU work of its row
    sums and broadcasts (:func:`_norm_xlu_ops`) is as large as its HBM traffic: priced at the chip's XLU rate
    where the spec has one, else said to be missing."""
    h = np.asarray(hidden)
    if lanes <= 1 or not np.any((h >= lanes) & (h <= 2 * lanes)):
        return ()
    rate = getattr(getattr(chip, "compute", None), "xlu_vreg_ops_per_s_per_chip", None)
    if rate is None:
        return (f"hidden of {lanes}-{2 * lanes} lanes: each row's sums and broadcasts are cross-lane (XLU) work, "
                f"which {getattr(chip, 'name', 'this chip')}'s spec gives no rate for: not priced, so the time is "
                "optimistic",)
    return (f"hidden of {lanes}-{2 * lanes} lanes: each row's sums and broadcasts are cross-lane (XLU) work, "
            "priced at the compiler's XLU cadence (hwspecs compute.xlu_vreg_ops_per_s_per_chip); tokamax's "
            "128-wide layer norms ran 1.06x the time so priced on one TPU7x core (perfmodel/harness/README.md)",)


def _norm_backward(*, tokens: Num, hidden: Num, elems: Num, padded: Num, item: int, out_item: int,
                   cast_ops: int, residual: bool, subtract_mean: bool, fused: bool, tiles: Any,
                   notes: tuple[str, ...] = ()) -> OpCost:
    """The gradient of (residual add +) RMSNorm / layer norm over [tokens, hidden] from the forward's f32
    statistics (rstd, and the mean for a layer norm): dx (in ``out_item`` bytes), the weight's gradient (and the
    offset's for a layer norm), each summed over the tokens in f32.

    Fused: one kernel reads x, the cotangent dout, the statistics and the weight, and writes dx and the
    parameter gradients. Unfused, as XLA compiles tokamax's normalization backward (two fusions, libtpu,
    deviceless, every shape of tokamax's normalization benchmark on 7x), in sequence: a reduction pass reads x,
    dout, the statistics and the weight and writes the row sums (mean(g * x_norm), and mean(g) for a layer
    norm, f32 per token) and the parameter gradients; the dx pass reads all of those again and the row sums,
    and writes dx. The residual add's gradient is dx plus the residual stream's cotangent: one more input read
    when fused, one more add kernel (two reads, one write) unfused. Each pass broadcasts the statistics it uses
    and the reduction pass sums its row sums across lanes (:func:`_norm_xlu_ops`)."""
    act, out = elems * item, elems * out_item
    stats = 1 + subtract_mean  # per-row statistics (rstd, and the mean) = row sums the gradient takes
    stat_bytes = tokens * 4.0 * stats  # f32 rstd (and mean) per token
    params_read = hidden * item
    params_grad = hidden * 4.0 * stats  # dscale (and doffset), f32 sums
    vpu_per = RMS_NORM_BACKWARD_VPU_OPS + LAYER_NORM_BACKWARD_EXTRA_VPU_OPS * subtract_mean + cast_ops + residual
    norm = "layer-norm" if subtract_mean else "rms-norm"
    name = f"{norm} backward" if not residual else f"add+{norm} backward"
    if fused:
        return _elementwise_cost(name=name, elements=elems, elements_padded=padded, vpu_per=vpu_per, eup=0.0,
                                 read=2 * act + stat_bytes + params_read + act * residual,
                                 write=out + params_grad, kernels=1, fused=True, notes=notes,
                                 xlu=_norm_xlu_ops(tokens, hidden, tiles, broadcasts=2 * stats, sums=stats))
    row_sums = stat_bytes
    half = (RMS_NORM_BACKWARD_VPU_OPS + LAYER_NORM_BACKWARD_EXTRA_VPU_OPS * subtract_mean) / 2
    passes = [
        _pass("reduction pass", elems, padded, half, 0.0, 2 * act + stat_bytes + params_read,
              row_sums + params_grad, _norm_xlu_ops(tokens, hidden, tiles, broadcasts=stats, sums=stats)),
        _pass("dx pass", elems, padded, half + cast_ops, 0.0, 2 * act + stat_bytes + params_read + row_sums, out,
              _norm_xlu_ops(tokens, hidden, tiles, broadcasts=2 * stats, sums=0)),
    ]
    if residual:
        passes.append(_pass("residual add", elems, padded, 1, 0.0, 2 * out, out))
    return _in_sequence(name, passes, notes)


def glu(
    *,
    tokens: Num,
    intermediate: Num,
    dtype: str = "bf16",
    kind: str = "swiglu",
    fused: bool = True,
    chip: object | None = None,
) -> OpCost:
    """act(gate) * up over two [tokens, intermediate] inputs (SwiGLU: SiLU, GeGLU: tanh GELU).

    Fused: read gate and up, write the product. Unfused: the activation reads
    gate and writes act(gate); the multiply reads it and up and writes the product.
    """
    tokens, inter = sizes("tokens", tokens), sizes("intermediate", intermediate)
    dt = parse_dtype(dtype, "`dtype`")
    choice("kind", kind, tuple(GLU_KINDS))
    act = EPILOGUES[GLU_KINDS[kind]]
    tiles = chip_tiles(chip)
    elems = 1.0 * tokens * inter
    padded = 1.0 * tiles.vreg_elements(tokens, inter)
    a = elems * DTYPES[dt].itemsize_bytes
    vpu_per = act.vpu_ops + 1 + _cast_ops(dt, dt, dt)
    read, write = (2 * a, a) if fused else (3 * a, 2 * a)
    return _elementwise_cost(name=kind, elements=elems, elements_padded=padded, vpu_per=vpu_per,
                             eup=act.eup_ops * padded, read=read, write=write, kernels=2, fused=fused)


def swiglu(**kwargs: object) -> OpCost:
    """SiLU(gate) * up; see :func:`glu`."""
    return glu(kind="swiglu", **kwargs)  # type: ignore[arg-type]


def geglu(**kwargs: object) -> OpCost:
    """GELU(gate) * up; see :func:`glu`."""
    return glu(kind="geglu", **kwargs)  # type: ignore[arg-type]


def rope(
    *,
    tokens: Num,
    heads: Num,
    head_dim: Num,
    dtype: str = "bf16",
    rotary_dim: Num | None = None,
    fused: bool = True,
    chip: object | None = None,
) -> OpCost:
    """Rotary embedding of [tokens, heads, head_dim] with f32 cos / sin tables of [tokens, rotary_dim / 2].

    Fused: read x and the tables, write x. Unfused (x*cos, rotate_half,
    *sin, add as four kernels): x is read twice, three intermediates are
    written and read back.
    """
    tokens, heads, head_dim = sizes("tokens", tokens), sizes("heads", heads), sizes("head_dim", head_dim)
    rot = head_dim if rotary_dim is None else sizes("rotary_dim", rotary_dim)
    if np.any(rot > head_dim):
        raise InputError(f"`rotary_dim` must be <= `head_dim`, got {np.max(rot)} > {np.min(head_dim)}")
    if rotary_dim is not None and np.any(rot % 2):
        raise InputError(f"`rotary_dim` must be even (RoPE rotates pairs of dims), got {np.max(rot % 2 * rot)}")
    dt = parse_dtype(dtype, "`dtype`")
    tiles = chip_tiles(chip)
    elems = 1.0 * tokens * heads * rot
    padded = 1.0 * heads * tiles.vreg_elements(tokens, rot)
    x = 1.0 * tokens * heads * head_dim * DTYPES[dt].itemsize_bytes
    xr = elems * DTYPES[dt].itemsize_bytes
    tables = 2.0 * tokens * (rot // 2) * SCALE_BYTES
    vpu_per = ROPE_VPU_OPS + _cast_ops(dt, dt)
    if fused:
        read, write = x + tables, x
    else:
        read, write = x + xr + tables + 3 * xr, 3 * xr + x
    return _elementwise_cost(name="rope", elements=elems, elements_padded=padded, vpu_per=vpu_per, eup=0.0,
                             read=read, write=write, kernels=4, fused=fused)


def dequant_gemm(
    *,
    m: Num,
    n: Num,
    k: Num,
    weight_dtype: str = "int8",
    act_dtype: str = "bf16",
    out_dtype: str = "bf16",
    weight_scale: str | None = None,
    scale_block: Num | None = None,
    fused: bool = True,
    chip: object | None = None,
) -> OpCost:
    """GEMM with quantized weights: dequantized in VMEM inside the GEMM (fused) or by a separate kernel.

    Unfused: a dequantization kernel reads the quantized weights and scales
    and writes them in ``act_dtype``; an ``act_dtype`` GEMM then reads them
    again. Parts: (dequantize, gemm).
    """
    from perfmodel.model.dtypes import is_quantized
    from perfmodel.model.gemm import gemm, resolve_weight_scale, weight_scale_bytes

    w_dt, a_dt = parse_dtype(weight_dtype, "`weight_dtype`"), parse_dtype(act_dtype, "`act_dtype`")
    if not is_quantized(w_dt):
        raise InputError(f"`weight_dtype` {w_dt}: weights are not quantized, so there is nothing to dequantize; "
                         "use int8, int4 or fp8 (or `predict gemm` for a plain GEMM)")
    if fused:
        cost = gemm(m=m, n=n, k=k, lhs_dtype=a_dt, rhs_dtype=w_dt, out_dtype=out_dtype, weight_scale=weight_scale,
                    scale_block=scale_block, chip=chip)
        return dataclasses.replace(cost, name="dequant+gemm", notes=("fused: dequantized in VMEM",) + cost.notes,
                                   metrics={"kernels": 1})
    k_arr, n_arr = sizes("k", k), sizes("n", n)
    kind, block = resolve_weight_scale(w_dt, weight_scale, scale_block)
    scales = weight_scale_bytes(k=k_arr, n=n_arr, batch=1, weight_scale=kind, scale_block=block)
    weights_q = 1.0 * k_arr * n_arr * DTYPES[w_dt].itemsize_bytes
    tiles = chip_tiles(chip)
    elems = 1.0 * k_arr * n_arr
    padded = 1.0 * tiles.vreg_elements(k_arr, n_arr)
    vpu_per = DTYPES[w_dt].widen_ops_per_element + (kind != "none")
    deq = OpCost(
        name="dequantize",
        vpu_ops=fval(vpu_per * padded),
        vpu_padding_ops=fval(vpu_per * (padded - elems)),
        hbm_read_bytes=fval(weights_q + scales),
        hbm_write_bytes=fval(elems * DTYPES[a_dt].itemsize_bytes),
        launches=1,
    )
    mm = gemm(m=m, n=n, k=k, lhs_dtype=a_dt, rhs_dtype=a_dt, out_dtype=out_dtype, chip=chip)
    cost = combine("dequant+gemm", [deq, mm],
                   notes=("unfused: a dequantize kernel writes the weights in "
                          f"{a_dt}, the GEMM reads them back",) + mm.notes)
    return dataclasses.replace(cost, metrics={"kernels": 2})
