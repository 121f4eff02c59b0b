"""VMEM / SMEM footprint of a pallas_call, with the TPU's tile padding.

A VMEM buffer is laid out in (sublanes x lanes) tiles of 32-bit words: the
last dimension pads to the lane count (128) and the second-to-last to the
sublane count times the dtype's packing (8 rows of f32, 16 of bf16, 32 of
int8). 1-D buffers pad to whole tiles. SMEM holds 32-bit words.
"""

from __future__ import annotations

import math
from typing import Sequence

from perfmodel.hw.spec import ChipSpec


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def packing(itemsize_bytes: int) -> int:
    """Elements of this size per 32-bit word (1 for 32-bit and wider)."""
    return max(1, 4 // max(1, itemsize_bytes))


def padded_vmem_bytes(shape: Sequence[int], itemsize_bytes: int, chip: ChipSpec) -> int:
    """Bytes a VMEM buffer of ``shape`` occupies on ``chip``."""
    shape = tuple(int(d) for d in shape)
    sub, lanes = chip.cores.vreg_sublanes, chip.cores.vreg_lanes
    if not sub or not lanes:  # not a TPU: no tiling
        return int(math.prod(shape)) * itemsize_bytes
    rows = sub * packing(itemsize_bytes)
    if len(shape) == 0:
        return rows * lanes * itemsize_bytes
    if len(shape) == 1:
        return _ceil_to(shape[0], rows * lanes) * itemsize_bytes
    lead = int(math.prod(shape[:-2]))
    return lead * _ceil_to(shape[-2], rows) * _ceil_to(shape[-1], lanes) * itemsize_bytes


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
