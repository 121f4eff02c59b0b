"""The bundled grouped matmul (mixture of experts) through the real TPU compiler (deviceless): per variant, case and
chip, bundles per grid step, vector spills/fills per step, and the compiler-backed time against its floor.

Prints figures; not collected by pytest. Run: ``.venv/bin/python tests/benchmarks/bench_grouped_matmul.py
[--chips tpu-v5e,tpu-v6e] [--variants bf16,bf16 x int8] [--cases decode,large]``.

The problem: 8 experts, K = 4096 -> N = 14336 (Mixtral-8x7B's gate/up projection), token rows sorted by expert
and split evenly.

* decode: M = 64 token rows (8 per expert); floor = the 8 experts' weight bytes (and their scales) over the chip's
  HBM rate (the spec's ``hbm_bw_bytes_per_s_per_chip``); the issue's target is 1.3x.
* large: M = 8192 (1024 per expert); floor = 2*M*N*K over the peak MXU rate of the dtype the MXU runs (bf16: int8
  and fp8 weights are converted to bf16 in VMEM); the issue's target is 1.15x.

Compiler-backed time: :func:`perfmodel.schedule.compiled.compiled_time` through
:func:`perfmodel.schedule.inspection.compile_inspection` (per grid step the larger of the compiled body's bundles at
the clock and the step's block DMAs at the achievable HBM rate, plus the first step's copies and the last
write-back; cached by the compile cache).
"""

from __future__ import annotations

import argparse
import os
import sys

from kernels.grouped_matmul.entry import EXPERTS, HIDDEN as K, WIDTH as N
from kernels.grouped_matmul.variants import BY_NAME, VARIANTS

os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: case -> M (token rows, split evenly over the experts).
CASES = {"decode": 64, "large": 8192}
#: Variants run by default (kernels/grouped_matmul/variants.py; fp8: ``--variants "bf16 x fp8" --chips tpu-v6e``,
#: tpu-v5e has no fp8 MXU path).
DEFAULT_VARIANTS = tuple(v.name for v in VARIANTS if v.rhs != "fp8")
CHIPS = ("tpu-v5e", "tpu-v6e")


def measure(variant: str, case: str, chip_name: str, blocks: tuple[int, int, int] | None = None) -> dict:
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.inspection import compile_inspection

    chip = get_chip(chip_name)
    m, v = CASES[case], BY_NAME[variant]
    block_map = dict(zip(("bm", "bk", "bn"), blocks)) if blocks else None
    row = {"variant": variant, "case": case, "chip": chip.name}
    try:
        got = compile_inspection("grouped_matmul", list(v.shapes(m, K, N, experts=EXPERTS)), block_map, (), chip.name)
    except Exception as exc:  # a benchmark reports what failed and goes on
        return {**row, "error": str(exc).splitlines()[0][:160]}
    (ck,) = got.compiled_kernels
    loop = ck.compile.loop
    weight_bytes = EXPERTS * K * N * v.rhs_itemsize + (EXPERTS * N * 4 if v.scaled else 0)
    if case == "decode":
        floor = weight_bytes / chip.memory.hbm_bw_bytes_per_s_per_chip
    else:
        floor = 2 * m * N * K / chip.matmul_rate("bf16")
    t = ck.time.expected_s
    if blocks is None:  # the kernel's defaults (its tuned decode entry at M <= 64), clamped to the problem
        from kernels.grouped_matmul.blocks import default_block_sizes

        d = default_block_sizes(chip.name, v.lhs, v.rhs, m=m)
        blocks = (min(d.bm, m), min(d.bk, K), min(d.bn, N))
    return {**row, "blocks": "x".join(map(str, blocks)),
            "step_bundles": ck.time.mean_step_bundles, "spills": loop.vector_spills, "fills": loop.vector_fills,
            "steps": ck.steps, "time_s": t, "floor_s": floor, "ratio": t / floor}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", default=",".join(CHIPS))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--blocks", default=None, help="bm,bk,bn for every row (default: the kernel's tuned defaults, decode ones at M <= 64)")
    a = p.parse_args(argv)
    from perfmodel.units import si

    blocks = tuple(int(v) for v in a.blocks.split(",")) if a.blocks else None
    print("| variant | case | chip | blocks | steps | bundles/step | spills/fills per step | compiled | floor | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        for variant in a.variants.split(","):
            for chip in a.chips.split(","):
                r = measure(variant, case, chip, blocks)
                if "error" in r:
                    print(f"| {variant} | {case} | {r['chip']} | FAIL: {r['error']} ||||||")
                else:
                    print(f"| {variant} | {case} | {r['chip']} | {r['blocks']} | {r['steps']} | "
                          f"{r['step_bundles']:,.0f} | {r['spills']}/{r['fills']} | {si(r['time_s'], 's')} | "
                          f"{si(r['floor_s'], 's')} | {r['ratio']:.2f}x |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
