"""Block sizes and VMEM budgets of the paged KV-cache update kernel, and per-chip defaults.

Head-major layout (the default): blocks of :data:`HEAD_MAJOR_TOKENS_PER_BLOCK` tokens in call order, each row
written through its row granule (:func:`row_granule`); nothing to tune, see :func:`head_major_vmem_bytes`.

Token-major layout: a block is ``tokens_per_block`` new tokens, each a whole [kv_heads, head_dim]
slab (the block spans both minor dimensions completely, so Mosaic's tile
rules hold at any head count or head size). Every token of a block is written
by its own DMA; all of a block's DMAs are in flight together.

The token-major per-chip defaults are data chosen by the block-size advisor
(``perfmodel tune kv_cache_update_token_major``) and stored in
``kernels/kv_cache_update/tuned.json``; see :func:`default_block_table`.
They are tuned with int8 caches (quantize on write, the larger VMEM need), so
they also fit bf16/f32 caches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels import tiling

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec


#: f32 temporaries Mosaic keeps in VMEM while the token-major kernel quantizes a block (int8 caches): on
#: chips with narrow Mosaic temporaries, about one f32 [64, kv_heads, head_dim] slab (1.125) once a block has
#: 64 tokens or more (none below); on chips that widen them through f32 (tpu-v4), four f32 slabs of the block.
QUANTIZE_F32_TOKENS = 64
QUANTIZE_F32_SLAB_FACTOR = 1.125
QUANTIZE_F32_SLABS_F32_VPU = 4

#: Cache layouts: head-major [kv_heads, num_pages, page_size, head_dim] (what paged_attention reads),
#: token-major [num_pages, page_size, kv_heads, head_dim], combined [num_pages, page_size, 2 * kv_heads, head_dim]
#: (one cache, K of head h at row 2h and V at 2h + 1: what ragged_paged_attention reads).
LAYOUTS = ("head-major", "token-major", "combined")
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

    def vmem_bytes(self, *, kv_heads: int, head_dim: int, new_dtype: Any, quantize: bool,
                   num_tokens: int | None = None, chip: ChipSpec | None = None, combined: bool = False) -> int:
        """VMEM of one grid step as Mosaic allocates it (v4 to 7x).

        The K and V token blocks (two buffers each; one when ``num_tokens`` fits one block, a single grid
        step), and quantizing, the int8 copies and f32 scales in scratch, all padded as
        :func:`kernels.tiling.mosaic_buffer_bytes`; plus, quantizing, the f32 temporaries of the
        quantization: four ``[tokens, kv_heads, head_dim]`` f32 slabs on chips that widen through f32
        (``chip`` None: assumed), 1.125 slabs of 64 tokens elsewhere once the block has 64 tokens
        (:data:`QUANTIZE_F32_TOKENS`). The block is ``min(tokens_per_block, num_tokens)`` tokens, as
        the kernel clamps it. At or above Mosaic's figure on the measured cases, within 10% but up to
        30% above for a single-step v5e call and where the 64-token rule over-counts. ``combined``
        (layout "combined"): plus the interleaved ``[tokens, 2 * kv_heads, head_dim]`` scratch the rows
        are copied from.
        """
        buf = tiling.mosaic_buffer_bytes
        tokens = self.tokens_per_block if num_tokens is None else min(self.tokens_per_block, num_tokens)
        buffers = 1 if num_tokens is not None and num_tokens <= tokens else 2
        slab = (tokens, kv_heads, head_dim)
        need = 2 * buffers * buf(slab, new_dtype)
        if combined:
            need += buf((tokens, 2 * kv_heads, head_dim), new_dtype)
        if quantize:
            need += 2 * (buf(slab, "int8") + buf((tokens, kv_heads, 1), "float32"))
            f32_token = kv_heads * tiling.round_up(head_dim, tiling.LANES) * 4
            if chip is not None and tiling.narrow_vmem_temporaries(chip):
                need += int(QUANTIZE_F32_SLAB_FACTOR * QUANTIZE_F32_TOKENS * f32_token) if tokens >= QUANTIZE_F32_TOKENS else 0
            else:
                need += QUANTIZE_F32_SLABS_F32_VPU * tokens * f32_token
        return int(need)

    def check(self, *, kv_heads: int, head_dim: int, new_dtype: Any, quantize: bool, chip: ChipSpec,
              num_tokens: int | None = None, combined: bool = False) -> int | None:
        """Check the VMEM budget; returns the vmem_limit_bytes to compile with (None: default)."""
        need = self.vmem_bytes(kv_heads=kv_heads, head_dim=head_dim, new_dtype=new_dtype, quantize=quantize,
                               num_tokens=num_tokens, chip=chip, combined=combined)
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", fix="use a smaller tokens_per_block",
                                 raised_limit=True)


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, KvCacheUpdateBlockSizes]]:
    """chip name -> configuration -> default token-major blocks.

    Data chosen by the block-size advisor and stored in
    ``kernels/kv_cache_update/tuned.json`` (regenerate with
    ``perfmodel tune --write kv_cache_update``). Read on first use, not at import.
    """
    return tiling.tuned_block_table("kv_cache_update",
                                    lambda b: KvCacheUpdateBlockSizes(tokens_per_block=b["tokens_per_block"]))


#: chip name -> default token-major blocks, read from the JSON on first use.
DEFAULT_BLOCK_SIZES = tiling.TunedChipTable(default_block_table)

#: Used for a chip the JSON does not list (e.g. a chip spec given as a file).
FALLBACK_BLOCK_SIZES = KvCacheUpdateBlockSizes(tokens_per_block=32)


def default_block_sizes(chip: str) -> KvCacheUpdateBlockSizes:
    """The chip's tuned token-major blocks (a chip the JSON lacks: :func:`kernels.tiling.tuned_entry_chip`'s;
    FALLBACK_BLOCK_SIZES if even that chip has none)."""
    table = default_block_table()
    return tiling.tuned_blocks(table, tiling.tuned_entry_chip(table, chip)) or FALLBACK_BLOCK_SIZES


#: Tokens per grid step of the head-major kernel (all of a block's DMAs are in flight together).
HEAD_MAJOR_TOKENS_PER_BLOCK = 32


def row_granule(cache_dtype: Any) -> int:
    """Rows of a head-major cache page one DMA moves at the least: the rows that share a 32-bit sublane word
    (1 f32, 2 bf16, 4 int8). Mosaic takes a DMA window at a sublane offset that is a multiple of this (the HBM
    tiling is (8, 128) of packed words); a one-row window of a packed dtype is refused ("Offsets along tiled
    dimensions must be aligned to tiles")."""
    return max(1, 4 // tiling.itemsize_bytes(cache_dtype))


def head_major_vmem_bytes(*, kv_heads: int, page_size: int, head_dim: int, new_dtype: Any, cache_dtype: Any,
                          quantize: bool, num_tokens: int | None = None) -> int:
    """VMEM of the head-major kernel for a block of :data:`HEAD_MAJOR_TOKENS_PER_BLOCK` tokens (or ``num_tokens``
    if fewer): the pipelined new K and V blocks ``[tokens, kv_heads, head_dim]`` (two buffers each, one when the
    call is a single block; padded as :func:`kernels.tiling.mosaic_buffer_bytes`), plus the scratch: the K and V
    row granules ``[tokens, kv_heads, row_granule, head_dim]`` and, quantizing, the page scale rows
    ``[tokens, kv_heads, 1, page_size]`` f32. Mosaic tiles the granule and scale-row buffers by their own row count
    (no padding to the dtype's sublane multiple; lanes pad to 128): the scratch is Mosaic's scoped-VMEM figure
    exactly on v5e (8 heads x 128, pages of 16: 256 KiB bf16, 512 KiB int8 with scales), which
    leaves the token blocks out."""
    buf = tiling.mosaic_buffer_bytes
    tokens = HEAD_MAJOR_TOKENS_PER_BLOCK if num_tokens is None else min(HEAD_MAJOR_TOKENS_PER_BLOCK, num_tokens)
    buffers = 1 if num_tokens is not None and num_tokens <= tokens else 2
    lanes = tiling.round_up(head_dim, tiling.LANES)
    need = 2 * buffers * buf((tokens, kv_heads, head_dim), new_dtype)
    need += 2 * tokens * kv_heads * row_granule(cache_dtype) * lanes * tiling.itemsize_bytes(cache_dtype)
    if quantize:
        need += 2 * tokens * kv_heads * tiling.round_up(page_size, tiling.LANES) * 4
    return int(need)
