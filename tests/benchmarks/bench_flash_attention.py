"""flash_attention vs JAX's flash attention, compiled for TPU (deviceless libtpu): bundles per head-step.

Both kernels are compiled on the same causal 8k-token prefill, bf16, head_dim 128:

* JAX's kernel (``jax.experimental.pallas.ops.tpu.flash_attention``, the ``jax-flash-attention`` catalog entry)
  is MHA only: 32 q heads and 32 K/V heads, blocks block_q = block_k = TILE. One grid step is one head's
  TILE x TILE tile; its figure is the grid-step loop body (it masks every block; the causal skip is a guard).
* The bundled kernel on the same MHA problem with block_q = block_kv = block_kv_compute = TILE: one grid step is
  one head's tile too. Its body has separate paths (unmasked interior block, masked diagonal block, skipped
  block); a step's figure is the bundles every step runs plus its path.
* The bundled kernel at its tuned defaults on Llama-3-8B's GQA 4 (32 q / 8 kv heads): a grid step holds 4 heads
  and several compute slices; bundles per head-step are the step's path (inner loops counted per trip) over
  the number of (head, TILE x TILE) tiles it covers.

Also printed: the floor of one head's tile in cycles, the larger of its MXU work (2 x 2 x TILE^2 x head_dim
FLOPs at the chip's bf16 matmul rate) and its exps (TILE^2 at the EUP rate), from hwspecs/*.yaml (sources there),
and the compile time of the bundled kernel at 8k (the issue's target: under 30 s on v5e).
Not collected by pytest; run ``.venv/bin/python tests/benchmarks/bench_flash_attention.py [CHIP ...]``
(default tpu-v5e; a few compiles of ~10 s each on 2 cores, cached afterwards).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

# The compile cache digests the kernel's source only where the repository is on sys.path (a script's sys.path[0]
# is its own folder): without this, an edited kernel would be answered from the cache.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("PERFMODEL_CACHE_DIR", tempfile.mkdtemp(prefix="perfmodel-bench-flash-"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from perfmodel.compiler.api import CompileCall, compile_report  # noqa: E402
from perfmodel.compiler.bundles import build_schedule, loop_stats  # noqa: E402
from perfmodel.hw.registry import get_chip  # noqa: E402

CONTEXT, Q_HEADS, HEAD_DIM, TILE = 8192, 32, 128, 512
#: One saved body line: address, optional control marker, '>' per loop depth, the bundle.
_ROW = re.compile(r"^(\s*0x[0-9a-f]+) (?:([A-Z]{2}):|   ) (>*) ?(\{.*)$")


def shapes(kv_heads: int) -> tuple[str, ...]:
    return (f"q=1x{Q_HEADS}x{CONTEXT}x{HEAD_DIM}:bf16", f"k=1x{kv_heads}x{CONTEXT}x{HEAD_DIM}:bf16",
            f"v=1x{kv_heads}x{CONTEXT}x{HEAD_DIM}:bf16")


def body_schedule(report):
    """The grid-step loop body the compile report saved, re-read as a schedule (its own loops and regions)."""
    kernel = report.kernels[0]
    lines = []
    for line in open(kernel.body_bundles_path, encoding="utf-8"):
        m = _ROW.match(line)
        if m:  # back to the compiler's own layout, which build_schedule reads
            addr, marker, depth, rest = m.groups()
            line = f"{addr} {marker + ':' if marker else ':'} {depth} {rest}\n"
        lines.append(line)
    return build_schedule("".join(lines))


def path_bundles(report) -> tuple[int, list[int]]:
    """(bundles every step runs, weighted bundles of each outermost predicated region) of the grid-step body."""
    sched = body_schedule(report)
    body = [lp for lp in sched.top_loops() if lp.bundles == len(sched.bundles)]
    stats = loop_stats(sched, body[0] if body else None)
    lo = body[0].start if body else 0
    weight = [1] * len(sched.bundles)
    for lp in sched.loops:
        if body and lp is body[0]:
            continue
        for i in range(lp.start, lp.end + 1):
            weight[i] *= lp.trip_count or 1
    regions, last = [], -1
    for r in sorted(sched.regions, key=lambda r: (r.first, -r.last)):
        if r.first <= last or r.bundles >= 0.75 * len(sched.bundles) or r.branch < lo:
            continue
        regions.append(sum(weight[r.first:r.last + 1]))
        last = r.last
    return stats.always_bundles, regions


def tile_floor_cycles(chip_name: str) -> tuple[float, float]:
    """(MXU, EUP) cycles of one head's TILE x TILE tile: QK^T and PV FLOPs, one exp per score."""
    compute = get_chip(chip_name).compute
    mxu = 2 * 2 * TILE * TILE * HEAD_DIM / compute.matmul_flops_per_s_per_chip["bf16"] * compute.clock_hz
    eup = TILE * TILE / compute.eup_ops_per_s_per_chip * compute.clock_hz
    return mxu, eup


def main(chips: list[str]) -> None:
    print(f"causal prefill, {CONTEXT} tokens, {Q_HEADS} q heads of {HEAD_DIM}, bf16; per-head tile "
          f"{TILE} x {TILE}")
    print(f"{'kernel':44s} {'chip':8s} {'compile s':>9s} {'every step':>10s} {'paths (per step)':>28s} "
          f"{'per head-step':>13s}")
    for chip in chips:
        mxu, eup = tile_floor_cycles(chip)
        print(f"{chip}: one head's tile floor {max(mxu, eup):,.0f} cycles (MXU {mxu:,.0f}, EUP {eup:,.0f})")
        jax_call = CompileCall(kind="catalog", target="jax-flash-attention", shapes=shapes(Q_HEADS),
                               blocks={"block_q": TILE, "block_k": TILE})
        ours_mha = CompileCall(kind="catalog", target="flash_attention", shapes=shapes(Q_HEADS),
                               blocks={"block_q": TILE, "block_kv": TILE, "block_kv_compute": TILE})
        ours_gqa = CompileCall(kind="catalog", target="flash_attention", shapes=shapes(8))
        for label, call, heads_per_step in (("jax flash_attention (MHA)", jax_call, 1),
                                            ("bundled flash_attention (MHA, same tile)", ours_mha, 1),
                                            ("bundled flash_attention (GQA 4, defaults)", ours_gqa, None)):
            report = compile_report(call, chip)
            if not report.compiled:
                print(f"{label:44s} {chip:8s} does not compile: {report.error}")
                continue
            always, regions = path_bundles(report)
            name = report.kernels[0].hlo_name
            if heads_per_step is None:  # tiles of TILE x TILE per head in one step, from the kernel's name
                m = re.search(r"bq(\d+)_bkv(\d+)", name)
                heads_per_step = 4 * (int(m.group(1)) * int(m.group(2))) / TILE**2
            big = sorted(regions)[-2:] if "bundled" in label else []
            paths = " / ".join(f"{always + r:,}" for r in big) or f"{always:,}"
            worst = (always + max(big, default=0)) / heads_per_step
            print(f"{label:44s} {chip:8s} {report.compile_s:9.1f} {always:10,d} {paths:>28s} {worst:13,.0f}")
        print(f"  ({name}: regions {regions})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["tpu-v5e"]))
