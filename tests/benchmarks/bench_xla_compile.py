"""Compile time of whole model steps with the TPU compiler (deviceless), and the compiled vs analytic step.

Run: ``.venv/bin/python tests/benchmarks/bench_xla_compile.py`` [CASE ...] (no cache: every step compiles afresh;
CASE numbers pick cases, default all).
Prints, per case, the compile wall time, the compiled and analytic step times and the HBM footprint.
"""

from __future__ import annotations

import sys
import time

from perfmodel.hw.registry import get_chip
from perfmodel.units import nbytes, seconds

CASES = [
    ("llama-3.1-8b", "v6e", None, dict(phase="decode", batch=1, context=2048, tp=1)),
    ("llama-3.1-8b", "v6e", None, dict(phase="decode", batch=64, context=2048, tp=1)),
    # bf16 weights of 70B are 16.4 GiB per chip at TP 8, over v5e's 16 GiB: int8 weights (8.2 GiB) fit
    ("llama-3.1-70b", "v5e", "v5e:2x4", dict(phase="decode", batch=8, context=2048, tp=8, weight_dtype="int8")),
    # the bundled Pallas attention and cache write (ragged_paged_attention, kv_cache_update combined)
    ("llama-3.1-8b", "v6e", None, dict(phase="decode", batch=64, context=2048, tp=1, kernels="bundled")),
]


def main() -> None:
    import os
    import tempfile

    from perfmodel.xla.compare import compare_step

    os.environ["PERFMODEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-xla-")  # no cached entries
    print(f"cache: {os.environ['PERFMODEL_CACHE_DIR']}")
    only = set(sys.argv[1:])  # case numbers to run (default: all)
    for i, (model, chip, topo, params) in enumerate(CASES):
        if only and str(i) not in only:
            continue
        t0 = time.perf_counter()
        params = dict(params)
        kernels = params.pop("kernels", "jnp")
        c = compare_step(model, chip=get_chip(chip), topology=topo, kernels=kernels, **params)
        wall = time.perf_counter() - t0
        print(f"{model} {params['phase']} batch {params['batch']} ctx {params['context']} TP {params['tp']} "
              f"{params.get('weight_dtype', 'bf16')} weights, {kernels} attention on "
              f"{chip} ({c.program.topology}): compile {c.program.compile_s:.1f} s (wall {wall:.1f} s with the "
              f"child process); compiled step {seconds(c.compiled_s)} vs analytic {seconds(c.analytic_s)} "
              f"({c.compiled_s / c.analytic_s:.2f}x); HBM footprint {nbytes(c.program.hbm_footprint_bytes)}")


if __name__ == "__main__":
    main()
