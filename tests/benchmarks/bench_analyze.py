"""Speed of the kernel-schedule model on million-step grids, and its calibration against published timings.

Run: .venv/bin/python tests/benchmarks/bench_analyze.py   (prints figures; not collected by pytest)
Target (issue 5): a grid of a million steps analyzed in well under a second.

Two figures per kernel: the schedule model alone on an already-traced pallas_call
(index maps at every step, pipeline simulation, body work, timing), and the whole
`analyze(fn, *args)` call including jax tracing.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import yaml  # noqa: E402
from jax.experimental.pallas.ops.tpu import flash_attention as fa  # noqa: E402
from jax.experimental.pallas.ops.tpu import matmul as jmm  # noqa: E402

from perfmodel.schedule.analyze import analyze, analyze_call, resolve_chip  # noqa: E402
from perfmodel.schedule.extract import find_pallas_calls, trace  # noqa: E402
from perfmodel.units import seconds, table  # noqa: E402

REPEATS = 5


def _cases():
    mm_x = jax.ShapeDtypeStruct((16384, 8192), jnp.bfloat16)
    mm_y = jax.ShapeDtypeStruct((8192, 16384), jnp.bfloat16)
    q = jax.ShapeDtypeStruct((8, 32, 8192, 128), jnp.bfloat16)
    fa_blocks = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return [
        ("jax matmul 16384x8192x16384, 128^3 blocks", lambda a, b: jmm.matmul(a, b, block_shape=(128, 128), block_k=128),
         (mm_x, mm_y)),
        ("jax flash attention causal 8x32x8192x128, 128 blocks",
         lambda a, b, c: fa.flash_attention(a, b, c, causal=True, block_sizes=fa_blocks), (q, q, q)),
    ]


def speed() -> None:
    chip = resolve_chip("tpu-v5e")
    for label, fn, args in _cases():
        call = find_pallas_calls(trace(fn, *args))[0]
        model, full = [], []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            analyze_call(call, chip)
            model.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            analyze(fn, *args, chip=chip)
            full.append(time.perf_counter() - t0)
        print(f"{label}: {call.steps:,} grid steps; schedule model median {seconds(statistics.median(model))} "
              f"(best {seconds(min(model))}); analyze() incl. tracing median {seconds(statistics.median(full))} "
              f"over {REPEATS} runs (target well under 1 s)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def calibration() -> None:
    data = yaml.safe_load((ROOT / "perfmodel/data/validation/tpu_v5e_matmul.yaml").read_text())
    rows = []
    for p in (p for p in data["points"] if p["kernel"] == "pallas"):
        x = jax.ShapeDtypeStruct((p["m"], p["k"]), jnp.bfloat16)
        y = jax.ShapeDtypeStruct((p["k"], p["n"]), jnp.bfloat16)
        k = analyze(jmm.matmul, x, y, chip=data["chip"], block_shape=(p["bm"], p["bn"]), block_k=p["bk"]).kernels[0]
        measured = p["measured_ms"] * 1e-3
        rows.append([f"{p['m']}^3", f"{p['bm']}x{p['bk']}x{p['bn']}", seconds(measured), seconds(k.time.expected_s),
                     f"{k.time.expected_s / measured - 1:+.1%}", seconds(k.time.expected_wall_s),
                     f"{k.time.expected_wall_s / measured - 1:+.1%}", k.time.limiter,
                     "yes" if k.time.dispatch_dominated else "no"])
    print()
    print(f"TPU v5e, JAX Pallas TPU matmul guide ({data['source']['url']}), bf16:")
    print(table(["M=N=K", "bm x bk x bn", "published", "expected", "err", "+dispatch", "err", "limiter",
                 "dispatch-dominated"], rows))


if __name__ == "__main__":
    speed()
    calibration()
