"""Block sizes of the fused residual-add + RMSNorm kernel and per-chip defaults.

A block is ``block_tokens`` whole rows: the reduction runs over the full
hidden dimension, so hidden is never split (its block equals the array
dimension, which Mosaic accepts at any size).

The per-chip defaults are data chosen by the block-size advisor (``perfmodel
tune rms_norm``) and stored in ``kernels/rms_norm/tuned.json``; see
:func:`default_block_table`. A default that does not fit the VMEM budget for a
large hidden size is halved until it does (a user-given block raises instead).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kernels import tiling

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec

#: [block_tokens, hidden] f32 tiles of body temporaries Mosaic keeps in VMEM (y and the normalized out; the
#: quantization's scaled copy too), on chips where Mosaic keeps bf16/int8 temporaries narrow and (more) on those
#: where it widens them through f32 (tpu-v4; kernels.tiling.narrow_vmem_temporaries).
_F32_TEMPS = 1.1
_F32_TEMPS_QUANTIZE = 2.1
_F32_TEMPS_F32_VPU = 1.3
_F32_TEMPS_QUANTIZE_F32_VPU = 2.25


@dataclass(frozen=True, kw_only=True)
class RmsNormBlockSizes:
    """Rows per grid step; a multiple of the sublane tile of every row-blocked dtype."""

    block_tokens: int

    def __post_init__(self) -> None:
        tiling.check_positive_int("block_tokens", self.block_tokens)
        tiling.check_multiple("block_tokens", self.block_tokens, tiling.SUBLANES_32BIT, "sublane tile of a 32-bit dtype")

    def label(self) -> str:
        return f"block_tokens={self.block_tokens}"

    def vmem_bytes(self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool,
                   chip: ChipSpec | None = None) -> int:
        """VMEM of one grid step as Mosaic allocates it (v4 to 7x): double-buffered row blocks
        in (x, residual) and out (out or int8 q, new residual; quantizing, the [rows, 1] scales), the weight
        row, padded as :func:`kernels.tiling.mosaic_buffer_bytes`, and the body's f32 temporaries: about
        1.1 ``[block_tokens, hidden]`` f32 tiles (2.1 quantizing; 1.3 and 2.25 on chips that widen
        through f32, or ``chip`` None). Within 3% above Mosaic's figure on every measured case."""
        buf = tiling.mosaic_buffer_bytes
        rows = (self.block_tokens, hidden)
        streamed = (buf(rows, x_dtype) + buf(rows, residual_dtype) + buf(rows, out_dtype) + buf(rows, residual_dtype)
                    + buf((1, hidden), "float32"))
        if quantize:
            streamed += buf((self.block_tokens, 1), "float32")
        narrow = chip is not None and tiling.narrow_vmem_temporaries(chip)
        tiles = (_F32_TEMPS_QUANTIZE if quantize else _F32_TEMPS) if narrow else (
            _F32_TEMPS_QUANTIZE_F32_VPU if quantize else _F32_TEMPS_F32_VPU)
        temporaries = int(tiles * self.block_tokens * tiling.round_up(hidden, tiling.LANES) * 4)
        return int(2 * streamed + temporaries)

    def check(
        self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool, chip: ChipSpec
    ) -> int | None:
        """Check tiling and the VMEM budget; returns the vmem_limit_bytes to compile with (None: default)."""
        rows = max(tiling.sublane_multiple(d) for d in (x_dtype, residual_dtype, out_dtype))
        tiling.check_multiple("block_tokens", self.block_tokens, rows, "sublane tile of the x, residual and out dtypes")
        need = self.vmem_bytes(
            hidden=hidden, x_dtype=x_dtype, residual_dtype=residual_dtype, out_dtype=out_dtype, quantize=quantize,
            chip=chip,
        )
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", raised_limit=True)

    def fitted(self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool,
               chip: ChipSpec) -> "RmsNormBlockSizes":
        """These blocks halved until they fit the chip's default scoped VMEM limit (never below one row tile)."""
        floor = max(tiling.sublane_multiple(d) for d in (x_dtype, residual_dtype, out_dtype))
        scoped = tiling.scoped_vmem_limit_bytes(chip)
        blocks = self
        while blocks.block_tokens > floor and blocks.vmem_bytes(
            hidden=hidden, x_dtype=x_dtype, residual_dtype=residual_dtype, out_dtype=out_dtype, quantize=quantize,
            chip=chip,
        ) > scoped:
            blocks = replace(blocks, block_tokens=max(floor, tiling.round_up(blocks.block_tokens // 2, floor)))
        return blocks


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, RmsNormBlockSizes]]:
    """chip name -> dtype configuration ("bf16") -> default blocks, before fitting to the hidden size.

    Data chosen by the block-size advisor and stored in
    ``kernels/rms_norm/tuned.json`` (regenerate with
    ``perfmodel tune --write rms_norm``). Read on first use, not at import.
    """
    return tiling.tuned_block_table("rms_norm", lambda b: RmsNormBlockSizes(block_tokens=b["block_tokens"]))


#: chip name -> default blocks (the tuned bf16 configuration), read from the JSON on first use.
DEFAULT_BLOCK_SIZES = tiling.TunedChipTable(default_block_table)

#: Used for a chip the JSON does not list (e.g. a chip spec given as a file), before fitting.
FALLBACK_BLOCK_SIZES = RmsNormBlockSizes(block_tokens=128)


def default_block_sizes(chip: str) -> RmsNormBlockSizes:
    """The chip's tuned blocks (a chip the JSON lacks: :func:`kernels.tiling.tuned_entry_chip`'s;
    FALLBACK_BLOCK_SIZES if even that chip has none); fit them with :meth:`fitted`."""
    table = default_block_table()
    return tiling.tuned_blocks(table, tiling.tuned_entry_chip(table, chip)) or FALLBACK_BLOCK_SIZES
