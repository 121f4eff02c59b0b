"""The bundled matmul's variants through the real TPU compiler (deviceless): per variant and chip, bundles per grid
step, vector spills/fills per step, and the compiler-backed time against its floor.

Prints figures; not collected by pytest. Run: ``.venv/bin/python tests/benchmarks/bench_matmul_variants.py
[--chips tpu-v5e,tpu-v6e] [--variants bf16,w8a8,...] [--cases decode,prefill]``.

* decode: M=64, K=N=4096; floor = the weight bytes (and their scales) over the chip's HBM rate (the spec's
  ``hbm_bw_bytes_per_s_per_chip``); the issue's target is 1.3x.
* prefill: M=K=N=4096; floor = 2*M*N*K over the peak MXU rate of the dtype the MXU runs (int8 for w8a8, bf16 for
  every weight-only variant: their weights are converted to bf16 in VMEM); the issue's target is 1.15x.

Compiler-backed time: :func:`perfmodel.schedule.compiled.compiled_time` (per grid step, the larger of the
compiled body's bundles at the clock and the step's block DMAs at the achievable HBM rate, plus the first
step's copies and the last write-back). Each (variant, case, chip) is one compile through
:func:`perfmodel.schedule.inspection.compile_inspection` (cached by the compile cache).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

K = N = 4096
#: case -> M.
CASES = {"decode": 64, "prefill": 4096}
#: variant -> (w dtype, w_scale shape ("" none, "n" per channel, "g" blockwise), --arg texts, MXU dtype).
VARIANTS = {
    "bf16": ("bf16", "", (), "bf16"),
    "bf16 x int8": ("int8", "n", (), "bf16"),
    "bf16 x int8 blockwise": ("int8", "g", (), "bf16"),
    "w8a8": ("int8", "n", ("quantize_x=True",), "int8"),
    "w8a8 blockwise": ("int8", "g", ("quantize_x=True",), "int8"),
    "bf16 x int4": ("int4", "n", (), "bf16"),
    "bf16 x int4 blockwise": ("int4", "g", (), "bf16"),
}
#: Decode blocks (bm, bk, bn) per chip: None = the kernel's tuned defaults (clamped to M).
DECODE_BLOCKS: dict[str, tuple[int, int, int] | None] = {"tpu-v5e": (64, 2048, 1024), "tpu-v6e": (64, 2048, 1024)}
CHIPS = ("tpu-v5e", "tpu-v6e")


def _shapes(m: int, variant: str) -> list[str]:
    w_dtype, scale, _, _ = VARIANTS[variant]
    rows = K // 2 if w_dtype == "int4" else K  # int4: two per byte, [K/2, N] uint8
    w = f"w={rows}x{N}:{'uint8' if w_dtype == 'int4' else w_dtype}"
    shapes = [f"x={m}x{K}:bf16", w]
    if scale == "n":
        shapes.append(f"w_scale={N}:f32")
    elif scale == "g":
        shapes.append(f"w_scale={K // 128}x{N}:f32")
    return shapes


def measure(variant: str, case: str, chip_name: str) -> dict:
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.inspection import compile_inspection

    chip = get_chip(chip_name)
    m = CASES[case]
    w_dtype, scale, args, mxu_dtype = VARIANTS[variant]
    args = tuple(args) + (("w_dtype=int4",) if w_dtype == "int4" else ())
    blocks = DECODE_BLOCKS.get(chip.name) if case == "decode" else None
    block_map = dict(zip(("bm", "bk", "bn"), blocks)) if blocks else None
    row = {"variant": variant, "case": case, "chip": chip.name}
    try:
        got = compile_inspection("matmul", _shapes(m, variant), block_map, args, chip.name)
    except Exception as exc:  # a benchmark reports what failed and goes on
        return {**row, "error": str(exc).splitlines()[0][:160]}
    (ck,) = got.compiled_kernels
    loop = ck.compile.loop
    weight_bytes = K * N * {"bf16": 2, "int8": 1, "int4": 0.5}[w_dtype]
    weight_bytes += {"": 0, "n": N * 4, "g": (K // 128) * N * 4}[scale]
    if case == "decode":
        floor = weight_bytes / chip.memory.hbm_bw_bytes_per_s_per_chip
    else:
        floor = 2 * m * N * K / chip.matmul_rate(mxu_dtype)
    t = ck.time.expected_s
    return {**row, "blocks": blocks or "defaults", "step_bundles": ck.time.mean_step_bundles,
            "body_bundles": loop.always_bundles + loop.predicated_bundles, "spills": loop.vector_spills,
            "fills": loop.vector_fills, "steps": ck.steps, "time_s": t, "floor_s": floor, "ratio": t / floor}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", default=",".join(CHIPS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cases", default=",".join(CASES))
    a = p.parse_args(argv)
    from perfmodel.units import si

    print("| variant | case | chip | steps | bundles/step | spills/fills per step | compiled | floor | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        for variant in a.variants.split(","):
            for chip in a.chips.split(","):
                r = measure(variant, case, chip)
                if "error" in r:
                    print(f"| {variant} | {case} | {r['chip']} | FAIL: {r['error']} |||||")
                else:
                    print(f"| {variant} | {case} | {r['chip']} | {r['steps']} | {r['step_bundles']:,.0f} | "
                          f"{r['spills']}/{r['fills']} | {si(r['time_s'], 's')} | {si(r['floor_s'], 's')} | "
                          f"{r['ratio']:.2f}x |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
