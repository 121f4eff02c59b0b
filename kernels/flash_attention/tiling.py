"""TPU tiling rules, chip lookup and dtype checks shared by the attention kernels.

Mosaic lays every 2-D VMEM array out in (sublane, lane) tiles of 32-bit
words: 8 sublanes x 128 lanes. Narrower dtypes pack several elements into a
word along the sublane axis, so the second-minor dimension of a block must be
a multiple of 8 (32-bit), 16 (16-bit) or 32 (8-bit) elements, and the minor
dimension a multiple of 128, unless the block spans the whole array there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from perfmodel.hw.spec import ChipSpec

#: Lanes of one vector register (every TPU generation).
LANES = 128
#: Sublanes of one vector register for 32-bit data (every TPU generation).
SUBLANES_32BIT = 8

#: Storage dtypes (numpy names) the kernels accept for queries / outputs.
FLOAT_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
#: fp8 storage dtypes; usable only on chips that list an fp8 matmul rate.
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")


def sublane_multiple(dtype: Any) -> int:
    """Rows per (8, 128) tile for dtype: 8 for 32-bit, 16 for 16-bit, 32 for 8-bit."""
    import numpy as np

    itemsize_bytes = np.dtype(dtype).itemsize
    return SUBLANES_32BIT * (4 // itemsize_bytes)


def div(a: Any, b: int) -> Any:
    """a // b for non-negative a: Python/numpy ints stay ints; traced scalars use lax.div.

    Mosaic lowers ``jnp.floor_divide`` through a sign fix-up that needs a TPU
    at lowering time; truncating division is exact for non-negative values.
    """
    import numpy as np

    if isinstance(a, (int, np.integer)):
        return a // b
    import jax

    return jax.lax.div(a, jax.numpy.asarray(b, dtype=a.dtype))


def rem(a: Any, b: int) -> Any:
    """a % b for non-negative a (lax.rem on traced scalars, see :func:`div`)."""
    import numpy as np

    if isinstance(a, (int, np.integer)):
        return a % b
    import jax

    return jax.lax.rem(a, jax.numpy.asarray(b, dtype=a.dtype))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def tpu_chip(chip: str) -> "ChipSpec":
    """The TPU ChipSpec for a chip name; ValueError naming ``chip`` for GPUs or chips without VMEM."""
    from perfmodel.hw.registry import get_chip

    spec = get_chip(chip)
    if spec.kind != "tpu":
        raise ValueError(f"chip: '{chip}' is a {spec.kind.upper()}; these Pallas kernels target TPUs "
                         "(e.g. chip='tpu-v5e')")
    if spec.memory.vmem_default_scoped_limit_bytes_per_core is None:
        raise ValueError(
            f"chip: the spec of '{chip}' has no memory.vmem_default_scoped_limit_bytes_per_core to size "
            "blocks against; use a TPU generation with Pallas support (tpu-v4 or later)"
        )
    return spec


def vmem_limit_bytes(spec: "ChipSpec") -> int:
    """Mosaic's default scoped-VMEM limit per TensorCore: the budget block sizes must fit."""
    limit = spec.memory.vmem_default_scoped_limit_bytes_per_core
    assert limit is not None  # tpu_chip() guarantees it
    return limit


def check_dtype(arg: str, dtype: Any, allowed: tuple[str, ...], spec: "ChipSpec") -> None:
    """ValueError naming ``arg`` unless dtype is in ``allowed`` and the chip can run it.

    fp8 storage needs a chip whose spec lists an fp8 matmul rate (TPU v7x);
    earlier generations have no fp8 conversion hardware.
    """
    import numpy as np

    name = np.dtype(dtype).name
    if name not in allowed:
        raise ValueError(f"{arg}: dtype {name} is not supported; use one of {', '.join(allowed)}")
    if name in FP8_DTYPES and spec.matmul_rate("fp8") is None:
        raise ValueError(
            f"{arg}: dtype {name} needs fp8 support, which {spec.name} lacks; "
            "use bfloat16 or int8, or a chip with fp8 (e.g. chip='tpu-7x')"
        )
