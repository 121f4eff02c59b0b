"""XLA's chunked attention: memory-efficient attention as a loop of XLA fusions (tokamax's
``XlaChunkedDotProductAttention``, after Rabe & Staats, arXiv 2112.05682).

The op scans over query chunks and, inside, loops over key chunks with an online softmax: every (query chunk,
key chunk) pair is computed, a causal or boolean mask is applied to it, never skipped. Compiled for TPU7x
(libtpu 0.0.42.1, deviceless, tokamax 0.0.12's op at 21 shapes; ``perfmodel xla`` on it), each iteration is
three fusions: the QK^T dot with the scale, bias and mask and the row max; exp and the row sum; the PV dot with
exp recomputed and the f32 accumulator rescaled. Their bundles per 128 x 128 tile of logits of one (batch,
head) follow the line of :func:`tile_cycles` (perfmodel/data/calibration/efficiency.yaml,
``xla_chunked_attention_tile_cycles``, with the shapes it was read off). The dots alone are about 64 of them
(K and N padded to the 256-wide MXU); the rest is the softmax, the accumulator and the loads around them.
The loop's HBM traffic by the program's own types (the f32 accumulator and logits, the q, k and v chunks:
405 MB an iteration at mixtral's shapes) does not bound it: tokamax's measured points run at 1.19x their loop's
bundles, faster than those bytes could move at one core's HBM rate, so the loop is priced by its bundles.

Priced as: the loop's bundles as issue slots at the chip's clock, counted as VPU work (one bundle = the
VPU's ops of one cycle) so that they run at the VPU's achievable share (0.80, an assumption), with the
padded dots' MXU work beside them for the floor and the report; then, outside the loop and in sequence,
XLA's HBM passes: k and v repeated to the query heads (GQA, ``jnp.repeat``), the output normalized and
written per chunk and re-laid from [chunks, ...] to [..., seq] (a transpose). On tokamax's two measured 7x
points: measured / expected 1.03 and 0.95 (nothing fitted on either).

Where it is a guess: the line was read on 7x only; other TPUs take the same cycles at their own clock (their
MXUs are narrower, so the dots' share differs; a note says so). Chunks other than 128 x 128 scale the tile's
cycles by area, unmeasured. The batch x heads term is clamped to the compiled range (32-8192).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.hw.views import split_device_suffix
from perfmodel.model.attention import check_heads
from perfmodel.model.core import Num, OpCost, combine
from perfmodel.model.dtypes import DTYPES, parse_dtype
from perfmodel.model.shapes import cdiv, chip_tiles, fval, round_up, sizes

#: The chunk edge the tile-cycle line was read at (tokamax's default ``chunk_size``).
LAW_CHUNK = 128
#: XLA launches outside the loop: the GQA repeat (when there is one), the output's write and its re-layout.
OUTSIDE_LAUNCHES = 2


#: Fields of the calibration file's ``xla_chunked_attention_tile_cycles`` (:func:`tile_cycles`).
LINE_FIELDS = ("base", "per_head_dim", "per_v_head_dim", "bias_and_mask", "per_log2_batch_heads", "head_dim_cap",
               "batch_heads_range")


def tile_cycle_line() -> dict[str, Any]:
    """The calibration file's line for the bundles of one 128 x 128 tile of the chunk loop, checked field by
    field (a ValueError naming the file and field otherwise)."""
    # The calibration table is efficiency's (one reader of the file); its loader is read, not changed, here so
    # that compiles keyed on efficiency.py's source stay cached.
    from perfmodel.model.efficiency import EFFICIENCY_FILE, _table

    where = f"{EFFICIENCY_FILE}: xla_chunked_attention_tile_cycles"
    value = _table().get("xla_chunked_attention_tile_cycles")
    if not isinstance(value, dict) or set(value) != set(LINE_FIELDS):
        got = ", ".join(sorted(value)) if isinstance(value, dict) else repr(value)
        raise ValueError(f"{where}: give exactly {', '.join(LINE_FIELDS)} (got {got})")
    lo, hi = (float(x) for x in value["batch_heads_range"])
    if not 1 <= lo <= hi or float(value["head_dim_cap"]) < 1:
        raise ValueError(f"{where}: batch_heads_range must be [low, high] with 1 <= low <= high and head_dim_cap "
                         ">= 1")
    line: dict[str, Any] = {k: float(value[k]) for k in LINE_FIELDS[:-1]}
    line["batch_heads_range"] = (lo, hi)
    return line


def tile_cycle_chip() -> str:
    """The chip whose compiles the tile-cycle line was read off (the calibration file's
    ``xla_chunked_attention_read_on``)."""
    from perfmodel.model.efficiency import EFFICIENCY_FILE, _table

    chip = _table().get("xla_chunked_attention_read_on")
    if not isinstance(chip, str) or not chip:
        raise ValueError(f"{EFFICIENCY_FILE}: xla_chunked_attention_read_on: name the chip the tile-cycle line was "
                         f"read on (got {chip!r})")
    return chip


def tile_cycles(*, head_dim: Num, v_head_dim: Num, bias_and_mask: bool, batch_heads: Num) -> np.ndarray:
    """Bundles (cycles) of one 128 x 128 logits tile of one (batch, head) in XLA's chunk loop on a TPU: the
    calibration file's line in the head dims (each capped where the compiles flatten), a bias and boolean mask,
    and log2 of batch x query heads (clamped to the compiled range)."""
    line = tile_cycle_line()
    cap = line["head_dim_cap"]
    lo, hi = line["batch_heads_range"]
    log_bh = np.log2(np.clip(np.asarray(batch_heads, dtype=float), lo, hi))
    return (line["base"] + line["per_head_dim"] * np.minimum(head_dim, cap) / LAW_CHUNK
            + line["per_v_head_dim"] * np.minimum(v_head_dim, cap) / LAW_CHUNK
            + line["bias_and_mask"] * float(bias_and_mask) + line["per_log2_batch_heads"] * log_bh)


def xla_chunked_attention(*, batch: Num, q_len: Num, kv_len: Num, q_heads: Num, kv_heads: Num, head_dim: Num,
                          v_head_dim: Num | None = None, chunk: Num = LAW_CHUNK, bias_and_mask: bool = False,
                          dtype: str = "bf16", chip: object | None = None) -> OpCost:
    """XLA's chunked attention over q [batch, q_len, q_heads, head_dim] and k, v [batch, kv_len, kv_heads, .]
    with ``chunk`` x ``chunk`` chunks (module docstring): the chunk loop, then XLA's passes around it.
    ``bias_and_mask``: an additive bias and a boolean mask (AlphaFold's attention); a causal mask costs the
    same as none (it is applied to every chunk, not used to skip any). metrics: ``iterations`` (chunk pairs),
    ``tile_cycles`` (bundles of one 128 x 128 tile)."""
    if chip is None or getattr(chip, "kind", None) != "tpu":
        name = getattr(chip, "name", "this chip")
        raise InputError(f"`hw`: {name} is not a TPU; XLA's chunked attention loop is modelled from the TPU "
                         "compiler's schedules only")
    batch, q_len, kv_len = sizes("batch", batch), sizes("q_len", q_len), sizes("kv_len", kv_len)
    q_heads, kv_heads, head_dim = sizes("q_heads", q_heads), sizes("kv_heads", kv_heads), sizes("head_dim", head_dim)
    v_head_dim = head_dim if v_head_dim is None else sizes("v_head_dim", v_head_dim)
    chunk = sizes("chunk", chunk)
    dt = parse_dtype(dtype, "`dtype`")
    group = check_heads(q_heads, kv_heads)
    item = DTYPES[dt].itemsize_bytes
    tiles = chip_tiles(chip)
    compute = chip.compute  # type: ignore[attr-defined]

    batch_heads = batch * q_heads
    iterations = cdiv(q_len, chunk) * cdiv(kv_len, chunk)
    cycles = tile_cycles(head_dim=head_dim, v_head_dim=v_head_dim, bias_and_mask=bias_and_mask,
                         batch_heads=batch_heads)
    # Every chunk pair is computed whole (a remainder chunk priced as a full one), scaled from the 128 x 128
    # tile the line was read at by its area.
    tile_area = (chunk / LAW_CHUNK) ** 2
    loop_cycles = 1.0 * cycles * tile_area * batch_heads * iterations
    vpu_per_cycle = compute.vpu_flops_per_s_per_chip / compute.clock_hz
    pair_tiles = 1.0 * batch_heads * iterations * chunk * chunk
    issued = 2.0 * pair_tiles * (round_up(head_dim, tiles.mxu) * round_up(chunk, tiles.mxu)
                                 + round_up(chunk, tiles.mxu) * round_up(v_head_dim, tiles.mxu)) / chunk
    useful = 2.0 * batch_heads * q_len * kv_len * (head_dim + v_head_dim)
    q_bytes = 1.0 * batch * q_len * q_heads * head_dim * item
    kv_bytes = 1.0 * batch * kv_len * kv_heads * (head_dim + v_head_dim) * item
    out_bytes = 1.0 * batch * q_len * q_heads * v_head_dim * item
    loop = OpCost(name="chunk loop", mxu_flops=fval(issued), useful_flops=fval(useful), mxu_dtype="bf16",
                  vpu_ops=fval(loop_cycles * vpu_per_cycle), eup_ops=fval(2.0 * pair_tiles),
                  hbm_read_bytes=fval(q_bytes + kv_bytes * group), launches=1)
    # GQA: k and v repeated to the query heads before the loop (read once, written group times larger).
    repeat_read = np.where(group > 1, kv_bytes, 0.0)
    repeat_write = np.where(group > 1, kv_bytes * group, 0.0)
    outside = OpCost(name="passes around the loop", hbm_read_bytes=fval(repeat_read + out_bytes),
                     hbm_write_bytes=fval(repeat_write + 2.0 * out_bytes),
                     launches=OUTSIDE_LAUNCHES + np.where(group > 1, 1, 0))
    from perfmodel.hw.registry import get_chip

    read_on = tile_cycle_chip()
    read_name = get_chip(read_on).display_name
    notes = [f"the chunk loop's bundles (the compiler's, a line per 128x128 tile read off {read_name} compiles) "
             "are priced as VPU issue slots; its HBM traffic hides under them"]
    if split_device_suffix(getattr(chip, "name", ""))[0] != read_on:
        notes.append(f"the tile-cycle line was read on {read_name}; on this chip it is the same cycles at its own "
                     "clock, unmeasured")
    if np.any(chunk != LAW_CHUNK):
        notes.append(f"chunks other than {LAW_CHUNK} scale the tile's cycles by area (unmeasured)")
    return combine("xla-chunked-attention", [loop, outside], tuple(notes), in_sequence=True,
                   metrics={"iterations": fval(iterations), "tile_cycles": fval(cycles)})
