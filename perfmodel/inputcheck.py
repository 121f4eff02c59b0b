"""One validation layer for user input: numbers, sizes, text files, echoed text.

Every loader (spec YAML, config.json, results JSONL, published YAML) and the CLI's value parsers call these, so a
NaN, an infinity, a negative time, a size that would exhaust memory or a file that is not UTF-8 is refused with
the same one-line :class:`perfmodel.errors.InputError` wherever it comes from. ``what`` is how the message names
the value: a field in backticks (the CLI rewrites it into the flag) or ``file:line: field 'x'``.

Nothing here imports numpy, yaml or jax.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError

#: Longest piece of user input a message echoes.
ECHO_CHARS = 80

#: Most elements one array or one grid may have (2**40, about 1.1e12: a 2 TiB bf16 array, larger than the HBM of
#: any chip in the database), and the most entries a list given on the command line may have; past these the model
#: would allocate per element or per entry and run out of memory before saying anything.
MAX_ELEMENTS = 1 << 40
MAX_LIST_ENTRIES = 1_000_000
#: Largest size any single dimension or count may have (2**53: beyond it float64 loses integers and int64
#: products overflow).
MAX_DIMENSION = 1 << 53


def short(text: Any, limit: int = ECHO_CHARS) -> str:
    """``text`` as a string of at most ``limit`` characters (the middle elided with "...")."""
    s = str(text)
    if len(s) <= limit:
        return s
    keep = (limit - 3) // 2
    return f"{s[:keep]}...{s[-keep:]} ({len(s)} characters)"


def finite(value: Any, what: str, *, positive: bool = False, nonnegative: bool = False) -> float:
    """``value`` as a finite float; with ``positive`` it must be > 0, with ``nonnegative`` >= 0. InputError naming
    ``what`` otherwise (booleans and strings are refused too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{what} is {short(repr(value))}: expected a number")
    try:
        x = float(value)
    except OverflowError:
        raise InputError(f"{what} is {short(value)}: too large for a number") from None
    if not math.isfinite(x):
        raise InputError(f"{what} is {x}: expected a finite number")
    if positive and x <= 0:
        raise InputError(f"{what} is {short(value)}: expected a positive number")
    if nonnegative and x < 0:
        raise InputError(f"{what} is {short(value)}: expected a number >= 0")
    return x


def dimension(value: int, what: str) -> int:
    """A size or count: an int in 1..MAX_DIMENSION."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{what} is {short(repr(value))}: expected a whole number")
    if value <= 0:
        raise InputError(f"{what} is {short(value)}: expected a positive whole number")
    if value > MAX_DIMENSION:
        raise InputError(f"{what} is {short(value)}: larger than 2**53; no chip holds that")
    return value


def elements(dims: Any, what: str, limit: int = MAX_ELEMENTS) -> int:
    """The product of ``dims`` (an array shape or a grid), InputError when it exceeds ``limit``."""
    total = 1
    for d in dims:
        total *= int(d)
    if total > limit:
        shape = "x".join(str(d) for d in dims)
        raise InputError(f"{what} {short(shape)} has {total:.3g} elements; at most {limit:.3g} "
                         "(about 2 TiB of bf16, more than any chip holds)")
    return total


def read_text(path: str | os.PathLike, what: str = "") -> str:
    """A text file's content as UTF-8; InputError naming the file (and ``what``, e.g. "`config_path`") when it is
    missing, not a regular file, unreadable, or not UTF-8 (with the line of the first bad byte)."""
    p = Path(path)
    label = f"{what} '{short(p)}'" if what else short(p)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{label}: is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"{label}: cannot read ({exc.strerror})") from None
    return decode(raw, label if what else str(p))


def decode(raw: bytes, where: str) -> str:
    """``raw`` decoded as UTF-8; InputError "where:LINE: not UTF-8 text (byte 0x89 at column 1)" otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError(f"{where}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}); "
                         "is this the right file?") from None


#: Largest size a model works with (2**62): an array of more elements or bytes fits no chip, and its counts would not
#: fit the 64-bit integers numpy uses.
MAX_SIZE_PRODUCT = 1 << 62
#: Largest product of size options that a model multiplies together (2**58): its counts (2 FLOPs per
#: multiply-add, up to 8 bytes per element) then stay under 2**62, below the 64-bit limit.
MAX_COUNT_PRODUCT = 1 << 58


def option_values(params: Mapping[str, Any], products: Sequence[Sequence[str]] = ()) -> None:
    """Numbers given as keyword arguments (CLI options): floats finite, integers at most 2**53, and, for each
    group of ``products`` (the size options the model multiplies together: an op's FLOPs and array sizes, not
    its block sizes; "a|b" stands for a, or b when a is not given), the product of those given at most
    :data:`MAX_COUNT_PRODUCT`, so no count the model forms
    overflows 64-bit arithmetic (a silent wrong number). Errors name the keyword arguments in backticks (the CLI
    writes them as flags)."""
    for key, value in params.items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, float):
            finite(value, f"`{key}`")
        elif isinstance(value, int) and abs(value) > MAX_DIMENSION:
            raise InputError(f"`{key}` is {short(value)}: larger than 2**53; no chip holds that")
    def size(alt: str) -> tuple[str, int] | None:
        """(name as the error writes it, value) of one factor: "a|b" is a, or b when a is not given."""
        first, *others = alt.split("|")
        key = next((k for k in (first, *others) if params.get(k) is not None), first)
        value = params.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 1:
            return None
        return (f"`{key}`" if key == first else f"`{first}` (= `{key}`)"), value

    for group in products:
        given = [x for x in map(size, group) if x is not None]
        product = math.prod(v for _, v in given)
        if product > MAX_COUNT_PRODUCT:
            names = ", ".join(k for k, _ in given)
            raise InputError(f"{names}: these sizes multiply to {product:.3g} in the model's counts, past 2**58 "
                             "(2.9e17); the problem is larger than any chip's memory and its counts would overflow "
                             "64-bit integers")


def check_new_file(path: str | os.PathLike, field: str, *, force: bool) -> None:
    """Refuse to replace an existing ``path`` unless ``force`` (the CLI's --force). Errors name ``field`` in
    backticks."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"`{field}` '{short(p)}': is a directory; give a file name", fields=(field,))
    if p.exists() and not force:
        raise InputError(f"`{field}` '{short(p)}' exists; give --force to replace it, or another name",
                         fields=(field,))
