"""Formatting numbers for people: SI prefixes and units on everything."""

from __future__ import annotations

import math
import re
import textwrap
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Sequence

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


#: The width tables fit by wrapping their widest text columns (None: no limit). The CLI sets it per command
#: (the terminal's width, at most 120 columns; unset with --wide), so that every renderer fits without a
#: width argument threaded through it.
_TABLE_WIDTH: ContextVar[int | None] = ContextVar("perfmodel_table_width", default=None)
#: A wrapped text column keeps at least this many characters.
MIN_WRAP_WIDTH = 12


@contextmanager
def table_width(columns: int | None) -> Iterator[None]:
    """Tables rendered inside fit ``columns`` characters (None: no limit)."""
    token = _TABLE_WIDTH.set(columns)
    try:
        yield
    finally:
        _TABLE_WIDTH.reset(token)


def current_table_width() -> int | None:
    """The width set by :func:`table_width` (None: no limit)."""
    return _TABLE_WIDTH.get()


def _fit(widths: list[int], align: str, max_width: int, headers: list[str], rows: list[list[str]]) -> list[int]:
    """Narrow columns until the table fits max_width (or none can narrow): first headers longer than their
    cells wrap (down to the cells' width or the header's longest word), then the widest text ('l') columns."""
    widths = list(widths)
    total = sum(widths) + 2 * (len(widths) - 1)
    for i, h in enumerate(headers):
        if total <= max_width:
            break
        floor = max([len(str(r[i])) for r in rows if i < len(r)] + [len(w) for w in str(h).split()] + [1])
        cut = min(total - max_width, max(widths[i] - floor, 0))
        widths[i] -= cut
        total -= cut
    while total > max_width:
        text = [i for i, a in enumerate(align) if a == "l" and widths[i] > MIN_WRAP_WIDTH]
        if not text:
            break
        i = max(text, key=lambda j: widths[j])
        others = [widths[j] for j in text if j != i]
        # down to the next widest text column (so that wide columns share the cut), at most what is missing
        floor = max([MIN_WRAP_WIDTH] + [w for w in others if w < widths[i]])
        cut = min(total - max_width, widths[i] - floor) or 1
        widths[i] -= cut
        total -= cut
    return widths


def _columns_to_hide(headers: Sequence[str], rows: Sequence[Sequence[str]], optional: Sequence[str],
                     limit: int | None) -> list[str]:
    """The optional columns to leave out, in order, until the full-width table fits ``limit``."""
    if not limit or not optional:
        return []
    # Each column at its cells' width, its header wrapped to its longest word (what _fit does first).
    widths = {h: max([len(str(c)) for c in col] + [len(w) for w in str(h).split()] + [1])
              for h, col in zip(headers, zip(*rows) if rows else [()] * len(headers))}
    total = sum(widths.values()) + 2 * (len(widths) - 1)
    hidden: list[str] = []
    for name in optional:
        if total <= limit:
            break
        if name in widths:
            hidden.append(name)
            total -= widths[name] + 2
    return hidden


def fit_text(text: str, width: int | None) -> str:
    """Prose lines (notes, titles, sources) longer than ``width`` wrap, indented under their first line; table
    lines (a header over a rule of dashes, the rows under it until a blank line) are left as the table renderer
    made them."""
    if not width:
        return text
    lines = text.split("\n")
    in_table = [False] * len(lines)
    for i, line in enumerate(lines):
        if _RULE.match(line):
            # Its header (a wrapped header takes a few lines) and its rows, none wider than the rule; a note
            # printed right under a table is wider, and wraps.
            rule = len(line)
            j = i - 1
            while j >= 0 and lines[j].strip() and j >= i - 3 and len(lines[j]) <= rule:
                in_table[j] = True
                j -= 1
            j = i
            while j < len(lines) and lines[j].strip() and len(lines[j]) <= rule:
                in_table[j] = True
                j += 1
    out: list[str] = []
    for line, table_line in zip(lines, in_table):
        if table_line or len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                                 break_long_words=False, break_on_hyphens=False) or [line])
    return "\n".join(out)


_RULE = re.compile(r"^(?=.*--)[\s-]+$")


def table(headers: list[str], rows: list[list[str]], align: str | None = None, *,
          max_width: int | None = None, optional: Sequence[str] = ()) -> str:
    """Plain-text table; align is one char per column ('l' or 'r'), default: first left, rest right.

    Wider than ``max_width`` (default: the width set by :func:`table_width`, else no limit), the ``optional``
    columns (header names, least needed first) are left out until it fits, with a line naming them, then the
    widest text columns wrap onto continuation lines (numbers never wrap)."""
    align = align or "l" + "r" * (len(headers) - 1)
    limit = max_width if max_width is not None else _TABLE_WIDTH.get()
    hidden = _columns_to_hide(headers, rows, optional, limit)
    if hidden:
        keep = [i for i, h in enumerate(headers) if h not in hidden]
        body = table([headers[i] for i in keep], [[r[i] for i in keep] for r in rows],
                     "".join(align[i] for i in keep), max_width=limit)
        return body + f"\n({', '.join(hidden)}: left out to fit {limit} columns; --wide shows every column)"
    full = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    max_width = max_width if max_width is not None else _TABLE_WIDTH.get()
    widths = _fit(full, align, max_width, headers, rows) if max_width else full

    def cell_lines(text: str, w: int, full_w: int) -> list[str]:
        return [text] if len(text) <= w else textwrap.wrap(text, w) or [""]

    def fmt(row: list[str]) -> list[str]:
        cells = [cell_lines(str(c), w, f) for c, w, f in zip(row, widths, full)]
        height = max(len(c) for c in cells)
        out = []
        for k in range(height):
            parts = [(c[k] if k < len(c) else "") for c in cells]
            out.append("  ".join(p.ljust(w) if a == "l" else p.rjust(w)
                                 for p, w, a in zip(parts, widths, align)).rstrip())
        return out

    # A column with an empty header (e.g. a marker column) gets no rule.
    rule = "  ".join(("-" if h else " ") * w for h, w in zip(headers, widths)).rstrip()
    return "\n".join([*fmt(headers), rule, *(line for r in rows for line in fmt(r))])
