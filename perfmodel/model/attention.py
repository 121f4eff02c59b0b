"""Attention: flash-style prefill and the counting helpers every attention model shares.

The paged-KV-cache models (decode, ragged mixed batches, MLA decode) live in
:mod:`perfmodel.model.paged_attention` and build on this module's tile and pair counts, softmax work and
tuned-block look-ups.

Conventions
-----------
* Causal attention places the ``q_len`` queries at the *last* positions of
  the ``kv_len`` keys (a prefill chunk after a cached prefix), so query row
  ``r`` sees keys ``[0, r + kv_len - q_len]`` (further clipped to the last
  ``sliding_window`` keys).
* Useful FLOPs are ``4 * head_dim`` per visible (query, key) pair per q head
  (QK^T and PV). Issued FLOPs count whole (block_q x block_kv) tiles: a tile
  with any visible pair is computed in full, fully masked tiles are skipped;
  head_dim pads to the MXU edge and rows to the sublane tile.
* K and V are read once per (q block, kv block) tile a kernel visits, for all
  q heads of a GQA group at once; Q is read and O written once.
* Softmax is the online (flash) form: per score element a max, subtract, sum
  and cast on the VPU plus one exp on the EUP; masked tiles add a compare and
  select; per row and kv block the running max / sum / accumulator rescale.
"""

from __future__ import annotations

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost
from perfmodel.model.dtypes import DTYPES, matmul_path, parse_dtype
from perfmodel.model.shapes import cdiv, chip_tiles, fval, optional_size, round_up, sizes

#: VPU ops per computed score element: running max, subtract, row sum, cast of p to the matmul dtype.
SOFTMAX_VPU_OPS_PER_SCORE = 4
#: Extra VPU ops per score element of a masked tile (iota compare + select).
MASK_VPU_OPS_PER_SCORE = 2
#: EUP ops per score element (exp).
SOFTMAX_EUP_OPS_PER_SCORE = 1
#: Per row and kv block: new max, exp(m_old - m_new) (EUP), rescale of l; plus head_dim accumulator rescale ops.
ONLINE_SOFTMAX_VPU_OPS_PER_ROW_BLOCK = 3
ONLINE_SOFTMAX_EUP_OPS_PER_ROW_BLOCK = 1


# ----------------------------------------------------------------------------- counting helpers


def floor_sum(n: Num, m: Num, a: Num, b: Num) -> np.ndarray:
    """sum_{i=0}^{n-1} floor((a*i + b) / m) for integer arrays (n, b >= 0; m >= 1; a >= 0), vectorized.

    The Euclid-like reduction: each round removes the whole quotients of a and
    b, then swaps the roles of the axes; O(log) rounds.
    """
    n, m, a, b = (np.array(x, dtype=np.int64) for x in np.broadcast_arrays(n, m, a, b))
    ans = np.zeros(n.shape, dtype=np.int64)
    active = n > 0
    while np.any(active):
        q = a // m
        ans += np.where(active, (n * (n - 1) // 2) * q, 0)
        a = a - q * m
        q = b // m
        ans += np.where(active, n * q, 0)
        b = b - q * m
        y = a * n + b
        active &= y >= m
        safe_m = np.where(active, m, 1)
        n, b, m, a = (np.where(active, y // safe_m, 0), np.where(active, y % safe_m, 0),
                      np.where(active, a, 1), np.where(active, m, 0))
    return ans


def _sum_min(lo: np.ndarray, hi: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """sum_{x=lo}^{hi} min(x, cap) for lo <= hi + 1 (empty range: 0)."""
    c = np.clip(cap, lo - 1, hi)
    return (lo + c) * (c - lo + 1) // 2 + cap * (hi - c)


def visible_pairs(q_len: np.ndarray, kv_len: np.ndarray, causal: bool, window: np.ndarray | None) -> np.ndarray:
    """(query, key) pairs attention actually uses, per (batch, head)."""
    if not causal:
        return q_len * kv_len
    cap = kv_len if window is None else np.minimum(window, kv_len)
    return _sum_min(kv_len - q_len + 1, kv_len, cap)


def kv_tiles(q_len: np.ndarray, kv_len: np.ndarray, bq: np.ndarray, bkv: np.ndarray, causal: bool,
             window: np.ndarray | None) -> np.ndarray:
    """(q block, kv block) tiles with at least one visible pair, per (batch, head)."""
    nq = cdiv(q_len, bq)
    nkv = cdiv(kv_len, bkv)
    if not causal:
        return nq * nkv
    off = kv_len - q_len
    # Highest visible key of q block j: j*bq + bq - 1 + off, except the last block: kv_len - 1.
    hi_sum = floor_sum(nq - 1, bkv, bq, bq - 1 + off) + (kv_len - 1) // bkv
    if window is None:
        lo_sum = 0
    else:
        # Lowest visible key of q block j: max(0, j*bq + off - window + 1).
        c = off - window + 1
        j0 = np.where(c > 0, 0, np.minimum(-c // bq + 1, nq))
        lo_sum = floor_sum(nq - j0, bkv, bq, j0 * bq + c)
    return hi_sum - lo_sum + nq


def check_heads(q_heads: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    if np.any(q_heads % kv_heads):
        bad = np.broadcast_arrays(q_heads, kv_heads)
        i = np.flatnonzero(bad[0] % bad[1])[0]
        raise InputError(f"`kv_heads` {bad[1].flat[i]} must divide `q_heads` {bad[0].flat[i]} "
                         "(GQA groups need a whole number of q heads per kv head)")
    return q_heads // kv_heads


def softmax_work(scores: Num, row_blocks: Num, head_dim: Num, masked_scores: Num) -> tuple[Num, Num]:
    """(VPU ops, EUP ops) of online softmax over ``scores`` computed elements."""
    vpu = (SOFTMAX_VPU_OPS_PER_SCORE * scores + MASK_VPU_OPS_PER_SCORE * masked_scores
           + (ONLINE_SOFTMAX_VPU_OPS_PER_ROW_BLOCK + head_dim) * row_blocks)
    eup = SOFTMAX_EUP_OPS_PER_SCORE * scores + ONLINE_SOFTMAX_EUP_OPS_PER_ROW_BLOCK * row_blocks
    return vpu, eup


def tuned_block(kernel: str, field: str, chip: object | None) -> int:
    """The bundled kernel's stored default for one block field on ``chip``: the data its ``blocks.py`` reads
    (``kernels/<kernel>/tuned.json``), so the op model and the shipped kernel agree. A chip without stored
    defaults (or none given) takes the default chip's. The kernel may shrink its blocks further to fit VMEM
    for large GQA groups or f32; the op model does not."""
    from kernels.tuned import stored_blocks
    from perfmodel.hw.registry import DEFAULT_CHIP

    name = getattr(chip, "name", None)
    blocks = (stored_blocks(kernel, name) if name else None) or stored_blocks(kernel, DEFAULT_CHIP)
    return int(blocks[field])


def _default_block(value: Num | None, field: str, chip: object | None, length: np.ndarray, multiple: int,
                   name: str) -> np.ndarray:
    """The block size used: given, or the bundled flash attention's tuned one for the chip, at most the length
    rounded up to the tile multiple."""
    if value is not None:
        return sizes(name, value)
    return np.minimum(tuned_block("flash_attention", field, chip), round_up(length, multiple))


# ----------------------------------------------------------------------------- prefill


def flash_attention(
    *,
    batch: Num,
    q_len: Num,
    kv_len: Num,
    q_heads: Num,
    kv_heads: Num,
    head_dim: Num,
    causal: bool = True,
    sliding_window: Num | None = None,
    dtype: str = "bf16",
    block_q: Num | None = None,
    block_kv: Num | None = None,
    precision: str | None = None,
    soft_cap: bool = False,
    sinks: bool = False,
    segment_ids: bool = False,
    chip: object | None = None,
) -> OpCost:
    """Flash-style attention (prefill), MHA / GQA / MQA, causal or not, optional sliding window.

    ``soft_cap``: scores capped as c * tanh(s / c) (one more EUP op and two VPU multiplies per score).
    ``sinks``: a sink logit per q head (the bundled kernel reads one f32 (8, 128) tile per head).
    ``segment_ids``: packed sequences; every computed tile is masked, and the bundled kernel reads the q ids
    replicated over 128 lanes once per kv head and the kv ids replicated over 8 sublanes per tile
    (int32).

    ``precision``: of the QK^T and PV dots (None = default: an fp32 dot is one bf16 pass on a TPU; the bundled
    kernel asks for "highest" with f32 inputs, six passes).

    Blocks default to the bundled flash attention's tuned blocks for the chip (:func:`tuned_block`), at most
    the length rounded up to the tile. metrics:
    ``masked_tile_share`` (share of computed score elements that are masked
    or padding), ``kv_tiles`` per (batch, head), ``grid_steps``.
    """
    batch, q_len, kv_len = sizes("batch", batch), sizes("q_len", q_len), sizes("kv_len", kv_len)
    q_heads, kv_heads, head_dim = sizes("q_heads", q_heads), sizes("kv_heads", kv_heads), sizes("head_dim", head_dim)
    window = optional_size("sliding_window", sliding_window)
    dt = parse_dtype(dtype, "`dtype`")
    group = check_heads(q_heads, kv_heads)
    if window is not None and not causal:
        raise InputError("`sliding_window` needs causal attention; drop `no_causal` or the window")
    if causal and np.any(q_len > kv_len):
        raise InputError("`q_len` must be <= `kv_len` for causal attention (queries are the last q_len positions)")
    tiles = chip_tiles(chip)
    path = matmul_path(chip, dt, dt, precision)
    bq = _default_block(block_q, "block_q", chip, q_len, max(tiles.sublanes, 8), "block_q")
    bkv = _default_block(block_kv, "block_kv", chip, kv_len, max(tiles.lanes, 128), "block_kv")

    pairs = visible_pairs(q_len, kv_len, causal, window)
    tiles_n = kv_tiles(q_len, kv_len, bq, bkv, causal, window)
    heads_b = batch * q_heads
    useful = 4.0 * head_dim * pairs * heads_b
    issued = (4.0 * round_up(bq, tiles.sublanes) * round_up(bkv, tiles.mxu) * round_up(head_dim, tiles.mxu)
              * tiles_n * heads_b * path.passes)
    scores = 1.0 * tiles_n * bq * bkv * heads_b
    masked = scores if (causal or window is not None or segment_ids) else 0.0
    row_blocks = 1.0 * tiles_n * bq * heads_b
    vpu, eup = softmax_work(scores, row_blocks, head_dim, masked)
    if soft_cap:
        vpu, eup = vpu + 2.0 * scores, eup + scores
    # Final normalisation: one reciprocal per row, head_dim multiplies and a cast.
    rows = 1.0 * cdiv(q_len, bq) * bq * heads_b
    vpu = vpu + rows * 2 * head_dim
    eup = eup + rows
    item = DTYPES[dt].itemsize_bytes
    q_bytes = 1.0 * batch * q_heads * q_len * head_dim * item
    kv_bytes = 2.0 * batch * kv_heads * tiles_n * bkv * head_dim * item
    ideal_kv = 2.0 * batch * kv_heads * kv_len * head_dim * item
    side_bytes = 0.0
    if sinks:
        side_bytes = side_bytes + 1.0 * batch * q_heads * 8 * 128 * 4
    if segment_ids:
        side_bytes = side_bytes + 1.0 * batch * kv_heads * (q_len * 128 + tiles_n * bkv * 8) * 4
    vmem = (2 * (bq * group + 2 * bkv) * head_dim * item + 2 * bq * group * head_dim * item
            + bq * group * (head_dim + 2 * 128) * 4 + bq * group * bkv * 4)
    steps = tiles_n * batch * kv_heads
    notes = list(path.notes)
    fixed = 0.0
    if chip is not None and chip.overheads.pallas_grid_step_overhead_s:
        fixed = steps * chip.overheads.pallas_grid_step_overhead_s
    if causal:
        notes.append("causal: fully masked tiles skipped, diagonal tiles computed in full")
    notes.append("K/V re-read once per q block (all q heads of a GQA group share each K/V tile)")
    with np.errstate(divide="ignore", invalid="ignore"):
        masked_share = 1.0 - pairs * heads_b / scores
    return OpCost(
        name="attention",
        mxu_flops=fval(issued),
        useful_flops=fval(useful),
        mxu_dtype=path.compute_dtype,
        vpu_ops=fval(vpu),
        eup_ops=fval(eup),
        hbm_read_bytes=fval(q_bytes + kv_bytes + side_bytes),
        hbm_write_bytes=fval(q_bytes),
        fixed_s=fval(fixed),
        launches=1,
        launch_kind="pallas",
        vmem_bytes=fval(vmem),
        notes=tuple(notes),
        metrics={
            "block_q": fval(bq),
            "block_kv": fval(bkv),
            "kv_tiles": fval(tiles_n),
            "masked_tile_share": fval(masked_share),
            "kv_reread_factor": fval(kv_bytes / ideal_kv),
            "grid_steps": fval(steps),
        },
    )
