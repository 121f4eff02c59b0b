"""Block sizes of the paged-attention (decode) kernel and their per-chip defaults.

The per-chip defaults are data chosen by the block-size advisor (``perfmodel
tune paged_attention``) and stored in ``kernels/paged_attention/tuned.json``
as KV tokens per compute block; see :func:`default_tokens_table`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernels.tiling import (
    LANES,
    TunedChipTable,
    check_vmem,
    narrow_vmem_temporaries,
    itemsize_bytes,
    mosaic_buffer_bytes,
    round_up,
    tuned_block_table,
    tuned_blocks,
    tuned_entry_chip,
)

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec

#: Bytes of one f32 element (scales, softmax statistics, accumulator, scores).
F32_BYTES = 4
#: K/V pages are double-buffered by the kernel's own DMAs; the pipelined q/out/scale blocks by Pallas.
BUFFERS = 2
#: [tokens, head_dim] f32 tiles of widened K/V Mosaic keeps in VMEM on chips that widen through f32 (tpu-v4): 2.75
#: since the kv heads of a block run back to back (tpu-v4, int8 pages of 16, 128-token blocks: Mosaic 1020 KiB).
F32_WIDENED_TILES = 2.75


@dataclass(frozen=True, kw_only=True)
class PagedAttentionBlockSizes:
    """How many KV pages one compute step DMAs and attends to.

    A compute block holds ``pages_per_compute_block * page_size`` tokens; that
    count is the lane axis of the score tile, so it must be a multiple of 128,
    and the block count must divide the page table's width.
    """

    pages_per_compute_block: int

    def __post_init__(self) -> None:
        value = self.pages_per_compute_block
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"block_sizes.pages_per_compute_block: must be a positive int, got {value!r}")

    def tokens(self, page_size: int) -> int:
        """KV tokens per compute block."""
        return self.pages_per_compute_block * page_size

    def validate(self, *, page_size: int, pages_per_seq: int, num_q_per_kv: int, kv_heads: int,
                 head_dim: int, q_dtype: Any, kv_dtype: Any, per_token_scales: bool | None,
                 spec: "ChipSpec") -> None:
        """Divisibility, lane tiling and the VMEM budget of ``spec``; ValueError naming the field."""
        ppcb = self.pages_per_compute_block
        if pages_per_seq % ppcb:
            raise ValueError(
                f"block_sizes.pages_per_compute_block: {ppcb} does not divide the page table's "
                f"{pages_per_seq} pages per sequence; pick a divisor or pad page_table"
            )
        if self.tokens(page_size) % LANES:
            raise ValueError(
                f"block_sizes.pages_per_compute_block: {ppcb} pages x page_size {page_size} = "
                f"{self.tokens(page_size)} tokens, not a multiple of {LANES} (the lane tile of the "
                f"score row); use a multiple of {LANES // _gcd(LANES, page_size)} pages"
            )
        need = self.vmem_bytes(page_size=page_size, pages_per_seq=pages_per_seq, num_q_per_kv=num_q_per_kv,
                               kv_heads=kv_heads, head_dim=head_dim, q_dtype=q_dtype, kv_dtype=kv_dtype,
                               per_token_scales=per_token_scales, chip=spec)
        check_vmem(need, spec, f"block_sizes.pages_per_compute_block: {ppcb} pages",
                   fix="use fewer pages per block" + (" or per-page scales" if per_token_scales else ""))

    def vmem_bytes(self, *, page_size: int, pages_per_seq: int, num_q_per_kv: int, kv_heads: int,
                   head_dim: int, q_dtype: Any, kv_dtype: Any, per_token_scales: bool | None,
                   chip: "ChipSpec | None" = None) -> int:
        """VMEM one grid step (one sequence) needs, as Mosaic allocates it.

        ``per_token_scales``: None for unquantized K/V, else which scale layout. The
        buffers, padded as :func:`kernels.tiling.mosaic_buffer_bytes`: the q and out
        blocks (all kv heads' ``[q_per_kv, head_dim]`` tiles, two buffers each), the
        two-slot K and V page buffers of every kv head, the f32 max / sum / accumulator
        scratch per kv head and the per-sequence scale rows. The score and probability rows (``[q_per_kv, tokens]``)
        stay in vregs; on chips that widen through f32 (``chip`` None: assumed) Mosaic
        widens quantized or f32 K/V through f32 in VMEM, about 2.75 ``[tokens, head_dim]``
        f32 tiles. Matches Mosaic's allocation to the byte for bf16,
        int8 and fp8 caches with head_dim 128 on v5e to 7x.
        """
        tokens = self.tokens(page_size)
        buf = mosaic_buffer_bytes
        q_and_out = 2 * BUFFERS * buf((kv_heads, num_q_per_kv, head_dim), q_dtype)
        kv_buffers = 2 * buf((BUFFERS, kv_heads, self.pages_per_compute_block, page_size, head_dim), kv_dtype)
        scratch = (2 * buf((kv_heads, num_q_per_kv, LANES), "float32")
                   + buf((kv_heads, num_q_per_kv, head_dim), "float32"))
        scales = 0
        if per_token_scales is not None:
            # [kv_heads, blocks, lanes] per sequence (lanes: tokens, or pages per block)
            lanes = tokens if per_token_scales else self.pages_per_compute_block
            blocks = pages_per_seq // self.pages_per_compute_block
            scales = 2 * BUFFERS * buf((kv_heads, blocks, lanes), "float32")
        temporaries = 0
        widened = per_token_scales is not None or itemsize_bytes(kv_dtype) == F32_BYTES
        if widened and (chip is None or not narrow_vmem_temporaries(chip)):
            temporaries = int(F32_WIDENED_TILES * tokens * round_up(head_dim, LANES) * F32_BYTES)
        return int(q_and_out + kv_buffers + scratch + scales + temporaries)


def _gcd(a: int, b: int) -> int:
    import math

    return math.gcd(a, b)


@functools.lru_cache(maxsize=None)
def default_tokens_table() -> dict[str, dict[str, int]]:
    """chip name -> configuration ("bf16") -> target KV tokens per compute block.

    The block-size advisor's pages_per_compute_block on its representative
    problem times that problem's page size, stored in
    ``kernels/paged_attention/tuned.json`` (regenerate with
    ``perfmodel tune --write paged_attention``). Read on first use, not at import.
    """
    return tuned_block_table("paged_attention", lambda b: int(b["tokens_per_compute_block"]))


#: chip name -> target KV tokens per compute block (the tuned bf16 configuration), read on first use.
DEFAULT_TOKENS_PER_COMPUTE_BLOCK = TunedChipTable(default_tokens_table)


def default_block_sizes(chip: str, *, page_size: int, pages_per_seq: int) -> PagedAttentionBlockSizes:
    """The largest lane-aligned divisor of ``pages_per_seq`` within the chip's tuned token target
    (the smallest such divisor when none is within it).

    A chip the JSON lacks takes :func:`kernels.tiling.tuned_entry_chip`'s target. ValueError naming ``chip`` if
    even that chip has none, or ``page_table`` if no number of pages is lane aligned and divides the table's
    width.
    """
    target = tuned_blocks(default_tokens_table(), tuned_entry_chip(default_tokens_table(), chip))
    if target is None:
        known = ", ".join(default_tokens_table())
        raise ValueError(
            f"chip: no paged_attention block-size defaults for '{chip}'; use one of {known} "
            "or pass block_sizes=PagedAttentionBlockSizes(...)"
        )
    aligned = [n for n in range(1, pages_per_seq + 1)
               if pages_per_seq % n == 0 and (n * page_size) % LANES == 0]
    if not aligned:
        raise ValueError(
            f"page_table: {pages_per_seq} pages per sequence of {page_size} tokens admit no compute block "
            f"of a multiple of {LANES} tokens; pad page_table to a multiple of "
            f"{LANES // _gcd(LANES, page_size)} pages"
        )
    fitting = [n for n in aligned if n * page_size <= target]
    return PagedAttentionBlockSizes(pages_per_compute_block=max(fitting) if fitting else min(aligned))
