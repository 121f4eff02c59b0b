"""The numbers ``vllm bench serve`` reports, computed from a simulated run the way it computes them from a real one
(vllm/benchmarks/serve.py, vllm-project/vllm@def9ce85, ``calculate_metrics``):

* duration: first send (t = 0) to the last request's last token;
* TTFT per request, TPOT = (latency - TTFT) / (output tokens - 1) for requests of more than one output token,
  ITL = every gap between streamed chunks of every request (a speculative step's tokens arrive as one chunk),
  E2EL = latency; each as mean, median, std and the asked percentiles (``np.percentile``, linear), in ms;
* throughputs: completed / duration, output tokens / duration, (input + output) / duration;
* goodput: requests meeting every ``--goodput`` SLO (metric <= bound, ms) / duration;
* peak output throughput: the most chunks in one whole second of the run, peak concurrency: the most requests in
  flight in one second.

:func:`result_dict` lays them out with ``--save-result``'s keys and order, so a simulated and a real result diff
key by key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.serve.records import RunResult

METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items: tuple[str, ...] | list[str]) -> dict[str, float]:
    """``--goodput ttft:MS tpot:MS e2el:MS`` into {metric: bound in ms}."""
    out: dict[str, float] = {}
    for item in items:
        for part in str(item).split():
            name, sep, value = part.partition(":")
            if not sep or name not in GOODPUT_METRICS:
                raise InputError(f"`goodput` '{part}': give METRIC:MS with METRIC one of "
                                 f"{', '.join(GOODPUT_METRICS)}, e.g. ttft:500 tpot:50")
            try:
                bound = float(value)
            except ValueError:
                raise InputError(f"`goodput` '{part}': '{value}' is not a number of milliseconds") from None
            if not (bound >= 0 and math.isfinite(bound)):
                raise InputError(f"`goodput` '{part}': the bound must be a finite number of ms >= 0")
            out[name] = bound
    return out


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in METRICS]
    if bad or not names:
        raise InputError(f"`percentile_metrics` '{text}': give a comma list of {', '.join(METRICS)}")
    return names


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    if text is None:
        return DEFAULT_PERCENTILES
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"`metric_percentiles` '{text}': give a comma list of numbers in (0, 100], e.g. "
                         "50,90,99") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise InputError(f"`metric_percentiles` '{text}': every percentile must be in (0, 100]")
    return values


def percentile_word(p: float) -> str:
    """vLLM's name of a percentile: 99 -> '99', 99.9 -> '99.9'."""
    return str(int(p)) if float(p).is_integer() else str(p)


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """One latency metric over a run, milliseconds."""

    mean_ms: float
    median_ms: float
    std_ms: float
    #: (percentile, ms) for each asked percentile.
    percentiles_ms: tuple[tuple[float, float], ...]


def distribution(values_s: np.ndarray, percentiles: tuple[float, ...], counts: np.ndarray | None = None
                 ) -> Distribution:
    """Mean, median, std and percentiles (ms) of ``values_s``, each value repeated ``counts`` times when given:
    the numbers numpy gives on the repeated list (np.percentile's linear interpolation), without building it."""
    x = np.asarray(values_s, dtype=float) * 1000.0
    c = np.ones(x.size, dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    keep = c > 0
    x, c = x[keep], c[keep]
    if x.size == 0:
        x, c = np.zeros(1), np.ones(1, dtype=np.int64)  # vLLM: `x or 0`
    order = np.argsort(x, kind="stable")
    x, c = x[order], c[order]
    ends = np.cumsum(c)  # the repeated list's positions ends[i - 1] .. ends[i] - 1 hold x[i]
    n = int(ends[-1])
    # elementwise products, not np.dot: a dot of this size starts BLAS threads that then spin beside the next run
    mean = float((x * c).sum() / n)
    std = float(np.sqrt(((x - mean) ** 2 * c).sum() / n))

    def at(pos: int) -> float:
        return float(x[np.searchsorted(ends, pos, side="right")])

    def pct(p: float) -> float:
        h = (n - 1) * p / 100.0
        lo = int(np.floor(h))
        a = at(lo)
        return a if lo + 1 >= n else a + (h - lo) * (at(lo + 1) - a)

    return Distribution(mean_ms=mean, median_ms=pct(50.0), std_ms=std,
                        percentiles_ms=tuple((p, pct(p)) for p in percentiles))


@dataclass(frozen=True, kw_only=True)
class BenchMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: float
    #: metric -> distribution, for every metric (the percentile metrics are the ones printed).
    distributions: dict[str, Distribution]
    percentile_metrics: tuple[str, ...]
    percentiles: tuple[float, ...]
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)


def bench_metrics(run: RunResult, *, percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS,
                  percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                  goodput_ms: dict[str, float] | None = None) -> BenchMetrics:
    recs = run.records
    if not recs:
        raise InputError("the run completed no request")
    duration = max(r.finish_s for r in recs)
    ttft = np.asarray([r.ttft_s for r in recs])
    e2el = np.asarray([r.e2el_s for r in recs])
    tpots = [r.tpot_s for r in recs]
    tpot = np.asarray([t for t in tpots if t is not None])
    outs = np.asarray([r.output_tokens for r in recs])
    ins = int(sum(r.input_tokens for r in recs))
    goodput = None
    if goodput_ms:
        per = {"ttft": ttft, "tpot": np.asarray([t or 0.0 for t in tpots]), "e2el": e2el}
        good = np.ones(len(recs), dtype=bool)
        for name, bound in goodput_ms.items():
            good &= per[name] <= bound / 1000.0
        goodput = float(good.sum()) / duration
    dists = {"ttft": distribution(ttft, percentiles), "tpot": distribution(tpot, percentiles),
             "itl": distribution(run.itl_values_s, percentiles, run.itl_counts),
             "e2el": distribution(e2el, percentiles)}
    peak_tok, peak_conc = _peaks(run)
    return BenchMetrics(
        completed=len(recs), failed=0, duration_s=duration, total_input_tokens=ins,
        total_output_tokens=int(outs.sum()), request_throughput=len(recs) / duration, request_goodput=goodput,
        output_throughput=float(outs.sum()) / duration, total_token_throughput=(ins + float(outs.sum())) / duration,
        max_output_tokens_per_s=peak_tok, max_concurrent_requests=peak_conc, distributions=dists,
        percentile_metrics=percentile_metrics, percentiles=percentiles, goodput_slos_ms=dict(goodput_ms or {}))


def _peaks(run: RunResult) -> tuple[float, float]:
    """(most chunks in one whole second, most requests in flight in one whole second)."""
    recs = run.records
    duration = max(r.finish_s for r in recs)
    seconds = int(math.ceil(duration)) + 1
    tok = np.zeros(seconds)
    np.add.at(tok, np.minimum(run.chunk_times.astype(np.int64), seconds - 1), run.chunk_counts)
    conc = np.zeros(seconds + 1)
    for r in recs:
        conc[int(r.send_s)] += 1
        conc[int(r.finish_s) + 1] -= 1
    return float(tok.max()), float(np.cumsum(conc)[:seconds].max())


def result_dict(m: BenchMetrics, *, header: dict[str, Any]) -> dict[str, Any]:
    """``vllm bench serve --save-result``'s dict: ``header`` (date, backend, model_id, num_prompts,
    request_rate, burstiness, max_concurrency), then the run's keys, then mean/median/std/pNN per percentile
    metric."""
    out: dict[str, Any] = dict(header)
    out.update({
        "duration": m.duration_s,
        "completed": m.completed,
        "failed": m.failed,
        "total_input_tokens": m.total_input_tokens,
        "total_output_tokens": m.total_output_tokens,
        "request_throughput": m.request_throughput,
        "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput,
        "total_token_throughput": m.total_token_throughput,
        "max_output_tokens_per_s": m.max_output_tokens_per_s,
        "max_concurrent_requests": m.max_concurrent_requests,
    })
    for name in m.percentile_metrics:
        d = m.distributions[name]
        out[f"mean_{name}_ms"] = d.mean_ms
        out[f"median_{name}_ms"] = d.median_ms
        out[f"std_{name}_ms"] = d.std_ms
        for p, v in d.percentiles_ms:
            out[f"p{percentile_word(p)}_{name}_ms"] = v
    return out


SECTION_TITLES = {"ttft": ("Time to First Token", "TTFT"), "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
                  "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}


def summary_text(m: BenchMetrics, *, max_concurrency: int | None, request_rate: float) -> str:
    """The block ``vllm bench serve`` prints, same labels, order and formats."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value: Any, fmt: str = "") -> None:
        lines.append(("{:<40} {:<10" + fmt + "}").format(label, value))

    row("Successful requests:", m.completed)
    row("Failed requests:", m.failed)
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if not math.isinf(request_rate):
        row("Request rate configured (RPS):", request_rate, ".2f")
    row("Benchmark duration (s):", m.duration_s, ".2f")
    row("Total input tokens:", m.total_input_tokens)
    row("Total generated tokens:", m.total_output_tokens)
    row("Request throughput (req/s):", m.request_throughput, ".2f")
    if m.request_goodput is not None:
        row("Request goodput (req/s):", m.request_goodput, ".2f")
    row("Output token throughput (tok/s):", m.output_throughput, ".2f")
    row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s, ".2f")
    row("Peak concurrent requests:", m.max_concurrent_requests, ".2f")
    row("Total token throughput (tok/s):", m.total_token_throughput, ".2f")
    for name in m.percentile_metrics:
        title, short = SECTION_TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        d = m.distributions[name]
        row(f"Mean {short} (ms):", d.mean_ms, ".2f")
        row(f"Median {short} (ms):", d.median_ms, ".2f")
        for p, v in d.percentiles_ms:
            row(f"P{percentile_word(p)} {short} (ms):", v, ".2f")
    lines.append("=" * 50)
    return "\n".join(lines)
