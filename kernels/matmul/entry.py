"""What perfmodel knows about the bundled matmul by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from kernels.matmul.variants import BY_NAME, Variant
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

ENTRIES = (
    KernelEntry(
        name="matmul", summary="bundled tiled GEMM (bf16/f32; int8/fp8 weights with scales; bias/activation)",
        function="kernels.matmul:matmul", reference="kernels.matmul:matmul_reference",
        arrays=("x", "w"), optional_arrays=("bias", "w_scale"),
        example=("x=4096x4096:bf16", "w=4096x4096:bf16"),
        block_axes=(BlockAxis(field="bm", array="x", dim=0, align=16),
                    BlockAxis(field="bk", array="x", dim=1, align=128),
                    BlockAxis(field="bn", array="w", dim=1, align=128)),
        block_class="kernels.matmul:MatmulBlockSizes",
        production=ProductionCall(label="matmul 8192x4096 @ 4096x14336 bf16",
                                  shapes=("x=8192x4096:bf16", "w=4096x14336:bf16")),
    ),
)

#: The problem the per-chip defaults are tuned on (a large square GEMM).
TUNED_SHAPE_MNK = (8192, 8192, 8192)
#: The problem the decode defaults (x with at most DECODE_MAX_M rows, kernels/matmul/blocks.py) are tuned on: one
#: decode step of 64 sequences through a Llama-3-8B MLP up-projection (K = 4096, N = 14336).
DECODE_SHAPE_MNK = (64, 14336, 4096)
#: The variants (kernels/matmul/variants.py) tuned at each problem, in the JSON's order. The square problem: each
#: operand pair (int8 and fp8 weights with per-channel scales); int8 x int8 (w8a8: bf16 activations quantized per
#: token in the kernel, quantize_activations; chips without an int8 MXU path, v4 and 7x, reject it and store nothing);
#: bf16 x int4 (packed weights unpacked in VMEM onto the bf16 MXU path); w4a8 (those unpacked to int8 codes against the
#: x codes on the int8 MXU path; v4 and 7x store nothing, as for int8 x int8).
SQUARE_VARIANTS = ("bf16", "fp32", "bf16 x int8", "fp32 x int8", "bf16 x fp8", "fp32 x fp8", "w8a8", "bf16 x int4",
                   "w4a8")
#: Blockwise weight scales (one per 128 rows of K) where the call runs another route than with per-channel ones: w8a8
#: and w4a8 at large M (on chips whose MXU is deeper than a scale group the codes go to the bf16 MXU,
#: kernels.matmul.rules.blockwise_codes_on_bf16_mxu) and bf16 x int4 at decode (int4_decode_on_int8_mxu runs
#: per-channel calls on the int8 MXU, blockwise ones on v6e stay on the bf16 MXU).
BLOCKWISE_SQUARE_VARIANTS = ("w8a8 blockwise", "w4a8 blockwise")
BLOCKWISE_DECODE_VARIANTS = ("bf16 x int4 blockwise",)
#: Decode: a few rows against the whole weight matrix, HBM-bound; bf16 activations against the weight dtypes of
#: serving.
DECODE_VARIANTS = tuple(name for name in SQUARE_VARIANTS if BY_NAME[name].x == "bf16")
#: (variant, decode) of every tuned configuration, in the JSON's order.
TUNED_VARIANTS: tuple[tuple[Variant, bool], ...] = tuple(
    [(BY_NAME[name], False) for name in SQUARE_VARIANTS + BLOCKWISE_SQUARE_VARIANTS]
    + [(BY_NAME[name], True) for name in BLOCKWISE_DECODE_VARIANTS + DECODE_VARIANTS])


def _tuned_config(variant: Variant, *, decode: bool) -> TunedConfig:
    """The tuned configuration of a variant at the square or the decode problem: its table key, static arguments,
    and shapes with a bias (the stored defaults must also fit when the epilogue is fused)."""
    m, n, k = DECODE_SHAPE_MNK if decode else TUNED_SHAPE_MNK
    return TunedConfig(key=variant.tuned_key(decode=decode).text(), static=variant.static(),
                       shapes=variant.shapes(m, k, n, bias=True))


TUNED = TunedKernel(
    kernel="matmul", entry="matmul",
    configs=tuple(_tuned_config(variant, decode=decode) for variant, decode in TUNED_VARIANTS), compile_raised=1,
    problem=("an M=N=K=%d GEMM with a fused bias (and per-channel scales for int8/fp8/int4 weights; \"int8 x int8\": "
             "bf16 activations quantized in the kernel, quantize_activations=True; \"bf16 x int4\": packed weights, "
             "w_dtype='int4'; \"int8 x int4\": both, w4a8; \"... blockwise\": those two, and bf16 x int4 at "
             "decode, with one scale per 128 rows of K); \"... decode\": x=%dx%d against w=%dx%d, the blocks of "
             "calls with at most %d rows"
             % (TUNED_SHAPE_MNK[0], DECODE_SHAPE_MNK[0], DECODE_SHAPE_MNK[2], DECODE_SHAPE_MNK[2], DECODE_SHAPE_MNK[1],
                DECODE_SHAPE_MNK[0])))
