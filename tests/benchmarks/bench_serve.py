"""Speed of the serving simulator (issue targets: 10,000 requests, random 1024 in / 1024 out, concurrency 256,
Llama-3.1-8B on v6e within 2 s on one core; a 16-point request-rate sweep within 15 s). Prints the figures."""

from __future__ import annotations

import time

from perfmodel.hw import get_chip
from perfmodel.model.configs import get_model
from perfmodel.serve.config import engine_config
from perfmodel.serve.run import simulate, sweep
from perfmodel.serve.workload import Workload


def main() -> None:
    cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_model_len=2048)
    w = Workload(num_prompts=10_000, random_input_len=1024, random_output_len=1024, max_concurrency=256)
    t0 = time.perf_counter()
    r = simulate(cfg, w)
    one = time.perf_counter() - t0
    print(f"10,000 requests 1024/1024 at concurrency 256 (llama-3.1-8b, v6e): {one:.2f} s "
          f"({r.run.stats.steps} engine steps, {r.run.stats.preemptions} preemptions) "
          f"{'PASS' if one <= 2.0 else 'FAIL'} (target 2 s)")
    rates = [0.5 * 1.5**i for i in range(15)] + [float("inf")]
    w2 = Workload(num_prompts=1000, random_input_len=1024, random_output_len=128)
    t0 = time.perf_counter()
    sweep(cfg, w2, "request_rate", rates)
    sw = time.perf_counter() - t0
    print(f"16-point request-rate sweep, 1,000 requests 1024/128 each: {sw:.2f} s "
          f"{'PASS' if sw <= 15.0 else 'FAIL'} (target 15 s)")


if __name__ == "__main__":
    main()
