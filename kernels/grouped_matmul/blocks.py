"""Block sizes of the grouped matmul kernel: the validated dataclass and per-chip defaults.

The defaults are data chosen by the block-size advisor (``perfmodel tune --compile --write grouped_matmul``) and
stored in ``kernels/grouped_matmul/tuned.json`` (chip -> "LHS x RHS" dtypes -> blocks, keyed by
:class:`kernels.grouped_matmul.variants.TunedKey`); see :func:`default_block_table`. A tile of the grouped matmul
is the bundled matmul's tile (an lhs row tile, one expert's weight tile, an f32 accumulator), so its VMEM need is
the matmul's (:class:`kernels.matmul.blocks.MatmulBlockSizes`) plus the masked store's temporaries.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kernels import tiling
from kernels.grouped_matmul.variants import TunedKey
from kernels.matmul.blocks import DECODE_MAX_M, MatmulBlockSizes, MatmulVariant

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec


#: lhs tiles ([bm, bk], lhs dtype) Mosaic allocates beyond the bundled matmul's tile for this body (the lhs slice
#: the dot reads from the resident row, the selected accumulator): fitted on two tpu-v5e compiles with libtpu
#: 0.0.42.1 (8192x4096 @ 8x4096x14336 bf16 at 512x1024x1024: Mosaic 11.1 MiB, without this term 10.0 MiB; 64 rows
#: at 64x2048x1024: 9.70 MiB vs 9.50 MiB); with it the estimate is 1% above both.
LHS_EXTRA_TILES = 1.25


@dataclass(frozen=True, kw_only=True)
class GroupedMatmulBlockSizes(tiling.GemmTile):
    """Tile of one grid step: lhs[bm, bk] @ rhs[group, bk, bn] -> out[bm, bn].

    bm is a sublane dimension (a multiple of the lhs/out dtype's sublane tile); bk and bn are lane dimensions
    (multiples of 128). A row tile holding rows of several groups is computed once per group.
    """

    def vmem_bytes(self, *, lhs_dtype: Any, rhs_dtype: Any, out_dtype: Any, scaled: bool,
                   chip: ChipSpec | None = None, lhs_row: int | None = None) -> int:
        """VMEM one grid step holds: the bundled matmul's tile (``lhs_row``: a resident [bm, lhs_row] lhs row
        block instead of the [bm, bk] tile; ``scaled``: a [1, bn] per-channel scale vector) plus the masked
        store's f32 [bm, bn] result and its row mask, and :data:`LHS_EXTRA_TILES` lhs tiles."""
        tile = MatmulBlockSizes(bm=self.bm, bk=self.bk, bn=self.bn)
        need = tile.vmem_bytes(x_dtype=lhs_dtype, w_dtype=rhs_dtype, out_dtype=out_dtype, epilogue_vectors=int(scaled),
                               chip=chip, variant=MatmulVariant(x_row=lhs_row))
        return int(need + 2 * tiling.mosaic_buffer_bytes((self.bm, self.bn), "float32")
                   + LHS_EXTRA_TILES * tiling.mosaic_buffer_bytes((self.bm, self.bk), lhs_dtype))

    def check(self, *, lhs_dtype: Any, rhs_dtype: Any, out_dtype: Any, scaled: bool, chip: ChipSpec,
              lhs_row: int | None = None) -> int | None:
        """Check the dtype-dependent tiling rules and the VMEM budget on chip; the ``vmem_limit_bytes`` to
        compile with (None: the default scoped limit suffices)."""
        self.check_dtype_tiles(lhs_dtype, rhs_dtype, out_dtype)
        need = self.vmem_bytes(lhs_dtype=lhs_dtype, rhs_dtype=rhs_dtype, out_dtype=out_dtype, scaled=scaled,
                               chip=chip, lhs_row=lhs_row)
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", raised_limit=True)


def _b(bm: int, bk: int, bn: int) -> GroupedMatmulBlockSizes:
    return GroupedMatmulBlockSizes(bm=bm, bk=bk, bn=bn)


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, GroupedMatmulBlockSizes]]:
    """chip name -> "lhs dtype x rhs dtype" (ChipSpec naming) -> default blocks, from ``tuned.json`` (read on
    first use, not at import)."""
    return tiling.tuned_block_table("grouped_matmul", lambda b: _b(b["bm"], b["bk"], b["bn"]))


#: For an operand pair or chip the table does not list: at most ~5 MiB of VMEM (f32 x f32), within every TPU's
#: default scoped limit.
FALLBACK_BLOCK_SIZES = _b(256, 512, 512)


def default_block_sizes(chip: str, lhs_name: str, rhs_name: str, *, m: int | None = None) -> GroupedMatmulBlockSizes:
    """The table's blocks for (chip, operand dtypes), its "... decode" blocks when ``m`` (all groups' rows) is at
    most matmul's DECODE_MAX_M and it has them (a chip the table lacks: :func:`kernels.tiling.tuned_entry_chip`'s);
    FALLBACK_BLOCK_SIZES when the pair is not listed."""
    table = default_block_table()
    configs, key = table.get(tiling.tuned_entry_chip(table, chip), {}), TunedKey(lhs=lhs_name, rhs=rhs_name)
    decode = replace(key, decode=True).text()
    if m is not None and m <= DECODE_MAX_M and decode in configs:
        return configs[decode]
    return configs.get(key.text(), FALLBACK_BLOCK_SIZES)
