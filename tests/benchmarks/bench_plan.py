"""Speed of perfmodel plan (issue target: a 1,000-configuration search of 2,000 requests each within 3 minutes on
2 cores). Runs a smaller search of the same kind (N configurations, default 40) on the local process pool and prints
the measured time per configuration and the projection to 1,000."""

from __future__ import annotations

import sys
import time

from perfmodel.plan.search import Slo, plan
from perfmodel.plan.space import SearchSpace
from perfmodel.serve.workload import Workload


def main(n: int = 40) -> None:
    conc = tuple(range(8, 8 + 8 * (n // 5), 8))[: max(n // 5, 1)]
    space = SearchSpace(chips=("tpu-v6e",), chip_counts=(4,), weight_dtypes=("bf16",), kv_cache_dtypes=("bf16",),
                        max_num_seqs=(256,), max_num_batched_tokens=(2048,), concurrencies=conc)
    w = Workload(num_prompts=2000, random_input_len=1024, random_output_len=128)
    t0 = time.perf_counter()
    r = plan("llama-3.1-8b", space, w, max_model_len=1152, slo=Slo(tpot_p90_ms=50), workers=2)
    dt = time.perf_counter() - t0
    k = len(r.outcomes)
    proj = dt / k * 1000
    print(f"{k} configurations x 2,000 requests (llama-3.1-8b, v6e-4 tp splits, 2 workers): {dt:.1f} s, "
          f"{dt / k:.2f} s each; 1,000 configurations: about {proj / 60:.1f} min "
          f"{'PASS' if proj <= 180 else 'FAIL'} (target 3 min)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
