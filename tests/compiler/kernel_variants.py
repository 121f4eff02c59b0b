"""The quantized matmul family's variants, grouped_matmul's dtypes and sampling's features as compile calls, and
the one-line refusal a chip without the MXU path gives (shared by the compile checks,
``tests/compiler/test_kernel_variants_compile.py``, and the refusal checks that need no compiler,
``tests/kernels/test_variant_refusals.py``)."""

from __future__ import annotations

from kernels.grouped_matmul import variants as grouped
from kernels.grouped_matmul.entry import EXPERTS, HIDDEN, WIDTH
from kernels.matmul.variants import BF16_VARIANTS, BY_NAME
from kernels.sampling import variants as sampling
from perfmodel.compiler.api import CompileCall
from perfmodel.hw.registry import get_chip

#: case -> (M, K, N): decode (64 rows: the "... decode" defaults) and a prefill-sized call of several row blocks
#: (the square defaults clamped to it; quantize_activations quantizes the next row block ahead on single-core chips).
MATMUL_CASES = {"decode": (64, 4096, 14336), "prefill": (2048, 4096, 4096)}
#: case -> token rows over the experts of grouped_matmul's tuned problem (kernels/grouped_matmul/entry.py: 8 experts,
#: K=4096, N=14336, rows split evenly).
GROUPED_CASES = {"decode": 64, "prefill": 2048}


def _sampling_call(variant: str, case: str) -> CompileCall:
    # Sampling's variants are one problem each (kernels/sampling/variants.py: 64 requests, 128,256 entries).
    v = sampling.BY_NAME[variant]
    return CompileCall(kind="function", target=v.target, shapes=v.shapes(), args=v.args())


def _matmul_call(variant: str, case: str) -> CompileCall:
    m, k, n = MATMUL_CASES[case]
    v = BY_NAME[variant]
    # int4: two codes per byte, [K/2, N] uint8 (kernels.quant.pack_int4's layout).
    return CompileCall(kind="catalog", target="matmul", shapes=v.shapes(m, k, n), extra=v.static() or None)


def _grouped_call(variant: str, case: str) -> CompileCall:
    shapes = grouped.BY_NAME[variant].shapes(GROUPED_CASES[case], HIDDEN, WIDTH, experts=EXPERTS)
    return CompileCall(kind="catalog", target="grouped_matmul", shapes=shapes)


def refusal(variant: str, chip_name: str) -> str | None:
    """The one-line error the wrapper gives where the chip has no MXU path for the variant (the rule is the
    wrapper's own check), else None."""
    from kernels.matmul.plan import _check_fp8_support, _check_int8_mxu

    chip = get_chip(chip_name)
    v = BY_NAME.get(variant)
    if v is not None and v.quantize_activations:
        try:
            _check_int8_mxu(chip)
        except ValueError:
            return "quantize_activations: .* has no int8 x int8 MXU path"
    if "fp8" in variant:
        try:
            _check_fp8_support(chip, "bfloat16", "float8_e4m3fn")
        except ValueError:
            return "need an fp8 MXU path"
    return None


CALLS = ([("matmul", v.name, c) for v in BF16_VARIANTS for c in MATMUL_CASES]
         + [("grouped_matmul", v.name, c) for v in grouped.VARIANTS for c in GROUPED_CASES]
         + [("sampling", v.name, "decode") for v in sampling.CHECKED])
BUILD = {"matmul": _matmul_call, "grouped_matmul": _grouped_call, "sampling": _sampling_call}
