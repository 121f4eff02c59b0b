"""Speed of the compiler in the loop (prints figures; not collected by pytest).

Compile report of production-shape kernels cold (a fresh cache) and from the cache, and `tune --compile` of 8
candidates. Goals (issue 8): under 30 s cold, under 0.5 s cached, tune --compile of 8 under 2 minutes.
"""

import os
import subprocess
import sys
import tempfile
import time

os.environ["PERFMODEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="perfmodel-bench-cache-")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from perfmodel.compiler.api import compile_report  # noqa: E402
from perfmodel.harness.compile_matrix import CASES  # noqa: E402


def main() -> None:
    for case in CASES:
        t = time.perf_counter()
        r = compile_report(case.call, "tpu-v5e")
        cold = time.perf_counter() - t
        t = time.perf_counter()
        compile_report(case.call, "tpu-v5e")
        warm = time.perf_counter() - t
        print(f"{case.name:56s} cold {cold:6.1f} s  cached {warm * 1e3:6.0f} ms  compiled={r.compiled}")
    cmd = [sys.executable, "-m", "perfmodel.cli.main", "inspect", "matmul", "--compile", "--hw", "v5e",
           "--shape", "x=8192x4096:bf16", "--shape", "w=4096x14336:bf16"]
    for label in ("cold", "cached"):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        print(f"perfmodel inspect matmul --compile ({label}, whole CLI process incl. jax import and the analytic "
              f"trace): {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "perfmodel.cli.main", "tune", "matmul", "--hw", "v5e",
                    "--shape", "x=4096x4096:bf16", "--shape", "w=4096x4096:bf16", "--compile", "8"],
                   check=True, capture_output=True)
    print(f"perfmodel tune matmul --compile 8 (cold): {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
