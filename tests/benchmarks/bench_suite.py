"""Wall time of the test loop: `make test` and `make compile-checks`, each with a cold cache and then warm.

Run: .venv/bin/python tests/benchmarks/bench_suite.py [--stages test,compile-checks] [--cache DIR]
(prints figures; not collected by pytest). Targets (issue 29), on 2 idle cores: `make test` <= 5 minutes;
`make ci` on a clean clone <= 25 minutes cold and <= 10 minutes warm.

How it measures: each stage runs twice in a row with PERFMODEL_CACHE_DIR set to a new, empty folder of its own
(under --cache DIR, default a new temporary folder): the first run is cold (every compile report and XLA:CPU program made afresh), the second warm
(served from what the first stored). The load average before each run is printed: on a busy machine every
figure is inflated. The figures for the README come from a clean clone (`git clone`, then this script).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS_S = {"test": 300.0}


def run_stage(stage: str, cache: str) -> tuple[float, int, str]:
    """(wall seconds, exit code, pytest's summary line) of one `make STAGE`."""
    env = {**os.environ, "PERFMODEL_CACHE_DIR": cache}
    t0 = time.perf_counter()
    proc = subprocess.run(["make", "-s", stage], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if " passed" in ln or " failed" in ln]
    return wall, proc.returncode, (lines[-1].strip("= ") if lines else proc.stderr.strip()[-200:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", default="test,compile-checks")
    ap.add_argument("--cache", default=None, help="cache folder (default: a new empty one)")
    args = ap.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="perfmodel-bench-suite-")
    print(f"cache: {cache}   cores: {os.cpu_count()}")
    print(f"{'stage':<16} {'cache':<5} {'wall':>9}  {'load':>5}  result")
    failed = False
    for stage in args.stages.split(","):
        for kind in ("cold", "warm"):
            load = os.getloadavg()[0]
            wall, code, summary = run_stage(stage, os.path.join(cache, stage))
            target = TARGETS_S.get(stage)
            verdict = "" if target is None else ("  PASS" if wall <= target else "  FAIL") + f" (<= {target / 60:.0f} min)"
            print(f"{stage:<16} {kind:<5} {wall / 60:>7.1f} min  {load:>5.2f}  {summary}{verdict}")
            failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
