"""Speed of `perfmodel tune` on every bundled kernel with block sizes, and of `analyze` on 8k-context ragged attention.

Run: .venv/bin/python tests/benchmarks/bench_tune.py [--repeats N] [--only KERNEL]   (prints figures; not collected
by pytest)
Targets (issue 9): `tune` ranks the candidates of any bundled kernel and shape up to 128k context in under 10 s;
`analyze` of an 8k-context ragged attention call in under 2 s.

Rows: `tune` at each kernel's production shape (its catalog entry's production call, else the problem its
defaults are tuned on) and, for the kernels with a context dimension (flash, paged and ragged paged attention),
at 128k context; then the `analyze` rows of bench_analyze.py. Figures are in-process wall times of the library
calls (`perfmodel.schedule.tune.tune`, `perfmodel.schedule.analyze.analyze`) on tpu-v5e, after one warm-up call
and with JAX's trace caches cleared before each run, so every run traces its kernels as a new process would;
starting Python and importing JAX (printed once) comes on top for a command line run.
Each row also says where its time went: tracing the kernel with jax (per candidate) against the schedule model.
The load average is printed: on a busy machine every figure is inflated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_t0 = time.perf_counter()
import jax  # noqa: E402,F401

IMPORT_S = time.perf_counter() - _t0

from bench_analyze import ragged_8k_rows, timed, verdict  # noqa: E402

from perfmodel.schedule import analyze as analyze_module  # noqa: E402
from perfmodel.schedule.catalog import bundled, tuned_kernels  # noqa: E402
from perfmodel.schedule.tune import tune  # noqa: E402
from perfmodel.units import seconds, table  # noqa: E402

CHIP = "tpu-v5e"
TUNE_TARGET_S = 10.0

#: 128k-context calls of the kernels with a context dimension. Ragged: 8 sequences of 2 new tokens (16 query
#: tokens, the smallest bf16 q block) over 16-token pages; paged: decode of 8 sequences; flash: a causal prefill.
LONG_CONTEXT: dict[str, tuple[str, tuple[str, ...]]] = {
    "flash_attention": ("causal prefill 128k, GQA 4", (
        "q=1x32x131072x128:bf16", "k=1x8x131072x128:bf16", "v=1x8x131072x128:bf16")),
    "paged_attention": ("decode 8 seqs x 128k", (
        "q=8x32x128:bf16", "k_pages=8x65536x16x128:bf16", "v_pages=8x65536x16x128:bf16",
        "page_table=8x8192:int32=arange", "lengths=8:int32=131072")),
    "ragged_paged_attention": ("8 seqs x 2 new tokens, 128k context", (
        "q=16x32x128:bf16", "kv_pages=65536x16x16x128:bf16",
        "kv_lens=8:int32=131072", "page_table=8x8192:int32=arange", "cu_q_lens=9:int32=arange*2",
        "num_seqs=1:int32=8")),
}


def production(entry) -> tuple[str, tuple[str, ...]]:
    """(label, --shape texts) of a kernel's production-sized call."""
    if entry.production is not None:
        return entry.production.label, tuple(entry.production.shapes)
    for t in tuned_kernels():
        if t.entry == entry.name:
            return f"{t.kernel} tuned problem ({t.configs[0].key})", tuple(t.configs[0].shapes)
    return f"{entry.name} example", tuple(entry.example)


class _TraceClock:
    """Seconds spent in jax tracing (the trace step of analyze) while active."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._orig = analyze_module.trace

    def __enter__(self) -> "_TraceClock":
        def timed_trace(*a, **k):
            t0 = time.perf_counter()
            try:
                return self._orig(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        analyze_module.trace = timed_trace
        return self

    def __exit__(self, *exc) -> None:
        analyze_module.trace = self._orig


def tune_rows(repeats: int, only: str | None) -> list[list[str]]:
    rows = []
    for entry in bundled():
        if not entry.tunable or (only and entry.name != only):
            continue
        cases = [production(entry)]
        if entry.name in LONG_CONTEXT:
            cases.append(LONG_CONTEXT[entry.name])
        for label, shapes in cases:
            results, traced = [], []

            def run() -> None:
                with _TraceClock() as clock:
                    results.append(tune(entry, shapes, CHIP))
                traced.append(clock.seconds)

            times = timed(run, repeats, cold=True)
            med = statistics.median(times)
            r = results[-1]
            best = r.ranked[0].label if r.ranked else "(none legal)"
            rows.append([f"tune {entry.name}, {label}", f"{r.evaluated} / {r.pruned}", seconds(med),
                         seconds(statistics.median(traced)), seconds(TUNE_TARGET_S), verdict(med, TUNE_TARGET_S),
                         best])
            print(f"  {rows[-1][0]}: {rows[-1][2]}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs per tune row (median printed)")
    ap.add_argument("--only", help="one kernel's tune rows (and the analyze rows)")
    args = ap.parse_args()
    # Warm-up: JAX's CPU backend, the registry and the kernels' modules load once per process.
    tune("rms_norm", ["x=64x256:bf16", "residual=64x256:bf16", "weight=256:f32"], CHIP)
    rows = tune_rows(args.repeats, args.only)
    print(f"tune on {CHIP}: in-process wall time (median of {args.repeats}); "
          f"evaluated / pruned candidates; time in jax tracing of the kernels")
    print(table(["call", "eval / pruned", "wall", "tracing", "target", "", "best"], rows))
    print()
    print(table(["call", "steps", "median", "best", "target", ""], ragged_8k_rows()))
    print()
    print(f"importing jax: {seconds(IMPORT_S)} (once per process); load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
