"""Text, CSV and JSON of `perfmodel predict` op sweeps and KV-cache capacity sweeps.

One point prints as a detailed report (a column per chip and variant, a row
per quantity); a sweep as a table with a row per chip x point x variant,
marking rows where the bound changes. Pure functions of the results of
:mod:`perfmodel.predict.sweep` and :mod:`perfmodel.predict.capacity`. No jax.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Callable

import numpy as np

from perfmodel import units
from perfmodel.jsonable import to_jsonable
from perfmodel.model.core import UNITS, Roofline, evaluate
from perfmodel.predict.capacity import CapacitySweep
from perfmodel.predict.sweep import OpPrediction, OpSweep
from perfmodel.units import binary, nbytes, percent, seconds, si, table

#: Marks a sweep row whose bound differs from the row before it (same chip and variant).
BOUND_CHANGE_MARK = "<- bound changes"


def _num(x: Any) -> float:
    arr = np.asarray(x, dtype=float)
    return float(arr) if arr.ndim == 0 else float(arr.sum())


def _intensity(r: Roofline) -> float | None:
    """Arithmetic intensity to print; None ("n/a") for an op that moves no HBM bytes (e.g. a 1-chip collective)."""
    x = _num(r.arithmetic_intensity)
    return x if np.isfinite(x) else None


def _header(p: OpPrediction) -> str:
    parts = [p.chip.name] + ([p.variant] if p.variant else [])
    return " / ".join(parts)


def _unit_row(label: str, preds: list[OpPrediction], unit: str) -> list[str]:
    row = [label]
    for p in preds:
        t = _num(p.roofline.unit_s[unit])
        row.append(f"{seconds(t)} ({percent(_num(p.roofline.peak_share[unit]))})" if t else "-")
    return row


#: Roofline.fixed_parts_s keys -> how the text report names them.
FIXED_PART_LABELS = {"launch": "launch", "dma_latency": "DMA latency", "op": "op fixed costs",
                     "serial_vpu": "serial dequantization", "serial_hbm": "HBM traffic run alone"}


def report_rows(preds: list[OpPrediction]) -> list[list[str]]:
    """The detailed quantity-by-chip rows of one point (one column per chip / variant)."""

    def row(label: str, fn: Callable[[OpPrediction], str]) -> list[str]:
        return [label] + [fn(p) for p in preds]

    r = lambda p: p.roofline  # noqa: E731
    c = lambda p: p.cost  # noqa: E731
    rows = [
        row("bound", lambda p: str(r(p).bound)),
        row("floor (roofline)", lambda p: seconds(_num(r(p).floor_s))),
        row("expected", lambda p: seconds(_num(r(p).expected_s))),
        row("no-overlap", lambda p: seconds(_num(r(p).no_overlap_s))),
    ]
    for part, label in FIXED_PART_LABELS.items():
        if any(_num(p.roofline.fixed_parts_s.get(part, 0)) for p in preds):
            rows.append(row(f"  in expected: {label}", lambda p, k=part: seconds(_num(r(p).fixed_parts_s.get(k, 0)))))
    if any(p.roofline.host_dispatch_s for p in preds):
        rows.append(row("expected + host dispatch", lambda p: seconds(_num(r(p).expected_with_dispatch_s))))
    rows += [_unit_row(f"  {u.upper()} time (share of peak)", preds, u) for u in UNITS
             if any(_num(p.roofline.unit_s[u]) for p in preds)]
    has = lambda field: any(_num(getattr(p.cost, field)) for p in preds)  # noqa: E731
    if has("mxu_flops"):
        rows += [
            row("MXU FLOPs issued", lambda p: f"{si(_num(c(p).mxu_flops), 'FLOP')} ({c(p).mxu_dtype})"),
            row("useful FLOPs", lambda p: si(_num(c(p).useful_flops), "FLOP")),
            row("MXU padding waste", lambda p: percent(_num(c(p).padding_waste))),
        ]
    if has("vpu_ops"):
        rows += [row("VPU ops", lambda p: si(_num(c(p).vpu_ops), "op")),
                 row("VPU padding waste", lambda p: percent(_num(c(p).vpu_padding_waste)))]
    if has("eup_ops"):
        rows.append(row("EUP ops", lambda p: si(_num(c(p).eup_ops), "op")))
    rows += [
        row("HBM read", lambda p: nbytes(_num(c(p).hbm_read_bytes))),
        row("HBM write", lambda p: nbytes(_num(c(p).hbm_write_bytes))),
    ]
    if has("ici_bytes"):
        rows.append(row("ICI bytes sent per chip", lambda p: nbytes(_num(c(p).ici_bytes))))
    if has("vmem_bytes"):
        rows.append(row("VMEM working set", lambda p: units.binary(_num(c(p).vmem_bytes))))
    if has("useful_flops"):
        rows += [
            row("arithmetic intensity", lambda p: units.intensity(_intensity(r(p)))),
            row("ridge point", lambda p: units.intensity(r(p).ridge_point)),
            row("attainable FLOP/s", lambda p: si(_num(r(p).attainable_flops_per_s), "FLOP/s")),
            row("MFU at floor", lambda p: percent(_num(r(p).mfu_at_floor))),
        ]
    rows += [
        row("attainable HBM BW", lambda p: si(_num(r(p).attainable_hbm_bytes_per_s), "B/s")),
        row("MBU at floor", lambda p: percent(_num(r(p).mbu_at_floor))),
    ]
    for part_idx in range(max(len(p.cost.parts) for p in preds)):
        def part_cell(p: OpPrediction, i: int = part_idx) -> str:
            if i >= len(p.cost.parts):
                return "-"
            pr = evaluate(p.cost.parts[i], p.chip)
            return f"{seconds(_num(pr.floor_s))} {pr.bound}"
        name = next((p.cost.parts[part_idx].name for p in preds if part_idx < len(p.cost.parts)), f"part {part_idx}")
        rows.append(row(f"part: {name}", part_cell))
    keys = list(dict.fromkeys(k for p in preds for k in p.cost.metrics))
    for k in keys:
        rows.append(row(k.replace("_", " "), lambda p, k=k: _metric(k, p.cost.metrics.get(k))))
    return rows


def _metric(key: str, value: Any) -> str:
    if value is None:
        return "-"
    v = _num(value)
    if key.endswith(("share", "waste")):
        return percent(v)
    if key.endswith("bytes") or "_bytes_" in key:
        return nbytes(v)
    if key.endswith("_s"):
        return seconds(v)
    if key.endswith("_factor"):
        return f"{v:.2f}x"
    return f"{int(v):,}" if np.isfinite(v) and v == int(v) and abs(v) < 1e15 else si(v, "")


def format_report(op: str, params: dict[str, Any], preds: list[OpPrediction]) -> str:
    shown = "  ".join(f"{k.replace('_', '-')}={_fmt_param(v)}" for k, v in params.items() if v is not None and v != "")
    lines = [f"{op}  {shown}".rstrip(), ""]
    lines.append(table([""] + [_header(p) for p in preds], report_rows(preds)))
    for p in preds:
        notes = p.cost.notes + tuple(n for part in p.cost.parts for n in part.notes if n not in p.cost.notes)
        for n in dict.fromkeys(notes):
            lines.append(f"note [{_header(p)}]: {n}")
    return "\n".join(lines)


def _fmt_param(v: Any) -> str:
    """A parameter as a table or CSV cell: lists comma-joined, an unset one (None) empty, never "None"."""
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, np.ndarray):
        return ",".join(str(x) for x in v.tolist()) if v.size <= 8 else f"[{v.size} values]"
    return str(v)


def sweep_rows(preds: list[OpPrediction], keys: list[str]) -> tuple[list[str], list[list[str]]]:
    """Table of one row per chip x point x variant, marking rows where the bound changes."""
    multi_chip = len({p.chip.name for p in preds}) > 1
    variants = any(p.variant for p in preds)
    headers = (["chip"] if multi_chip else []) + (["variant"] if variants else []) + [k.replace("_", "-") for k in keys]
    headers += ["floor", "expected", "bound", "intensity", "MFU@floor", "MBU@floor", "HBM bytes"]
    rows = []
    last: dict[tuple[str, str], str] = {}
    for p in preds:
        r = p.roofline
        bound = str(r.bound)
        series = (p.chip.name, p.variant)
        mark = BOUND_CHANGE_MARK if series in last and last[series] != bound else ""
        last[series] = bound
        row = ([p.chip.name] if multi_chip else []) + ([p.variant] if variants else [])
        row += [_fmt_param(p.point.get(k)) for k in keys]
        row += [seconds(_num(r.floor_s)), seconds(_num(r.expected_s)), bound,
                units.intensity(_intensity(r)), percent(_num(r.mfu_at_floor)),
                percent(_num(r.mbu_at_floor)), nbytes(_num(p.cost.hbm_bytes)), mark]
        rows.append(row)
    if any(r[-1] for r in rows):
        headers.append("")
    else:
        rows = [r[:-1] for r in rows]
    return headers, rows


def prediction_record(p: OpPrediction, params: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready record of one prediction."""
    r = p.roofline
    roof = {f: getattr(r, f) for f in ("unit_s", "floor_s", "no_overlap_s", "expected_s", "arithmetic_intensity",
                                       "ridge_point", "attainable_flops_per_s", "attainable_hbm_bytes_per_s",
                                       "peak_share", "fixed_parts_s", "achievable_share", "host_dispatch_s")}
    roof["expected_with_dispatch_s"] = r.expected_with_dispatch_s
    roof.update(bound=r.bound, limiter=r.limiter, mfu_at_floor=r.mfu_at_floor, mbu_at_floor=r.mbu_at_floor)
    cost = to_jsonable(p.cost)
    cost.update(padding_waste=to_jsonable(p.cost.padding_waste), vpu_padding_waste=to_jsonable(
        p.cost.vpu_padding_waste), hbm_bytes=to_jsonable(p.cost.hbm_bytes))
    return {"op": p.op, "chip": p.chip.name, "variant": p.variant or None,
            "params": to_jsonable({**params, **p.point}), "cost": cost, "roofline": to_jsonable(roof)}


CSV_FIELDS = ("floor_s", "expected_s", "no_overlap_s", "bound", "mxu_s", "vpu_s", "eup_s", "hbm_s", "ici_s",
              "mxu_flops", "useful_flops", "mxu_dtype", "padding_waste", "vpu_ops", "vpu_padding_waste", "eup_ops",
              "hbm_read_bytes", "hbm_write_bytes", "ici_bytes", "arithmetic_intensity", "ridge_point",
              "mfu_at_floor", "mbu_at_floor")


def csv_text(preds: list[OpPrediction], params: dict[str, Any]) -> str:
    buf = io.StringIO()
    keys = list(dict.fromkeys(list(params) + [k for p in preds for k in p.point]))
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["op", "chip", "variant", *keys, *CSV_FIELDS])
    for p in preds:
        r, c = p.roofline, p.cost
        values = {**{f"{u}_s": _num(r.unit_s[u]) for u in UNITS}, "floor_s": _num(r.floor_s),
                  "expected_s": _num(r.expected_s), "no_overlap_s": _num(r.no_overlap_s), "bound": r.bound,
                  "mxu_flops": _num(c.mxu_flops), "useful_flops": _num(c.useful_flops), "mxu_dtype": c.mxu_dtype,
                  "padding_waste": _num(c.padding_waste), "vpu_ops": _num(c.vpu_ops),
                  "vpu_padding_waste": _num(c.vpu_padding_waste), "eup_ops": _num(c.eup_ops),
                  "hbm_read_bytes": _num(c.hbm_read_bytes), "hbm_write_bytes": _num(c.hbm_write_bytes),
                  "ici_bytes": _num(c.ici_bytes), "arithmetic_intensity": _num(r.arithmetic_intensity),
                  "ridge_point": r.ridge_point, "mfu_at_floor": _num(r.mfu_at_floor),
                  "mbu_at_floor": _num(r.mbu_at_floor)}
        merged = {**params, **p.point}
        w.writerow([p.op, p.chip.name, p.variant, *(_fmt_param(merged.get(k)) for k in keys),
                    *(values[f] for f in CSV_FIELDS)])
    return buf.getvalue()


def op_text(sweep: OpSweep) -> str:
    """The detailed report of one point, or the sweep table."""
    preds = list(sweep.predictions)
    if not sweep.swept:
        return format_report(sweep.op, sweep.params, preds)
    fixed = {k: v for k, v in sweep.params.items() if k not in sweep.swept}
    shown = "  ".join(f"{k.replace('_', '-')}={_fmt_param(v)}" for k, v in fixed.items() if v is not None and v != "")
    headers, rows = sweep_rows(preds, list(sweep.swept))
    return "\n".join([f"{sweep.op} on {', '.join(sweep.chips)}  {shown}".rstrip(), "", table(headers, rows)])


def op_csv(sweep: OpSweep) -> str:
    return csv_text(list(sweep.predictions), sweep.params)


def op_records(sweep: OpSweep) -> list[dict[str, Any]]:
    """JSON-ready records, one per prediction."""
    return [prediction_record(p, sweep.params) for p in sweep.predictions]


# ----------------------------------------------------------------------------- KV-cache capacity


CAPACITY_FIELDS = ("hbm_bytes", "usable_bytes", "free_bytes", "kv_bytes_per_token", "pages", "tokens", "sequences",
                   "weights_fit")


def capacity_records(sweep: CapacitySweep) -> list[dict[str, Any]]:
    """JSON-ready records, one per chip x point: {"chip", "params", "capacity"}."""
    return [to_jsonable(r) for r in sweep.rows]


def capacity_csv(sweep: CapacitySweep) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = list(sweep.params)
    w.writerow(["chip", *keys, *CAPACITY_FIELDS])
    for r in capacity_records(sweep):
        w.writerow([r["chip"], *(r["params"].get(k) for k in keys), *(r["capacity"][f] for f in CAPACITY_FIELDS)])
    return buf.getvalue()


def capacity_text(sweep: CapacitySweep) -> str:
    swept = list(sweep.swept)
    headers = ["chip", *[k.replace("_", "-") for k in swept], "HBM", "usable", "weights/chip", "free for KV",
               "KV/token/chip", "tokens", "sequences", "fits"]
    rows = []
    for r in capacity_records(sweep):
        c, p = r["capacity"], r["params"]
        free = c["free_bytes"]
        fits = "yes" if c["weights_fit"] else f"no: weights exceed usable HBM by {binary(-free)}"
        rows.append([r["chip"], *(str(p[k]) for k in swept), binary(c["hbm_bytes"]), binary(c["usable_bytes"]),
                     binary(c["weight_bytes"] / p["num_chips"]), binary(max(free, 0)),
                     nbytes(c["kv_bytes_per_token"] / p["num_chips"]), si(c["tokens"], "tok"),
                     "-" if c["sequences"] is None else f"{c['sequences']:g}", fits])
    return table(headers, rows)
