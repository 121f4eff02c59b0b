"""Text, CSV and JSON of `perfmodel predict model` results and of the built-in model list.

One point (on one or more chips) prints as a per-op table and a summary; a
sweep as one row per chip x point with the bound changes marked. Pure
functions of a :class:`~perfmodel.predict.steps.StepSweep`. No jax.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from perfmodel.jsonable import to_jsonable
from perfmodel.predict.render import BOUND_CHANGE_MARK
from perfmodel.predict.steps import StepSweep
from perfmodel.units import binary, nbytes, percent, seconds, si, table


def step_text(sweep: StepSweep) -> str:
    """The per-op report of one point (chips side by side), or the sweep table."""
    if sweep.swept:
        return _sweep_table(sweep.model, [(p.point, p.prediction) for p in sweep.points], list(sweep.swept))
    return _report(sweep.predictions)


def step_csv(sweep: StepSweep) -> str:
    """One row per (chip, point, op) plus a 'step' row of totals for each (chip, point)."""
    return _csv([(p.point, p.prediction) for p in sweep.points])


def step_records(sweep: StepSweep) -> list[dict[str, Any]]:
    """JSON-ready records, one per chip x point (:func:`prediction_record` plus the point)."""
    return [to_jsonable({"point": p.point, **prediction_record(p.prediction)}) for p in sweep.points]


def prediction_record(p: Any) -> dict[str, Any]:
    """JSON-ready summary of a step prediction (perfmodel.model.transformer.StepPrediction; the CLI's `json`)."""
    mem = p.memory
    return {
        "model": p.model.name,
        "chip": p.chip.name,
        "step": to_jsonable(p.step),
        "floor_s": p.floor_s,
        "expected_s": p.expected_s,
        "no_overlap_s": p.no_overlap_s,
        "overlapped_floor_s": p.overlapped_floor_s,
        "unit_s": p.unit_s,
        "bound": p.bound,
        "bound_shares": p.bound_shares,
        "tokens_per_step": p.tokens_per_step,
        "tokens_per_s": p.tokens_per_s,
        "tokens_per_s_per_chip": p.tokens_per_s_per_chip,
        "tokens_per_s_at_floor": p.tokens_per_s_at_floor,
        "tokens_per_s_per_chip_at_floor": p.tokens_per_s_per_chip_at_floor,
        "compute_dtype": p.compute_dtype,
        "mbu_at_floor": p.mbu_at_floor,
        "mfu_at_floor": p.mfu_at_floor,
        "hbm_bytes": p.hbm_bytes,
        "useful_flops": p.useful_flops,
        "ici_bytes": p.ici_bytes,
        "memory": to_jsonable(mem),
        "routing": to_jsonable(p.routing) if p.routing else None,
        "ops": [
            {"name": op.name, "block": op.block, "count": op.count, "floor_s": op.floor_s,
             "expected_s": op.expected_s, "bound": op.bound, "share": p.share(op), "hbm_bytes": op.hbm_bytes,
             "useful_flops": op.useful_flops, "ici_bytes": op.ici_bytes, "mxu_dtype": op.cost.mxu_dtype,
             "notes": list(op.cost.notes)}
            for op in p.ops
        ],
    }


def preset_record(cfg: Any) -> dict[str, Any]:
    """A built-in model for `--list --json`: every config field (sources included) and its parameter counts."""
    from perfmodel.model.schema import parameter_counts

    counts = parameter_counts(cfg)
    return {**to_jsonable(cfg), "parameter_counts": {**to_jsonable(counts), "total": counts.total,
                                                     "active": counts.active}}


def models_csv(presets: list) -> str:
    from perfmodel.model.configs import describe
    from perfmodel.model.schema import parameter_counts

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["name", "display_name", "params_total", "params_active", "architecture"])
    for c in presets:
        counts = parameter_counts(c)
        w.writerow([c.name, c.display_name, counts.total, counts.active, describe(c)])
    return buf.getvalue()


def models_table(presets: list) -> str:
    from perfmodel.model.configs import describe
    from perfmodel.model.schema import parameter_counts

    rows = []
    for c in presets:
        counts = parameter_counts(c)
        active = si(counts.active, "") if counts.active != counts.total else "(dense)"
        rows.append([c.name, c.display_name, si(counts.total, ""), active, describe(c)])
    return table(["name", "model", "params", "active", "architecture"], rows, align="lllll")


def _step_line(p: Any) -> str:
    s = p.step
    if s.phase == "decode" and s.context_lens is not None:
        lens = s.sequence_kv_tokens()
        what = (f"decode, batch {s.batch}, contexts {lens.min()}..{lens.max()} tokens "
                f"(mean {lens.mean():.0f})")
    elif s.phase == "decode":
        what = f"decode, batch {s.batch}, context {s.context_tokens} tokens"
    else:
        prefix = f" after {s.context_tokens} cached" if s.context_tokens else ""
        what = f"prefill, batch {s.batch} x {s.chunk_tokens} new tokens{prefix}"
    return (f"{what}; weights {_weights(s)}, activations {s.act_dtype}, KV {s.kv_dtype}, "
            f"page {s.page_size}, TP {s.tp}")


def _weights(s: Any) -> str:
    """The weight dtype, with its scales where they are not the default, and int8 x int8 / int8 x int4 GEMMs."""
    text = s.weight_dtype
    if s.weight_scale == "per-block":
        text += f" (scales per {s.scale_block} rows of K)"
    if s.quantize_activations:
        text += f", GEMMs int8 x {s.weight_dtype} (activations quantized per token in each GEMM)"
    return text


def _fixed_line(p: Any, swept: list[str]) -> str:
    """The step's settings that a sweep leaves alone, then what it sweeps."""
    s = p.step
    context = s.context_tokens if s.context_lens is None else f"{min(s.context_lens)}..{max(s.context_lens)}"
    fields = [("phase", s.phase), ("batch", s.batch), ("context", context),
              ("prefill_len", s.chunk_tokens if s.phase == "prefill" else None), ("weight_dtype", s.weight_dtype),
              ("weight_scale", s.weight_scale if s.weight_scale == "per-block" else None),
              ("scale_block", s.scale_block), ("quantize_activations", "yes" if s.quantize_activations else None),
              ("act_dtype", s.act_dtype), ("kv_dtype", s.kv_dtype), ("page_size", s.page_size), ("tp", s.tp)]
    fixed = ", ".join(f"{k.replace('_', '-')} {v}" for k, v in fields if k not in swept and v is not None)
    return f"{fixed}; sweeping {', '.join(k.replace('_', '-') for k in swept)}"


def _need_line(p: Any) -> str:
    m = p.memory
    return f"{binary(m.weight_bytes)} + {binary(m.kv_bytes)} = {binary(m.weight_bytes + m.kv_bytes)}"


def _usable_line(p: Any) -> str:
    m = p.memory
    return f"{binary(m.usable_bytes)} ({percent(m.hbm_utilization)} of {binary(m.hbm_bytes)})"


def _fits_line(p: Any) -> str:
    return "yes" if p.memory.fits else f"NO, short by {binary(p.memory.shortfall_bytes)}"


def _max_batch_line(p: Any) -> str:
    m = p.memory
    if m.max_batch == 0:
        return "0 (the weights alone exceed the usable HBM; raise --tp or narrow --weight-dtype)"
    if p.step.context_lens is not None:
        return f"{m.max_batch} sequences of this length mix ({binary(m.kv_bytes_per_sequence)} of KV each on average)"
    return f"{m.max_batch} sequences of {p.step.kv_tokens} tokens ({binary(m.kv_bytes_per_sequence)} of KV each)"


def _summary_rows(preds: list) -> list[list[str]]:
    def row(label: str, fn: Any) -> list[str]:
        return [label] + [fn(p) for p in preds]

    rows = [
        row("step floor (sum of op floors)", lambda p: seconds(p.floor_s)),
        row("expected", lambda p: seconds(p.expected_s)),
        row("no-overlap", lambda p: seconds(p.no_overlap_s)),
        row("if all ops overlapped", lambda p: seconds(p.overlapped_floor_s)),
        row("bound (share of floor)", lambda p: ", ".join(f"{b} {percent(s)}" for b, s in p.bound_shares.items()
                                                          if s >= 0.005)),
        row("tokens/s per chip expected", lambda p: si(p.tokens_per_s_per_chip, "tok/s")),
        row("tokens/s system expected", lambda p: f"{si(p.tokens_per_s, 'tok/s')} ({p.step.tp} chip"
            f"{'s' if p.step.tp > 1 else ''})"),
        row("tokens/s system at floor (bound)", lambda p: si(p.tokens_per_s_at_floor, "tok/s")),
        row("MBU at floor", lambda p: percent(p.mbu_at_floor)),
        row("MFU at floor", lambda p: f"{percent(p.mfu_at_floor)} of {p.compute_dtype} peak"),
        row("HBM traffic per chip", lambda p: nbytes(p.hbm_bytes)),
        row("useful FLOPs per chip", lambda p: si(p.useful_flops, "FLOP")),
    ]
    if any(p.ici_bytes for p in preds):
        rows.append(row("ICI bytes sent per chip", lambda p: nbytes(p.ici_bytes)))
    if any(p.routing for p in preds):
        rows.append(row("MoE tokens per expert", lambda p: (
            f"{p.routing.tokens_per_expert:.3g} mean; {p.routing.experts_touched}/{p.model.moe.num_experts} experts "
            f"touched" if p.routing else "-")))
    rows += [
        row("weights + KV per chip", _need_line),
        row("usable HBM per chip", _usable_line),
        row("fits in HBM", _fits_line),
        row("largest batch that fits", _max_batch_line),
    ]
    return rows


def _ops_table(preds: list) -> str:
    multi = len(preds) > 1
    headers = ["op", "x"]
    for p in preds:
        suffix = f" [{p.chip.name}]" if multi else ""
        headers += [f"time{suffix}", "bound", "share"]
    headers += ["HBM bytes", "FLOPs"] if not multi else []
    rows = []
    for i, op in enumerate(preds[0].ops):
        row = [op.name, str(op.count)]
        for p in preds:
            o = p.ops[i]
            row += [seconds(o.floor_s), o.bound, percent(p.share(o))]
        if not multi:
            row += [nbytes(op.hbm_bytes), si(op.useful_flops, "FLOP") if op.useful_flops else "-"]
        rows.append(row)
    return table(headers, rows, align="lr" + "rlr" * len(preds) + ("rr" if not multi else ""))


def _report(preds: list) -> str:
    from perfmodel.model.configs import describe

    p0 = preds[0]
    chips = ", ".join(p.chip.display_name for p in preds)
    lines = [f"{p0.model.display_name} on {chips}: {_step_line(p0)}", f"  ({describe(p0.model)})", ""]
    lines.append(_ops_table(preds))
    lines.append("")
    rows = _summary_rows(preds)
    if len(preds) > 1:
        lines.append(table([""] + [p.chip.name for p in preds], rows, align="l" * (1 + len(preds))))
    else:
        width = max(len(r[0]) for r in rows)
        lines += [f"{label.ljust(width)}  {value}" for label, value in rows]
    notes = _notes(p0)
    if notes:
        lines.append("")
        lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def _notes(p: Any) -> list[str]:
    out = ["times are per step on each chip of the TP group; ops run back to back, so the step floor is the sum "
           "of each op's roofline floor"]
    cfg, s = p.model, p.step
    if cfg.moe is not None:
        out.append("MoE routing assumed uniform: expected distinct experts touched, tokens spread evenly over them")
    if cfg.mla is not None and s.tp > 1:
        out.append("MLA latent cache and down projections are replicated on every TP chip (no data-parallel "
                   "attention)")
    if cfg.mla is not None and s.phase == "prefill":
        out.append("MLA prefill: flash attention with 192-wide heads for V too (V is 128 wide: PV over-counted)")
    if s.phase == "prefill" and s.kv_dtype != s.act_dtype:
        out.append(f"prefill attention reads K/V in {s.act_dtype}; the {s.kv_dtype} cache only sets the write "
                   "and the footprint")
    return out


def _sweep_table(cfg: Any, preds: list[tuple[dict, Any]], swept: list[str]) -> str:
    multi = len({p.chip.name for _, p in preds}) > 1
    headers = (["chip"] if multi else []) + [k.replace("_", "-") for k in swept]
    headers += ["floor", "expected", "tok/s/chip", "tok/s system", "(floor)", "MBU", "MFU", "bound", "fits",
                "max batch", ""]
    rows, last = [], {}
    for point, p in preds:
        mark = BOUND_CHANGE_MARK if p.chip.name in last and last[p.chip.name] != p.bound else ""
        last[p.chip.name] = p.bound
        row = ([p.chip.name] if multi else []) + [str(point[k]) for k in swept]
        row += [seconds(p.floor_s), seconds(p.expected_s), si(p.tokens_per_s_per_chip, "tok/s"),
                si(p.tokens_per_s, "tok/s"), f"<= {si(p.tokens_per_s_at_floor, 'tok/s')}", percent(p.mbu_at_floor), percent(p.mfu_at_floor), p.bound,
                "yes" if p.memory.fits else f"no (-{binary(p.memory.shortfall_bytes)})", str(p.memory.max_batch), mark]
        rows.append(row)
    title = f"{cfg.display_name}: {_fixed_line(preds[0][1], swept)}"
    return "\n".join([title, "", table(headers, rows, align="l" * (len(headers) - 11) + "r" * 7 + "llrl")])


# --------------------------------------------------------------------------- CSV


CSV_FIELDS = ("op", "block", "count", "floor_s", "expected_s", "bound", "share", "hbm_bytes", "useful_flops",
              "ici_bytes")


def _csv(preds: list[tuple[dict, Any]]) -> str:
    """One row per (chip, point, op) plus a 'step' row of totals for each (chip, point)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "chip", "phase", "batch", "context", "prefill_len", "tp", "weight_dtype", "act_dtype",
                "kv_dtype", *CSV_FIELDS, "tokens_per_s", "tokens_per_s_per_chip", "tokens_per_s_at_floor", "mbu_at_floor", "mfu_at_floor",
                "fits", "max_batch"])
    for _, p in preds:
        s = p.step
        head = [p.model.name, p.chip.name, s.phase, s.batch, s.context_tokens,
                s.chunk_tokens if s.phase == "prefill" else "", s.tp, s.weight_dtype, s.act_dtype, s.kv_dtype]
        for op in p.ops:
            w.writerow(head + [op.name, op.block, op.count, op.floor_s, op.expected_s, op.bound, p.share(op),
                               op.hbm_bytes, op.useful_flops, op.ici_bytes] + [""] * 6)
        w.writerow(head + ["step", "", 1, p.floor_s, p.expected_s, p.bound, 1.0, p.hbm_bytes, p.useful_flops,
                           p.ici_bytes, p.tokens_per_s, p.tokens_per_s_per_chip, p.tokens_per_s_at_floor, p.mbu_at_floor, p.mfu_at_floor,
                           p.memory.fits, p.memory.max_batch])
    return buf.getvalue()
