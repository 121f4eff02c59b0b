"""Block sizes and VMEM budgets of the paged KV-cache update kernel, and per-chip defaults.

Head-major layout (the default): one grid step per token, whose block is the
token's whole page for every kv head; nothing to tune, see
:func:`head_major_vmem_bytes`.

Token-major layout: a block is ``tokens_per_block`` new tokens, each a whole [kv_heads, head_dim]
slab (the block spans both minor dimensions completely, so Mosaic's tile
rules hold at any head count or head size). Every token of a block is written
by its own DMA; all of a block's DMAs are in flight together.

The token-major per-chip defaults are data chosen by the block-size advisor
(``perfmodel tune kv_cache_update_token_major``) and stored in
``perfmodel/data/tuned/kv_cache_update.json``; see :func:`default_block_table`.
They are tuned with int8 caches (quantize on write, the larger VMEM need), so
they also fit bf16/f32 caches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from kernels import tiling
from perfmodel.hw.spec import ChipSpec


#: Cache layouts: head-major [kv_heads, num_pages, page_size, head_dim] (what paged_attention reads),
#: token-major [num_pages, page_size, kv_heads, head_dim].
LAYOUTS = ("head-major", "token-major")
DEFAULT_LAYOUT = "head-major"


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {', '.join(map(repr, LAYOUTS))}")


@dataclass(frozen=True, kw_only=True)
class KvCacheUpdateBlockSizes:
    """New tokens per grid step (a leading dimension: no tile-multiple rule)."""

    tokens_per_block: int

    def __post_init__(self) -> None:
        tiling.check_positive_int("tokens_per_block", self.tokens_per_block)

    def label(self) -> str:
        return f"tokens_per_block={self.tokens_per_block}"

    def vmem_bytes(self, *, kv_heads: int, head_dim: int, new_dtype: Any, quantize: bool) -> int:
        """Double-buffered K and V token blocks, plus (quantizing) the int8 copies, scales and f32 temporaries."""
        tile = tiling.padded_tile_bytes
        slab = (self.tokens_per_block, kv_heads, head_dim)
        need = 2 * 2 * tile(slab, new_dtype)
        if quantize:
            scales = (self.tokens_per_block, kv_heads, 1)
            need += 2 * (tile(slab, "int8") + tile(scales, "float32")) + 2 * tile(slab, "float32")
        return need

    def check(self, *, kv_heads: int, head_dim: int, new_dtype: Any, quantize: bool, chip: ChipSpec) -> int | None:
        """Check the VMEM budget; returns the vmem_limit_bytes to compile with (None: default)."""
        need = self.vmem_bytes(kv_heads=kv_heads, head_dim=head_dim, new_dtype=new_dtype, quantize=quantize)
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", fix="use a smaller tokens_per_block",
                                 raised_limit=True)


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, KvCacheUpdateBlockSizes]]:
    """chip name -> configuration -> default token-major blocks.

    Data chosen by the block-size advisor and stored in
    ``perfmodel/data/tuned/kv_cache_update.json`` (regenerate with
    ``python -m perfmodel.schedule.tune --write kv_cache_update``). Read on first use, not at import.
    """
    return tiling.tuned_block_table("kv_cache_update",
                                    lambda b: KvCacheUpdateBlockSizes(tokens_per_block=b["tokens_per_block"]))


#: chip name -> default token-major blocks, read from the JSON on first use.
DEFAULT_BLOCK_SIZES = tiling.TunedChipTable(default_block_table)

#: Used for a chip the JSON does not list (e.g. a chip spec given as a file).
FALLBACK_BLOCK_SIZES = KvCacheUpdateBlockSizes(tokens_per_block=32)


def default_block_sizes(chip: str) -> KvCacheUpdateBlockSizes:
    """The chip's tuned token-major blocks; FALLBACK_BLOCK_SIZES for a chip the JSON lacks."""
    return tiling.tuned_blocks(default_block_table(), chip) or FALLBACK_BLOCK_SIZES


#: Pages per block of a head-major scale cache [kv_heads, num_pages, page_size]: the pages axis is its
#: second-minor (sublane) dimension, so a block spans a whole f32 tile of 8 pages.
SCALE_PAGES_PER_BLOCK = 8


def scale_pages_per_block(num_pages: int) -> int:
    """8 when it divides num_pages, else all pages (a block must be a tile multiple or the whole dimension).

    No partial last block: Pallas' TPU interpret mode mishandles a partial block
    of an aliased output (it returns the padded buffer), so the kernel avoids one.
    """
    return SCALE_PAGES_PER_BLOCK if num_pages % SCALE_PAGES_PER_BLOCK == 0 else num_pages


def head_major_vmem_bytes(*, kv_heads: int, num_pages: int, page_size: int, head_dim: int, new_dtype: Any,
                          cache_dtype: Any, quantize: bool) -> int:
    """VMEM of the head-major kernel: one token's K/V slabs and one page of each cache, all double-buffered.

    Per cache: an input and an output page block [kv_heads, page_size, head_dim],
    two buffers each; the new token's [kv_heads, head_dim] K and V, two buffers
    each; the f32 page row-insert temporaries (one head at a time: old and new);
    quantizing, the scale blocks [kv_heads, scale_pages_per_block, page_size] the same way.
    """
    tile = tiling.padded_tile_bytes
    buffers = 2  # double buffering
    need = 2 * buffers * tile((kv_heads, head_dim), new_dtype)
    need += 2 * 2 * buffers * kv_heads * tile((page_size, head_dim), cache_dtype)
    need += 2 * tile((page_size, head_dim), "float32")
    if quantize:
        need += 2 * 2 * buffers * kv_heads * tile((scale_pages_per_block(num_pages), page_size), "float32")
    return need
