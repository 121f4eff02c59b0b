"""`perfmodel serve --json` output as a `perfmodel report` (markdown or HTML): one table per run (vLLM's metrics
and the engine's statistics), a sweep as one table with a row per point. A pure function of the JSON."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError

#: (label, key, unit scale, unit) of the rows a serve report shows.
ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("completed requests", "completed", 1.0, ""),
    ("duration", "duration", 1.0, "s"),
    ("request throughput", "request_throughput", 1.0, "req/s"),
    ("request goodput", "request_goodput", 1.0, "req/s"),
    ("output token throughput", "output_throughput", 1.0, "tok/s"),
    ("total token throughput", "total_token_throughput", 1.0, "tok/s"),
    ("mean TTFT", "mean_ttft_ms", 1e-3, "s"),
    ("median TTFT", "median_ttft_ms", 1e-3, "s"),
    ("P99 TTFT", "p99_ttft_ms", 1e-3, "s"),
    ("mean TPOT", "mean_tpot_ms", 1e-3, "s"),
    ("P99 TPOT", "p99_tpot_ms", 1e-3, "s"),
    ("mean ITL", "mean_itl_ms", 1e-3, "s"),
    ("P99 ITL", "p99_itl_ms", 1e-3, "s"),
)


def is_serve(data: Any) -> bool:
    """Whether ``data`` is `perfmodel serve --json` output (a run, or a sweep's list of runs)."""
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(d, dict) and "perfmodel" in d and "completed" in d for d in items)


def serve_report(data: Any, *, source: str) -> Any:
    from perfmodel.harness.roofline_report import Cell, Column, Report, RooflineChart, Table
    from perfmodel.units import si

    runs: Sequence[Mapping[str, Any]] = data if isinstance(data, list) else [data]
    for i, r in enumerate(runs):
        for key in ("completed", "duration", "output_throughput", "mean_ttft_ms"):
            if not isinstance(r.get(key), (int, float)):
                raise InputError(f"`input_path` {source}: run {i} has no number '{key}'; give `perfmodel serve "
                                 "--json` output", fields=("input_path",))

    def cell(value: Any, scale: float, unit: str) -> Cell:
        if value is None:
            return Cell(value=None, text="-")
        v = float(value) * scale
        return Cell(value=v, text=si(v, unit) if unit else f"{v:g}")

    first = runs[0]["perfmodel"]
    columns = [Column(header="metric", key="metric", align="l")]
    columns += [Column(header=_label(r, i, len(runs)), key=f"run_{i}", align="r") for i, r in enumerate(runs)]
    rows = []
    for label, key, scale, unit in ROWS:
        if not any(key in r for r in runs):
            continue
        rows.append((Cell(value=key, text=label),) + tuple(cell(r.get(key), scale, unit) for r in runs))
    stats = [("preemptions", "preemptions", ""), ("mean running requests", "mean_running", ""),
             ("mean KV use", "mean_kv_usage", "%")]
    for label, key, unit in stats:
        vals = [r["perfmodel"]["stats"].get(key) for r in runs]
        rows.append((Cell(value=key, text=label),) + tuple(
            Cell(value=v, text="-" if v is None else (f"{100 * v:.1f}%" if unit == "%" else f"{v:.3g}"))
            for v in vals))
    summary = (f"{first['engine']} engine, {first['chip']} x{first['tp'] * first['dp']} (tp {first['tp']}, dp "
               f"{first['dp']}), max-num-seqs {first['max_num_seqs']}, max-num-batched-tokens "
               f"{first['max_num_batched_tokens']}, {first['weight_dtype']} weights, {first['kv_cache_dtype']} KV",)
    table = Table(heading=f"Serving benchmark (simulated): {runs[0].get('model_id', '')}", columns=tuple(columns),
                  rows=tuple(rows), summary=summary)
    return Report(title="Serving report (perfmodel serve)", source=source, sections=(table,),
                  roofline=RooflineChart(roofs=(), points=()),
                  notes=("simulated by perfmodel serve: vLLM bench serve's metrics of a modelled server, not a "
                         "measurement",),
                  inputs=tuple({k: r.get(k) for k in ("model_id", "num_prompts", "request_rate", "max_concurrency")}
                               for r in runs))


def _label(r: Mapping[str, Any], i: int, n: int) -> str:
    if n == 1:
        return "value"
    key = r.get("swept")
    return f"{key.replace('_', '-')} {r[key]}" if key in r else f"run {i}"
