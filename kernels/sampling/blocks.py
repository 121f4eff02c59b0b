"""Block sizes of the fused sampling kernel, their checks and per-chip defaults.

A grid step holds ``block_b`` rows and ``block_v`` vocabulary entries. The
whole vocabulary of a row block stays resident in VMEM (in the logits' dtype)
after the first streaming pass, so the VMEM check depends on the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.common import DEFAULT_CHIP
from kernels.tiling import LANES, round_up, sublane_multiple, tpu_chip, scoped_vmem_limit_bytes

F32_BYTES = 4
#: Chunk-sized f32 temporaries live at once in a pass (scaled logits, mask, accumulators, noise).
CHUNK_TEMPORARIES = 4


@dataclass(frozen=True, kw_only=True)
class SamplingBlockSizes:
    """Tile sizes of one sampling call; :meth:`validate` checks them against shapes and the chip."""

    #: Rows per grid step: a multiple of 8 for 32-bit logits, 16 for bf16.
    block_b: int
    #: Vocabulary entries per grid step and per pass chunk: a multiple of 128.
    block_v: int

    def __post_init__(self) -> None:
        for name in ("block_b", "block_v"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"block_sizes.{name} must be a positive int, got {value!r}")
        if self.block_v % LANES:
            raise ValueError(f"block_sizes.block_v={self.block_v} must be a multiple of {LANES} (lane tiling); "
                             f"try {round_up(self.block_v, LANES)}")

    def vmem_bytes(self, *, vocab: int, logits_dtype, with_noise: bool) -> int:
        """Resident row block + pipelined input (and noise) blocks + per-chunk f32 temporaries."""
        itemsize = np.dtype(logits_dtype).itemsize
        tile = self.block_b * self.block_v
        resident = round_up(vocab, self.block_v) * self.block_b * itemsize
        pipelined = 2 * tile * itemsize + (2 * tile * F32_BYTES if with_noise else 0)
        return resident + pipelined + CHUNK_TEMPORARIES * tile * F32_BYTES

    def validate(self, *, vocab: int, logits_dtype, with_noise: bool, chip: str) -> None:
        """Sublane tiling for the dtype and the chip's scoped-VMEM budget; ValueError naming the field."""
        sub = sublane_multiple(logits_dtype)
        if self.block_b % sub:
            raise ValueError(f"block_sizes.block_b={self.block_b} must be a multiple of {sub} for "
                             f"{np.dtype(logits_dtype).name} logits (sublane tiling); "
                             f"try {round_up(self.block_b, sub)}")
        need = self.vmem_bytes(vocab=vocab, logits_dtype=logits_dtype, with_noise=with_noise)
        limit = scoped_vmem_limit_bytes(tpu_chip(chip))
        if need > limit:
            from perfmodel.units import binary

            raise ValueError(f"block_sizes={self} needs {binary(need)} of VMEM for a vocabulary of {vocab}, over "
                             f"the {binary(limit)} scoped limit of {chip}; use a smaller block_b")


#: Default block sizes per TPU generation (block_b is for 32-bit logits and is
#: doubled for bf16). A (8, 2048) f32 chunk is 16 vector registers, so a pass's
#: compare / select / add chain stays in registers.
DEFAULT_BLOCK_SIZES: dict[str, SamplingBlockSizes] = {
    "tpu-v4": SamplingBlockSizes(block_b=8, block_v=2048),
    "tpu-v5e": SamplingBlockSizes(block_b=8, block_v=2048),
    "tpu-v5p": SamplingBlockSizes(block_b=8, block_v=2048),
    "tpu-v6e": SamplingBlockSizes(block_b=8, block_v=2048),
    "tpu-7x": SamplingBlockSizes(block_b=8, block_v=2048),
}


def default_block_sizes(chip: str, *, logits_dtype, vocab: int) -> SamplingBlockSizes:
    """The chip's defaults (tpu-v5e's for chips without an entry), fitted to the dtype and vocabulary."""
    base = DEFAULT_BLOCK_SIZES.get(tpu_chip(chip).name, DEFAULT_BLOCK_SIZES[DEFAULT_CHIP])
    block_b = round_up(base.block_b, sublane_multiple(logits_dtype))
    block_v = min(base.block_v, round_up(vocab, LANES))
    return SamplingBlockSizes(block_b=block_b, block_v=block_v)
