"""Machinery shared by every ``perfmodel predict`` command.

A command builds an op cost from its options; this module does the rest:

* ``--hw`` (repeatable or a comma list): several chips side by side;
* ``--sweep name=v1,v2,...`` (repeatable): the cross product of values, each
  converted by the option's own click type, one row per point, rows where
  the bound changes marked;
* output: a human report (one point) or table (several), ``--json``, ``--csv``.

Use it from a command::

    @click.command()
    @click.option("-m", "--m", type=int, required=True)
    @predict_options
    @user_errors
    def gemm(m, hw, sweep, as_json, as_csv):
        run_prediction("gemm", lambda chip, m: model.gemm(m=m, ..., chip=chip),
                       dict(m=m), hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)

``build`` may return one OpCost or a dict {variant label: OpCost} (e.g.
fused / unfused), shown as extra columns / rows. No jax here.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import click
import numpy as np

from perfmodel.cli.common import echo_json, to_jsonable
from perfmodel.errors import InputError
from perfmodel.model.core import UNITS, OpCost, Roofline, evaluate
from perfmodel import units
from perfmodel.units import nbytes, percent, seconds, si, table

DEFAULT_CHIP = "tpu-v5e"
BOUND_CHANGE_MARK = "<- bound changes"

Build = Callable[..., "OpCost | Mapping[str, OpCost]"]


# ----------------------------------------------------------------------------- options


def predict_options(fn: Callable) -> Callable:
    """--hw, --sweep, --json, --csv (in that order in --help)."""
    fn = click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one row per chip x point x variant).")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(fn)
    fn = click.option(
        "--sweep", "sweep", multiple=True, metavar="NAME=V1,V2,...",
        help="Sweep an option over values (repeatable: cross product); one row per point.")(fn)
    fn = click.option(
        "--hw", "hw", multiple=True, metavar="CHIP",
        help=f"Chip name or spec file; repeat or comma-separate to compare chips (default {DEFAULT_CHIP}).")(fn)
    return fn


def resolve_chips(hw: Iterable[str]) -> list:
    """ChipSpecs for --hw values (comma lists allowed), in order, without duplicates."""
    from perfmodel.hw import get_chip

    names = [n.strip() for value in (hw or (DEFAULT_CHIP,)) for n in str(value).split(",") if n.strip()]
    chips, seen = [], set()
    for name in names or [DEFAULT_CHIP]:
        chip = get_chip(name)
        if chip.name not in seen:
            seen.add(chip.name)
            chips.append(chip)
    return chips


def _option_for(ctx: click.Context | None, name: str) -> click.Parameter | None:
    if ctx is None:
        return None
    for p in ctx.command.params:
        if p.name == name:
            return p
    return None


def sweep_points(sweep: Iterable[str], allowed: Iterable[str]) -> list[dict[str, Any]]:
    """Cross product of ``--sweep name=v1,v2`` values, converted with the option's click type.

    ``allowed``: option names that may be swept. Returns [{}] without sweeps.
    """
    allowed = list(allowed)
    ctx = click.get_current_context(silent=True)
    axes: list[tuple[str, list[Any]]] = []
    for item in sweep:
        name, sep, values = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        if not sep or not key or not values.strip():
            raise InputError(f"--sweep '{item}': write NAME=V1,V2,... (e.g. --sweep m=1,8,64)")
        if key not in allowed:
            shown = ", ".join(a.replace("_", "-") for a in allowed)
            raise InputError(f"--sweep: '{name}' cannot be swept here; sweepable: {shown}")
        if any(key == k for k, _ in axes):
            raise InputError(f"--sweep: '{name}' given twice; list all its values in one --sweep")
        param = _option_for(ctx, key)
        if param is not None and ctx.get_parameter_source(key) == click.core.ParameterSource.COMMANDLINE:
            flag = max(param.opts, key=len)
            raise InputError(f"--sweep {name}: {flag} is also given and would be ignored; drop {flag} or the sweep")
        raw = [v.strip() for v in values.split(",") if v.strip()]
        converted = []
        for v in raw:
            if param is not None and not getattr(param, "multiple", False):
                try:
                    v = param.type.convert(v, param, ctx)
                except click.BadParameter as exc:
                    raise InputError(f"--sweep {name}: {exc.message}") from None
            converted.append(v)
        axes.append((key, converted))
    if not axes:
        return [{}]
    return [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """One evaluated row: a chip, a sweep point, a variant."""

    op: str
    chip: Any
    point: dict[str, Any]
    variant: str
    roofline: Roofline

    @property
    def cost(self) -> OpCost:
        return self.roofline.cost


def evaluate_all(op: str, build: Build, params: dict[str, Any], chips: list, points: list[dict[str, Any]]
                 ) -> list[Prediction]:
    """Call build(chip=..., **params, **point) for every chip and point; evaluate every variant."""
    out = []
    for chip in chips:
        for point in points:
            result = build(chip=chip, **{**params, **point})
            variants = result.items() if isinstance(result, Mapping) else [("", result)]
            for label, cost in variants:
                out.append(Prediction(op=op, chip=chip, point=point, variant=label, roofline=evaluate(cost, chip)))
    return out


def _num(x: Any) -> float:
    arr = np.asarray(x, dtype=float)
    return float(arr) if arr.ndim == 0 else float(arr.sum())


# ----------------------------------------------------------------------------- rendering


def _intensity(r: Roofline) -> float | None:
    """Arithmetic intensity to print; None ("n/a") for an op that moves no HBM bytes (e.g. a 1-chip collective)."""
    x = _num(r.arithmetic_intensity)
    return x if np.isfinite(x) else None


def _header(p: Prediction) -> str:
    parts = [p.chip.name] + ([p.variant] if p.variant else [])
    return " / ".join(parts)


def _unit_row(label: str, preds: list[Prediction], unit: str) -> list[str]:
    row = [label]
    for p in preds:
        t = _num(p.roofline.unit_s[unit])
        row.append(f"{seconds(t)} ({percent(_num(p.roofline.peak_share[unit]))})" if t else "-")
    return row


def report_rows(preds: list[Prediction]) -> list[list[str]]:
    """The detailed quantity-by-chip rows of one point (one column per chip / variant)."""

    def row(label: str, fn: Callable[[Prediction], str]) -> list[str]:
        return [label] + [fn(p) for p in preds]

    r = lambda p: p.roofline  # noqa: E731
    c = lambda p: p.cost  # noqa: E731
    rows = [
        row("bound", lambda p: str(r(p).bound)),
        row("floor (roofline)", lambda p: seconds(_num(r(p).floor_s))),
        row("expected", lambda p: seconds(_num(r(p).expected_s))),
        row("no-overlap", lambda p: seconds(_num(r(p).no_overlap_s))),
    ]
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
        def part_cell(p: Prediction, i: int = part_idx) -> str:
            if i >= len(p.cost.parts):
                return "-"
            pr = evaluate(p.cost.parts[i], p.chip)
            return f"{seconds(_num(pr.floor_s))} {pr.bound}"
        name = preds[0].cost.parts[part_idx].name if part_idx < len(preds[0].cost.parts) else f"part {part_idx}"
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


def format_report(op: str, params: dict[str, Any], preds: list[Prediction]) -> str:
    shown = "  ".join(f"{k.replace('_', '-')}={_fmt_param(v)}" for k, v in params.items() if v is not None and v != "")
    lines = [f"{op}  {shown}".rstrip(), ""]
    lines.append(table([""] + [_header(p) for p in preds], report_rows(preds)))
    for p in preds:
        notes = p.cost.notes + tuple(n for part in p.cost.parts for n in part.notes if n not in p.cost.notes)
        for n in dict.fromkeys(notes):
            lines.append(f"note [{_header(p)}]: {n}")
    return "\n".join(lines)


def _fmt_param(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, np.ndarray):
        return ",".join(str(x) for x in v.tolist()) if v.size <= 8 else f"[{v.size} values]"
    return str(v)


def sweep_rows(preds: list[Prediction], keys: list[str]) -> tuple[list[str], list[list[str]]]:
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


def prediction_record(p: Prediction, params: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready record of one prediction."""
    r = p.roofline
    roof = {f: getattr(r, f) for f in ("unit_s", "floor_s", "no_overlap_s", "expected_s", "arithmetic_intensity",
                                       "ridge_point", "attainable_flops_per_s", "attainable_hbm_bytes_per_s",
                                       "peak_share")}
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


def csv_text(preds: list[Prediction], params: dict[str, Any]) -> str:
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


def render(op: str, params: dict[str, Any], preds: list[Prediction], *, swept: list[str], as_json: bool,
           as_csv: bool) -> None:
    """Print predictions as JSON, CSV, a detailed report (one point) or a sweep table."""
    if as_json and as_csv:
        raise InputError("--json and --csv: pick one output format")
    if as_json:
        echo_json([prediction_record(p, params) for p in preds])
        return
    if as_csv:
        click.echo(csv_text(preds, params), nl=False)
        return
    if not swept:
        click.echo(format_report(op, params, preds))
        return
    fixed = {k: v for k, v in params.items() if k not in swept}
    shown = "  ".join(f"{k.replace('_', '-')}={_fmt_param(v)}" for k, v in fixed.items() if v is not None and v != "")
    headers, rows = sweep_rows(preds, swept)
    chips = ", ".join(dict.fromkeys(p.chip.name for p in preds))
    click.echo(f"{op} on {chips}  {shown}".rstrip())
    click.echo("")
    click.echo(table(headers, rows))


def check_required(params: dict[str, Any], swept: Iterable[str], required: Iterable[str]) -> None:
    """InputError for a required option that is neither given nor swept (options stay optional in click so
    that ``--sweep`` can supply them)."""
    swept = set(swept)
    for name in required:
        if params.get(name) is None and name not in swept:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"missing option {flag}: give {flag} VALUE or --sweep {name.replace('_', '-')}=V1,V2")


def run_prediction(op: str, build: Build, params: dict[str, Any], *, hw: Iterable[str], sweep: Iterable[str],
                   as_json: bool, as_csv: bool, sweepable: Iterable[str] | None = None,
                   required: Iterable[str] = ()) -> list[Prediction]:
    """Resolve chips and sweep points, evaluate, print; returns the predictions (for callers and tests).

    ``build(chip=..., **params)`` returns an OpCost or {variant: OpCost}.
    ``sweepable`` defaults to every key of params; ``required`` names options
    that must be given or swept.
    """
    points = sweep_points(sweep, sweepable if sweepable is not None else params)
    swept = list(points[0]) if points and points[0] else []
    check_required(params, swept, required)
    chips = resolve_chips(hw)
    preds = evaluate_all(op, build, params, chips, points)
    render(op, params, preds, swept=swept, as_json=as_json, as_csv=as_csv)
    return preds


# ----------------------------------------------------------------------------- shared option groups


def context_options(fn: Callable) -> Callable:
    """--context / --context-lens / --context-dist / --batch: per-sequence context lengths."""
    fn = click.option("--batch", type=int, default=None,
                      help="Sequences (with --context or --context-dist; default 1).")(fn)
    fn = click.option("--context-dist", default=None, metavar="DIST",
                      help="Context lengths as --batch quantiles of uniform:LO:HI, normal:MEAN:STD or "
                           "lognormal:MEDIAN:SIGMA.")(fn)
    fn = click.option("--context-lens", default=None, metavar="LIST",
                      help="One context length per sequence, e.g. 4096,100,17 or 2048x31,8192 (VALUExCOUNT).")(fn)
    fn = click.option("--context", type=int, default=None, help="Context length shared by all --batch sequences.")(fn)
    return fn


def context_lengths(context: int | None, context_lens: str | None, context_dist: str | None, batch: int | None
                    ) -> tuple[Any, Any]:
    """(context_lens, batch) arguments for the paged-attention models from the context options.

    --context with --batch gives (length, batch); --context-lens gives the
    list (batch None); --context-dist gives --batch quantiles (batch None).
    """
    from perfmodel.model.distributions import parse_length_list, quantile_lengths
    from perfmodel.model.shapes import sizes

    given = [n for n, v in (("--context", context), ("--context-lens", context_lens),
                            ("--context-dist", context_dist)) if v is not None]
    if len(given) != 1:
        raise InputError("give exactly one of --context, --context-lens, --context-dist"
                         + (f" (got {', '.join(given)})" if given else ""))
    if batch is not None:
        sizes("batch", batch)
    if context is not None:
        return sizes("context", context), (1 if batch is None else batch)
    if context_lens is not None:
        if batch is not None:
            raise InputError("--batch: not with --context-lens (the list gives one length per sequence)")
        return parse_length_list(context_lens, "--context-lens"), None
    return quantile_lengths(context_dist, 1 if batch is None else batch), None


def context_flag(context: Any, context_lens: Any, context_dist: Any) -> str:
    """The context option the user gave (for error messages); --context-lens when none or several."""
    given = [n for n, v in (("--context", context), ("--context-lens", context_lens),
                            ("--context-dist", context_dist)) if v is not None]
    return given[0] if len(given) == 1 else "--context-lens"


@contextlib.contextmanager
def blame_context(flag: str) -> Iterator[None]:
    """Prefix the model's too-small page table error ("a context of N tokens needs ... --pages-per-seq ...",
    which cannot know the flag) with the context flag the user gave."""
    try:
        yield
    except InputError as exc:
        if str(exc).startswith("a context of "):
            raise InputError(f"{flag}: {exc}") from None
        raise


# ----------------------------------------------------------------------------- kv capacity


def run_capacity(params: dict[str, Any], *, hw: Iterable[str], sweep: Iterable[str], as_json: bool,
                 as_csv: bool) -> None:
    """`predict kv-cache capacity`: tokens and sequences of KV that fit next to the weights, per chip."""
    from perfmodel.model.dtypes import itemsize, parse_dtype
    from perfmodel.model.dtypes import is_quantized
    from perfmodel.model.kvcache import kv_bytes_per_token, kv_capacity
    from perfmodel.units import binary

    if as_json and as_csv:
        raise InputError("--json and --csv: pick one output format")
    points = sweep_points(sweep, [k for k in params if k not in ("weight_dtype", "kv_dtype", "kv_scale")])
    check_required(params, points[0], ("layers", "kv_heads"))
    chips = resolve_chips(hw)
    records = []
    for chip in chips:
        for point in points:
            p = {**params, **point}
            if (p["weight_bytes"] is None) == (p["params_b"] is None):
                raise InputError("give exactly one of --weight-bytes and --params-b")
            if p["params_b"] is not None and not 0 < p["params_b"] < float("inf"):
                raise InputError("--params-b must be a positive number of billions of parameters, "
                                 f"got {p['params_b']:g}")
            weights = p["weight_bytes"] if p["weight_bytes"] is not None else (
                p["params_b"] * 1e9 * itemsize(p["weight_dtype"], "--weight-dtype"))
            kv_scale = p["kv_scale"]
            if kv_scale is None:  # as kv-cache update and predict model: per-token scales for a quantized cache
                kv_scale = "per-token" if is_quantized(parse_dtype(p["kv_dtype"], "--kv-dtype")) else "none"
            per_token = kv_bytes_per_token(layers=p["layers"], kv_heads=p["kv_heads"], head_dim=p["head_dim"],
                                           kv_dtype=p["kv_dtype"], kv_scale=kv_scale)
            cap = kv_capacity(chip=chip, weight_bytes=weights, kv_bytes_per_token=per_token,
                              page_size=p["page_size"], context_len=p["context"], num_chips=p["num_chips"],
                              reserved_bytes=p["reserved_bytes"], hbm_utilization=p["hbm_utilization"])
            records.append({"chip": chip.name, "params": to_jsonable(p), "capacity": to_jsonable(cap)})
    if as_json:
        echo_json(records)
        return
    fields = ["hbm_bytes", "usable_bytes", "free_bytes", "kv_bytes_per_token", "pages", "tokens", "sequences",
              "weights_fit"]
    if as_csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        keys = list(params)
        w.writerow(["chip", *keys, *fields])
        for r in records:
            w.writerow([r["chip"], *(r["params"].get(k) for k in keys), *(r["capacity"][f] for f in fields)])
        click.echo(buf.getvalue(), nl=False)
        return
    swept = list(points[0]) if points[0] else []
    headers = ["chip", *[k.replace("_", "-") for k in swept], "HBM", "usable", "weights/chip", "free for KV",
               "KV/token/chip", "tokens", "sequences", "fits"]
    rows = []
    for r in records:
        c, p = r["capacity"], r["params"]
        free = c["free_bytes"]
        fits = "yes" if c["weights_fit"] else f"no: weights exceed usable HBM by {binary(-free)}"
        rows.append([r["chip"], *(str(p[k]) for k in swept), binary(c["hbm_bytes"]), binary(c["usable_bytes"]),
                     binary(c["weight_bytes"] / p["num_chips"]), binary(max(free, 0)),
                     nbytes(c["kv_bytes_per_token"] / p["num_chips"]), si(c["tokens"], "tok"),
                     "-" if c["sequences"] is None else f"{c['sequences']:g}", fits])
    click.echo(table(headers, rows))
