"""The quantized matmul family's variants, grouped_matmul's dtypes and sampling's features as compile calls, and
the one-line refusal a chip without the MXU path gives (shared by the compile checks,
``tests/compiler/test_kernel_variants_compile.py``, and the refusal checks that need no compiler,
``tests/kernels/test_variant_refusals.py``)."""

from __future__ import annotations

from kernels.matmul.variants import BF16_VARIANTS, BY_NAME
from perfmodel.compiler.api import CompileCall
from perfmodel.hw.registry import get_chip

#: case -> (M, K, N): decode (64 rows: the "... decode" defaults) and a prefill-sized call of several row blocks
#: (the square defaults clamped to it; quantize_x quantizes the next row block ahead on single-core chips).
MATMUL_CASES = {"decode": (64, 4096, 14336), "prefill": (2048, 4096, 4096)}
#: case -> token rows over 8 experts (K=4096, N=14336, rows split evenly).
GROUPED_CASES = {"decode": 64, "prefill": 2048}
GROUPED_VARIANTS = {"bf16": ("bf16", False), "bf16 x int8": ("int8", True), "bf16 x fp8": ("float8_e4m3fn", True)}


#: Sampling features (64 requests over a 128,256-entry vocabulary, per-request seeds): variant -> (function,
#: arrays, static arguments).
_LOGITS, _SEEDS, _VOCAB = "logits=64x128256:f32", "seeds=64:int32", "64x128256"
SAMPLING_VARIANTS = {
    "top-k+top-p": ("sampling", (_LOGITS, _SEEDS), ("temperature=0.8", "top_k=50", "top_p=0.9")),
    "bf16 min-p, per-request temperatures": ("sampling", ("logits=64x128256:bf16", _SEEDS, "temperature=64:f32"),
                                             ("min_p=0.05",)),
    "penalties, bias and masks": ("sampling", (_LOGITS, _SEEDS, f"token_counts={_VOCAB}:int32",
                                               f"logit_bias={_VOCAB}:f32", f"allowed_mask={_VOCAB}:bool",
                                               f"banned_mask={_VOCAB}:bool"),
                                  ("presence_penalty=0.5", "frequency_penalty=0.2", "repetition_penalty=1.1",
                                   "top_k=50")),
    "logprobs": ("sampling", (_LOGITS, _SEEDS), ("top_k=50", "top_p=0.9", "logprobs=5")),
    "greedy": ("sampling", (_LOGITS,), ()),
    "rejection k=4": ("rejection_sample", ("draft_token_ids=64x4:int32", "draft_probs=4x64x128256:f32",
                                           "target_probs=5x64x128256:f32", _SEEDS), ()),
}


def _sampling_call(variant: str, case: str) -> CompileCall:
    fn, shapes, args = SAMPLING_VARIANTS[variant]
    return CompileCall(kind="function", target=f"kernels.sampling:{fn}", shapes=shapes, args=args)


def _matmul_call(variant: str, case: str) -> CompileCall:
    m, k, n = MATMUL_CASES[case]
    v = BY_NAME[variant]
    # int4: two codes per byte, [K/2, N] uint8 (kernels.quant.pack_int4's layout).
    return CompileCall(kind="catalog", target="matmul", shapes=v.shapes(m, k, n), extra=v.static() or None)


def _grouped_call(variant: str, case: str) -> CompileCall:
    m, (rhs, scaled) = GROUPED_CASES[case], GROUPED_VARIANTS[variant]
    shapes = [f"lhs={m}x4096:bf16", f"rhs=8x4096x14336:{rhs}", f"group_sizes=8:int32={m // 8}"]
    shapes += ["rhs_scale=8x14336:f32"] if scaled else []
    return CompileCall(kind="catalog", target="grouped_matmul", shapes=tuple(shapes))


def refusal(variant: str, chip_name: str) -> str | None:
    """The one-line error the wrapper gives where the chip has no MXU path for the variant (the rule is the
    wrapper's own check), else None."""
    from kernels.matmul.kernel import _check_fp8_support, _check_int8_mxu

    chip = get_chip(chip_name)
    v = BY_NAME.get(variant)
    if v is not None and v.quantize_x:
        try:
            _check_int8_mxu(chip)
        except ValueError:
            return "quantize_x: .* has no int8 x int8 MXU path"
    if "fp8" in variant:
        try:
            _check_fp8_support(chip, "bfloat16", "float8_e4m3fn")
        except ValueError:
            return "need an fp8 MXU path"
    return None


CALLS = ([("matmul", v.name, c) for v in BF16_VARIANTS for c in MATMUL_CASES]
         + [("grouped_matmul", v, c) for v in GROUPED_VARIANTS for c in GROUPED_CASES]
         + [("sampling", v, "decode") for v in SAMPLING_VARIANTS])
BUILD = {"matmul": _matmul_call, "grouped_matmul": _grouped_call, "sampling": _sampling_call}
