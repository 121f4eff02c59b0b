"""Roofline reports as data and markdown: for a `predict model` step or for measured records.

:func:`step_report` takes what ``perfmodel predict model ... --json`` prints
(one record or a list); :func:`records_report` takes measurement records.
Both return a :class:`Report` (tables of strings plus the roofline's roofs
and points); :func:`to_markdown` renders it, :func:`perfmodel.harness.plots.roofline_figure`
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
from typing import Any, Mapping, Sequence

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
class Section:
    heading: str
    headers: tuple[str, ...]
    #: Markdown alignment per column: "l" or "r".
    align: str
    rows: tuple[tuple[str, ...], ...]
    summary: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Report:
    title: str
    source: str
    sections: tuple[Section, ...]
    roofline: RooflineChart
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Problems met reading the input that did not stop it (e.g. a truncated last line skipped).
    warnings: tuple[str, ...] = ()


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


def _shares(chip: Any, dtype: str, useful_flops: float, hbm_bytes: float, time_s: float) -> tuple[str, str]:
    """MXU and HBM share of peak of work done in time_s."""
    rate = chip.matmul_rate(dtype)
    mxu = percent(useful_flops / (time_s * rate)) if rate and useful_flops and time_s > 0 else "-"
    hbm = percent(hbm_bytes / (time_s * chip.memory.hbm_bw_bytes_per_s_per_chip)) if hbm_bytes and time_s > 0 else "-"
    return mxu, hbm


def _intensity(useful_flops: float, hbm_bytes: float) -> float | None:
    return useful_flops / hbm_bytes if useful_flops > 0 and hbm_bytes > 0 else None


# --------------------------------------------------------------------------- predict model steps


_STEP_FIELDS = ("model", "chip", "step", "ops", "floor_s", "expected_s", "bound")
_OP_FIELDS = ("name", "count", "floor_s", "expected_s", "bound", "share", "hbm_bytes", "useful_flops", "mxu_dtype")


def step_report(data: Any, *, source: str) -> Report:
    """Report of `perfmodel predict model --json` output (a record or a list of them)."""
    steps = data if isinstance(data, list) else [data]
    if not steps:
        raise InputError(f"{source}: no step records")
    sections, roofs, points, left_out = [], {}, [], []
    for i, raw in enumerate(steps, start=1):
        where = f"{source}: record {i}"
        _require(raw, _STEP_FIELDS, where, "a `perfmodel predict model --json` record")
        chip = _chip(str(raw["chip"]), where)
        rows = []
        for j, op in enumerate(raw["ops"], start=1):
            _require(op, _OP_FIELDS, f"{where}, op {j}", "an op of `predict model --json`")
            floor, expected, useful, hbm, share = (
                finite(op[key], f"{where}, op {j}: field '{key}'", nonnegative=True)
                for key in ("floor_s", "expected_s", "useful_flops", "hbm_bytes", "share"))
            ai = _intensity(useful, hbm)
            mxu, hbm_share = _shares(chip, str(op["mxu_dtype"]), useful, hbm, floor)
            rows.append((str(op["name"]), str(op["count"]), seconds(floor), seconds(expected),
                         str(op["bound"]), percent(share), intensity(ai) if ai else "-", mxu, hbm_share))
            label = op["name"] if len(steps) == 1 else f"{op['name']} [{chip.name}]"
            roof = _roof(chip, str(op["mxu_dtype"]))
            if ai is None or roof is None or floor <= 0 or expected <= 0:
                left_out.append(str(op["name"]))
                continue
            roofs[(roof.chip, roof.dtype)] = roof
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / floor, kind="floor"))
            points.append(RooflinePoint(label=label, chip=chip.name, intensity_flop_per_byte=ai,
                                        flops_per_s=useful / expected, kind="expected"))
        sections.append(Section(
            heading=f"{raw['model']} on {chip.name}: {_step_text(raw['step'])}",
            headers=("op", "x", "floor", "expected", "bound", "share of step", "FLOP/B", "MXU share at floor",
                     "HBM share at floor"),
            align="lrrrlrrrr", rows=tuple(rows),
            summary=_step_summary(raw),
        ))
    models = ", ".join(dict.fromkeys(str(s["model"]) for s in steps))
    chips = ", ".join(dict.fromkeys(str(s["chip"]) for s in steps))
    notes = ["times are per step on one chip; each op's floor is its roofline bound, `expected` applies the "
             "model's achievable-efficiency factors (perfmodel.model.core.ACHIEVABLE)"]
    if left_out:
        notes.append(f"not on the roofline (no matrix FLOPs): {', '.join(dict.fromkeys(left_out))}")
    return Report(title=f"Roofline report: {models} on {chips}", source=source, sections=tuple(sections),
                  roofline=RooflineChart(roofs=tuple(roofs.values()), points=tuple(points),
                                         left_out=tuple(dict.fromkeys(left_out))),
                  notes=tuple(notes))


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


def _step_summary(raw: Mapping[str, Any]) -> tuple[str, ...]:
    out = [f"step floor {seconds(float(raw['floor_s']))}, expected {seconds(float(raw['expected_s']))}, "
           f"{raw['bound']}"]
    if "mbu_at_floor" in raw and "mfu_at_floor" in raw:
        out.append(f"MBU at floor {percent(float(raw['mbu_at_floor']))}, MFU at floor "
                   f"{percent(float(raw['mfu_at_floor']))}")
    if "tokens_per_s_per_chip" in raw:
        out.append(f"{si(float(raw['tokens_per_s_per_chip']), 'tok/s')} per chip at the floor")
    return tuple(out)


# --------------------------------------------------------------------------- measured records


def records_report(items: Sequence[Located], *, source: str) -> Report:
    """Report of measurement records: one row per record, predicted and (real TPU only) measured points."""
    if not items:
        raise InputError(f"{source}: no measurement records")
    rows, roofs, points, left_out = [], {}, [], []
    interpret = 0
    for n, item in enumerate(items, start=1):
        r = item.record
        p = r.prediction
        chip = _chip(p.chip, item.where)
        label = f"#{n}"
        if r.is_real:
            measured = seconds(r.timing.measured_s)
            eff = percent(r.efficiency) if r.efficiency is not None else "-"
            mxu, hbm = _shares(chip, p.mxu_dtype, p.useful_flops, p.ideal_hbm_bytes, r.timing.measured_s)
        else:
            interpret += 1
            measured = f"{seconds(r.timing.measured_s)} interpret wall (not TPU)"
            eff, mxu, hbm = "-", "-", "-"
        rows.append((str(n), r.kernel, r.arrays_text, r.blocks_text, p.chip, f"{r.backend}/{r.mode}", measured,
                     seconds(p.op_floor_s), seconds(r.expected_wall_s), bound_name(p.op_floor_limiter), limited_by(p),
                     eff, mxu, hbm))
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
    section = Section(
        heading="Measured kernels",
        headers=("#", "kernel", "arrays", "blocks", "chip", "backend/mode", "measured", "op floor",
                 "expected (+dispatch)", "floor bound", "limited by", "efficiency", "MXU share", "HBM share"),
        align="rllllllrrllrrr", rows=tuple(rows),
    )
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
                  notes=tuple(notes))


# --------------------------------------------------------------------------- markdown


def to_markdown(report: Report, *, plot_name: str | None) -> str:
    """The report as markdown; the roofline image is linked as plot_name (relative to the markdown file)."""
    lines = [f"# {report.title}", "", f"Source: `{report.source}`.", ""]
    if plot_name:
        lines += [f"![roofline]({plot_name})", ""]
    for s in report.sections:
        lines += [f"## {s.heading}", "", _md_table(s.headers, s.rows, s.align), ""]
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
    """JSON-ready form (tables as lists of dicts keyed by header)."""
    return {
        "title": report.title,
        "source": report.source,
        "sections": [{"heading": s.heading, "rows": [dict(zip(s.headers, r)) for r in s.rows],
                      "summary": list(s.summary)} for s in report.sections],
        "roofline": to_jsonable(report.roofline),
        "notes": list(report.notes),
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
    if input_path == "-":
        raise InputError("`input_path` -: not `perfmodel predict model --json` output; report reads that (also from "
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
