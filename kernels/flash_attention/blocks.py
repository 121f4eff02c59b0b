"""Block sizes of the flash-attention (prefill) kernel and their per-chip defaults.

The per-chip defaults are data chosen by the block-size advisor (``perfmodel
tune flash_attention``) and stored in ``kernels/flash_attention/tuned.json``;
see :func:`default_block_table`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels.tiling import (
    LANES,
    SUBLANES_32BIT,
    TunedChipTable,
    check_vmem,
    matmul_dtype_name,
    round_up,
    sublane_multiple,
    tuned_block_table,
    tuned_blocks,
    tuned_entry_chip,
)

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec

#: Bytes of one f32 element (softmax statistics, accumulator, scores).
F32_BYTES = 4
#: Pallas double-buffers every pipelined input and output block.
PIPELINE_BUFFERS = 2
#: [block_q, head_dim] f32 temporaries Mosaic keeps for the bf16 splits of f32 (HIGHEST precision) matmuls.
F32_HIGHEST_SPLITS = 4


@dataclass(frozen=True, kw_only=True)
class FlashAttentionBlockSizes:
    """Tile sizes of one grid step.

    ``block_q`` query rows and ``block_kv`` key/value rows are DMA'd per grid
    step; the step walks its K/V block in ``block_kv_compute``-row slices, so
    the f32 score tile is ``block_q x block_kv_compute``. Sequences need not be
    multiples of the blocks: edge blocks are masked, and a block longer than
    its sequence is shrunk to fit (see :meth:`effective`).
    """

    block_q: int
    block_kv: int
    #: Defaults to ``block_kv`` (one score tile per K/V block).
    block_kv_compute: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_q", "block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if value is None and name == "block_kv_compute":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"block_sizes.{name}: must be a positive int, got {value!r}")
        if self.block_q % SUBLANES_32BIT:
            raise ValueError(
                f"block_sizes.block_q: {self.block_q} is not a multiple of {SUBLANES_32BIT} "
                "(the sublane tile); use e.g. 128, 256 or 512"
            )
        for name in ("block_kv", "block_kv_compute"):
            value = getattr(self, name)
            if value is not None and value % LANES:
                raise ValueError(
                    f"block_sizes.{name}: {value} is not a multiple of {LANES} (the lane tile; "
                    "key positions are the lane axis of the score tile); use e.g. 128, 256 or 512"
                )
        if self.block_kv % self.kv_compute:
            raise ValueError(
                f"block_sizes.block_kv_compute: {self.kv_compute} does not divide "
                f"block_kv={self.block_kv}; pick a divisor such as {LANES}"
            )

    @property
    def kv_compute(self) -> int:
        """``block_kv_compute`` with its default filled in."""
        return self.block_kv if self.block_kv_compute is None else self.block_kv_compute

    def effective(self, *, q_len: int, kv_len: int) -> tuple[int, int, int]:
        """(block_q, block_kv, block_kv_compute) actually used for these sequence lengths.

        A block longer than its sequence is shrunk: to the whole sequence when it
        fits in one compute slice, else to the largest multiple of the compute
        slice that fits (the last block is then a masked partial block).
        """
        bq = min(self.block_q, q_len)
        bkc = self.kv_compute
        if kv_len <= bkc:
            return bq, kv_len, kv_len
        bk = min(self.block_kv, (kv_len // bkc) * bkc)
        return bq, bk, bkc

    def validate(self, *, q_dtype: Any, kv_dtype: Any, head_dim: int, group: int, q_len: int, kv_len: int,
                 spec: "ChipSpec") -> None:
        """Dtype-dependent tiling and the VMEM budget of ``spec``; ValueError naming the field."""
        packing = sublane_multiple(q_dtype)
        if self.block_q % packing and self.block_q < q_len:
            raise ValueError(
                f"block_sizes.block_q: {self.block_q} is not a multiple of {packing}, the sublane tile "
                f"of {_name(q_dtype)} queries; use a multiple of {packing}"
            )
        need = self.vmem_bytes(q_dtype=q_dtype, kv_dtype=kv_dtype, head_dim=head_dim, group=group, q_len=q_len,
                               kv_len=kv_len)
        check_vmem(need, spec, f"block_sizes: block_q={self.block_q}, block_kv={self.block_kv}, "
                               f"block_kv_compute={self.kv_compute} with {group} q heads per kv head")

    def vmem_bytes(self, *, q_dtype: Any, kv_dtype: Any, head_dim: int, group: int, q_len: int,
                   kv_len: int) -> int:
        """VMEM one grid step needs, as Mosaic allocates it: double-buffered q/k/v/out blocks, the f32
        softmax scratch, and the body's temporaries, all padded to whole (sublane, lane) tiles.

        A step holds the ``group`` q heads of one kv head: q, out and the softmax scratch scale with
        it; the temporaries do not (the kernel loops over heads and compute slices, so Mosaic keeps one
        head's slice live at a time). Those temporaries are one ``[block_q, block_kv_compute]`` score
        tile in f32 plus its probabilities in V's dtype (Mosaic spills both to VMEM; 1.5 f32 tiles
        for bf16); f32 inputs also keep the bf16 splits of the HIGHEST-precision matmuls, about four
        ``[block_q, head_dim]`` f32 tiles. Checked against Mosaic's allocation on
        v4 to 7x: at or above it, and within 10% for the tuned defaults at GQA 4.
        """
        import numpy as np

        bq, bk, bkc = self.effective(q_len=q_len, kv_len=kv_len)
        q_bytes = np.dtype(q_dtype).itemsize
        kv_bytes = np.dtype(kv_dtype).itemsize
        rows_q = round_up(bq, sublane_multiple(q_dtype))
        rows_f32 = round_up(bq, SUBLANES_32BIT)
        lanes_d = round_up(head_dim, LANES)
        rows_kv = round_up(bk, sublane_multiple(kv_dtype))
        pipelined = PIPELINE_BUFFERS * (2 * group * rows_q * lanes_d * q_bytes + 2 * rows_kv * lanes_d * kv_bytes)
        scratch = F32_BYTES * group * rows_f32 * (2 * LANES + lanes_d)
        # One head's scores in f32 and probabilities in V's dtype, [block_q, block_kv_compute].
        temporaries = rows_f32 * round_up(bkc, LANES) * (F32_BYTES + kv_bytes)
        if q_bytes == F32_BYTES:
            temporaries += F32_BYTES * rows_f32 * lanes_d * F32_HIGHEST_SPLITS
        return int(pipelined + scratch + temporaries)


def _name(dtype: Any) -> str:
    import numpy as np

    return np.dtype(dtype).name


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, FlashAttentionBlockSizes]]:
    """chip name -> q dtype ("bf16") -> default blocks, before fitting to the call.

    Data chosen by the block-size advisor and stored in
    ``kernels/flash_attention/tuned.json`` (regenerate with
    ``perfmodel tune --write flash_attention``). Read on first use, not at import.
    """
    return tuned_block_table("flash_attention", lambda b: FlashAttentionBlockSizes(
        block_q=b["block_q"], block_kv=b["block_kv"], block_kv_compute=b.get("block_kv_compute")))


#: chip name -> default blocks (the tuned bf16 configuration), read from the JSON on first use.
DEFAULT_BLOCK_SIZES = TunedChipTable(default_block_table)


def _smaller(sizes: FlashAttentionBlockSizes, floor: int) -> FlashAttentionBlockSizes | None:
    """One step down: block_q halved (not below ``floor``), else block_kv halved (not below the compute
    slice), else both K/V sizes halved (not below 128); None at the smallest blocks."""
    if sizes.block_q > floor:
        return dataclasses.replace(sizes, block_q=max(floor, sizes.block_q // 2 // floor * floor))
    bkc = sizes.kv_compute
    if sizes.block_kv > bkc:
        return dataclasses.replace(sizes, block_kv=max(bkc, sizes.block_kv // 2 // bkc * bkc))
    if bkc > LANES:
        half = max(LANES, bkc // 2 // LANES * LANES)
        return dataclasses.replace(sizes, block_kv=half, block_kv_compute=half)
    return None


def default_block_sizes(chip: str, *, q_dtype: Any = "bfloat16", kv_dtype: Any = "bfloat16",
                        head_dim: int = 128, group: int = 1, q_len: int = 8192, kv_len: int = 8192,
                        vmem_limit: int | None = None) -> FlashAttentionBlockSizes:
    """The chip's tuned defaults for q's dtype (its bf16 ones when that dtype is not tuned), made smaller
    while a step would overflow ``vmem_limit``: block_q halved first, then block_kv, then the compute slice.

    Large GQA groups multiply the per-step query state, f32 doubles every buffer, hence the shrinking.
    A chip the JSON lacks takes :func:`kernels.tiling.tuned_entry_chip`'s defaults; ValueError naming ``chip``
    if even that chip has none.
    """
    table = default_block_table()
    sizes = tuned_blocks(table, tuned_entry_chip(table, chip), matmul_dtype_name(q_dtype))
    if sizes is None:
        known = ", ".join(table)
        raise ValueError(
            f"chip: no flash_attention block-size defaults for '{chip}'; use one of {known} "
            "or pass block_sizes=FlashAttentionBlockSizes(...)"
        )
    if vmem_limit is None:
        return sizes
    floor = sublane_multiple(q_dtype)
    while sizes.vmem_bytes(q_dtype=q_dtype, kv_dtype=kv_dtype, head_dim=head_dim, group=group, q_len=q_len,
                           kv_len=kv_len) > vmem_limit:
        smaller = _smaller(sizes, floor)
        if smaller is None:
            break
        sizes = smaller
    return sizes
