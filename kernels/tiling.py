"""TPU tiling, VMEM-budget, chip and dtype rules shared by every bundled kernel.

jax-free (block-size tables and checks import without jax; the two helpers
that need jax import it lazily).

Mosaic lays every VMEM/HBM buffer out in (sublane, lane) tiles of 32-bit
words: 8 sublanes x 128 lanes on every TPU generation. Narrower dtypes pack
several elements into a word along the sublane axis, so the second-minor
dimension of a block must be a multiple of 8 (32-bit), 16 (16-bit) or 32
(8-bit) elements and the minor dimension a multiple of 128, unless the block
spans the whole array dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from kernels import perf

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec

T = TypeVar("T")

#: Lanes of a vreg / minor-dimension tile on every TPU generation.
LANES = 128
#: Sublanes of a vreg (rows of 32-bit words per tile).
SUBLANES_32BIT = 8

#: Storage dtypes (numpy names) the attention kernels accept for queries / outputs.
FLOAT_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
#: fp8 storage dtypes; usable only on chips that list an fp8 matmul rate.
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")

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


def div(a: Any, b: int) -> Any:
    """a // b for non-negative a: Python/numpy ints stay ints; traced scalars use lax.div.

    Mosaic lowers ``jnp.floor_divide`` through a sign fix-up that needs a TPU
    at lowering time; truncating division is exact for non-negative values.
    """
    if isinstance(a, (int, np.integer)):
        return a // b
    import jax

    return jax.lax.div(a, jax.numpy.asarray(b, dtype=a.dtype))


def rem(a: Any, b: int) -> Any:
    """a % b for non-negative a (lax.rem on traced scalars, see :func:`div`)."""
    if isinstance(a, (int, np.integer)):
        return a % b
    import jax

    return jax.lax.rem(a, jax.numpy.asarray(b, dtype=a.dtype))


def padded_rows(rows: int, itemsize: int, sublanes: int = SUBLANES_32BIT) -> int:
    """Rows Mosaic allocates for a VMEM buffer whose second-minor dimension is ``rows`` of ``itemsize``-byte
    elements: the one padding rule of the kernels' VMEM checks and of perfmodel's schedule model.

    Measured against Mosaic's allocations (v4 to 7x), for pipelined blocks and scratch alike: Mosaic tiles VMEM
    buffers like XLA tiles HBM arrays, in ``sublanes``-row tiles for every dtype (bf16 and int8 pack 2 and 4
    rows per 32-bit word inside a tile), with smaller power-of-two tiles for short dimensions: up to
    ``sublanes`` rows round up to a power of two, at least one 32-bit word (2 bf16 rows, 4 int8 rows); more
    round up to a multiple of ``sublanes``. So a bf16 [24, 128] block takes 24 rows (not 32), an int8 [16, 128]
    page 16 and an f32 [4, 128] row block 4.
    """
    if rows <= sublanes:
        return max(1 << max(0, rows - 1).bit_length(), 4 // min(4, itemsize))
    return round_up(rows, sublanes)


def padded_vmem_bytes(shape: tuple[int, ...], itemsize: int, *, sublanes: int = SUBLANES_32BIT,
                      lanes: int = LANES) -> int:
    """VMEM bytes of one Mosaic buffer of ``shape``: rows as :func:`padded_rows`, the minor dimension padded to
    ``lanes``; a 1-D buffer is one row; a scalar one (sublanes x lanes) tile of 32-bit words."""
    if not shape:
        return sublanes * lanes * 4
    dims = [int(d) for d in shape]
    if len(dims) == 1:
        dims = [1] + dims
    dims[-1] = round_up(dims[-1], lanes)
    dims[-2] = padded_rows(dims[-2], itemsize, sublanes)
    return math.prod(dims) * itemsize


def mosaic_buffer_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """VMEM bytes of one Mosaic buffer of ``shape`` and ``dtype`` (:func:`padded_vmem_bytes`)."""
    return padded_vmem_bytes(shape, itemsize_bytes(dtype))


def narrow_vmem_temporaries(chip: "ChipSpec") -> bool:
    """Whether Mosaic keeps the VMEM temporaries of bf16/int8 values at their width on ``chip`` (its spec's
    ``compiler.mosaic_narrow_vmem_temporaries``: tpu-v5e and later). Where not (v2-v4, or a spec that leaves it
    null), Mosaic widens them through f32 and keeps more (f32) temporaries in VMEM, which the kernels' VMEM
    estimates count. Not the spec's vpu_bf16_arithmetic (v6e and later): v5e and v5p keep narrow temporaries
    though their bf16 arithmetic is widened (hwspecs/README.md)."""
    return bool(chip.compiler.mosaic_narrow_vmem_temporaries)


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


class GemmGrid:
    """The grid counts of a GEMM call's plan (a frozen dataclass with ``m``, ``n``, ``k`` and ``blocks``, a
    :class:`GemmTile`): shared by the matmul kernels' plans."""

    m: int
    n: int
    k: int
    blocks: "GemmTile"

    @property
    def n_i(self) -> int:
        """Row blocks."""
        return cdiv(self.m, self.blocks.bm)

    @property
    def n_j(self) -> int:
        """Column blocks."""
        return cdiv(self.n, self.blocks.bn)

    @property
    def n_k(self) -> int:
        """K steps (the innermost grid axis)."""
        return cdiv(self.k, self.blocks.bk)


@dataclass(frozen=True, kw_only=True)
class GemmTile:
    """A GEMM grid step's tile lhs[bm, bk] @ rhs[bk, bn] -> out[bm, bn] (the matmul kernels' block sizes derive
    from it): bm a sublane dimension (a multiple of a 32-bit dtype's sublane tile), bk and bn lane dimensions
    (multiples of 128)."""

    bm: int
    bk: int
    bn: int

    def __post_init__(self) -> None:
        for field, value in (("bm", self.bm), ("bk", self.bk), ("bn", self.bn)):
            check_positive_int(field, value)
        check_multiple("bm", self.bm, SUBLANES_32BIT, "sublane tile of a 32-bit dtype")
        check_multiple("bk", self.bk, LANES, "lane tile: bk is the minor dim of the lhs block")
        check_multiple("bn", self.bn, LANES, "lane tile: bn is the minor dim of the rhs and out blocks")

    def label(self) -> str:
        return f"bm={self.bm},bk={self.bk},bn={self.bn}"

    def check_dtype_tiles(self, lhs_dtype: Any, rhs_dtype: Any, out_dtype: Any) -> None:
        """bm a multiple of the lhs and out dtypes' sublane tiles, bk of the rhs dtype's (packed dtypes need more
        rows than the 32-bit tile)."""
        rows = max(sublane_multiple(lhs_dtype), sublane_multiple(out_dtype))
        check_multiple("bm", self.bm, rows, "sublane tile of the lhs and out dtypes")
        check_multiple("bk", self.bk, sublane_multiple(rhs_dtype), "sublane tile of the rhs dtype")


def tpu_chip(chip: str) -> "ChipSpec":
    """The ChipSpec for ``chip`` (name, alias or spec path); ValueError naming ``chip`` unless it is a TPU
    with VMEM figures."""
    if not isinstance(chip, str):
        raise ValueError(f"chip={chip!r} must be a chip name such as 'tpu-v5e' or a spec-file path")
    spec = perf.chip_spec(chip)
    if spec.kind != "tpu":
        raise ValueError(f"chip: '{chip}' is a {spec.kind.upper()}; these Pallas kernels target TPUs (e.g. chip='tpu-v5e')")
    if spec.memory.vmem_bytes_per_core is None:
        raise ValueError(f"chip: the spec of '{chip}' has no memory.vmem_bytes_per_core to size blocks against; add it")
    return spec


def scoped_vmem_limit_bytes(spec: "ChipSpec") -> int:
    """Mosaic's default scoped-VMEM limit per TensorCore: the budget block sizes must fit by default
    (the physical VMEM where the spec records no scoped limit, e.g. v2/v3)."""
    physical = spec.memory.vmem_bytes_per_core
    assert physical is not None  # tpu_chip() guarantees it
    return spec.memory.vmem_default_scoped_limit_bytes_per_core or physical


def check_vmem(need_bytes: int, chip: "ChipSpec", what: str, *, fix: str = "use smaller blocks",
               raised_limit: bool = False) -> int | None:
    """The VMEM-budget check of every bundled kernel's block sizes; returns the ``vmem_limit_bytes`` to compile with.

    ``what`` names the blocks at fault (e.g. ``"block_sizes (bm=..,bk=..,bn=..)"``)
    and ``fix`` says what to change; the ValueError reads
    "<what> need <size> of VMEM, over the <limit> scoped limit of <chip>; <fix>"
    (with ``raised_limit``: "<what> need <size> of VMEM but <chip> has <physical> per core; <fix>").

    ``raised_limit=False`` (kernels compiled without ``vmem_limit_bytes``): the
    need must fit Mosaic's default scoped limit; returns None.
    ``raised_limit=True``: None when the need fits the default scoped limit; the
    need plus 25% headroom (capped at the physical VMEM) when it fits only the
    physical VMEM; ValueError when it fits neither.
    """
    scoped = scoped_vmem_limit_bytes(chip)
    if need_bytes <= scoped:
        return None
    physical = chip.memory.vmem_bytes_per_core
    assert physical is not None  # tpu_chip() guarantees it
    need = perf.binary(need_bytes)
    if not raised_limit:
        raise ValueError(f"{what} need {need} of VMEM, over the {perf.binary(scoped)} scoped limit of "
                         f"{chip.name}; {fix}")
    if need_bytes > physical:
        raise ValueError(f"{what} need {need} of VMEM but {chip.name} has {perf.binary(physical)} per core; "
                         f"{fix}")
    return min(physical, int(need_bytes * 1.25))


def compile_vmem_limit_bytes(need_bytes: int, chip: "ChipSpec", what: str,
                             fix: str = "use smaller blocks") -> int | None:
    """:func:`check_vmem` for a kernel that raises ``vmem_limit_bytes`` when its blocks need it."""
    return check_vmem(need_bytes, chip, what, fix=fix, raised_limit=True)


def check_dtype(arg: str, dtype: Any, allowed: tuple[str, ...], spec: "ChipSpec") -> None:
    """ValueError naming ``arg`` unless dtype is in ``allowed`` and the chip can run it.

    fp8 storage needs a chip whose spec lists an fp8 matmul rate.
    """
    name = np_dtype(dtype).name
    if name not in allowed:
        raise ValueError(f"{arg}: dtype {name} is not supported; use one of {', '.join(allowed)}")
    if name in FP8_DTYPES and spec.matmul_rate("fp8") is None:
        raise ValueError(
            f"{arg}: dtype {name} needs fp8 support, which {spec.name} lacks; "
            "use bfloat16 or int8, or a chip with fp8 (e.g. chip='tpu-7x')"
        )


# ----------------------------------------------------------------------------- tuned per-chip defaults


def tuned_block_table(kernel: str, make: Callable[[Mapping[str, Any]], T]) -> dict[str, dict[str, T]]:
    """chip -> dtype configuration -> blocks built by ``make`` from each entry of ``kernels/<kernel>/tuned.json``.

    That file is the block-size advisor's output (regenerate with
    ``perfmodel tune --write KERNEL``, see :mod:`kernels.tuned`); each chip lists its
    configurations (e.g. "bf16", or "bf16 x int8" for matmul) production one
    first. Reads the file (json only, no jax); callers cache the result. A
    missing file reads as an empty table (every chip takes the kernel's
    fallback; only while ``--write`` creates a kernel's first file).
    """
    from kernels.tuned import load_tuned_defaults

    try:
        stored = load_tuned_defaults(kernel)
    except FileNotFoundError:
        return {}
    return {chip: {config: make(entry) for config, entry in configs.items()} for chip, configs in stored.items()}


def tuned_entry_chip(table: Mapping[str, Any], chip: str) -> str:
    """The chip whose tuned entry a kernel takes on ``chip``: the one policy of every bundled kernel (and so of
    the op models, which read the kernels' defaults) for a chip its tuned.json has no entry for, such as a chip
    just added as a hwspec YAML file: ``chip`` itself when the table has it, else the reference chip
    ``kernels.perf.DEFAULT_CHIP`` (the generation the model is calibrated on), whose blocks the kernel then fits
    to the chip (dtype tiles, VMEM) as it fits its own. ``perfmodel tune --write`` adds the chip's own entry."""
    from kernels.perf import DEFAULT_CHIP

    return chip if chip in table else DEFAULT_CHIP


def tuned_blocks(table: Mapping[str, Mapping[str, T]], chip: str, config: str | None = None) -> T | None:
    """The chip's blocks for ``config``; its first (production) configuration when ``config`` is None or not
    stored for the chip; None when the table has no entry for the chip."""
    configs = table.get(chip)
    if not configs:
        return None
    if config is not None and config in configs:
        return configs[config]
    return next(iter(configs.values()))


class TunedChipTable(Mapping[str, Any]):
    """Read-only ``chip -> blocks`` view of a tuned table (each chip's first, production configuration).

    ``load`` is the kernel's cached table reader (e.g. ``blocks.default_block_table``);
    nothing is read until the view is first used, so importing a kernel stays cheap.
    """

    def __init__(self, load: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._load = load

    def __getitem__(self, chip: str) -> Any:
        blocks = tuned_blocks(self._load(), chip)
        if blocks is None:
            raise KeyError(chip)
        return blocks

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"TunedChipTable({dict(self)!r})"
