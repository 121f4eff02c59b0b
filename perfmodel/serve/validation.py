"""The serving simulator against published real-TPU serving benchmarks (perfmodel/data/validation/serving.yaml).

Each point is a published run (engine, model, chips, TP, limits, dataset, lengths, prompts, rate or
concurrency) and what it measured. :func:`run_serving_validation` simulates each vLLM / SGLang-JAX point with the
vLLM v1 engine (SGLang-JAX's scheduler is also continuous batching with chunked prefill under a token budget:
``--chunked-prefill-size`` is the budget, ``--max-running-requests`` max-num-seqs) and compares three metrics:
output throughput, the per-token latency (mean TPOT; the sweep tables' ITL column where that is all there is)
and TTFT (median, else mean; not the sweep tables' TTFT, measured in a separate run). JetStream points publish
one throughput of ShareGPT runs whose lengths are not given, so they stay out until a tokenizer-free length
model exists.

Roles: within each engine build (a point's ``engine_build``, else its engine), every third point by id is a **fit**
point: the build's host overhead (perfmodel/data/calibration/serving.yaml: ms per step + ms per request in the
step) is the grid value that minimizes the mean of the median |error| of output throughput and of the per-token
latency over them (:func:`fit_host_overhead`; a build with fewer than 3 fit points fits the per-step term only);
the rest are **held out**. Both errors are reported.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "validation" / "serving.yaml"
#: Hugging Face ids -> perfmodel presets with the same architecture.
PRESETS = {"meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b", "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
           "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "Qwen/Qwen3-32B": "qwen3-32b"}
SIMULATED_ENGINES = ("vllm", "sglang-jax")
METRIC_KEYS = {"output_throughput": ("output_throughput",), "tpot": ("mean_tpot_ms", "itl_ms"),
               "ttft": ("median_ttft_ms", "mean_ttft_ms")}


@dataclass(frozen=True, kw_only=True)
class ServingPoint:
    id: str
    source: str
    role: str
    raw: dict


@dataclass(frozen=True, kw_only=True)
class ServingRow:
    point: ServingPoint
    #: metric -> (measured, simulated)
    values: dict[str, tuple[float, float]]

    def error(self, metric: str) -> float | None:
        v = self.values.get(metric)
        return None if v is None else v[1] / v[0] - 1.0


@lru_cache(maxsize=None)
def _data() -> dict:
    import yaml

    with open(DATA, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def build_of(p: dict) -> str:
    """The calibration key of a published point: its engine build, else its engine."""
    return p.get("engine_build") or p["engine"]


def load_points() -> list[ServingPoint]:
    data = _data()
    usable = sorted((p for p in data["points"] if p["engine"] in SIMULATED_ENGINES and p.get("input_len")
                     and p.get("output_len") and (p["model"] in PRESETS or p.get("arch"))),
                    key=lambda p: (build_of(p), p["id"]))
    out, seen = [], {}
    for p in usable:
        i = seen[build_of(p)] = seen.get(build_of(p), -1) + 1
        out.append(ServingPoint(id=p["id"], source=data["sources"][p["source"]],
                                role="fit" if i % 3 == 0 else "held-out", raw=p))
    return out


def hf_config(p: dict) -> dict:
    """The Hugging Face config.json fields of a point's ``arch`` (numbers from the model's HF config, as the
    validation file records them): dense Llama-style (Qwen(1) 7B is one too: MHA, SwiGLU), Qwen3, Qwen3-MoE
    (``type: moe``) and Gemma-2 (``sliding_window``: alternating local / global layers)."""
    a, name = p["arch"], p["model"].lower()
    hf = {"hidden_size": a["hidden"], "num_hidden_layers": a["layers"], "num_attention_heads": a["heads"],
          "num_key_value_heads": a["kv_heads"], "head_dim": a["head_dim"], "vocab_size": a["vocab"],
          "hidden_act": "silu", "tie_word_embeddings": False}
    if a.get("type") == "moe":
        hf.update(model_type="qwen3_moe", num_experts=a["experts"], num_experts_per_tok=a["experts_per_token"],
                  moe_intermediate_size=a["moe_intermediate"], intermediate_size=a["moe_intermediate"])
    elif a.get("sliding_window"):  # Gemma-2: sliding-window and global layers alternate, the first local
        hf.update(model_type="gemma2", intermediate_size=a["intermediate"], hidden_act="gelu_pytorch_tanh",
                  hidden_activation="gelu_pytorch_tanh", sliding_window=a["sliding_window"],
                  layer_types=["sliding_attention", "full_attention"] * (a["layers"] // 2), tie_word_embeddings=True)
    else:
        hf.update(model_type="qwen3" if "qwen3" in name else "llama", intermediate_size=a["intermediate"])
    return hf


def _model(p: dict) -> Any:
    from perfmodel.harness.published_validation import model_config_from_hf
    from perfmodel.model.configs import get_model

    if p["model"] in PRESETS:
        return get_model(PRESETS[p["model"]])
    return model_config_from_hf(p["model"].split("/")[-1].lower(), hf_config(p))


def simulate_point(pt: ServingPoint, *, host: tuple[float, float] | None = None) -> ServingRow:
    """Simulate one published run; ``host`` = (seconds per step, seconds per request) overrides the engine's
    calibrated host overhead (the fit's trial values)."""
    from perfmodel.hw import get_chip
    from perfmodel.serve import calibration
    from perfmodel.serve.config import engine_config
    from perfmodel.serve.run import simulate
    from perfmodel.serve.workload import Workload

    p = pt.raw
    rate = p.get("request_rate")
    workload = Workload(num_prompts=int(p["num_prompts"]), random_input_len=int(p["input_len"]),
                        random_output_len=int(p["output_len"]),
                        request_rate=math.inf if rate in (None, "inf") else float(rate),
                        max_concurrency=p.get("max_concurrency"))
    longest = int(p["input_len"]) + int(p["output_len"])
    per_step, per_seq, _ = calibration.host_overhead(build_of(p))
    if host is not None:
        per_step, per_seq = host
    cfg = engine_config(model=_model(p), chip=get_chip(p["chip"]), tp=int(p["tp"]), dp=int(p.get("dp") or 1),
                        max_num_seqs=p.get("max_num_seqs"), max_num_batched_tokens=p.get("max_num_batched_tokens"),
                        max_model_len=max(int(p.get("max_model_len") or 0), longest),
                        weight_dtype=p.get("weight_dtype") or "bf16", kv_cache_dtype=p.get("kv_dtype"),
                        host_overhead_s=per_step, host_overhead_per_seq_s=per_seq)
    r = simulate(cfg, workload).metrics
    sim = {"output_throughput": r.output_throughput, "tpot": r.distributions["tpot"].mean_ms,
           "ttft": r.distributions["ttft"].median_ms if "median_ttft_ms" in p["metrics"] else
           r.distributions["ttft"].mean_ms}
    values = {}
    for metric, keys in METRIC_KEYS.items():
        measured = next((p["metrics"][k] for k in keys if p["metrics"].get(k) is not None), None)
        if measured is not None:
            values[metric] = (float(measured), float(sim[metric]))
    return ServingRow(point=pt, values=values)


#: The fit's grid: host ms per step x host ms per request.
FIT_STEP_MS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0)
FIT_REQUEST_MS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6)


def fit_host_overhead(build: str, progress: Callable[..., None] | None = None) -> dict[str, Any]:
    """The (per-step, per-request) host overhead of ``build`` on the grid that minimizes, over its fit points,
    the mean of the median |error| of output throughput and of the per-token latency."""
    pts = [p for p in load_points() if p.role == "fit" and build_of(p.raw) == build]
    best: dict[str, Any] = {"objective": math.inf}
    combos = [(a, b) for a in FIT_STEP_MS for b in (FIT_REQUEST_MS if len(pts) >= 3 else (0.0,))]
    for i, (a, b) in enumerate(combos):
        if progress is not None:
            progress(f"{a} ms + {b} ms/request", done=i, total=len(combos))
        rows = [simulate_point(p, host=(a * 1e-3, b * 1e-3)) for p in pts]
        meds = []
        for m in ("output_throughput", "tpot"):
            errs = [abs(e) for r in rows if (e := r.error(m)) is not None]
            if errs:
                meds.append(float(np.median(errs)))
        obj = float(np.mean(meds))
        if obj < best["objective"]:
            best = {"build": build, "per_step_ms": a, "per_request_ms": b, "objective": obj,
                    "fit_points": [p.id for p in pts]}
    return best


@dataclass(frozen=True, kw_only=True)
class ServingReport:
    rows: tuple[ServingRow, ...]

    def summary(self, role: str, metric: str, build: str | None = None) -> tuple[int, float | None]:
        errs = [abs(e) for r in self.rows if r.point.role == role and (e := r.error(metric)) is not None
                and (build is None or build_of(r.point.raw) == build)]
        return len(errs), (float(np.median(errs)) if errs else None)


def run_serving_validation(progress: Callable[..., None] | None = None, *, backend: str = "auto",
                           workers: int | None = None) -> ServingReport:
    """Every usable point simulated (on perfmodel.runner's backend: a process pool by default)."""
    from perfmodel.errors import ToolFailure
    from perfmodel.runner import run_tasks

    results = run_tasks(simulate_point, load_points(), backend=backend, workers=workers, progress=progress)
    failed = [r for r in results if not r.ok]
    if failed:
        raise ToolFailure(f"serving validation: {len(failed)} point(s) failed, first {failed[0].inputs.id}: "
                          f"{failed[0].error}")
    return ServingReport(rows=tuple(r.value for r in results))


def report_text(rep: ServingReport) -> str:
    from perfmodel.units import table

    def cell(r: ServingRow, m: str) -> str:
        v = r.values.get(m)
        return "" if v is None else f"{v[0]:.4g} / {v[1]:.4g} ({v[1] / v[0] - 1:+.0%})"

    rows = [[r.point.id, r.point.raw["engine"], r.point.raw["chip"], r.point.role, cell(r, "output_throughput"),
             cell(r, "tpot"), cell(r, "ttft")] for r in rep.rows]
    out = [table(["point", "engine", "chip", "role", "output tok/s meas / sim", "TPOT ms meas / sim",
                  "TTFT ms meas / sim"], rows)]
    summ = []
    for m, target in (("output_throughput", 0.15), ("tpot", 0.15), ("ttft", 0.25)):
        n_h, med_h = rep.summary("held-out", m)
        n_f, med_f = rep.summary("fit", m)
        summ.append([m, f"{n_h}", "-" if med_h is None else f"{med_h:.1%}", f"{target:.0%}",
                     "met" if med_h is not None and med_h <= target else "missed", f"{n_f}",
                     "-" if med_f is None else f"{med_f:.1%}"])
    out.append(table(["metric", "held-out points", "median |err|", "target", "", "fit points", "median |err|"],
                     summ))
    per = []
    for build in dict.fromkeys(build_of(r.point.raw) for r in rep.rows):
        cells = []
        for m in ("output_throughput", "tpot", "ttft"):
            n, med = rep.summary("held-out", m, build)
            cells.append("-" if med is None else f"{med:.1%} ({n})")
        per.append([build, *cells])
    out.append(table(["held out, by build", "output tok/s", "TPOT", "TTFT"], per))
    return "\n".join(out)


def main() -> None:
    """``python -m perfmodel.serve.validation --fit ENGINE``: print the fitted host overhead (to copy into
    perfmodel/data/calibration/serving.yaml with its fit points)."""
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "--fit":
        print(json.dumps(fit_host_overhead(sys.argv[2]), indent=1))
    else:
        print(report_text(run_serving_validation()))


def report_records(rep: ServingReport) -> list[dict]:
    return [{"id": r.point.id, "role": r.point.role, "engine": r.point.raw["engine"], "chip": r.point.raw["chip"],
             "values": {m: {"measured": a, "simulated": b, "error": b / a - 1.0} for m, (a, b) in r.values.items()},
             "source": r.point.source} for r in rep.rows]


if __name__ == "__main__":
    main()
