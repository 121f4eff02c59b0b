"""The ``--shape`` syntax of `perfmodel analyze / tune / inspect`, and turning it into arguments.

Grammar (one array argument per ``--shape``)::

    NAME=DIMS[:DTYPE][=FILL]

    DIMS   4096x4096, 8x128x1024, 32 (one dimension) or "scalar"
    DTYPE  bf16 (default), f32 / fp32 / float32, f16, fp8 / e4m3, e5m2,
           int8, uint8, int16, int32, uint32, bool
    FILL   a number (every element), "arange" (0, 1, 2, ... in row-major
           order), "arange*N" (0, N, 2N, ...) or "random" (seeded normal
           floats, or ints in [0, 10))

Without ``=FILL`` the argument is abstract (a ``jax.ShapeDtypeStruct``):
nothing is computed from it. Index maps that read scalar-prefetch operands
(page tables, lengths, slot mappings) need their values: give those a FILL,
e.g. ``--shape page_table=8x64:int32=arange --shape lengths=8:int32=2048``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.inputcheck import short

#: What users type -> numpy / ml_dtypes name.
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "f32": "float32", "fp32": "float32", "float32": "float32",
    "f16": "float16", "fp16": "float16", "float16": "float16",
    "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "float8_e5m2": "float8_e5m2",
    "int8": "int8", "i8": "int8", "uint8": "uint8", "u8": "uint8",
    "int16": "int16", "int32": "int32", "i32": "int32", "uint32": "uint32", "u32": "uint32",
    "bool": "bool",
}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEED = 0


@dataclass(frozen=True, kw_only=True)
class ShapeSpec:
    """One parsed --shape."""

    name: str
    shape: tuple[int, ...]
    #: numpy / ml_dtypes dtype name, e.g. "bfloat16".
    dtype: str
    #: None (abstract), a number, "arange", "arange*N" or "random".
    fill: float | str | None = None

    def text(self) -> str:
        dims = "x".join(str(d) for d in self.shape) if self.shape else "scalar"
        fill = "" if self.fill is None else f"={self.fill:g}" if isinstance(self.fill, float) else f"={self.fill}"
        return f"{self.name}={dims}:{self.dtype}{fill}"


def parse_shape(text: str, flag: str = "--shape") -> ShapeSpec:
    """Parse ``NAME=DIMS[:DTYPE][=FILL]``; InputError naming ``flag`` on any mistake."""
    example = "e.g. x=4096x4096:bf16 or lengths=8:int32=1024"
    if "=" not in text:
        raise InputError(f"{flag} '{short(text)}': expected NAME=DIMS[:DTYPE][=FILL], {example}")
    name, rest = text.split("=", 1)
    name = name.strip()
    if not _NAME.match(name):
        raise InputError(f"{flag} '{text}': '{name}' is not a valid argument name")
    fill_text = None
    if "=" in rest:
        rest, fill_text = rest.split("=", 1)
    dims_text, _, dtype_text = rest.partition(":")
    shape = _parse_dims(dims_text.strip(), text, flag, example)
    dtype_key = (dtype_text.strip() or "bf16").lower()
    dtype = DTYPE_ALIASES.get(dtype_key)
    if dtype is None:
        raise InputError(f"{flag} '{text}': unknown dtype '{dtype_text}'; use one of {', '.join(sorted(set(DTYPE_ALIASES)))}")
    fill = _parse_fill(fill_text, text, flag)
    _check_size(shape, dtype, fill, text, flag)
    return ShapeSpec(name=name, shape=shape, dtype=dtype, fill=fill)


#: Largest array a --shape may describe (2**40 bytes, 1.1 TB: several times the HBM of any chip in the database),
#: and the most elements of an array given values (a FILL: those are built in host memory).
MAX_SHAPE_BYTES = 1 << 40
MAX_FILLED_ELEMENTS = 1 << 28


def _check_size(shape: tuple[int, ...], dtype: str, fill: Any, text: str, flag: str) -> None:
    import ml_dtypes  # noqa: F401  (registers bfloat16 and the float8 types with numpy)

    elements = math.prod(shape)
    nbytes = elements * np.dtype(dtype).itemsize
    if nbytes > MAX_SHAPE_BYTES:
        raise InputError(f"{flag} '{short(text)}': {nbytes:.3g} bytes; at most 2**40 (1.1 TB), more than any "
                         "chip's HBM holds")
    if fill is not None and elements > MAX_FILLED_ELEMENTS:
        raise InputError(f"{flag} '{short(text)}': {elements:.3g} elements given values (FILL); at most 2**28 "
                         "(values are built in host memory); leave FILL off for an abstract array")


def _parse_dims(dims: str, text: str, flag: str, example: str) -> tuple[int, ...]:
    if dims.lower() == "scalar":
        return ()
    parts = dims.lower().split("x")
    if not dims or any(not p.strip().isdigit() for p in parts):
        raise InputError(f"{flag} '{text}': dimensions must be positive integers joined by 'x' (or 'scalar'), {example}")
    shape = tuple(int(p) for p in parts)
    if any(d <= 0 for d in shape):
        raise InputError(f"{flag} '{text}': every dimension must be >= 1")
    return shape


def _parse_fill(fill: str | None, text: str, flag: str) -> float | str | None:
    if fill is None:
        return None
    fill = fill.strip().lower()
    if fill in ("arange", "random") or re.fullmatch(r"arange\*\d+", fill):
        return fill
    try:
        return float(fill)
    except ValueError:
        raise InputError(f"{flag} '{text}': fill '{fill}' must be a number, 'arange', 'arange*N' or 'random'") from None


def materialize(spec: ShapeSpec) -> Any:
    """A ``jax.ShapeDtypeStruct`` (no fill) or a concrete jax array."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(spec.dtype)
    if spec.fill is None:
        return jax.ShapeDtypeStruct(spec.shape, dtype)
    size = int(math.prod(spec.shape))
    if isinstance(spec.fill, str) and spec.fill.startswith("arange"):
        step = int(spec.fill.split("*", 1)[1]) if "*" in spec.fill else 1
        return jnp.asarray((np.arange(size) * step).reshape(spec.shape), dtype=dtype)
    if spec.fill == "random":
        rng = np.random.default_rng(_SEED)
        if np.issubdtype(np.dtype(dtype), np.integer) or dtype == jnp.bool_:
            return jnp.asarray(rng.integers(0, 10, size=spec.shape), dtype=dtype)
        return jnp.asarray(rng.standard_normal(spec.shape), dtype=dtype)
    return jnp.full(spec.shape, spec.fill, dtype=dtype)


def abstract(spec: ShapeSpec) -> Any:
    """The ShapeDtypeStruct of a spec, whatever its fill (for lowering)."""
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(spec.shape, jnp.dtype(spec.dtype))
