"""Block sizes of the fused sampling kernel, their checks and per-chip defaults.

A grid step holds ``block_b`` rows and ``block_v`` vocabulary entries. The
whole vocabulary of a row block stays resident in VMEM (in the logits' dtype)
after the first streaming pass, so the VMEM check depends on the vocabulary.

The per-chip defaults are data chosen by the block-size advisor (``perfmodel
tune sampling``) and stored in ``kernels/sampling/tuned.json``; see
:func:`default_block_table`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from kernels.perf import DEFAULT_CHIP
from kernels.tiling import (
    LANES,
    TunedChipTable,
    check_vmem,
    matmul_dtype_name,
    mosaic_buffer_bytes,
    round_up,
    scoped_vmem_limit_bytes,
    sublane_multiple,
    tpu_chip,
    tuned_block_table,
    tuned_blocks,
    tuned_entry_chip,
)

F32_BYTES = 4
#: [block_b, block_v] f32 chunk temporaries Mosaic keeps in VMEM (fitted on tpu-v5e, 64 x 128256 f32, libtpu
#: 0.0.42; greedy: v6e needs the most): a sampled call, and a greedy one. The passes fold chunks into
#: lane-wide state, so no filter adds any.
CHUNK_TEMPORARIES = 2
CHUNK_TEMPORARIES_GREEDY = 1.25
#: Extra f32 chunk temporaries of the top-n log-probability passes (v4 needs the most: 11.03 MB at 64 x 128256).
CHUNK_TEMPORARIES_TOP_N = 0.75
#: Lanes of the lane-wide state (plan.LANE_GROUP; the kernel uses 128 when block_v is not a multiple of it).
LANE_STATE = 256
#: f32 option columns per row (plan.N_OPTS_F).
OPTION_COLUMNS_F = 7


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

    def vmem_bytes(self, *, vocab: int, logits_dtype, with_noise: bool, greedy: bool = False, penalties: bool = False, bias: bool = False, top_logprobs: int = 0) -> int:
        """VMEM one grid step needs, as Mosaic allocates it: the resident row block (f32 when
        penalties or a bias adjust the logits, else the logits' dtype), the pipelined logits (and noise, token
        count, bias) blocks, the per-row option / output columns (each ``[block_b, n]`` padded to 128 lanes),
        the lane-wide and per-row state, and Mosaic's f32 chunk temporaries.

        ``greedy`` (no draw): no resident copy unless top-n log-probabilities need it. Measured on tpu-v5e at
        64 x 128256 f32 (``tests/benchmarks/bench_sampling_kernel.py``): 0-10% above Mosaic's figure (v4 too).
        """
        block_v = self.block_v
        buf = mosaic_buffer_bytes
        tile = (self.block_b, block_v)
        rows_dtype = "float32" if (penalties or bias) else logits_dtype
        resident_blocks = 1 if greedy and not top_logprobs else -(-vocab // block_v)
        resident = resident_blocks * buf(tile, rows_dtype)
        streams = [logits_dtype] + ["float32"] * with_noise + ["int32"] * penalties + ["float32"] * bias
        pipelined = sum(2 * buf(tile, dt) for dt in streams)
        column = buf((self.block_b, 1), "float32")
        lanes = buf((self.block_b, min(block_v, LANE_STATE)), "float32")
        options = 2 * (buf((self.block_b, OPTION_COLUMNS_F), "float32") + buf((self.block_b, 2), "int32"))
        outputs = 2 * column * (2 + (top_logprobs > 0 or 0)) + 2 * 2 * buf((self.block_b, max(top_logprobs, 1)),
                                                                             "float32") * (top_logprobs > 0)
        state = (3 + 3 * (not greedy)) * lanes + 4 * column
        chunks = ((CHUNK_TEMPORARIES_GREEDY if greedy else CHUNK_TEMPORARIES)
                  + CHUNK_TEMPORARIES_TOP_N * (top_logprobs > 0))
        temporaries = int(chunks * self.block_b * block_v * F32_BYTES)
        return int(resident + pipelined + options + outputs + state + temporaries)

    def validate(self, *, vocab: int, logits_dtype, with_noise: bool, chip: str, greedy: bool = False, penalties: bool = False, bias: bool = False, top_logprobs: int = 0) -> None:
        """Sublane tiling for the dtype and the chip's scoped-VMEM budget; ValueError naming the field."""
        sub = sublane_multiple(logits_dtype)
        if self.block_b % sub:
            raise ValueError(f"block_sizes.block_b={self.block_b} must be a multiple of {sub} for "
                             f"{np.dtype(logits_dtype).name} logits (sublane tiling); "
                             f"try {round_up(self.block_b, sub)}")
        need = self.vmem_bytes(vocab=vocab, logits_dtype=logits_dtype, with_noise=with_noise, greedy=greedy,
                               penalties=penalties, bias=bias, top_logprobs=top_logprobs)
        check_vmem(need, tpu_chip(chip), f"block_sizes (block_b={self.block_b}, block_v={self.block_v}) for a "
                   f"vocabulary of {vocab}", fix="use a smaller block_b")


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, SamplingBlockSizes]]:
    """chip name -> logits dtype ("fp32") -> default blocks, before fitting to the dtype and vocabulary.

    Data chosen by the block-size advisor and stored in
    ``kernels/sampling/tuned.json`` (regenerate with
    ``perfmodel tune --write sampling``). Read on first use, not at import.
    """
    return tuned_block_table("sampling", lambda b: SamplingBlockSizes(block_b=b["block_b"], block_v=b["block_v"]))


#: chip name -> default blocks (the tuned f32-logits configuration), read from the JSON on first use.
DEFAULT_BLOCK_SIZES = TunedChipTable(default_block_table)


def default_block_sizes(chip: str, *, logits_dtype, vocab: int) -> SamplingBlockSizes:
    """The chip's tuned defaults for the logits' dtype (its f32 ones when that dtype is not tuned; :func:`kernels.tiling.tuned_entry_chip`'s
    for a chip the JSON lacks), fitted to the call: block_b rounded up to the dtype's sublane tile, block_v
    shrunk to a small vocabulary, then block_b halved while the resident rows (with a noise stream, the
    largest need) would overflow the chip's scoped VMEM."""
    spec = tpu_chip(chip)
    table = default_block_table()
    key = matmul_dtype_name(logits_dtype)
    base = tuned_blocks(table, tuned_entry_chip(table, spec.name), key)
    if base is None:
        raise ValueError(f"chip: no sampling block-size defaults for '{chip}' or {DEFAULT_CHIP}; "
                         "regenerate kernels/sampling/tuned.json or pass block_sizes=...")
    sub = sublane_multiple(logits_dtype)
    blocks = SamplingBlockSizes(block_b=round_up(base.block_b, sub), block_v=min(base.block_v, round_up(vocab, LANES)))
    limit = scoped_vmem_limit_bytes(spec)
    while blocks.block_b > sub and blocks.vmem_bytes(vocab=vocab, logits_dtype=logits_dtype, with_noise=True) > limit:
        blocks = replace(blocks, block_b=max(sub, blocks.block_b // 2 // sub * sub))
    return blocks
