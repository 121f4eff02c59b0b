"""Speed of the roofline model as a library: one vectorized call over a million GEMM shapes.

Run: .venv/bin/python tests/benchmarks/bench_predict.py   (prints figures; not collected by pytest)
Target (issue 3): 1e6 GEMM shapes in < 1 s. The whole `perfmodel predict ...` process (issue 9: < 0.2 s)
is measured by bench_cli_speed.py.
"""

from __future__ import annotations

import statistics
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


def main() -> None:
    lib = library_sweep()
    print(f"library: {N_SHAPES:,} GEMM shapes (gemm + evaluate, int8 weights, tpu-v5e): "
          f"median {seconds(statistics.median(lib))}, best {seconds(min(lib))} over {REPEATS} runs (target < 1 s)")
    print("whole process (`perfmodel predict gemm ...`): see tests/benchmarks/bench_cli_speed.py")


if __name__ == "__main__":
    main()
