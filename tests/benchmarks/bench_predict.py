"""Speed of the roofline model: a vectorized library sweep and the `perfmodel predict gemm` process.

Run: .venv/bin/python tests/benchmarks/bench_predict.py   (prints figures; not collected by pytest)
Targets (issue 3): 1e6 GEMM shapes in < 1 s; `perfmodel predict gemm ...` as a whole process < 0.3 s.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfmodel.hw import get_chip  # noqa: E402
from perfmodel.model.core import evaluate  # noqa: E402
from perfmodel.model.gemm import gemm  # noqa: E402
from perfmodel.units import seconds  # noqa: E402

N_SHAPES = 1_000_000
REPEATS = 5
CLI_ARGS = ["predict", "gemm", "--hw", "v5e", "-m", "8192", "-n", "8192", "-k", "8192"]


def library_sweep() -> list[float]:
    chip = get_chip("tpu-v5e")
    rng = np.random.default_rng(0)
    m, n, k = (rng.integers(1, 16384, N_SHAPES) for _ in range(3))
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        r = evaluate(gemm(m=m, n=n, k=k, rhs_dtype="int8", chip=chip), chip)
        times.append(time.perf_counter() - t0)
    assert r.floor_s.shape == (N_SHAPES,)
    return times


def cli_command() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "perfmodel"
    if exe.exists():
        return [str(exe)]
    python = ROOT / ".venv" / "bin" / "python"
    return [str(python if python.exists() else sys.executable), "-c",
            "from perfmodel.cli.main import main; main()"]


def cli_process() -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds of the child) per run; CPU time is what matters on a shared, loaded machine."""
    cmd = cli_command() + CLI_ARGS
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)  # warm the file cache
    walls, cpus = [], []
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return walls, cpus


def main() -> None:
    lib = library_sweep()
    print(f"library: {N_SHAPES:,} GEMM shapes (gemm + evaluate, int8 weights, tpu-v5e): "
          f"median {seconds(statistics.median(lib))}, best {seconds(min(lib))} over {REPEATS} runs (target < 1 s)")
    cli, cpu = cli_process()
    shown = " ".join(["perfmodel", *CLI_ARGS]) if shutil.which("perfmodel") or (ROOT / ".venv/bin/perfmodel").exists() \
        else "python -c 'from perfmodel.cli.main import main; main()' " + " ".join(CLI_ARGS)
    print(f"process: `{shown}`: median {seconds(statistics.median(cli))}, best {seconds(min(cli))} "
          f"over {REPEATS} runs (target < 0.3 s); CPU time median {seconds(statistics.median(cpu))}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
