"""``perfmodel plan``: search TPU serving configurations for the best throughput per chip under latency SLOs.

Parses the search space, the workload (``vllm bench serve``'s client flags) and the SLOs, calls
:func:`perfmodel.plan.search.plan` and prints with :mod:`perfmodel.plan.render`. No numpy, jax or model import
until the command runs.
"""

from __future__ import annotations

from typing import Any

import click

from perfmodel.cli.common import Progress, emit, json_option, output_format, user_errors
from perfmodel.cli.serve_options import split_model_and_goodput, workload_from, workload_options
from perfmodel.errors import InputError

_HELP = """Search serving configurations (chip, chips, TP x DP, weight and KV dtypes, max-num-seqs, token budget,
speculative decoding, client concurrency) for the best output tokens/s per chip against tokens/s per user,
under latency SLOs. Configurations that cannot hold their weights and one max-model-len sequence are pruned
before anything is simulated; the rest run through `perfmodel serve`'s simulator on a local process pool
(--workers) or a Ray cluster (--ray). Prints the Pareto front, the best configuration per chip type with its
`vllm serve` and `perfmodel serve` command lines.

\b
Examples:
  perfmodel plan llama-3.1-8b --hw v5e,v6e --chips 1,4 --concurrency 8,64 --tpot-p90-ms 50 --num-prompts 200
  perfmodel plan llama-3.1-70b --hw v6e,tpu-7x --chips 4,8 --weight-dtype bf16,int8 --out plan.jsonl
  perfmodel plan llama-3.1-70b --hw v6e --chips 8 --out plan.jsonl --resume --ray auto
"""


@click.command("plan", help=_HELP, short_help="Search serving configurations under latency SLOs.")
@click.argument("args", nargs=-1, metavar="MODEL")
@click.option("--config", "config_path", metavar="PATH", help="Hugging Face config.json instead of MODEL.")
@click.option("--hw", "hw", default="tpu-v6e", show_default=True, metavar="CHIPS", help="Chips to try (comma list).")
@click.option("--chips", default="1,4,8", show_default=True, help="Chips per deployment (TP x DP splits of each).")
@click.option("--weight-dtype", default="bf16", show_default=True, help="Weight dtypes to try (comma list).")
@click.option("--kv-cache-dtype", default="bf16", show_default=True, help="KV dtypes to try (comma list).")
@click.option("--max-num-seqs", "max_num_seqs_list", default="256", show_default=True, help="Comma list.")
@click.option("--max-num-batched-tokens", "budgets", default="2048", show_default=True, help="Comma list.")
@click.option("--concurrency", default="1,8,32,128", show_default=True,
              help="Client concurrencies each configuration is measured at (comma list).")
@click.option("--max-model-len", type=int, default=None, help="Default: the longest request.")
@click.option("--speculative-config", default=None, metavar="JSON", help="Also try this speculative decoding.")
@click.option("--acceptance-rate", default=None, help="Its acceptance (as perfmodel serve).")
@click.option("--ttft-p90-ms", type=float, default=None, help="SLO: p90 TTFT at most this.")
@click.option("--tpot-p90-ms", type=float, default=None, help="SLO: p90 TPOT at most this.")
@click.option("--goodput", multiple=True, metavar="METRIC:MS", help="SLOs as vllm bench serve's --goodput: at "
              "least 90% of requests within them.")
@click.option("--workers", type=int, default=None, help="Processes of the local pool (default: every core).")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Run on Ray: auto starts or joins a local instance, else a cluster address (perfmodel[ray]).")
@click.option("--out", default=None, metavar="FILE.jsonl", help="Append each configuration's result as it finishes.")
@click.option("--resume", is_flag=True, help="Continue the search in --out: simulate only what is not in it.")
@click.option("--force", is_flag=True, help="Start --out over / overwrite --plot.")
@click.option("--plot", default=None, metavar="FILE.png", help="The Pareto picture.")
@workload_options
@json_option
@user_errors
def plan(args: tuple[str, ...], config_path: str | None, hw: str, chips: str, weight_dtype: str,
         kv_cache_dtype: str, max_num_seqs_list: str, budgets: str, concurrency: str, max_model_len: int | None,
         speculative_config: str | None, acceptance_rate: str | None, ttft_p90_ms: float | None,
         tpot_p90_ms: float | None, goodput: tuple[str, ...], workers: int | None, ray_address: str | None,
         out: str | None, resume: bool, force: bool, plot: str | None, as_json: bool, **stream: Any) -> None:
    from pathlib import Path

    from perfmodel.hw import get_chip
    from perfmodel.model.dtypes import parse_dtype
    from perfmodel.plan import render
    from perfmodel.plan.search import ResultsFile, Slo, plan as run_plan
    from perfmodel.plan.space import SearchSpace, parse_int_list, parse_list
    from perfmodel.serve.config import parse_speculative_config
    from perfmodel.serve.metrics import parse_goodput
    from perfmodel.serve.workload import build_requests

    fmt = output_format(as_json)
    name, goodput = split_model_and_goodput(args, goodput, config_path)
    model_ref = config_path or name
    workload = workload_from(stream)
    requests = build_requests(workload)
    longest = max(r.input_tokens + r.output_tokens for r in requests)
    for flag, v in (("ttft_p90_ms", ttft_p90_ms), ("tpot_p90_ms", tpot_p90_ms)):
        if v is not None and not v > 0:
            raise InputError(f"`{flag}` must be a number of ms > 0, got {v}")
    if resume and out is None:
        raise InputError("`resume` continues the search in --out FILE.jsonl; give --out")
    if plot and Path(plot).exists() and not force:
        raise InputError(f"`plot`: {plot} exists; pass --force to overwrite it")
    parse_speculative_config(speculative_config, acceptance_rate)  # checked once here
    space = SearchSpace(
        chips=tuple(get_chip(c).name for c in parse_list(hw)), chip_counts=parse_int_list(chips, "chips"),
        weight_dtypes=tuple(parse_dtype(d, "`weight_dtype`") for d in parse_list(weight_dtype)),
        kv_cache_dtypes=tuple(parse_dtype(d, "`kv_cache_dtype`") for d in parse_list(kv_cache_dtype)),
        max_num_seqs=parse_int_list(max_num_seqs_list, "max_num_seqs"),
        max_num_batched_tokens=parse_int_list(budgets, "max_num_batched_tokens"),
        concurrencies=parse_int_list(concurrency, "concurrency"),
        speculative=((None, None),) + (((speculative_config, acceptance_rate),) if speculative_config else ()))
    slo = Slo(ttft_p90_ms=ttft_p90_ms, tpot_p90_ms=tpot_p90_ms, goodput_ms=tuple(parse_goodput(goodput).items()))
    results = ResultsFile(out, resume=resume, force=force) if out else None
    try:
        with Progress("plan") as bar:
            result = run_plan(model_ref, space, workload, max_model_len=max_model_len or longest, slo=slo,
                              backend="ray" if ray_address else "auto", workers=workers, address=ray_address,
                              results=results, progress=bar)
    finally:
        if results is not None:
            results.close()
    if plot:
        from perfmodel.harness.plots import save

        save(render.pareto_figure(result), Path(plot), field="plot")
    emit(fmt, text=lambda: render.plan_text(result, workload, model_ref),
         json=lambda: render.plan_record(result, workload, model_ref))
