"""Roofline reports as data and markdown: for a `predict model` step or for measured records.

:func:`step_report` takes what ``perfmodel predict model ... --json`` prints
(one record or a list); :func:`records_report` takes measurement records.
Both return a :class:`Report` (tables of values with their display text, plus
the roofline's roofs and points); :func:`to_markdown` renders it, :func:`perfmodel.harness.plots.roofline_figure`
draws its roofline. Pure functions of their inputs; no jax, no matplotlib.
:func:`build_report` tells the kinds of input apart (what `perfmodel report`
reads) and :func:`write_report` writes the markdown and the PNG.

Roofline axes: arithmetic intensity (useful matrix FLOPs per HBM byte) and
useful FLOP/s. A roof per (chip, MXU dtype): min(peak FLOP/s, intensity x
HBM bandwidth). Predicted points sit at the op floor (on or under the roof)
and at the expected time; measured points (real TPU only) at the measured
time. Ops without matrix FLOPs (norms, elementwise, sampling) have no place
on a FLOP/s roofline: they are listed in the tables and named in a note.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from perfmodel.errors import InputError, naming
from perfmodel.inputcheck import finite, read_text
from perfmodel.harness.records import Located, bound_name, limited_by
from perfmodel.jsonable import to_jsonable
from perfmodel.units import intensity, percent, seconds, si


@dataclass(frozen=True, kw_only=True)
class Roof:
    chip: str
    dtype: str
    peak_flops_per_s: float
    hbm_bytes_per_s: float

    JSON_DERIVED = ("ridge_flop_per_byte",)

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.peak_flops_per_s / self.hbm_bytes_per_s


@dataclass(frozen=True, kw_only=True)
class RooflinePoint:
    label: str
    chip: str
    intensity_flop_per_byte: float
    flops_per_s: float
    #: "floor" and "expected" (predictions) or "measured" (a real TPU).
    kind: str


@dataclass(frozen=True, kw_only=True)
class RooflineChart:
    """The roofs and points of a report's roofline figure."""

    roofs: tuple[Roof, ...]
    points: tuple[RooflinePoint, ...]
    #: Labels of rows that have no point (no matrix FLOPs or no HBM bytes).
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Column:
    """A table column: its header, its key in ``--json`` output (units in the name) and its alignment."""

    header: str
    key: str
    #: Markdown alignment: "l" or "r".
    align: str


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One table value: a number in SI base units (seconds, bytes, FLOP/s, fractions), a string or None (no
    value), and its display text, made from the value by :func:`_cell`."""

    value: Any
    text: str


@dataclass(frozen=True, kw_only=True)
class Section:
    """A table as text (what `compare` renders); a report's :class:`Table` gives one by :meth:`Table.text`."""

    heading: str
    headers: tuple[str, ...]
    #: Markdown alignment per column: "l" or "r".
    align: str
    rows: tuple[tuple[str, ...], ...]
    summary: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Table:
    """A report's table: values (for ``--json``) with their display text."""

    heading: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    #: Step totals: numbers in SI base units by key (``--json``); ``summary`` says them in words.
    totals: tuple[tuple[str, Any], ...] = ()
    summary: tuple[str, ...] = ()

    @property
    def headers(self) -> tuple[str, ...]:
        return tuple(c.header for c in self.columns)

    @property
    def align(self) -> str:
        return "".join(c.align for c in self.columns)

    @property
    def text_rows(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(c.text for c in row) for row in self.rows)

    def text(self) -> Section:
        return Section(heading=self.heading, headers=self.headers, align=self.align, rows=self.text_rows,
                       summary=self.summary)


@dataclass(frozen=True, kw_only=True)
class Report:
    title: str
    source: str
    sections: tuple[Table, ...]
    roofline: RooflineChart
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Problems met reading the input that did not stop it (e.g. a truncated last line skipped).
    warnings: tuple[str, ...] = ()
    #: What produced the report: one mapping per step record (model, chip, step parameters) or measurement record
    #: (where it came from, kernel, arrays, blocks, chip, backend, mode), values as in the input.
    inputs: tuple[Mapping[str, Any], ...] = ()
    #: The measurement records (records reports only): the HTML report plots them measured vs predicted.
    records: tuple[Located, ...] = ()


# --------------------------------------------------------------------------- shared helpers


def _chip(name: str, where: str) -> Any:
    from perfmodel.hw.registry import get_chip

    try:
        return get_chip(name)
    except InputError:
        raise
    except Exception as exc:  # UnknownChipError / SpecError: keep their one line, say where
        raise InputError(f"{where}: chip '{name}': {exc}") from None


def _roof(chip: Any, dtype: str) -> Roof | None:
    rate = chip.matmul_rate(dtype)
    if rate is None:
        return None
    return Roof(chip=chip.name, dtype=dtype, peak_flops_per_s=rate,
                hbm_bytes_per_s=chip.memory.hbm_bw_bytes_per_s_per_chip)


def _shares(chip: Any, dtype: str, useful_flops: float, hbm_bytes: float,
            time_s: float) -> tuple[float | None, float | None]:
    """MXU and HBM share of peak (fractions) of work done in time_s; None where there is no such work."""
    rate = chip.matmul_rate(dtype)
    mxu = useful_flops / (time_s * rate) if rate and useful_flops and time_s > 0 else None
    hbm = hbm_bytes / (time_s * chip.memory.hbm_bw_bytes_per_s_per_chip) if hbm_bytes and time_s > 0 else None
    return mxu, hbm


def _cell(value: Any, fmt: Callable[[Any], str] = str) -> Cell:
    """A table cell: the value and its text (fmt of the value; "-" for None)."""
    return Cell(value=value, text="-" if value is None else fmt(value))


def _intensity(useful_flops: float, hbm_bytes: float) -> float | None:
    return useful_flops / hbm_bytes if useful_flops > 0 and hbm_bytes > 0 else None


# --------------------------------------------------------------------------- predict model steps


_STEP_FIELDS = ("model", "chip", "step", "ops", "floor_s", "expected_s", "bound")
_OP_FIELDS = ("name", "count", "floor_s", "expected_s", "bound", "share", "hbm_bytes", "useful_flops", "mxu_dtype")


_STEP_COLUMNS = (
    Column(header="op", key="op", align="l"),
    Column(header="x", key="count", align="r"),
    Column(header="floor", key="floor_s", align="r"),
    Column(header="expected", key="expected_s", align="r"),
    Column(header="bound", key="bound", align="l"),
    Column(header="share of step", key="share_of_step", align="r"),
    Column(header="FLOP/B", key="intensity_flop_per_byte", align="r"),
    Column(header="MXU share at floor", key="mxu_share_at_floor", align="r"),
    Column(header="HBM share at floor", key="hbm_share_at_floor", align="r"),
)


def step_report(data: Any, *, source: str) -> Report:
    """Report of `perfmodel predict model --json` output (a record or a list of them)."""
    steps = data if isinstance(data, list) else [data]
    if not steps:
        raise InputError(f"{source}: no step records")
    sections, roofs, points, left_out, inputs = [], {}, [], [], []
    for i, raw in enumerate(steps, start=1):
        where = f"{source}: record {i}"
        _require(raw, _STEP_FIELDS, where, "a `perfmodel predict model --json` record")
    tags = _step_tags(steps)
    for i, raw in enumerate(steps, start=1):
        where = f"{source}: record {i}"
        chip = _chip(str(raw["chip"]), where)
        inputs.append({"model": raw["model"], "chip": chip.name,
                       **(raw["step"] if isinstance(raw["step"], dict) else {"step": raw["step"]})})
        rows = []
        for j, op in enumerate(raw["ops"], start=1):
            _require(op, _OP_FIELDS, f"{where}, op {j}", "an op of `predict model --json`")
            floor, expected, useful, hbm, share = (
                finite(op[key], f"{where}, op {j}: field '{key}'", nonnegative=True)
                for key in ("floor_s", "expected_s", "useful_flops", "hbm_bytes", "share"))
            ai = _intensity(useful, hbm)
            mxu, hbm_share = _shares(chip, str(op["mxu_dtype"]), useful, hbm, floor)
            rows.append((_cell(str(op["name"])), _cell(op["count"]), _cell(floor, seconds), _cell(expected, seconds),
                         _cell(str(op["bound"])), _cell(share, percent), _cell(ai, intensity),
                         _cell(mxu, percent), _cell(hbm_share, percent)))
            label = op["name"] if tags[i - 1] is None else f"{op['name']} [{tags[i - 1]}]"
            roof = _roof(chip, str(op["mxu_dtype"]))
            if ai is None or roof is None or floor <= 0 or expected <= 0:
                left_out.append(str(op["name"]))
                continue
            roofs[(roof.chip, roof.dtype)] = roof
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / floor, kind="floor"))
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / expected, kind="expected"))
        totals, summary = _step_summary(raw, where)
        sections.append(Table(heading=f"{raw['model']} on {chip.name}: {_step_text(raw['step'])}",
                              columns=_STEP_COLUMNS, rows=tuple(rows), totals=totals, summary=summary))
    models = ", ".join(dict.fromkeys(str(s["model"]) for s in steps))
    chips = ", ".join(dict.fromkeys(str(s["chip"]) for s in steps))
    notes = ["times are per step on one chip; each op's floor is its roofline bound, `expected` applies the "
             "model's achievable-efficiency factors (perfmodel.model.core.ACHIEVABLE)"]
    if left_out:
        notes.append(f"not on the roofline (no matrix FLOPs): {', '.join(dict.fromkeys(left_out))}")
    return Report(title=f"Roofline report: {models} on {chips}", source=source, sections=tuple(sections),
                  roofline=RooflineChart(roofs=tuple(roofs.values()), points=tuple(points),
                                         left_out=tuple(dict.fromkeys(left_out))),
                  notes=tuple(notes), inputs=tuple(inputs))


def _step_tags(steps: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """What tells each step's points apart on the roofline: None for one step; else the chip (when the chips
    differ) and the sweep point (`predict model --sweep`), or the record number when those are all alike."""
    if len(steps) == 1:
        return [None]
    chips_differ = len({str(s["chip"]) for s in steps}) > 1
    tags = []
    for raw in steps:
        parts = [str(raw["chip"])] if chips_differ else []
        point = raw.get("point")
        if isinstance(point, dict):
            parts += [f"{k} {v}" for k, v in point.items() if k not in ("hw", "chip")]
        tags.append(", ".join(parts))
    if len(set(tags)) < len(tags) or not all(tags):
        tags = [f"#{i}" for i in range(1, len(steps) + 1)]
    return tags


def _require(obj: Any, fields: Sequence[str], where: str, what: str) -> None:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected {what} (a JSON object)")
    missing = [f for f in fields if f not in obj]
    if missing:
        raise InputError(f"{where}: field '{missing[0]}' missing; expected {what}")


def _step_text(step: Mapping[str, Any]) -> str:
    if not isinstance(step, dict):
        return str(step)
    parts = [str(step.get("phase", "?"))]
    if step.get("batch") is not None:
        parts.append(f"batch {step['batch']}")
    if step.get("phase") == "prefill":
        parts.append(f"{step.get('chunk_tokens')} new tokens after {step.get('context_tokens')}")
    else:
        parts.append(f"context {step.get('context_tokens')}")
    parts.append(f"weights {step.get('weight_dtype')}, KV {step.get('kv_dtype')}, TP {step.get('tp')}")
    return ", ".join(parts)


def _step_summary(raw: Mapping[str, Any], where: str) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """A step's totals (numbers by key, SI base units) and the same in words."""
    def number(key: str) -> float:
        return finite(raw[key], f"{where}: field '{key}'", nonnegative=True)

    totals: dict[str, Any] = {"floor_s": number("floor_s"), "expected_s": number("expected_s"),
                              "bound": str(raw["bound"])}
    out = [f"step floor {seconds(totals['floor_s'])}, expected {seconds(totals['expected_s'])}, {totals['bound']}"]
    if "mbu_at_floor" in raw and "mfu_at_floor" in raw:
        totals.update(mbu_at_floor=number("mbu_at_floor"), mfu_at_floor=number("mfu_at_floor"))
        out.append(f"MBU at floor {percent(totals['mbu_at_floor'])}, MFU at floor {percent(totals['mfu_at_floor'])}")
    if "tokens_per_s_per_chip" in raw:
        totals["tokens_per_s_per_chip"] = number("tokens_per_s_per_chip")
        out.append(f"{si(totals['tokens_per_s_per_chip'], 'tok/s')} per chip at the expected step time")
    return tuple(totals.items()), tuple(out)


# --------------------------------------------------------------------------- measured records


_RECORD_COLUMNS = (
    Column(header="#", key="record", align="r"),
    Column(header="kernel", key="kernel", align="l"),
    Column(header="arrays", key="arrays", align="l"),
    Column(header="blocks", key="blocks", align="l"),
    Column(header="chip", key="chip", align="l"),
    Column(header="backend/mode", key="backend_mode", align="l"),
    Column(header="measured", key="measured_s", align="l"),
    Column(header="op floor", key="op_floor_s", align="r"),
    Column(header="expected (+dispatch)", key="expected_wall_s", align="r"),
    Column(header="floor bound", key="floor_bound", align="l"),
    Column(header="limited by", key="limited_by", align="l"),
    Column(header="efficiency", key="efficiency", align="r"),
    Column(header="MXU share", key="mxu_share", align="r"),
    Column(header="HBM share", key="hbm_share", align="r"),
)


def records_report(items: Sequence[Located], *, source: str) -> Report:
    """Report of measurement records: one row per record, predicted and (real TPU only) measured points."""
    if not items:
        raise InputError(f"{source}: no measurement records")
    rows, roofs, points, left_out, inputs = [], {}, [], [], []
    interpret = 0
    for n, item in enumerate(items, start=1):
        r = item.record
        p = r.prediction
        chip = _chip(p.chip, item.where)
        label = f"#{n}"
        inputs.append({"record": n, "where": item.where, "kernel": r.kernel, "arrays": r.arrays_text,
                       "blocks": r.blocks_text, "chip": p.chip, "backend": r.backend, "mode": r.mode})
        if r.is_real:
            measured = _cell(r.timing.measured_s, seconds)
            eff = r.efficiency
            mxu, hbm = _shares(chip, p.mxu_dtype, p.useful_flops, p.ideal_hbm_bytes, r.timing.measured_s)
        else:
            interpret += 1
            measured = _cell(r.timing.measured_s, lambda t: f"{seconds(t)} interpret wall (not TPU)")
            eff, mxu, hbm = None, None, None
        rows.append((_cell(n), _cell(r.kernel), _cell(r.arrays_text), _cell(r.blocks_text), _cell(p.chip),
                     _cell(f"{r.backend}/{r.mode}"), measured, _cell(p.op_floor_s, seconds),
                     _cell(r.expected_wall_s, seconds), _cell(bound_name(p.op_floor_limiter)), _cell(limited_by(p)),
                     _cell(eff, percent), _cell(mxu, percent), _cell(hbm, percent)))
        ai = _intensity(p.useful_flops, p.ideal_hbm_bytes)
        roof = _roof(chip, p.mxu_dtype) or _roof(chip, "bf16")
        if roof is not None:
            roofs[(roof.chip, roof.dtype)] = roof
        if ai is None or roof is None:
            left_out.append(label)
            continue
        points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                    flops_per_s=p.useful_flops / p.op_floor_s, kind="floor"))
        points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                    flops_per_s=p.useful_flops / p.expected_s, kind="expected"))
        if r.is_real:
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=p.useful_flops / r.timing.measured_s, kind="measured"))
    section = Table(heading="Measured kernels", columns=_RECORD_COLUMNS, rows=tuple(rows))
    notes = ["efficiency = op floor / measured time (wall per call, dispatch included); MXU and HBM shares are "
             "useful FLOPs and each-byte-once HBM bytes over the measured time, against the chip's peaks; "
             "`expected (+dispatch)` adds the record's dispatch estimate where the timing includes dispatch; "
             "`limited by` is what sets the expected time (a unit, or the per-grid-step overhead)"]
    if interpret:
        notes.append(f"{interpret} interpret-mode record(s): their times are host wall times of Pallas TPU "
                     "interpret mode, not TPU performance; they have no efficiency and only their predictions are "
                     "plotted")
    if left_out:
        notes.append(f"not on the roofline (no matrix FLOPs): {', '.join(left_out)}")
    return Report(title="Roofline report: measured kernels", source=source, sections=(section,),
                  roofline=RooflineChart(roofs=tuple(roofs.values()), points=tuple(points), left_out=tuple(left_out)),
                  notes=tuple(notes), inputs=tuple(inputs), records=tuple(items))


# --------------------------------------------------------------------------- markdown


def to_markdown(report: Report, *, plot_name: str | None) -> str:
    """The report as markdown; the roofline image is linked as plot_name (relative to the markdown file)."""
    lines = [f"# {report.title}", "", f"Source: `{report.source}`.", ""]
    if plot_name:
        lines += [f"![roofline]({plot_name})", ""]
    for s in report.sections:
        lines += [f"## {s.heading}", "", _md_table(s.headers, s.text_rows, s.align), ""]
        lines += [f"- {line}" for line in s.summary]
        if s.summary:
            lines.append("")
    if report.notes:
        lines += ["Notes:", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    def cells(row: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([cells(headers), rule, *(cells(r) for r in rows)])


def as_dict(report: Report) -> dict[str, Any]:
    """JSON-ready form: numbers in SI base units (seconds, bytes, FLOP/s; shares as fractions), None where a table
    shows "-"; table rows as dicts keyed by each column's key (``floor_s``, ``efficiency``, ...)."""
    return {
        "title": report.title,
        "source": report.source,
        "inputs": [dict(i) for i in report.inputs],
        "sections": [{"heading": s.heading,
                      "rows": [{c.key: cell.value for c, cell in zip(s.columns, row)} for row in s.rows],
                      "totals": dict(s.totals)} for s in report.sections],
        "roofline": to_jsonable(report.roofline),
        "notes": list(report.notes),
        "warnings": list(report.warnings),
    }


# --------------------------------------------------------------------------- input and files


def build_report(input_path: str, *, stdin_text: str | None = None) -> Report:
    """The report of INPUT: `perfmodel predict model --json` output (a file, or ``"-"`` with ``stdin_text``), a
    results file of `perfmodel measure` (.jsonl) or a published-measurement YAML; the kind is told apart by the
    name and the content."""
    from perfmodel.harness.sources import load_results

    if input_path.endswith((".yaml", ".yml")):
        loaded = load_results([input_path])
        return dataclasses.replace(records_report(loaded.items, source=input_path), warnings=loaded.warnings)
    if input_path == "-":
        text = stdin_text or ""
    else:
        with naming("input_path"):
            text = read_text(input_path, "`input_path`")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if _is_step(data):
        return step_report(data, source="stdin" if input_path == "-" else input_path)
    from perfmodel.serve.report import is_serve, serve_report

    if is_serve(data):
        return serve_report(data, source="stdin" if input_path == "-" else input_path)
    if input_path == "-":
        raise InputError("`input_path` -: not `perfmodel predict model --json` or `perfmodel serve --json` output; "
                         "report reads those (also from "
                         "stdin), or a measure results file or the published results YAML given by path",
                         fields=("input_path",))
    loaded = load_results([input_path])
    return dataclasses.replace(records_report(loaded.items, source=input_path), warnings=loaded.warnings)


def _is_step(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(d, dict) and "ops" in d for d in items)


@dataclass(frozen=True, kw_only=True)
class WrittenReport:
    report: Report
    markdown: str
    plot: str

    @property
    def table_rows(self) -> int:
        return sum(len(s.rows) for s in self.report.sections)


def write_report(report: Report, out: str | os.PathLike, plot: str | os.PathLike | None = None) -> WrittenReport:
    """Write the markdown to ``out`` and the roofline PNG to ``plot`` (default: ``out`` with .png), the markdown
    linking the image by its relative path."""
    from perfmodel.harness.plots import roofline_figure, save

    md_path = Path(out)
    png_path = Path(plot) if plot is not None else md_path.with_suffix(".png")
    for path, name in ((md_path, "out"), (png_path, "plot")):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"`{name}` '{path}': cannot create its directory ({exc.strerror})",
                             fields=(name,)) from None
    save(roofline_figure(report.roofline, report.title), png_path, field="plot")
    link = os.path.relpath(png_path.resolve(), md_path.resolve().parent)
    try:
        md_path.write_text(to_markdown(report, plot_name=link))
    except OSError as exc:
        raise InputError(f"`out` '{md_path}': cannot write ({exc.strerror})", fields=("out",)) from None
    return WrittenReport(report=report, markdown=str(md_path), plot=str(png_path))
