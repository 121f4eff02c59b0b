"""VMEM / SMEM footprint of a pallas_call, with the TPU's tile padding.

A VMEM buffer is padded as Mosaic pads it (``kernels.tiling.padded_rows``, the rule measured against Mosaic's
allocations that the kernels' own VMEM checks use too): the last dimension to the lane count, the second-to-last
to a multiple of the sublane count (a power of two below it, at least one 32-bit word), the sublanes and lanes
being the chip's (hwspec ``cores``). SMEM holds 32-bit words.
"""

from __future__ import annotations

import math
from typing import Sequence

from kernels.tiling import padded_vmem_bytes as mosaic_vmem_bytes
from perfmodel.hw.spec import ChipSpec


def padded_vmem_bytes(shape: Sequence[int], itemsize_bytes: int, chip: ChipSpec) -> int:
    """Bytes a VMEM buffer of ``shape`` occupies on ``chip``."""
    shape = tuple(int(d) for d in shape)
    sub, lanes = chip.cores.vreg_sublanes, chip.cores.vreg_lanes
    if not sub or not lanes:  # not a TPU: no tiling
        return int(math.prod(shape)) * itemsize_bytes
    return mosaic_vmem_bytes(shape, itemsize_bytes, sublanes=sub, lanes=lanes)


def smem_bytes(shape: Sequence[int], itemsize_bytes: int) -> int:
    """SMEM stores 32-bit words."""
    return int(math.prod(shape)) * max(4, itemsize_bytes)


def buffer_bytes(shape: Sequence[int], itemsize_bytes: int, memory_space: str, chip: ChipSpec) -> int:
    """Bytes one buffer takes in its memory space (0 for HBM / ANY / semaphores)."""
    if memory_space == "vmem":
        return padded_vmem_bytes(shape, itemsize_bytes, chip)
    if memory_space == "smem":
        return smem_bytes(shape, itemsize_bytes)
    return 0


def vmem_status(total_bytes: int, chip: ChipSpec, requested_limit_bytes: int | None) -> str:
    """"fits", "needs vmem_limit_bytes" or "does not fit" (or "n/a" for chips without VMEM data)."""
    capacity = chip.memory.vmem_bytes_per_core
    default = chip.memory.vmem_default_scoped_limit_bytes_per_core
    limit = requested_limit_bytes if requested_limit_bytes is not None else default
    if capacity is None and limit is None:
        return "n/a"
    if capacity is not None and total_bytes > capacity:
        return "does not fit"
    if limit is not None and total_bytes > limit:
        return "needs vmem_limit_bytes"
    return "fits"
