"""Block sizes of the ragged paged attention kernel, their checks and per-chip defaults.

``block_q`` is the number of query *tokens* (of the flat, ragged token axis)
one grid step holds for one KV head; with ``G = q_heads // kv_heads`` query
heads per KV head, the step's score matrix has ``G * block_q`` rows.
``block_kv`` is the number of KV *tokens* fetched and scored at once: a whole
number of pages (``block_kv // page_size`` pages are DMA'd per KV block).

The per-chip defaults are data chosen by the block-size advisor (``perfmodel
tune ragged_paged_attention``) and stored in
``kernels/ragged_paged_attention/tuned.json``; see :func:`default_block_table`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kernels.perf import DEFAULT_CHIP
from kernels.tiling import (
    LANES,
    TunedChipTable,
    check_vmem,
    narrow_vmem_temporaries,
    matmul_dtype_name,
    mosaic_buffer_bytes,
    np_dtype,
    round_up,
    sublane_multiple,
    tpu_chip,
    tuned_block_table,
    tuned_blocks,
    tuned_entry_chip,
)

#: Lane-replicated width of the running max / sum scratch (one vreg row).
STATS_LANES = LANES
F32_BYTES = 4
#: f32 score tiles ([G * block_q, block_kv]) of temporaries Mosaic keeps in VMEM per KV step; more on chips
#: where Mosaic widens bf16/int8 values through f32 (tpu-v4; kernels.tiling.narrow_vmem_temporaries).
SCORE_TILES = 1.0
SCORE_TILES_F32_VPU = 1.375
#: Quantized KV cache dtypes (read with f32 ``kv_scales``; kernels.ragged_paged_attention.kernel).
QUANT_KV_DTYPES = ("int8", "float8_e4m3fn")
#: VMEM banks of 32-bit rows a strided vector load spreads its sublanes over (a load whose rows share a bank is
#: split: at a stride of 8 rows, two loads with half the sublanes each plus an OR, as the compiled schedule shows).
#: Public source for the bank count: vLLM tpu-inference's RPA v3 pads its KV buffer rows for the same reason
#: (https://github.com/vllm-project/tpu-inference, kernels/ragged_paged_attention/v3/kernel.py, has_bank_conflicts).
VMEM_BANKS = 32
#: Sublanes one vector load fills.
SUBLANES = 8


@dataclass(frozen=True, kw_only=True)
class KvRowLayout:
    """How one token's K/V rows sit in the kernel's VMEM KV buffer of a bf16 / f32 cache: ``words`` 32-bit rows
    (``pack`` values of consecutive K/V rows in each: bf16 K and V of a head share one), padded to
    ``stride`` rows so that a strided load of one head's rows over ``SUBLANES`` tokens hits distinct banks."""

    words: int
    stride: int
    pack: int


def kv_row_layout(kv_dtype, kv_heads: int) -> KvRowLayout:
    """The VMEM row layout of a bf16 / f32 cache's KV block (quantized caches keep unpadded rows)."""
    pack = 4 // np_dtype(kv_dtype).itemsize
    words = 2 * kv_heads // pack
    stride = words
    while words > 1 and len({(i * stride) % VMEM_BANKS for i in range(SUBLANES)}) < SUBLANES:
        stride += 1
    return KvRowLayout(words=words, stride=stride, pack=pack)


@dataclass(frozen=True, kw_only=True)
class RaggedPagedAttentionBlockSizes:
    """Tile sizes of one ragged paged attention call.

    The constructor checks what it can alone (positive integers, ``block_kv`` a
    multiple of 128 lanes); :meth:`validate` checks the rest against the call's
    shapes, dtypes and the chip's scoped-VMEM budget.
    """

    #: Query tokens per grid step (a multiple of 8 for 32-bit q, 16 for bf16).
    block_q: int
    #: KV tokens per KV block: a multiple of the page size and of 128.
    block_kv: int

    def __post_init__(self) -> None:
        for name in ("block_q", "block_kv"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"block_sizes.{name} must be a positive int, got {value!r}")
        if self.block_kv % LANES:
            raise ValueError(f"block_sizes.block_kv={self.block_kv} must be a multiple of {LANES} "
                             f"(the lane width of the score tile); try {round_up(self.block_kv, LANES)}")

    def pages_per_block(self, page_size: int) -> int:
        return self.block_kv // page_size

    def vmem_bytes(self, *, q_heads_per_kv_head: int, head_dim: int, q_dtype, kv_dtype, kv_heads: int = 1,
                   page_size: int | None = None, chip=None) -> int:
        """VMEM one grid step needs, as Mosaic allocates it: pipelined q/out blocks (every q head), the
        sink rows, the two-slot combined K/V block buffer, the per-KV-head f32 max / sum / accumulator
        scratch (buffers padded as :func:`kernels.tiling.mosaic_buffer_bytes`), and the body's spilled
        temporaries.

        The temporaries scale with one KV head's ``[G * block_q, block_kv]`` f32 score tile (the heads run
        one after another); the estimate takes one score tile (1.375 on chips that widen through f32, or
        ``chip`` None), one ``[G * block_q, head_dim]`` f32 tile and K and V of one head widened to f32
        (the bf16 split goes through 32-bit rows). A quantized cache (int8, fp8) adds the two slots of one KV block's
        f32 scales, ``[2 * kv_heads, block_kv]`` each.
        """
        rows = q_heads_per_kv_head * self.block_q
        q_heads = q_heads_per_kv_head * kv_heads
        buf = mosaic_buffer_bytes
        q_and_out_blocks = 2 * 2 * buf((self.block_q, q_heads * head_dim), q_dtype)
        sinks = 2 * buf((q_heads, STATS_LANES), "float32")
        if np_dtype(kv_dtype).name in QUANT_KV_DTYPES:
            kv_buffers = buf((2, self.block_kv * 2 * kv_heads, head_dim), kv_dtype)
        else:  # each token's rows padded to the layout's stride (bank-conflict-free strided loads)
            layout = kv_row_layout(kv_dtype, kv_heads)
            kv_buffers = buf((2, self.block_kv * layout.stride, head_dim), "uint32")
        state = kv_heads * (2 * buf((rows, STATS_LANES), "float32") + buf((rows, head_dim), "float32"))
        score_tiles = SCORE_TILES if chip is not None and narrow_vmem_temporaries(chip) else SCORE_TILES_F32_VPU
        temporaries = score_tiles * rows * round_up(self.block_kv, LANES) * F32_BYTES
        temporaries += rows * round_up(head_dim, LANES) * F32_BYTES
        temporaries += 2 * self.block_kv * round_up(head_dim, LANES) * F32_BYTES
        if np_dtype(kv_dtype).name in QUANT_KV_DTYPES:
            kv_buffers += buf((2, 2 * kv_heads, self.block_kv), "float32")
        return int(q_and_out_blocks + sinks + kv_buffers + state + temporaries)

    def validate(self, *, q_dtype, kv_dtype, page_size: int, q_heads_per_kv_head: int, head_dim: int,
                 chip: str, kv_heads: int = 1) -> None:
        """Tiling, divisibility and VMEM checks for one call; ValueError naming the field."""
        sub = sublane_multiple(q_dtype)
        if self.block_q % sub:
            raise ValueError(f"block_sizes.block_q={self.block_q} must be a multiple of {sub} for "
                             f"{np.dtype(q_dtype).name} queries (sublane tiling); try {round_up(self.block_q, sub)}")
        if self.block_kv % page_size:
            raise ValueError(f"block_sizes.block_kv={self.block_kv} must be a multiple of page_size={page_size} "
                             f"(KV blocks are whole pages); try {round_up(self.block_kv, page_size)}")
        spec = tpu_chip(chip)
        need = self.vmem_bytes(q_heads_per_kv_head=q_heads_per_kv_head, head_dim=head_dim, q_dtype=q_dtype,
                               kv_dtype=kv_dtype, kv_heads=kv_heads, page_size=page_size, chip=spec)
        check_vmem(need, spec, f"block_sizes (block_q={self.block_q}, block_kv={self.block_kv})",
                   fix="use a smaller block_q or block_kv")


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, RaggedPagedAttentionBlockSizes]]:
    """chip name -> q dtype ("bf16") -> default blocks, before fitting to the dtype and page size.

    Data chosen by the block-size advisor and stored in
    ``kernels/ragged_paged_attention/tuned.json`` (regenerate with
    ``perfmodel tune --write ragged_paged_attention``). Read on first use, not at import.
    """
    return tuned_block_table("ragged_paged_attention", lambda b: RaggedPagedAttentionBlockSizes(
        block_q=b["block_q"], block_kv=b["block_kv"]))


#: chip name -> default blocks (the tuned bf16 configuration), read from the JSON on first use.
DEFAULT_BLOCK_SIZES = TunedChipTable(default_block_table)


def default_block_sizes(chip: str, *, q_dtype, page_size: int) -> RaggedPagedAttentionBlockSizes:
    """The chip's tuned defaults for q's dtype (its bf16 ones when that dtype is not tuned;
    :func:`kernels.tiling.tuned_entry_chip`'s for a chip the JSON lacks), fitted to the dtype (block_q a sublane multiple) and page size (block_kv whole pages)."""
    table = default_block_table()
    key = matmul_dtype_name(q_dtype)
    base = tuned_blocks(table, tuned_entry_chip(table, tpu_chip(chip).name), key)
    if base is None:
        raise ValueError(f"chip: no ragged_paged_attention block-size defaults for '{chip}' or {DEFAULT_CHIP}; "
                         "regenerate kernels/ragged_paged_attention/tuned.json or pass block_sizes=...")
    block_q = round_up(base.block_q, sublane_multiple(q_dtype))
    block_kv = round_up(base.block_kv, np.lcm(LANES, page_size))
    return RaggedPagedAttentionBlockSizes(block_q=int(block_q), block_kv=int(block_kv))
