"""Whole-process speed of `perfmodel predict gemm` and `perfmodel predict model`, next to llm-analysis.

Run: .venv/bin/python tests/benchmarks/bench_cli_speed.py [--runs N]   (prints figures; not collected by pytest)
Target (issue 9): each command under 0.2 s as a whole process on an idle machine (median of N runs).

Reference: llm-analysis (`pip install llm-analysis`; not a perfmodel dependency, skipped when missing):
`python -m llm_analysis.analysis infer` for one model config, the same kind of work (one model's inference
estimate from a command line, offline). It ships no TPU or Llama-3.1 configs, so it gets the Llama-3.1-8B
shape of perfmodel's own preset as a local config JSON and its bundled `a100-sxm-80gb` GPU config. Without
`transformers` installed it skips importing it (and logs a warning): that is its fastest configuration, so
the ratio is a conservative one.

How it measures: the commands run in rounds (one run of each per round, so a change in machine load hits them
alike) after one warm-up run each; figures are the median wall time (PASS/FAIL is on it), the best run (near
what an idle machine gives) and the median CPU time of the child.
Children run with bytecode caching on (PYTHONDONTWRITEBYTECODE removed), as an installed package does, and
with a spec cache of their own: the first, cold run (empty cache: the YAML specs are parsed) is printed
separately. The load average is printed: on a busy machine every figure is inflated.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TARGET_S = 0.2
GEMM_ARGS = ["predict", "gemm", "--hw", "v5e", "-m", "8192", "-n", "8192", "-k", "8192"]
MODEL_ARGS = ["predict", "model", "llama-3.1-8b", "--hw", "v5e"]
LLMA_GPU = "a100-sxm-80gb"


def perfmodel_command() -> tuple[list[str], str]:
    """The installed console script next to this interpreter, else the entry point through python -c."""
    exe = Path(sys.executable).parent / "perfmodel"
    if exe.exists():
        return [str(exe)], "perfmodel"
    return [sys.executable, "-c", "from perfmodel.cli.main import main; main()"], \
        "python -c 'from perfmodel.cli.main import main; main()'"


def llm_analysis_config(workdir: Path) -> Path:
    """perfmodel's llama-3.1-8b preset as an llm-analysis ModelConfig JSON."""
    from perfmodel.model.configs import get_model

    cfg = get_model("llama-3.1-8b")
    data = {
        "name": "llama-3.1-8b", "num_layers": cfg.num_layers, "n_head": cfg.num_q_heads,
        "hidden_dim": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_key_value_heads": cfg.num_kv_heads,
        # llm-analysis asserts ffn % hidden == 0 unless the (fractional) expansion ratio is given too
        "ffn_embed_dim": cfg.intermediate_size, "expansion_ratio": cfg.intermediate_size / cfg.hidden_size,
        "model_type": "llama",
    }
    path = workdir / "llama-3.1-8b.json"
    path.write_text(json.dumps(data))
    return path


def llm_analysis_command(workdir: Path) -> tuple[list[str] | None, str]:
    """(command, description), or (None, why it is skipped)."""
    if importlib.util.find_spec("llm_analysis") is None:
        return None, "skipped: pip install llm-analysis (not a perfmodel dependency)"
    cmd = [sys.executable, "-m", "llm_analysis.analysis", "infer", "--model_name", str(llm_analysis_config(workdir)),
           "--gpu_name", LLMA_GPU, "--batch_size_per_gpu", "1", "--seq_len", "1024",
           "--num_tokens_to_generate", "1", "--log_level", "ERROR"]
    probe = subprocess.run(cmd, capture_output=True, text=True)
    if probe.returncode != 0 or not probe.stdout.lstrip().startswith("{"):
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"skipped: llm-analysis is installed but `infer` failed ({last})"
    transformers = importlib.util.find_spec("transformers") is not None
    shown = (f"python -m llm_analysis.analysis infer --model_name llama-3.1-8b.json --gpu_name {LLMA_GPU} "
             f"--batch_size_per_gpu 1 --seq_len 1024 --num_tokens_to_generate 1"
             f" [transformers {'installed: imported too' if transformers else 'not installed: not imported'}]")
    return cmd, shown


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run; a failing command stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"`{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="measured runs of each command (default 15)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="perfmodel-bench-cli-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PERFMODEL_CACHE_DIR=str(workdir / "cache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pm, pm_shown = perfmodel_command()
    cases = {"gemm": pm + GEMM_ARGS, "model": pm + MODEL_ARGS}
    llma_cmd, llma_shown = llm_analysis_command(workdir)
    if llma_cmd is not None:
        cases["llm-analysis"] = llma_cmd

    # Cold: empty spec cache (bytecode from a throwaway run of an unrelated command, so only the cache is cold).
    subprocess.run(pm + ["--version"], cwd=ROOT, env=env, capture_output=True)
    cold = {name: run_once(cmd, env)[0] for name, cmd in cases.items() if name != "llm-analysis"}
    for cmd in cases.values():
        run_once(cmd, env)  # warm-up
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, cmd in cases.items():
            wall, cpu = run_once(cmd, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    shutil.rmtree(workdir, ignore_errors=True)

    load = os.getloadavg()[0]
    ncpu = os.cpu_count() or 1
    print(f"whole-process time, median of {args.runs} runs (load average {load:.1f} on {ncpu} CPUs"
          + ("; the machine is busy: figures are inflated" if load > 0.25 * ncpu else "") + ")")
    ref = statistics.median(walls["llm-analysis"]) if "llm-analysis" in walls else None
    for name, shown_args in (("gemm", GEMM_ARGS), ("model", MODEL_ARGS)):
        wall = statistics.median(walls[name])
        verdict = "PASS" if wall < TARGET_S else "FAIL"
        vs = f"; {wall / ref:.2f}x llm-analysis's time" if ref else ""
        print(f"  `{pm_shown} {' '.join(shown_args)}`: {wall:.3f} s wall (best {min(walls[name]):.3f} s; CPU "
              f"{statistics.median(cpus[name]):.3f} s; first run, cold spec cache {cold[name]:.3f} s) "
              f"target < {TARGET_S} s: {verdict}{vs}")
    if ref is not None:
        print(f"  llm-analysis `{llma_shown}`: {ref:.3f} s wall (best {min(walls['llm-analysis']):.3f} s; "
              f"CPU {statistics.median(cpus['llm-analysis']):.3f} s)")
    else:
        print(f"  llm-analysis: {llma_shown}")


if __name__ == "__main__":
    main()
