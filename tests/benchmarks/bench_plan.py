"""Speed of perfmodel plan (issue targets: a 1,000-configuration search of 2,000 requests each within 3 minutes on
2 cores; scaling >= 1.8x from 1 to 2 workers). Runs one search -- Llama-3.1-8B on v6e slices of 1, 4 and 8 chips
(every TP/DP split), bf16/int8 weights and KV, two max-num-seqs, two token budgets and ``N`` concurrencies
(default 8: 1,024 configurations) of 2,000 random 1024/128 requests each -- in process, on a 2-worker process pool
and on a local 2-worker Ray, and prints the time, configurations per second and the scaling of each."""

from __future__ import annotations

import sys
import time

from perfmodel.plan.search import Slo, plan
from perfmodel.plan.space import SearchSpace
from perfmodel.serve.workload import Workload


def _search(n_conc: int, **backend) -> tuple[int, float]:
    space = SearchSpace(chips=("tpu-v6e",), chip_counts=(1, 4, 8), weight_dtypes=("bf16", "int8"),
                        kv_cache_dtypes=("bf16", "int8"), max_num_seqs=(128, 256),
                        max_num_batched_tokens=(1024, 2048), concurrencies=tuple(8 * 2**i for i in range(n_conc)))
    w = Workload(num_prompts=2000, random_input_len=1024, random_output_len=128)
    t0 = time.perf_counter()
    r = plan("llama-3.1-8b", space, w, max_model_len=1152, slo=Slo(tpot_p90_ms=50), **backend)
    return len(r.outcomes), time.perf_counter() - t0


def main(n_conc: int = 8) -> None:
    rates = {}
    for label, backend in (("1 worker (in process)", dict(backend="inprocess")),
                           ("2 workers (process pool)", dict(backend="process", workers=2)),
                           ("2 workers (local Ray)", dict(backend="ray", workers=2, address="auto"))):
        try:
            if backend["backend"] == "ray":  # start the local cluster and its workers first, as a cluster would be
                t0 = time.perf_counter()
                _search(1, **backend)
                print(f"(local Ray start-up and a {128}-configuration warm-up: {time.perf_counter() - t0:.1f} s, "
                      "not counted)")
            k, dt = _search(n_conc, **backend)
        except Exception as exc:  # Ray not installed: say so, keep the other figures
            print(f"{label}: not run ({exc})")
            continue
        rates[label] = k / dt
        verdict = f" {'PASS' if dt <= 180 else 'FAIL'} (target 3 min)" if k >= 1000 else ""
        print(f"{label}: {k} configurations x 2,000 requests in {dt:.1f} s, {k / dt:.2f} configurations/s{verdict}")
    one = rates.get("1 worker (in process)")
    for label in ("2 workers (process pool)", "2 workers (local Ray)"):
        if one and label in rates:
            x = rates[label] / one
            print(f"scaling 1 -> {label}: {x:.2f}x {'PASS' if x >= 1.8 else 'FAIL'} (target 1.8x)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
