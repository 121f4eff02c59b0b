"""Block sizes of the fused residual-add + RMSNorm kernel and per-chip defaults.

A block is ``block_tokens`` whole rows: the reduction runs over the full
hidden dimension, so hidden is never split (its block equals the array
dimension, which Mosaic accepts at any size).

``DEFAULT_BLOCK_SIZES`` is data (chip name -> blocks) for a tuning tool to
regenerate. A default that does not fit the VMEM budget for a large hidden
size is halved until it does (a user-given block raises instead).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kernels import tiling
from perfmodel.hw.spec import ChipSpec

#: f32 temporaries per row element the kernel body holds (y, y*y / normalized out).
_F32_TEMPS = 3


@dataclass(frozen=True, kw_only=True)
class RmsNormBlockSizes:
    """Rows per grid step; a multiple of the sublane tile of every row-blocked dtype."""

    block_tokens: int

    def __post_init__(self) -> None:
        tiling.check_positive_int("block_tokens", self.block_tokens)
        tiling.check_multiple("block_tokens", self.block_tokens, tiling.SUBLANES_32BIT, "sublane tile of a 32-bit dtype")

    def label(self) -> str:
        return f"block_tokens={self.block_tokens}"

    def vmem_bytes(self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool) -> int:
        """Double-buffered row blocks in and out, the weight row, and the body's f32 temporaries."""
        tile = tiling.padded_tile_bytes
        rows = (self.block_tokens, hidden)
        streamed = tile(rows, x_dtype) + 2 * tile(rows, residual_dtype) + tile(rows, out_dtype) + tile((1, hidden), x_dtype)
        if quantize:
            streamed += tile((self.block_tokens, 1), "float32")
        return 2 * streamed + _F32_TEMPS * tile(rows, "float32")

    def check(
        self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool, chip: ChipSpec
    ) -> int | None:
        """Check tiling and the VMEM budget; returns the vmem_limit_bytes to compile with (None: default)."""
        rows = max(tiling.sublane_multiple(d) for d in (x_dtype, residual_dtype, out_dtype))
        tiling.check_multiple("block_tokens", self.block_tokens, rows, "sublane tile of the x, residual and out dtypes")
        need = self.vmem_bytes(
            hidden=hidden, x_dtype=x_dtype, residual_dtype=residual_dtype, out_dtype=out_dtype, quantize=quantize
        )
        return tiling.compile_vmem_limit_bytes(need, chip, f"block_sizes ({self.label()})")

    def fitted(self, *, hidden: int, x_dtype: Any, residual_dtype: Any, out_dtype: Any, quantize: bool,
               chip: ChipSpec) -> "RmsNormBlockSizes":
        """These blocks halved until they fit the chip's default scoped VMEM limit (never below one row tile)."""
        floor = max(tiling.sublane_multiple(d) for d in (x_dtype, residual_dtype, out_dtype))
        scoped = chip.memory.vmem_default_scoped_limit_bytes_per_core or chip.memory.vmem_bytes_per_core
        blocks = self
        while blocks.block_tokens > floor and blocks.vmem_bytes(
            hidden=hidden, x_dtype=x_dtype, residual_dtype=residual_dtype, out_dtype=out_dtype, quantize=quantize
        ) > scoped:
            blocks = replace(blocks, block_tokens=max(floor, tiling.round_up(blocks.block_tokens // 2, floor)))
        return blocks


#: chip name -> default blocks (before fitting to the hidden size).
DEFAULT_BLOCK_SIZES: dict[str, RmsNormBlockSizes] = {
    "tpu-v2": RmsNormBlockSizes(block_tokens=128),
    "tpu-v3": RmsNormBlockSizes(block_tokens=128),
    "tpu-v4": RmsNormBlockSizes(block_tokens=256),
    "tpu-v5e": RmsNormBlockSizes(block_tokens=256),
    "tpu-v5p": RmsNormBlockSizes(block_tokens=256),
    "tpu-v6e": RmsNormBlockSizes(block_tokens=512),
    "tpu-7x": RmsNormBlockSizes(block_tokens=512),
}

FALLBACK_BLOCK_SIZES = RmsNormBlockSizes(block_tokens=128)


def default_block_sizes(chip: str) -> RmsNormBlockSizes:
    return DEFAULT_BLOCK_SIZES.get(chip, FALLBACK_BLOCK_SIZES)
