"""``perfmodel serve``: what ``vllm bench serve`` would report against a TPU server, simulated.

Parses vLLM's server flags and the client flags of ``vllm bench serve``, calls
:func:`perfmodel.serve.run.serve` (or :func:`~perfmodel.serve.run.sweep`) and prints with
:mod:`perfmodel.serve.render`. No numpy, jax or model import until the command runs.
"""

from __future__ import annotations

import math
from typing import Any

import click

from perfmodel.cli.common import Progress, emit, json_option, one_chip_option, output_format, user_errors
from perfmodel.cli.serve_options import split_model_and_goodput, workload_from, workload_options
from perfmodel.errors import InputError

_HELP = """Simulate a serving benchmark: a vLLM-style TPU server (or JetStream) under a request stream.

MODEL is a built-in model or --config PATH. The server flags are vLLM's (vllm serve), the client
flags those of vllm bench serve; the output is vllm bench serve's summary block (--json: the keys
of its --save-result file). Step times come from perfmodel's transformer model (one ragged step
per iteration, padded to tpu-inference's precompiled shapes, plus a per-step host overhead).

\b
Examples:
  perfmodel serve llama-3.1-8b --hw v6e --random-input-len 1024 --random-output-len 128 \\
      --num-prompts 500 --max-concurrency 64
  perfmodel serve llama-3.1-70b --hw v6e --tp 8 --request-rate 4 --goodput ttft:1000 tpot:50
  perfmodel serve llama-3.1-8b --hw v6e --op-speedup attention=1.15 --max-concurrency 128
  perfmodel serve llama-3.1-8b --hw v6e --sweep request-rate=1,2,4,8,inf --plot out/
"""


@click.command("serve", help=_HELP, short_help="Simulate vllm bench serve against a TPU server.")
@click.argument("args", nargs=-1, metavar="MODEL")
@click.option("--config", "config_path", metavar="PATH", help="Hugging Face config.json (or a model YAML) instead "
              "of MODEL.")
@one_chip_option("tpu-v6e", "Chip of every replica (name or spec file).")
@click.option("--engine", type=click.Choice(["vllm", "jetstream"]), default="vllm", show_default=True,
              help="vLLM v1 scheduler as tpu-inference runs it, or JetStream's fixed decode slots.")
@click.option("--tensor-parallel-size", "--tp", "tp", type=int, default=1, show_default=True,
              help="Chips per replica.")
@click.option("--data-parallel-size", "--dp", "dp", type=int, default=1, show_default=True,
              help="Replicas (requests dealt round robin).")
@click.option("--max-num-seqs", type=int, default=None, help="Requests running at once (vLLM: 256, or 1024 on "
              "chips with >= 70 GiB of HBM). JetStream: decode slots.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Token budget per step (vLLM: 2048, or "
              "8192 on chips with >= 70 GiB).")
@click.option("--max-model-len", type=int, default=None, help="Longest sequence (default: the longest request).")
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True,
              help="Share of HBM for weights, activations and KV (vLLM's name, TPU too).")
@click.option("--block-size", type=int, default=None, help="KV page size in tokens (default: tpu-inference's rule "
              "from --max-model-len).")
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True)
@click.option("--enable-chunked-prefill/--no-enable-chunked-prefill", default=True, show_default=True)
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="auto (= activations), bf16, fp8, int8.")
@click.option("--weight-dtype", default="bf16", show_default=True, help="Weights: bf16, fp8, int8, int4.")
@click.option("--quantization", default=None, help="vLLM's name for quantized weights: fp8, int8, tpu_int8, int4, "
              "awq, gptq.")
@click.option("--speculative-config", default=None, metavar="JSON",
              help='e.g. \'{"method": "eagle3", "num_speculative_tokens": 3}\' (ngram, eagle, eagle3, mtp, '
                   'draft_model with "model").')
@click.option("--acceptance-rate", default=None, metavar="RATE|LIST",
              help="Speculative acceptance: one rate per token (0.7) or one per position (0.8,0.6,0.4).")
@workload_options
@click.option("--goodput", multiple=True, metavar="METRIC:MS",
              help="SLOs for goodput, e.g. --goodput ttft:500 tpot:50 (ttft, tpot, e2el in ms).")
@click.option("--percentile-metrics", default=None, help="Metrics to report percentiles of (default ttft,tpot,itl).")
@click.option("--metric-percentiles", default=None, help="Percentiles (default 99).")
@click.option("--op-speedup", multiple=True, metavar="OP=X",
              help="Run the same stream with this op X times faster too and print both (repeatable; "
                   "attention = every attention kernel).")
@click.option("--host-overhead-ms", type=float, default=None,
              help="Host time per engine step (default: perfmodel/data/calibration/serving.yaml).")
@click.option("--host-overhead-per-request-ms", type=float, default=None,
              help="Host time per request in each step (default: perfmodel/data/calibration/serving.yaml).")
@click.option("--no-padding", is_flag=True, help="Run each step at its own size (no precompiled-shape padding).")
@click.option("--compile", "with_compile", is_flag=True,
              help="Scale the step model by the TPU compiler's times of a decode step and a prefill chunk of this "
                   "model (libtpu, deviceless; minutes the first time, then cached).")
@click.option("--sweep", "sweep_text", default=None, metavar="NAME=V1,...",
              help="request-rate=1,2,4,inf or max-concurrency=1,8,64: one run per value.")
@click.option("--workers", type=int, default=None, help="With --sweep: processes of the local pool (default: "
              "every core; 1 runs the points in this process).")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="With --sweep: run the points on Ray (perfmodel[ray]).")
@click.option("--save-requests", default=None, metavar="FILE.jsonl",
              help="One record per request, written (fsynced) as each finishes.")
@click.option("--plot", "plot_dir", default=None, metavar="DIR", help="Write timeline.png (and curve.png with "
              "--sweep) into DIR.")
@click.option("--force", is_flag=True, help="Overwrite --save-requests / --plot files.")
@json_option
@user_errors
def serve(args: tuple[str, ...], config_path: str | None, hw: str, engine: str, tp: int, dp: int,
          max_num_seqs: int | None, max_num_batched_tokens: int | None, max_model_len: int | None,
          gpu_memory_utilization: float, block_size: int | None, enable_prefix_caching: bool,
          enable_chunked_prefill: bool, kv_cache_dtype: str, weight_dtype: str, quantization: str | None,
          speculative_config: str | None, acceptance_rate: str | None, goodput: tuple[str, ...],
          percentile_metrics: str | None, metric_percentiles: str | None, op_speedup: tuple[str, ...],
          host_overhead_ms: float | None, host_overhead_per_request_ms: float | None, no_padding: bool,
          with_compile: bool, workers: int | None, ray_address: str | None, sweep_text: str | None, save_requests: str | None,
          plot_dir: str | None, force: bool, as_json: bool, **stream: Any) -> None:
    from perfmodel.hw import get_chip
    from perfmodel.model.configs import get_model
    from perfmodel.serve import render
    from perfmodel.serve.config import engine_config, parse_speculative_config
    from perfmodel.serve.metrics import parse_goodput, parse_percentile_metrics, parse_percentiles
    from perfmodel.serve.requests_file import RequestWriter
    from perfmodel.serve.run import parse_sweep, serve as run_serve, sweep
    from perfmodel.serve.workload import build_requests

    fmt = output_format(as_json)
    name, goodput = split_model_and_goodput(args, goodput, config_path)
    model = get_model(config_path or name)
    chip = get_chip(hw)
    workload = workload_from(stream)
    requests = build_requests(workload)
    speedups = tuple(_speedup(x) for x in op_speedup)
    cfg = engine_config(
        model=model, chip=chip, engine=engine, tp=tp, dp=dp, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        longest_request=max(r.input_tokens + r.output_tokens for r in requests),
        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
        enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
        weight_dtype=weight_dtype, kv_cache_dtype=kv_cache_dtype, quantization=quantization,
        speculative=parse_speculative_config(speculative_config, acceptance_rate), padding=not no_padding,
        host_overhead_s=None if host_overhead_ms is None else host_overhead_ms * 1e-3,
        host_overhead_per_seq_s=None if host_overhead_per_request_ms is None else host_overhead_per_request_ms * 1e-3,
        op_speedups=speedups)
    if with_compile:
        import dataclasses

        from perfmodel.serve.compiled import compiled_scales

        typical = min(workload.max_concurrency or cfg.max_num_seqs, cfg.max_num_seqs, len(requests))
        mean_ctx = int(sum(r.input_tokens + r.output_tokens / 2 for r in requests) / len(requests))
        with Progress("compile") as bar:
            cfg = dataclasses.replace(cfg, compiled=compiled_scales(config_path or name, cfg,
                                                                    decode_batch=typical, decode_context=mean_ctx,
                                                                    progress=bar))
    kw = dict(percentile_metrics=parse_percentile_metrics(percentile_metrics),
              percentiles=parse_percentiles(metric_percentiles), goodput_ms=parse_goodput(goodput))
    writer = RequestWriter(save_requests, force=force) if save_requests else None
    try:
        if sweep_text:
            swept, values = parse_sweep(sweep_text)
            with Progress("serve sweep") as bar:
                result = sweep(cfg, workload, swept, values, progress=bar,
                               on_record=writer.write if writer else None,
                               backend="ray" if ray_address else ("inprocess" if workers == 1 else "auto"),
                               workers=workers, address=ray_address, **kw)
            if plot_dir:
                from perfmodel.serve.plots import write_plots

                write_plots(plot_dir, result=result.points[-1].faster or result.points[-1].base, sweep=result,
                            force=force)
            emit(fmt, text=lambda: render.sweep_text(result), json=lambda: render.sweep_records(result))
            return
        with Progress("serve") as bar:
            cmp = run_serve(cfg, workload, on_record=writer.write if writer else None, progress=bar, **kw)
    finally:
        if writer:
            writer.close()
    if plot_dir:
        from perfmodel.serve.plots import write_plots

        write_plots(plot_dir, result=cmp.faster or cmp.base, force=force)
    emit(fmt, text=lambda: render.serve_text(cmp), json=lambda: render.comparison_record(cmp))


def _speedup(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        factor = float(value)
    except ValueError:
        factor = float("nan")
    if not sep or not name.strip() or not (factor > 0 and math.isfinite(factor)):
        raise InputError(f"`op_speedup` '{text}': give OP=X with X a number > 0, e.g. attention=1.15")
    return name.strip(), factor
