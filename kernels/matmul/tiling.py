"""TPU tiling and VMEM-budget rules shared by the matmul, rms_norm and
kv_cache_update kernels (jax-free, so block-size tables load without jax).

Mosaic tiles the two minor dimensions of every VMEM/HBM buffer: the last
(lane) dimension in multiples of 128 and the second-minor (sublane) dimension
in multiples of 8 rows of 32-bit words, so narrower dtypes pack more rows per
tile: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit types. A block dimension must
be a multiple of that tile or equal the whole array dimension.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from perfmodel.hw.spec import ChipSpec

#: Lanes of a vreg / minor-dimension tile on every TPU generation.
LANES = 128
#: Sublanes of a vreg (rows of 32-bit words per tile).
SUBLANES_32BIT = 8

#: Matmul dtype names of perfmodel.hw.spec.MATMUL_DTYPES by numpy dtype name.
_MATMUL_DTYPE_NAMES: dict[str, str] = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8": "int8",
    "int4": "int4",
}


def np_dtype(dtype: Any) -> np.dtype:
    """numpy dtype of a jnp/numpy dtype, type or name (bf16/fp8 come from ml_dtypes)."""
    if isinstance(dtype, str) and dtype in {"bfloat16", "float8_e4m3fn", "float8_e5m2", "int4"}:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def itemsize_bytes(dtype: Any) -> int:
    return np_dtype(dtype).itemsize


def sublane_multiple(dtype: Any) -> int:
    """Rows per (sublane x lane) tile: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit dtypes."""
    return SUBLANES_32BIT * max(1, 4 // itemsize_bytes(dtype))


def matmul_dtype_name(dtype: Any) -> str | None:
    """'bf16', 'fp32', 'fp8', 'int8', ... (the ChipSpec naming), or None if the MXU model has no name for it."""
    return _MATMUL_DTYPE_NAMES.get(np_dtype(dtype).name)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def padded_tile_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """VMEM bytes of a buffer of ``shape`` once its two minor dims are padded to the dtype's tile."""
    if not shape:
        return itemsize_bytes(dtype)
    dims = list(shape)
    dims[-1] = round_up(dims[-1], LANES)
    if len(dims) >= 2:
        dims[-2] = round_up(dims[-2], sublane_multiple(dtype))
    return math.prod(dims) * itemsize_bytes(dtype)


def check_multiple(field: str, value: int, multiple: int, why: str) -> None:
    """Raise ValueError naming ``field`` unless value is a positive multiple of ``multiple``."""
    if value % multiple:
        lo = max(multiple, value - value % multiple)
        hi = round_up(value, multiple)
        alt = f"{lo} or {hi}" if lo != hi else f"{hi}"
        raise ValueError(f"block_sizes.{field}={value} must be a multiple of {multiple} ({why}); try {alt}")


def check_positive_int(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"block_sizes.{field}={value!r} must be a positive int")


def resolve_tpu_chip(chip: str) -> ChipSpec:
    """The ChipSpec for ``chip`` (name, alias or spec path); ValueError unless it is a TPU with VMEM figures."""
    from perfmodel.hw.registry import get_chip

    if not isinstance(chip, str):
        raise ValueError(f"chip={chip!r} must be a chip name such as 'tpu-v5e' or a spec-file path")
    spec = get_chip(chip)
    if spec.kind != "tpu":
        raise ValueError(f"chip='{chip}' is a {spec.kind.upper()}; these Pallas kernels target TPUs (e.g. chip='tpu-v5e')")
    if spec.memory.vmem_bytes_per_core is None:
        raise ValueError(f"chip='{chip}': its spec has no memory.vmem_bytes_per_core; add it to check VMEM budgets")
    return spec


def vmem_limit_bytes(need_bytes: int, chip: ChipSpec, what: str) -> int | None:
    """The ``vmem_limit_bytes`` compiler parameter a kernel needing ``need_bytes`` of VMEM should pass.

    None when the need fits Mosaic's default scoped limit; the need plus 25%
    headroom (capped at the physical VMEM) when it fits only the physical
    VMEM; ValueError naming ``what`` (the block sizes) when it fits neither.
    """
    physical = chip.memory.vmem_bytes_per_core
    scoped = chip.memory.vmem_default_scoped_limit_bytes_per_core or physical
    if need_bytes <= scoped:
        return None
    if need_bytes > physical:
        raise ValueError(
            f"{what} need {need_bytes / 2**20:.1f} MiB of VMEM but {chip.name} has "
            f"{physical / 2**20:.0f} MiB per core; use smaller blocks"
        )
    return min(physical, int(need_bytes * 1.25))
