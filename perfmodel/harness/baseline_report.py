"""The views of a baseline (:mod:`perfmodel.harness.baseline`): a comparison as a text table, a markdown table
for a pull-request comment or JSON records; the recorded figures as text or JSON; and the kernels README's
per-kernel tables, filled in place between their marker comments (pure functions from records to text).
"""

from __future__ import annotations

import textwrap
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError
from perfmodel.harness.baseline import BaselineRecord, CompareRow, _pct, _record_json, regressions


def _fmt(name: str, value: Any) -> str:
    from perfmodel.units import binary, seconds

    if value is None:
        return "-"
    if name == "compiled_time_s":
        return seconds(value)
    if name == "scoped_vmem_bytes":
        return binary(value)
    return f"{value:,}"


def _cell(row: CompareRow, name: str) -> str:
    """The new figure, and the old one with the change where it changed."""
    rec = row.new or row.old
    value = _fmt(name, getattr(rec, name) if rec else None)
    rel = row.changes.get(name)
    if rel is None or row.old is None:
        return value
    sign = "+" if rel > 0 else ""
    return f"{_fmt(name, getattr(row.old, name))} -> {value} ({sign}{_pct(rel)})"


_COLUMNS = ["loop_bundles_per_step", "predicated_bundles_per_step", "compiled_time_s", "scoped_vmem_bytes",
            "spills_per_step", "fills_per_step", "dma_starts_per_step"]
_HEADERS = ["every-step bundles", "predicated bundles", "time", "scoped VMEM", "spills", "fills", "DMA starts"]


def _verdict(row: CompareRow) -> str:
    return ("FAIL " if row.failing else "") + row.verdict


def summary(rows: Sequence[CompareRow], tolerance: float) -> str:
    bad = regressions(rows)
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in ("grew", "shrank", "same", "new", "missing", "failed")}
    tally = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    head = (f"{len(bad)} regression(s)" if bad else "no regression") + f" in {len(rows)} call(s) x chip(s)"
    return f"{head} ({tally}; tolerance {tolerance * 100:g}% on bundles and time, any new spill or fill, VMEM " \
           "past the chip's limit)"


def report_text(rows: Sequence[CompareRow], tolerance: float) -> str:
    """Plain-text table of a check (bundles and spills per grid step), the failing rows' reasons, a summary."""
    from perfmodel.units import table

    body = [[r.name, r.chip, *(_cell(r, c) for c in _COLUMNS), _verdict(r)] for r in rows]
    lines = [table(["call", "chip", *_HEADERS, "verdict"], body, align="ll" + "r" * len(_COLUMNS) + "l",
                   optional=["fills", "DMA starts", "predicated bundles"])]
    for r in regressions(rows):
        lines.append(f"FAIL {r.name} on {r.chip}: {'; '.join(r.reasons)}")
    lines.append(summary(rows, tolerance))
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def report_markdown(rows: Sequence[CompareRow], tolerance: float) -> str:
    """A markdown table for a pull-request comment: a summary line, the rows that fail or changed, and the
    unchanged ones folded in a <details> block."""
    head = "| call | chip | " + " | ".join(_HEADERS) + " | verdict |"
    rule = "|" + "---|" * (len(_HEADERS) + 3)

    def line(r: CompareRow) -> str:
        verdict = ("**FAIL** " if r.failing else "") + r.verdict
        if r.failing:
            verdict += ": " + "; ".join(r.reasons)
        return "| " + " | ".join(_md(x) for x in [r.name, r.chip, *(_cell(r, c) for c in _COLUMNS)]) + \
               f" | {_md(verdict)} |"

    bad = regressions(rows)
    mark = ":x:" if bad else ":white_check_mark:"
    out = [f"### perfmodel baseline check {mark}", "", summary(rows, tolerance), ""]
    changed = [r for r in rows if r.failing or r.verdict != "same"]
    same = [r for r in rows if not r.failing and r.verdict == "same"]
    if changed:
        out += [head, rule, *(line(r) for r in changed), ""]
    if same:
        out += [f"<details><summary>{len(same)} unchanged</summary>", "", head, rule, *(line(r) for r in same), "",
                "</details>", ""]
    out.append("Figures per grid step from the TPU compiler's schedule (deviceless libtpu); "
               "time: perfmodel's compiler-backed estimate.")
    return "\n".join(out)


def report_records(rows: Sequence[CompareRow], tolerance: float) -> dict[str, Any]:
    """JSON-ready: the tolerance, the regressions count and each row with its old and new records."""
    return {"tolerance": tolerance, "regressions": len(regressions(rows)),
            "rows": [{"name": r.name, "chip": r.chip, "verdict": r.verdict, "failing": r.failing,
                      "reasons": list(r.reasons), "changes": dict(r.changes),
                      "old": _record_json(r.old) if r.old else None,
                      "new": _record_json(r.new) if r.new else None} for r in rows]}


def records_text(records: Sequence[BaselineRecord]) -> str:
    """Plain-text table of recorded figures (what `baseline write` prints)."""
    from perfmodel.units import table

    body = [[r.name, r.chip, *(_fmt(c, getattr(r, c)) for c in _COLUMNS),
             "" if r.compiled else f"does not compile: {r.error}"] for r in records]
    return table(["call", "chip", *_HEADERS, "note"], body, align="ll" + "r" * len(_COLUMNS) + "l",
                 optional=["note", "fills", "DMA starts", "predicated bundles"])


def records_json(records: Sequence[BaselineRecord]) -> list[dict[str, Any]]:
    return [_record_json(r) for r in records]


# ----------------------------------------------------------------------------- README tables
#
# kernels/README.md shows each kernel's baseline figures as a markdown table between marker comments; the tables
# are rendered from the baseline file here (never edited by hand) and a fast test fails when they drift from it.

#: A README region: the opening marker names the kernel (a record's target), the closing marker ends the region.
README_OPEN = "<!-- baseline-table: {kernel} -->"
README_CLOSE = "<!-- /baseline-table -->"
_OPEN_PREFIX, _OPEN_SUFFIX = "<!-- baseline-table:", "-->"

#: A kernel table's columns, in order.
TABLE_HEADERS = ("chip", "call", "bundles / step (every / predicated)", "compiler-backed time", "scoped VMEM",
                 "spills / fills per step", "DMA starts / step")


def kernel_records(records: Sequence[BaselineRecord],
                   chip_order: Sequence[str] | None = None) -> dict[str, tuple[BaselineRecord, ...]]:
    """Records grouped by kernel (the record's target, e.g. ``rms_norm``; a YAML call's MODULE:FUNCTION), kernels
    and calls in order of first appearance, each call's chips in ``chip_order`` (chips it lacks after them, in
    the records' order; None: the records' order). A fixed chip order keeps a table's rows where they are when
    ``baseline write --chips`` appends a chip's records at the end of the file."""
    rank = {c: i for i, c in enumerate(chip_order or ())}
    calls: dict[str, dict[str, list[BaselineRecord]]] = {}
    for r in records:
        calls.setdefault(r.target or r.name, {}).setdefault(r.name, []).append(r)
    return {kernel: tuple(r for rows in by_call.values()
                          for r in sorted(rows, key=lambda x: rank.get(x.chip, len(rank))))  # stable: ties keep order
            for kernel, by_call in calls.items()}


def _pair(a: int | None, b: int | None) -> str:
    """Two counts in one cell, "every / predicated" or "spills / fills"."""
    return "-" if a is None and b is None else f"{_fmt('', a)} / {_fmt('', b)}"


def table_cells(r: BaselineRecord) -> list[str]:
    """One table row: chip, call, bundles (every step / predicated), compiler-backed time (SI), scoped VMEM
    (binary units), spills / fills and DMA starts per grid step; '-' where the record has no figure."""
    if not r.compiled:
        return [r.chip, f"{r.name} (does not compile)", *["-"] * (len(TABLE_HEADERS) - 2)]
    return [r.chip, r.name, _pair(r.loop_bundles_per_step, r.predicated_bundles_per_step),
            _fmt("compiled_time_s", r.compiled_time_s), _fmt("scoped_vmem_bytes", r.scoped_vmem_bytes),
            _pair(r.spills_per_step, r.fills_per_step), _fmt("dma_starts_per_step", r.dma_starts_per_step)]


def kernel_table(records: Sequence[BaselineRecord]) -> str:
    """A markdown table of one kernel's records, one row per call and chip in the given order."""
    head = "| " + " | ".join(TABLE_HEADERS) + " |"
    rule = "|" + "---|" * 2 + "---:|" * (len(TABLE_HEADERS) - 2)
    return "\n".join([head, rule, *("| " + " | ".join(_md(c) for c in table_cells(r)) + " |" for r in records)])


def kernel_tables(records: Sequence[BaselineRecord], chip_order: Sequence[str] | None = None,
                  kernel: str | None = None) -> dict[str, str]:
    """kernel -> its markdown table (:func:`kernel_records` order); ``kernel`` keeps that one only (an
    InputError listing the baseline's kernels when it has no records of it)."""
    return {k: kernel_table(rs) for k, rs in _chosen(kernel_records(records, chip_order), kernel).items()}


def _chosen(groups: dict[str, tuple[BaselineRecord, ...]],
            kernel: str | None) -> dict[str, tuple[BaselineRecord, ...]]:
    if kernel is None:
        return groups
    if kernel not in groups:
        raise InputError(f"`kernel` '{kernel}' has no records in the baseline; its kernels: "
                         f"{', '.join(groups) or 'none'}")
    return {kernel: groups[kernel]}


def tables_markdown(tables: Mapping[str, str]) -> str:
    """The tables for printing: one alone as is, several each under a ``### kernel`` heading."""
    if len(tables) == 1:
        return next(iter(tables.values()))
    return "\n\n".join(f"### {k}\n\n{t}" for k, t in tables.items())


def tables_json(records: Sequence[BaselineRecord], chip_order: Sequence[str] | None = None,
                kernel: str | None = None) -> list[dict[str, Any]]:
    """JSON-ready: per kernel, its records in table order (figures raw, units in the field names)."""
    return [{"kernel": k, "records": [_record_json(r) for r in rs]}
            for k, rs in _chosen(kernel_records(records, chip_order), kernel).items()]


def readme_caption(source: str, readme: str, libtpu_version: str | None) -> str:
    """The line above each README table: where it comes from and how to regenerate it."""
    # the command is one unbreakable word (no line starts inside it), restored after wrapping as the prose is
    command = f"`perfmodel baseline table {source} --write-readme {readme}`".replace(" ", "\0")
    text = (f"Generated from `{source}` (libtpu {libtpu_version or 'unknown'}) by {command}; do not edit by hand. "
            "Bundles, spills, fills and DMA starts per grid step of the compiled loop body; time: perfmodel's "
            "compiler-backed estimate of the whole call.")
    return textwrap.fill(text, 110, break_long_words=False, break_on_hyphens=False).replace("\0", " ")


def readme_regions(text: str, where: str = "README") -> list[tuple[str, int, int]]:
    """The marked regions of a README: (kernel, offset where the region's body starts (after the opening
    marker's line), offset of its closing marker). A marker without its partner, a region inside another or a
    kernel marked twice is an InputError naming the line."""
    out: list[tuple[str, int, int]] = []
    open_at: tuple[str, int, int] | None = None  # kernel, body start, line number
    offset = 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.strip()
        if stripped.startswith(_OPEN_PREFIX) and stripped.endswith(_OPEN_SUFFIX):
            kernel = stripped[len(_OPEN_PREFIX):-len(_OPEN_SUFFIX)].strip()
            if open_at is not None:
                raise InputError(f"{where}:{number}: a baseline-table marker inside the region opened on line "
                                 f"{open_at[2]}; close it first with {README_CLOSE}")
            if not kernel:
                raise InputError(f"{where}:{number}: the baseline-table marker names no kernel; write "
                                 f"{README_OPEN.format(kernel='rms_norm')}")
            if any(k == kernel for k, _, _ in out):
                raise InputError(f"{where}:{number}: kernel '{kernel}' already has a baseline-table region")
            open_at = (kernel, offset + len(line), number)
        elif stripped == README_CLOSE:
            if open_at is None:
                raise InputError(f"{where}:{number}: {README_CLOSE} without an opening baseline-table marker")
            out.append((open_at[0], open_at[1], offset))
            open_at = None
        offset += len(line)
    if open_at is not None:
        raise InputError(f"{where}:{open_at[2]}: the baseline-table region of '{open_at[0]}' is never closed; end "
                         f"it with {README_CLOSE}")
    return out


def region_body(table: str, caption: str) -> str:
    """What goes between a region's markers: the caption, the table, and a blank line so the closing marker is
    not read as part of the table."""
    return f"{caption}\n\n{table}\n\n"


def fill_readme(text: str, tables: Mapping[str, str], caption: str, *, where: str = "README",
                only: Sequence[str] | None = None) -> str:
    """``text`` with every marked region's body replaced by its kernel's table (``only``: just those kernels'
    regions; the rest are kept as they are). A region naming a kernel ``tables`` lacks is an InputError."""
    pieces, last = [], 0
    for kernel, start, end in readme_regions(text, where):
        if kernel not in tables:
            raise InputError(f"{where}: the baseline-table region '{kernel}' names no kernel of the baseline; its "
                             f"kernels: {', '.join(tables) or 'none'}")
        if only is not None and kernel not in only:
            continue
        pieces += [text[last:start], region_body(tables[kernel], caption)]
        last = end
    return "".join(pieces) + text[last:]


def stale_regions(text: str, tables: Mapping[str, str], caption: str, where: str = "README") -> list[str]:
    """The kernels whose marked region differs from what :func:`fill_readme` would write."""
    fresh = {k: region_body(t, caption) for k, t in tables.items()}
    return [k for k, start, end in readme_regions(text, where) if text[start:end] != fresh.get(k)]
