"""The paged KV cache: writing new tokens, gathering pages, and capacity.

* :func:`kv_cache_update` scatters ``num_tokens`` new K and V rows into
  their page slots (a slot-mapping int32 per token), quantizing on the way
  when the cache dtype is narrower (absmax, scale, round, cast on the VPU;
  one reciprocal per row on the EUP).
* :func:`kv_gather` copies the pages of some sequences into a contiguous
  buffer (whole pages read, the used tokens written), dequantizing if asked.
* :func:`kv_capacity` answers how many tokens and sequences fit in HBM next
  to the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost
from perfmodel.model.dtypes import DTYPES, INDEX_BYTES, SCALE_BYTES, default_kv_scale, is_quantized, parse_dtype
from perfmodel.model.shapes import cdiv, chip_tiles, choice, flag_name, fval, sizes

#: Quantize-on-write per element: |x|, running max, multiply by 1/scale, round, cast.
QUANTIZE_VPU_OPS = 5
#: Per quantized row (token x kv head, for K and V): the reciprocal of its scale.
QUANTIZE_EUP_OPS_PER_ROW = 1
#: Dequantize per element: widen, multiply by the scale.
DEQUANT_SCALE_VPU_OPS = 1
UPDATE_SCALES = (None, "none", "per-tensor", "per-token")
#: Cache layouts of the update: "rows" writes only the new rows (token-major / combined pages: a token's row is
#: its own DMA); "head-major" ([kv_heads, pages, page_size, head_dim] pages) writes each row through its row
#: granule (the rows sharing a 32-bit sublane word, :func:`row_granule_rows`), read, modified and written back,
#: and quantized, through the page's row of per-token scales [page_size] f32 the same way.
UPDATE_LAYOUTS = ("rows", "head-major")
#: Share of HBM kept free for activations, compiler scratch and fragmentation when sizing the cache
#: (vLLM's default gpu_memory_utilization is 0.9).
DEFAULT_HBM_UTILIZATION = 0.9


def kv_cache_update(
    *,
    num_tokens: Num,
    kv_heads: Num,
    head_dim: Num,
    page_size: Num,
    kv_dtype: str = "bf16",
    src_dtype: str = "bf16",
    kv_scale: str | None = None,
    layout: str = "rows",
    chip: object | None = None,
) -> OpCost:
    """Write ``num_tokens`` new K and V rows (per layer) into their paged slots.

    Reads K and V in ``src_dtype`` and the int32 slot mapping, writes them
    in ``kv_dtype``. A narrower cache dtype quantizes on write: ``kv_scale``
    None = :func:`default_kv_scale` ("per-token" scales, one f32 per token and kv
    head, for K and V, written next to the page, for a quantized cache);
    "per-tensor" uses a fixed scale (no scale bytes, no absmax).

    ``layout`` (:data:`UPDATE_LAYOUTS`): "rows" moves only the new rows; "head-major" reads and writes each
    token's row granule and (per-token scales) its page's scale row, counted per token (decode: every token on
    its own granule; a prefill that fills whole granules moves less: an upper bound there).
    """
    tokens = sizes("num_tokens", num_tokens)
    kv_heads, head_dim, page_size = sizes("kv_heads", kv_heads), sizes("head_dim", head_dim), sizes(
        "page_size", page_size)
    kv_dt, src_dt = parse_dtype(kv_dtype, "`kv_dtype`"), parse_dtype(src_dtype, "`src_dtype`")
    choice("kv_scale", kv_scale, UPDATE_SCALES)
    choice("layout", layout, UPDATE_LAYOUTS)
    quantize = kv_dt != src_dt and is_quantized(kv_dt)
    if kv_scale is None:
        kv_scale = default_kv_scale(kv_dt)
    if kv_scale != "none" and not is_quantized(kv_dt):
        raise InputError(f"`kv_scale` {kv_scale}: a {kv_dt} KV cache has no scales; use `kv_dtype` int8/fp8/int4")
    tiles = chip_tiles(chip)
    rows = 2.0 * tokens * kv_heads  # K and V rows of head_dim elements
    elems = rows * head_dim
    elems_pad = 2.0 * kv_heads * tiles.vreg_elements(tokens, head_dim)
    vpu = np.zeros(())
    eup = np.zeros(())
    notes = []
    if quantize:
        per = QUANTIZE_VPU_OPS if kv_scale == "per-token" else QUANTIZE_VPU_OPS - 2
        vpu = per * elems_pad
        eup = rows * QUANTIZE_EUP_OPS_PER_ROW if kv_scale == "per-token" else eup
        notes.append(f"quantize-on-write {src_dt} -> {kv_dt} ({kv_scale} scales)")
    elif kv_dt != src_dt:
        vpu = DTYPES[kv_dt].widen_ops_per_element * elems_pad
        notes.append(f"cast on write {src_dt} -> {kv_dt}")
    scale_bytes = rows * SCALE_BYTES if kv_scale == "per-token" else 0.0
    read = elems * DTYPES[src_dt].itemsize_bytes + tokens * INDEX_BYTES
    written = elems * DTYPES[kv_dt].itemsize_bytes + scale_bytes
    write = written
    if layout == "head-major":
        granule = elems * row_granule_rows(kv_dt) * DTYPES[kv_dt].itemsize_bytes
        scale_rows = rows * page_size * SCALE_BYTES if kv_scale == "per-token" else 0.0
        read = read + granule + scale_rows
        write = granule + scale_rows
        notes.append(f"head-major: each row through its {row_granule_rows(kv_dt)}-row granule and page scale row "
                     "(read-modify-write, per token)")
    else:
        notes.append("writes only the new rows (DMA per slot)")
    return OpCost(
        name="kv-cache-update",
        launches=1,
        launch_kind="pallas",
        vpu_ops=fval(vpu),
        vpu_padding_ops=fval(np.asarray(vpu) * (1 - elems / elems_pad) if quantize else 0.0),
        eup_ops=fval(eup),
        hbm_read_bytes=fval(read),
        hbm_write_bytes=fval(write),
        notes=tuple(notes),
        metrics={"kv_bytes_written": fval(written)},
    )


def row_granule_rows(kv_dtype: str) -> int:
    """Rows of a head-major page one DMA moves at the least: those sharing a 32-bit sublane word (1 for 32-bit,
    2 for 16-bit, 4 for 8-bit, 8 for 4-bit dtypes)."""
    return max(1, int(4 // DTYPES[parse_dtype(kv_dtype, "`kv_dtype`")].itemsize_bytes))


def kv_gather(
    *,
    context_lens: Num,
    kv_heads: Num,
    head_dim: Num,
    page_size: Num,
    kv_dtype: str = "bf16",
    out_dtype: str | None = None,
    batch: Num | None = None,
    chip: object | None = None,
) -> OpCost:
    """Gather the pages of sequences into a contiguous [tokens, kv_heads, head_dim] K and V buffer.

    Whole pages are read (a partial last page costs a full one), with the page
    table; the used tokens are written in ``out_dtype`` (default: the cache
    dtype; a wider one dequantizes on the VPU with per-token scales).
    ``context_lens`` / ``batch`` as in paged_decode_attention.
    """
    lens = sizes("context_lens", context_lens)
    b = sizes("batch", batch) if batch is not None else None
    if b is None:
        lens = np.atleast_1d(lens)
    kv_heads, head_dim, page_size = sizes("kv_heads", kv_heads), sizes("head_dim", head_dim), sizes(
        "page_size", page_size)
    kv_dt = parse_dtype(kv_dtype, "`kv_dtype`")
    out_dt = kv_dt if out_dtype is None else parse_dtype(out_dtype, "`out_dtype`")
    tiles = chip_tiles(chip)
    pages = cdiv(lens, page_size)

    def total(x: Num) -> Num:
        arr = np.asarray(x, dtype=float) * np.ones(np.shape(lens))
        return fval(arr * b if b is not None else arr.sum(axis=-1))

    stored = 2.0 * kv_heads * head_dim * pages * page_size
    used = 2.0 * kv_heads * head_dim * lens
    dequant = out_dt != kv_dt
    scales = is_quantized(kv_dt) and dequant
    read = stored * DTYPES[kv_dt].itemsize_bytes + pages * INDEX_BYTES
    if scales:
        read = read + 2.0 * kv_heads * pages * page_size * SCALE_BYTES
    write = used * DTYPES[out_dt].itemsize_bytes
    vpu = 0.0
    if dequant:
        per = DTYPES[kv_dt].widen_ops_per_element + (DEQUANT_SCALE_VPU_OPS if scales else 0)
        vpu = per * 2.0 * kv_heads * tiles.vreg_elements(lens, head_dim)
    return OpCost(
        name="kv-gather",
        launches=1,
        vpu_ops=total(vpu),
        hbm_read_bytes=total(read),
        hbm_write_bytes=total(write),
        notes=("whole pages read, used tokens written",) + ((f"dequantize {kv_dt} -> {out_dt}",) if dequant else ()),
        metrics={"pages": total(pages)},
    )


def kv_bytes_per_token(*, layers: Num, kv_heads: Num, head_dim: Num, kv_dtype: str = "bf16",
                       kv_scale: str | None = None) -> Num:
    """KV-cache bytes one token takes over all layers (K and V; f32 scales if per-token, the default for a
    quantized cache, see :func:`default_kv_scale`)."""
    layers, kv_heads, head_dim = sizes("layers", layers), sizes("kv_heads", kv_heads), sizes("head_dim", head_dim)
    kv_dt = parse_dtype(kv_dtype, "`kv_dtype`")
    choice("kv_scale", kv_scale, UPDATE_SCALES)
    kv_scale = default_kv_scale(kv_dt) if kv_scale is None else kv_scale
    if kv_scale not in (None, "none") and not is_quantized(kv_dt):
        raise InputError(f"`kv_scale` {kv_scale}: a {kv_dt} KV cache has no scales; use `kv_dtype` int8/fp8/int4")
    per_head = head_dim * DTYPES[kv_dt].itemsize_bytes + (SCALE_BYTES if kv_scale == "per-token" else 0)
    return fval(2.0 * layers * kv_heads * per_head)


@dataclass(frozen=True, kw_only=True)
class KVCapacity:
    """How much KV cache fits in HBM next to the weights (per chip; arrays broadcast)."""

    hbm_bytes: Num
    usable_bytes: Num
    weight_bytes: Num
    reserved_bytes: Num
    #: Bytes left for the KV cache (negative: the weights alone do not fit, by that much).
    free_bytes: Num
    kv_bytes_per_token: Num
    page_size: Num
    #: Whole pages of KV that fit, and the tokens they hold.
    pages: Num
    tokens: Num
    #: Sequences of context_len tokens that fit (whole pages each); None without context_len.
    sequences: Num | None
    weights_fit: Num


def _finite(name: str, value: Num) -> np.ndarray:
    """Float array of a byte count; InputError naming the flag for nan / inf."""
    arr = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{flag_name(name)} must be a finite number of bytes, got {arr[~np.isfinite(arr)].flat[0]}")
    return arr


def kv_capacity(
    *,
    chip: object,
    weight_bytes: Num,
    kv_bytes_per_token: Num,
    page_size: Num = 16,
    context_len: Num | None = None,
    num_chips: Num = 1,
    reserved_bytes: Num = 0,
    hbm_utilization: float = DEFAULT_HBM_UTILIZATION,
) -> KVCapacity:
    """Tokens and sequences whose KV fits in HBM next to the weights.

    Weights and KV are sharded over ``num_chips`` (tensor parallelism): each
    chip holds weight_bytes / num_chips and kv_bytes_per_token / num_chips per
    token. ``hbm_utilization`` of each chip's HBM is usable; ``reserved_bytes``
    (activations, workspace) per chip comes off the top.
    """
    if chip is None:
        raise InputError("`hw`: kv capacity needs a chip")
    if not 0.0 < hbm_utilization <= 1.0:
        raise InputError(f"`hbm_utilization` must be in (0, 1], got {hbm_utilization}")
    weights = _finite("weight_bytes", weight_bytes)
    if np.any(weights < 0):
        raise InputError(f"`weight_bytes` must be >= 0, got {np.min(weights):g}")
    per_token = _finite("kv_bytes_per_token", kv_bytes_per_token)
    if np.any(per_token <= 0):
        raise InputError(f"`kv_bytes_per_token` must be > 0, got {np.min(per_token):g}")
    reserved = _finite("reserved_bytes", reserved_bytes)
    if np.any(reserved < 0):
        raise InputError(f"`reserved_bytes` must be >= 0 (bytes kept free per chip), got {np.min(reserved):g}")
    chips = sizes("num_chips", num_chips)
    page_size = sizes("page_size", page_size)
    hbm = float(chip.memory.hbm_bytes_per_chip)
    usable = hbm * hbm_utilization
    free = usable - reserved - weights / chips
    page_bytes = per_token / chips * page_size
    pages = np.floor(np.maximum(free, 0) / page_bytes)
    tokens = pages * page_size
    seqs = None
    if context_len is not None:
        ctx = sizes("context", context_len)  # the CLI flag is `context`
        seqs = fval(np.floor(pages / cdiv(ctx, page_size)))
    return KVCapacity(
        hbm_bytes=hbm, usable_bytes=usable, weight_bytes=fval(weights), reserved_bytes=fval(reserved),
        free_bytes=fval(free), kv_bytes_per_token=fval(per_token), page_size=fval(page_size), pages=fval(pages),
        tokens=fval(tokens), sequences=seqs, weights_fit=free >= 0 if np.ndim(free) else bool(free >= 0),
    )
