"""The bundled matmul's variants through the real TPU compiler (deviceless): per variant and chip, bundles per grid
step, vector spills/fills per step, and the compiler-backed time against its floor.

Prints figures; not collected by pytest. Run: ``.venv/bin/python tests/benchmarks/bench_matmul_variants.py
[--chips tpu-v5e,tpu-v6e] [--variants bf16,w8a8,...] [--cases decode,prefill]``.

* decode: M=64, K=4096, N=14336 (a Llama-3-8B MLP up-projection, 64 sequences) at the kernel's tuned decode
  defaults; floor = the weight bytes (and their scales) over the chip's HBM rate (the spec's
  ``hbm_bw_bytes_per_s_per_chip``); the issue's target is 1.3x. Two ratios: "step compute / HBM" is a grid step's
  compute (its bundles at the clock) over the time its weight tile takes at that HBM rate (the kernel stays
  HBM-bound while it is under 1); "ratio" is the whole call's compiler-backed time over the floor.
* prefill: M=K=N=8192 (the problem the square defaults are tuned on) at the tuned defaults; floor = 2*M*N*K
  over the peak MXU rate of the dtype the MXU runs ("MXU": int8 for w8a8 and w4a8, bf16 for every weight-only
  variant, whose weights are converted to bf16 in VMEM, and for blockwise w8a8 / w4a8 where the kernel holds the
  codes in bf16, kernels.matmul.rules.blockwise_codes_on_bf16_mxu); the issue's target is 1.15x; "vs int8 floor"
  is the int8 x int8 rows' time over the int8 MXU floor whichever MXU runs them.

Compiler-backed time: :func:`perfmodel.schedule.compiled.compiled_time` (per grid step, the larger of the
compiled body's bundles at the clock and the step's block DMAs at the achievable HBM rate, plus the first
step's copies and the last write-back). Each (variant, case, chip) is one compile through
:func:`perfmodel.schedule.inspection.compile_inspection` (cached by the compile cache).
"""

from __future__ import annotations

import argparse
import os
import sys

from kernels.matmul.variants import BF16_VARIANTS

os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: case -> (M, K, N).
CASES = {"decode": (64, 4096, 14336), "prefill": (8192, 8192, 8192)}
#: The variants of bf16 activations, by name (kernels/matmul/variants.py).
VARIANTS = {v.name: v for v in BF16_VARIANTS}
CHIPS = ("tpu-v5e", "tpu-v6e")
W_BYTES = {"bf16": 2, "int8": 1, "fp8": 1, "int4": 0.5}


def _plan(variant: str, case: str, chip: str):
    """The kernel's plan of the call at its default blocks (its tuned table, clamped to the problem)."""
    import jax
    import jax.numpy as jnp

    from kernels.matmul.plan import make_plan
    from perfmodel.schedule.shapes import parse_shape

    m, k, n = CASES[case]
    v = VARIANTS[variant]
    arrays = {s.name: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype)) for s in map(parse_shape, v.shapes(m, k, n))}
    return make_plan(arrays.pop("x"), arrays.pop("w"), **arrays, **v.static(), chip=chip)


def measure(variant: str, case: str, chip_name: str) -> dict:
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.inspection import compile_inspection

    chip = get_chip(chip_name)
    m, k, n = CASES[case]
    v = VARIANTS[variant]
    # The MXU dtype of the floor: int8 with quantize_activations, bf16 for every weight-only variant (converted in
    # VMEM).
    mxu_dtype = "int8" if v.quantize_activations else "bf16"
    args = tuple(f"{name}={value}" for name, value in v.static().items())
    row = {"variant": variant, "case": case, "chip": chip.name}
    if v.w == "fp8" and "fp8" not in chip.compute.matmul_flops_per_s_per_chip:
        return {**row, "skip": "no fp8 MXU path"}
    try:
        got = compile_inspection("matmul", list(v.shapes(m, k, n)), None, args, chip.name)
    except Exception as exc:  # a benchmark reports what failed and goes on
        return {**row, "error": str(exc).splitlines()[0][:160]}
    (ck,) = got.compiled_kernels
    loop = ck.compile.loop
    hbm = chip.memory.hbm_bw_bytes_per_s_per_chip
    scale_bytes = {"none": 0, "per-channel": n * 4, "per-block": (k // 128) * n * 4}[v.scales]
    weight_bytes = k * n * W_BYTES[v.w] + scale_bytes
    plan = _plan(variant, case, chip.name)
    bm, bk, bn = plan.blocks.bm, plan.blocks.bk, plan.blocks.bn
    int8_floor = None
    if mxu_dtype == "int8" and case == "prefill":
        int8_floor = 2 * m * n * k / chip.matmul_rate("int8")
        if plan.variant.float_codes:
            mxu_dtype = "bf16"  # the kernel's route: the codes in bf16 on the bf16 MXU
    floor = weight_bytes / hbm if case == "decode" else 2 * m * n * k / chip.matmul_rate(mxu_dtype)
    tile_s = bk * bn * W_BYTES[v.w] / hbm  # one step's weight tile at the spec's HBM rate
    t = ck.time.expected_s
    return {**row, "blocks": f"{bm}x{bk}x{bn}", "step_bundles": ck.time.mean_step_bundles,
            "step_vs_hbm": ck.time.mean_step_compute_s / tile_s, "spills": loop.vector_spills,
            "fills": loop.vector_fills, "steps": ck.steps, "time_s": t, "floor_s": floor, "ratio": t / floor,
            "mxu": mxu_dtype, "vs_int8": None if int8_floor is None else t / int8_floor}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", default=",".join(CHIPS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cases", default=",".join(CASES))
    a = p.parse_args(argv)
    from perfmodel.units import si

    print("| variant | case | chip | blocks | steps | bundles/step | spills/fills per step | step compute / HBM | "
          "compiled | MXU | floor | ratio | vs int8 floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        for variant in a.variants.split(","):
            for chip in a.chips.split(","):
                r = measure(variant, case, chip)
                if "skip" in r:
                    continue
                if "error" in r:
                    print(f"| {variant} | {case} | {r['chip']} | FAIL: {r['error']} |||||||||")
                else:
                    # Decode only: prefill steps are MXU-bound by design.
                    step_vs_hbm = f"{r['step_vs_hbm']:.2f}x" if case == "decode" else "-"
                    vs_int8 = "-" if r["vs_int8"] is None else f"{r['vs_int8']:.2f}x"
                    mxu = "HBM" if case == "decode" else r["mxu"]
                    print(f"| {variant} | {case} | {r['chip']} | {r['blocks']} | {r['steps']} | "
                          f"{r['step_bundles']:,.0f} | {r['spills']}/{r['fills']} | {step_vs_hbm} | "
                          f"{si(r['time_s'], 's')} | {mxu} | {si(r['floor_s'], 's')} | {r['ratio']:.2f}x | {vs_int8} |")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
