"""Block sizes of the matmul kernel: the validated dataclass and per-chip defaults.

The per-chip defaults are data chosen by the schedule model's block-size advisor
(``perfmodel tune matmul``) and stored in ``perfmodel/data/tuned/matmul.json``
(chip name -> "LHS x RHS" operand dtypes -> blocks); see :func:`default_block_table`.
Stored defaults fit the chip's default scoped VMEM limit unless the JSON gives
them a ``vmem_limit_bytes``. Blocks larger than the default scoped VMEM limit
make the wrapper raise ``vmem_limit_bytes`` up to the physical VMEM.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any

from kernels import tiling
from perfmodel.hw.spec import ChipSpec


@dataclass(frozen=True, kw_only=True)
class MatmulBlockSizes:
    """Tile of one grid step: x[bm, bk] @ w[bk, bn] -> out[bm, bn].

    bm is a sublane dimension (multiple of the x/out dtype's sublane tile);
    bk and bn are lane dimensions of x and w/out (multiples of 128).
    """

    bm: int
    bk: int
    bn: int

    def __post_init__(self) -> None:
        for field in ("bm", "bk", "bn"):
            tiling.check_positive_int(field, getattr(self, field))
        tiling.check_multiple("bm", self.bm, tiling.SUBLANES_32BIT, "sublane tile of a 32-bit dtype")
        tiling.check_multiple("bk", self.bk, tiling.LANES, "lane tile: bk is the minor dim of the x block")
        tiling.check_multiple("bn", self.bn, tiling.LANES, "lane tile: bn is the minor dim of the w and out blocks")

    def label(self) -> str:
        return f"bm={self.bm},bk={self.bk},bn={self.bn}"

    def vmem_bytes(self, *, x_dtype: Any, w_dtype: Any, out_dtype: Any, epilogue_vectors: int) -> int:
        """VMEM one grid step holds: double-buffered x, w, out tiles (and the
        epilogue's [1, bn] vectors), the f32 accumulator, the f32 dot result and,
        when w is converted in the kernel, the converted w tile."""
        tile = tiling.padded_tile_bytes
        streamed = (
            tile((self.bm, self.bk), x_dtype)
            + tile((self.bk, self.bn), w_dtype)
            + tile((self.bm, self.bn), out_dtype)
            + epilogue_vectors * tile((1, self.bn), "float32")
        )
        f32_tiles = 2 * tile((self.bm, self.bn), "float32")
        converted_w = tile((self.bk, self.bn), x_dtype) if tiling.np_dtype(w_dtype) != tiling.np_dtype(x_dtype) else 0
        return 2 * streamed + f32_tiles + converted_w

    def check(self, *, x_dtype: Any, w_dtype: Any, out_dtype: Any, epilogue_vectors: int, chip: ChipSpec) -> int | None:
        """Check the dtype-dependent tiling rules and the VMEM budget on chip.

        Returns the ``vmem_limit_bytes`` to compile with (None: the default scoped limit suffices).
        """
        rows = max(tiling.sublane_multiple(x_dtype), tiling.sublane_multiple(out_dtype))
        tiling.check_multiple("bm", self.bm, rows, "sublane tile of the x and out dtypes")
        tiling.check_multiple("bk", self.bk, tiling.sublane_multiple(w_dtype), "sublane tile of the w dtype")
        need = self.vmem_bytes(x_dtype=x_dtype, w_dtype=w_dtype, out_dtype=out_dtype, epilogue_vectors=epilogue_vectors)
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", raised_limit=True)


def _b(bm: int, bk: int, bn: int) -> MatmulBlockSizes:
    return MatmulBlockSizes(bm=bm, bk=bk, bn=bn)


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, MatmulBlockSizes]]:
    """chip name -> "x dtype x w dtype" (ChipSpec naming) -> default blocks.

    Data chosen by the block-size advisor (``perfmodel tune matmul``) and stored
    in ``perfmodel/data/tuned/matmul.json``; regenerate it with
    ``python -m perfmodel.schedule.tune --write``. Read on first use, not at import.
    """
    return tiling.tuned_block_table("matmul", lambda b: _b(b["bm"], b["bk"], b["bn"]))


#: Used for an operand pair or chip the table does not list (e.g. a chip spec given as a file): at most 5 MiB
#: of VMEM (f32 x f32), within every TPU's default scoped limit.
FALLBACK_BLOCK_SIZES = _b(256, 512, 512)


def default_block_sizes(chip: str, x_name: str, w_name: str) -> MatmulBlockSizes:
    """The table's blocks for (chip, operand dtypes); FALLBACK_BLOCK_SIZES when not listed."""
    return default_block_table().get(chip, {}).get(f"{x_name} x {w_name}", FALLBACK_BLOCK_SIZES)
