"""Text, JSON and the Pareto picture of a plan; the `vllm serve` and `perfmodel serve` command lines of a
configuration. Pure functions of the result."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from perfmodel.plan.search import Outcome, PlanResult
from perfmodel.units import si, table

#: perfmodel weight dtypes -> vLLM's --quantization.
VLLM_QUANTIZATION = {"int8": "tpu_int8", "fp8": "fp8", "int4": "awq"}


def vllm_command(model: str, o: Outcome) -> str:
    c = o.candidate
    args = ["vllm", "serve", model, "--tensor-parallel-size", str(c.tp)]
    if c.dp > 1:
        args += ["--data-parallel-size", str(c.dp)]
    args += ["--max-num-seqs", str(c.max_num_seqs), "--max-num-batched-tokens", str(c.max_num_batched_tokens)]
    if c.weight_dtype in VLLM_QUANTIZATION:
        args += ["--quantization", VLLM_QUANTIZATION[c.weight_dtype]]
    if c.kv_cache_dtype != "bf16":
        args += ["--kv-cache-dtype", c.kv_cache_dtype]
    if c.speculative_config:
        args += ["--speculative-config", c.speculative_config]
    return shlex.join(args)


def perfmodel_command(model: str, o: Outcome, workload: Any) -> str:
    c = o.candidate
    args = ["perfmodel", "serve", model, "--hw", c.chip, "--tp", str(c.tp), "--dp", str(c.dp), "--max-num-seqs",
            str(c.max_num_seqs), "--max-num-batched-tokens", str(c.max_num_batched_tokens), "--weight-dtype",
            c.weight_dtype, "--kv-cache-dtype", c.kv_cache_dtype, "--max-concurrency", str(c.concurrency),
            "--num-prompts", str(workload.num_prompts), "--random-input-len", str(workload.random_input_len),
            "--random-output-len", str(workload.random_output_len)]
    if not math.isinf(workload.request_rate):
        args += ["--request-rate", str(workload.request_rate)]
    if c.speculative_config:
        args += ["--speculative-config", c.speculative_config, "--acceptance-rate", str(c.acceptance_rate)]
    return shlex.join(args)


def _row(o: Outcome) -> list[str]:
    c = o.candidate
    spec = "yes" if c.speculative_config else "no"
    return [c.chip, str(c.chips), f"{c.tp}x{c.dp}", c.weight_dtype, c.kv_cache_dtype, str(c.max_num_seqs),
            str(c.max_num_batched_tokens), spec, str(c.concurrency), si(o.tokens_per_s_per_chip, "tok/s"),
            si(o.tokens_per_s_per_user, "tok/s"), si(o.p90_ttft_ms * 1e-3, "s"), si(o.p90_tpot_ms * 1e-3, "s"),
            "yes" if o.slo_met else "no"]


HEADERS = ["chip", "chips", "tp x dp", "weights", "KV", "max seqs", "budget", "spec", "concurrency", "per chip",
           "per user", "p90 TTFT", "p90 TPOT", "SLO"]


def plan_text(r: PlanResult, workload: Any, model_ref: str) -> str:
    slo = ", ".join(f"{k} <= {v:g} ms" for k, v in (("p90 TTFT", r.slo.ttft_p90_ms), ("p90 TPOT", r.slo.tpot_p90_ms))
                    if v is not None) or "none"
    lines = [f"{r.model}: {len(r.outcomes)} configurations simulated, {len(r.pruned)} pruned (do not fit), "
             f"{len(r.failed)} failed; SLO: {slo}", "",
             "Pareto front (output tokens/s per chip against tokens/s per user):",
             table(HEADERS, [_row(o) for o in r.front])]
    if r.best_per_chip:
        lines += ["", "Best per chip type (most tokens/s per chip meeting the SLO):"]
        for o in r.best_per_chip:
            lines += [f"  {o.candidate.chip}: {si(o.tokens_per_s_per_chip, 'tok/s')} per chip, "
                      f"{si(o.tokens_per_s_per_user, 'tok/s')} per user",
                      f"    {vllm_command(model_ref, o)}", f"    {perfmodel_command(model_ref, o, workload)}"]
    else:
        lines += ["", "No configuration meets the SLO."]
    if r.failed:
        lines += ["", "Failed:"] + [f"  {c.as_dict()}: {err}" for c, err in r.failed[:10]]
    if r.pruned:
        reasons: dict[str, int] = {}
        for c, why in r.pruned:
            why = re.sub(r"`([a-z_]+)`", lambda m: "--" + m.group(1).replace("_", "-"), why)
            reasons.setdefault(why, 0)
            reasons[why] += 1
        lines += ["", "Pruned (not simulated):"] + [f"  {n} x {why}" for why, n in list(reasons.items())[:5]]
    return "\n".join(lines)


def plan_record(r: PlanResult, workload: Any, model_ref: str) -> dict[str, Any]:
    return {"model": r.model, "slo": {"ttft_p90_ms": r.slo.ttft_p90_ms, "tpot_p90_ms": r.slo.tpot_p90_ms},
            "outcomes": [o.as_dict() for o in r.outcomes],
            "front": [o.as_dict() for o in r.front],
            "best_per_chip": [{**o.as_dict(), "vllm_serve": vllm_command(model_ref, o),
                               "perfmodel_serve": perfmodel_command(model_ref, o, workload)} for o in r.best_per_chip],
            "pruned": [{"candidate": c.as_dict(), "why": why} for c, why in r.pruned],
            "failed": [{"candidate": c.as_dict(), "error": e} for c, e in r.failed]}


def pareto_figure(r: PlanResult):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for chip in dict.fromkeys(o.candidate.chip for o in r.outcomes):
        pts = [o for o in r.outcomes if o.candidate.chip == chip]
        ax.scatter([o.tokens_per_s_per_user for o in pts], [o.tokens_per_s_per_chip for o in pts], s=14, alpha=0.5,
                   label=chip)
    front = list(r.front)
    ax.plot([o.tokens_per_s_per_user for o in front], [o.tokens_per_s_per_chip for o in front], "k-", lw=1,
            label="Pareto front")
    met = [o for o in r.outcomes if o.slo_met]
    ax.scatter([o.tokens_per_s_per_user for o in met], [o.tokens_per_s_per_chip for o in met], s=40,
               facecolors="none", edgecolors="k", label="meets SLO")
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel("output tokens/s per chip")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{r.model}: throughput per chip against speed per user")
    fig.tight_layout()
    return fig
