"""Size arguments: validation, broadcasting, tile padding.

Op models accept a Python number or a numpy array for every size; these
helpers check them once (positive integers, one-line InputError naming the
flag) and do the ceil-division / round-up arithmetic of tiling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from perfmodel.errors import InputError
from perfmodel.inputcheck import MAX_SIZE_PRODUCT

Num = Union[float, int, np.ndarray]


def flag_name(name: str) -> str:
    """``kv_heads`` -> "`kv_heads`": how a message names a keyword argument (the CLI writes it as the command's
    flag, ``--kv-heads``; see perfmodel.errors)."""
    return f"`{name}`"


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> object:
    return arr[bad].flat[0] if arr.ndim else arr.item()


def sizes(name: str, value: Num, *, minimum: int = 1) -> np.ndarray:
    """Integer array of a size argument; InputError naming the flag unless all are >= minimum."""
    try:
        arr = np.asarray(value)
    except Exception:  # pragma: no cover - exotic input
        raise InputError(f"{flag_name(name)}: expected an integer size, got {value!r}") from None
    if arr.dtype.kind not in "iuf" or arr.size == 0:
        raise InputError(f"{flag_name(name)}: expected an integer size, got {value!r}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
            raise InputError(f"{flag_name(name)}: sizes must be whole numbers, got {_first_bad(arr, bad)}")
        huge = np.abs(arr) > MAX_SIZE_PRODUCT  # would wrap around in the int64 cast (9.3e18 -> -9.2e18)
        if np.any(huge):
            raise InputError(f"{flag_name(name)}: {_first_bad(arr, huge):.3g} is too large (at most 2**62)")
        arr = arr.astype(np.int64)
    arr = arr.astype(np.int64, copy=False)
    below = arr < minimum
    if np.any(below):
        raise InputError(f"{flag_name(name)} must be >= {minimum}, got {_first_bad(arr, below)}")
    return arr


def optional_size(name: str, value: Num | None, *, minimum: int = 1) -> np.ndarray | None:
    return None if value is None else sizes(name, value, minimum=minimum)


def cdiv(a: Num, b: Num) -> np.ndarray:
    """Ceiling division of non-negative integers."""
    return -(-np.asarray(a) // np.asarray(b))


def round_up(a: Num, multiple: Num) -> np.ndarray:
    return cdiv(a, multiple) * np.asarray(multiple)


def fval(x: Num) -> Num:
    """A float array, or a Python float for 0-d results."""
    arr = np.asarray(x, dtype=float)
    return arr if arr.ndim else float(arr)


def choice(name: str, value: object, allowed: tuple) -> object:
    """InputError naming the flag unless value is one of allowed."""
    if value not in allowed:
        shown = ", ".join(str(a) for a in allowed)
        raise InputError(f"{flag_name(name)}: got {value!r}; use one of {shown}")
    return value


@dataclass(frozen=True, kw_only=True)
class Tiles:
    """Tile sizes work is padded to on a chip (all 1 when no chip is given)."""

    #: MXU systolic array edge (K and N of a matmul pad to it).
    mxu: int
    #: Vector register tile (8 x 128 on TPUs).
    sublanes: int
    lanes: int

    def vreg_elements(self, rows: Num, cols: Num) -> np.ndarray:
        """Elements a (rows, cols) f32 array occupies in (sublanes, lanes) vregs."""
        return round_up(rows, self.sublanes) * round_up(cols, self.lanes)


#: MMA tile edge assumed for GPUs, whose specs have no mxu_dim (tensor-core fragments are 16 wide).
GPU_MMA_TILE = 16


def chip_tiles(chip: object | None) -> Tiles:
    if chip is None:
        return Tiles(mxu=1, sublanes=1, lanes=1)
    cores = chip.cores  # type: ignore[attr-defined]
    return Tiles(mxu=cores.mxu_dim or GPU_MMA_TILE, sublanes=cores.vreg_sublanes or 1, lanes=cores.vreg_lanes or 1)
