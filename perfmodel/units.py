"""Formatting numbers for people: SI prefixes and units on everything."""

from __future__ import annotations

import math

_PREFIXES = [(1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p"), (1e-15, "f")]
#: Units of things counted whole (tokens, sequences, requests): no milli- or micro- prefix.
_COUNT_UNITS = ("tok", "seq", "req")
_BINARY = [(2**60, "Ei"), (2**50, "Pi"), (2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"), (1, "")]


def si(value: float | None, unit: str, digits: int = 3, *, sub_unit_prefixes: bool = True) -> str:
    """``si(1.97e14, "FLOP/s") == "197 TFLOP/s"``; None prints as "n/a".

    ``sub_unit_prefixes=False`` keeps values below 1 unprefixed (``0.400 FLOP/B``
    rather than ``400 mFLOP/B``), for ratios where milli-units read oddly.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if value == 0:
        return f"0 {unit}"
    if math.isinf(value):
        return f"{'-' if value < 0 else ''}inf {unit}"
    if unit.startswith(_COUNT_UNITS):
        sub_unit_prefixes = False  # 0.0625 tok/s, not "62.5 mtok/s" (which reads as mega)
    mag = abs(value)
    if not sub_unit_prefixes and mag < 1:
        return f"{_sig(value, digits)} {unit}"
    for scale, prefix in _PREFIXES:
        if mag >= scale * 0.9995:
            break
    else:
        scale, prefix = _PREFIXES[-1]
    return f"{_sig(value / scale, digits)} {prefix}{unit}"


def binary(value: float | None, unit: str = "B", digits: int = 3) -> str:
    """Capacities in binary prefixes: ``binary(2**27) == "128 MiB"``."""
    if value is None:
        return "n/a"
    if value == 0:
        return f"0 {unit}"
    for scale, prefix in _BINARY:
        if abs(value) >= scale:
            break
    return f"{_sig(value / scale, digits)} {prefix}{unit}"


def _sig(x: float, digits: int) -> str:
    if x == 0:
        return "0"
    if not 1e-4 <= abs(x) < 1e6:
        # beyond the prefixes (a spec's absurd 1e-300 B/s gives 3.37e+269 Ys): e-notation, not 270 digits
        return f"{x:.{digits - 1}e}"
    x = float(f"{x:.{digits}g}")
    places = max(digits - 1 - int(math.floor(math.log10(abs(x)))), 0)
    text = f"{x:.{places}f}"
    return text


def seconds(value: float | None) -> str:
    return si(value, "s")


def flops(value: float | None) -> str:
    return si(value, "FLOP/s")


def bandwidth(value: float | None) -> str:
    return si(value, "B/s")


def nbytes(value: float | None) -> str:
    return si(value, "B")


def intensity(value: float | None) -> str:
    """Arithmetic intensity or ridge point: ``intensity(0.4) == "0.400 FLOP/B"``."""
    return si(value, "FLOP/B", sub_unit_prefixes=False)


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """Plain-text table; align is one char per column ('l' or 'r'), default: first left, rest right."""
    align = align or "l" + "r" * (len(headers) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def fmt(row: list[str]) -> str:
        cells = [str(c).ljust(w) if a == "l" else str(c).rjust(w) for c, w, a in zip(row, widths, align)]
        return "  ".join(cells).rstrip()

    # A column with an empty header (e.g. a marker column) gets no rule.
    rule = "  ".join(("-" if h else " ") * w for h, w in zip(headers, widths)).rstrip()
    return "\n".join([fmt(headers), rule, *(fmt(r) for r in rows)])
