"""Text and JSON views of serve results: vLLM's summary block, the engine's statistics, the --op-speedup
comparison and the sweep table. Pure functions of the results."""

from __future__ import annotations

import math
from typing import Any

from perfmodel.jsonable import to_jsonable
from perfmodel.serve.metrics import percentile_word, result_dict, summary_text
from perfmodel.serve.run import ServeComparison, ServeResult, ServeSweep
from perfmodel.units import percent, si, table


def header(r: ServeResult) -> dict[str, Any]:
    """The leading keys of vLLM's saved result."""
    w = r.workload
    return {"backend": "perfmodel-" + r.engine.engine, "model_id": r.engine.model.name,
            "num_prompts": len(r.run.records), "request_rate": "inf" if math.isinf(w.request_rate) else w.request_rate,
            "burstiness": w.burstiness, "max_concurrency": w.max_concurrency}


def engine_lines(r: ServeResult) -> list[str]:
    c, s, cap = r.engine, r.run.stats, r.capacity
    setup = f"server: {c.engine} on {c.chip.name} x{c.tp * c.dp} (tp {c.tp}, dp {c.dp}), {c.model.name} " \
            f"{c.weight_dtype} weights, {c.kv_cache_dtype} KV; "
    host = f"host overhead {si(c.host_overhead_s, 's')} per step + {si(c.host_overhead_per_seq_s, 's')} per request"
    kv = (f"({si(cap.kv_bytes_per_chip, 'B')} per chip beside {si(cap.weight_bytes_per_chip, 'B')} of weights and "
          f"{si(cap.workspace_bytes_per_chip, 'B')} of workspace, {c.gpu_memory_utilization:g} of "
          f"{si(cap.hbm_bytes_per_chip, 'B')})")
    if c.engine == "jetstream":  # fixed decode slots, whole-prompt prefills: no blocks, budget or prefix cache
        return [setup + f"{c.max_num_seqs} decode slots of {c.max_model_len} tokens",
                f"KV cache: {cap.tokens} tokens per replica {kv}",
                f"engine: {s.steps} steps (prefills and generate steps) of {si(s.mean_step_s, 's')} on average, "
                f"{s.mean_running:.1f} requests per step; slots in use {percent(s.mean_kv_usage)} mean, "
                f"{percent(s.peak_kv_usage)} peak; {host}"] + list(r.run.notes)
    lines = [
        setup + f"max-num-seqs {c.max_num_seqs}, max-num-batched-tokens {c.max_num_batched_tokens}, max-model-len "
        f"{c.max_model_len}, block-size {c.block_size}, prefix caching "
        f"{'on' if c.enable_prefix_caching else 'off'}, chunked prefill {'on' if c.enable_chunked_prefill else 'off'}"
        + (f", speculative {c.speculative.method} k={c.speculative.num_speculative_tokens} (mean accepted "
           f"{c.speculative.mean_accepted:.2f})" if c.speculative else ""),
        f"KV cache: {cap.num_blocks} blocks = {cap.tokens} tokens per replica {kv}",
        f"engine: {s.steps} steps of {si(s.mean_step_s, 's')} on average, {s.mean_running:.1f} requests and "
        f"{s.mean_step_tokens:.0f} tokens per step; KV use {percent(s.mean_kv_usage)} mean, "
        f"{percent(s.peak_kv_usage)} peak; {s.preemptions} preemptions; prefix-cache hit rate "
        f"{percent(s.prefix_cache_hit_rate)}; {host}",
    ]
    if c.compiled is not None:
        lines.append("compiled (--compile): " + "; ".join(
            f"{ph} batch {b} x {n} tokens: analytic {si(a, 's')}, compiled {si(cs, 's')} ({cs / a:.2f}x)"
            for ph, b, n, a, cs in c.compiled.shapes) + "; device time scaled by these ratios")
    return lines + list(r.run.notes)


def serve_text(cmp: ServeComparison) -> str:
    """The summary block (and engine lines); with --op-speedup both runs side by side."""
    if cmp.faster is None:
        r = cmp.base
        return "\n".join([summary_text(r.metrics, max_concurrency=r.workload.max_concurrency,
                                       request_rate=r.workload.request_rate)] + engine_lines(r))
    return comparison_text(cmp)


def _rows(r: ServeResult) -> list[tuple[str, float, str]]:
    m = r.metrics
    rows = [("Request throughput (req/s)", m.request_throughput, ".2f"),
            ("Output token throughput (tok/s)", m.output_throughput, ".2f"),
            ("Total token throughput (tok/s)", m.total_token_throughput, ".2f")]
    if m.request_goodput is not None:
        rows.append(("Request goodput (req/s)", m.request_goodput, ".2f"))
    for name in m.percentile_metrics:
        d = m.distributions[name]
        short = name.upper()
        rows += [(f"Mean {short} (ms)", d.mean_ms, ".2f"), (f"Median {short} (ms)", d.median_ms, ".2f")]
        rows += [(f"P{percentile_word(p)} {short} (ms)", v, ".2f") for p, v in d.percentiles_ms]
    return rows


def comparison_text(cmp: ServeComparison) -> str:
    speed = ", ".join(f"{k} x{v:g}" for k, v in cmp.faster.engine.op_speedups)
    rows = []
    for (label, a, fmt), (_, b, _) in zip(_rows(cmp.base), _rows(cmp.faster)):
        change = (b / a - 1.0) if a else 0.0
        rows.append([label, format(a, fmt), format(b, fmt), f"{change:+.1%}"])
    lines = [f"What {speed} buys ({cmp.base.engine.model.name} on {cmp.base.engine.chip.name}, the same stream):",
             table(["metric", "as is", "faster", "change"], rows, align="lrrr")]
    return "\n".join(lines + engine_lines(cmp.base))


def comparison_record(cmp: ServeComparison) -> dict[str, Any]:
    """JSON: vLLM's result dict of the run (of the faster run with --op-speedup, the baseline under
    ``baseline``), plus perfmodel's engine statistics under ``perfmodel``."""
    out = result_record(cmp.faster or cmp.base)
    if cmp.faster is not None:
        out["baseline"] = result_record(cmp.base)
    return out


def result_record(r: ServeResult) -> dict[str, Any]:
    out = result_dict(r.metrics, header=header(r))
    if r.metrics.goodput_slos_ms:
        out["goodput_slos_ms"] = dict(r.metrics.goodput_slos_ms)
    c = r.engine
    out["perfmodel"] = {
        "engine": c.engine, "chip": c.chip.name, "tp": c.tp, "dp": c.dp, "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens, "max_model_len": c.max_model_len,
        "block_size": c.block_size, "weight_dtype": c.weight_dtype, "kv_cache_dtype": c.kv_cache_dtype,
        "enable_prefix_caching": c.enable_prefix_caching, "enable_chunked_prefill": c.enable_chunked_prefill,
        "speculative": to_jsonable(c.speculative), "compiled": to_jsonable(c.compiled),
        "op_speedups": dict(c.op_speedups), "host_overhead_s": c.host_overhead_s,
        "host_overhead_per_seq_s": c.host_overhead_per_seq_s, "host_overhead_source": c.host_overhead_source,
        "kv_capacity": to_jsonable(r.capacity), "kv_tokens": r.capacity.tokens,
        "stats": to_jsonable(r.run.stats), "prefix_cache_hit_rate": r.run.stats.prefix_cache_hit_rate,
        "notes": list(r.run.notes),
    }
    return out


def sweep_text(sw: ServeSweep) -> str:
    has_faster = any(p.faster is not None for p in sw.points)
    headers = [sw.swept.replace("_", "-"), "req/s", "output tok/s", "mean TTFT", "median TTFT", "mean TPOT",
               "P99 ITL", "KV use", "preempt"]
    if has_faster:
        headers += ["output tok/s faster", "mean TPOT faster"]
    rows = []
    for v, p in zip(sw.values, sw.points):
        m, st = p.base.metrics, p.base.run.stats
        itl = dict(m.distributions["itl"].percentiles_ms)
        p99 = itl.get(99.0, m.distributions["itl"].percentiles_ms[-1][1])
        row = [str(v), f"{m.request_throughput:.2f}", f"{m.output_throughput:.1f}",
               si(m.distributions["ttft"].mean_ms * 1e-3, "s"), si(m.distributions["ttft"].median_ms * 1e-3, "s"),
               si(m.distributions["tpot"].mean_ms * 1e-3, "s"), si(p99 * 1e-3, "s"), percent(st.mean_kv_usage),
               str(st.preemptions)]
        if has_faster:
            f = p.faster.metrics if p.faster else m
            row += [f"{f.output_throughput:.1f}", si(f.distributions["tpot"].mean_ms * 1e-3, "s")]
        rows.append(row)
    base = sw.points[0].base
    title = (f"{base.engine.model.name} on {base.engine.chip.name} x{base.engine.tp * base.engine.dp}, "
             f"{base.engine.engine}: latency against throughput over {sw.swept.replace('_', '-')}")
    return "\n".join([title, table(headers, rows)])


def sweep_records(sw: ServeSweep) -> list[dict[str, Any]]:
    return [{**comparison_record(p), "swept": sw.swept, sw.swept: v} for v, p in zip(sw.values, sw.points)]
