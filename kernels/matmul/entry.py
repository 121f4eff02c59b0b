"""What perfmodel knows about the bundled matmul by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from perfmodel.schedule.catalog import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

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
        production=ProductionCall(label="matmul 8192x4096 @ 4096x14336 bf16", shapes=("x=8192x4096:bf16", "w=4096x14336:bf16")),
    ),
)

#: Operand dtype pairs of the defaults table (x dtype, w dtype) and their --shape dtype names.
PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("bf16", "bf16", "bf16", "bf16"),
    ("fp32", "fp32", "f32", "f32"),
    ("bf16", "int8", "bf16", "int8"),
    ("fp32", "int8", "f32", "int8"),
    ("bf16", "fp8", "bf16", "fp8"),
    ("fp32", "fp8", "f32", "fp8"),
)
#: The problem the per-chip defaults are tuned on (a large square GEMM).
TUNED_SHAPE_MNK = (8192, 8192, 8192)
#: The problem the decode defaults (x with at most DECODE_MAX_M rows, kernels/matmul/blocks.py) are tuned on: one
#: decode step of 64 sequences through a Llama-3-8B MLP up-projection (K = 4096, N = 14336).
DECODE_SHAPE_MNK = (64, 14336, 4096)
#: The operand pairs with decode defaults: bf16 activations against the weight dtypes of serving.
DECODE_PAIRS = tuple(p for p in PAIRS if p[0] == "bf16")


def _configs_at(mnk: tuple[int, int, int], pairs: tuple[tuple[str, str, str, str], ...],
                suffix: str = "") -> list[TunedConfig]:
    """The tuned configurations of one problem (M, N, K): each pair, int8 x int8, bf16 x int4 and int8 x int4
    (w4a8); keys end in ``suffix``."""
    m, n, k = mnk
    bias, scale = f"bias={n}:f32", f"w_scale={n}:f32"
    configs = []
    for x_name, w_name, x_flag, w_flag in pairs:
        # With a bias: the stored defaults must also fit when the epilogue is fused.
        shapes = [f"x={m}x{k}:{x_flag}", f"w={k}x{n}:{w_flag}", bias] + ([scale] if w_name in ("int8", "fp8") else [])
        configs.append(TunedConfig(key=f"{x_name} x {w_name}{suffix}", shapes=tuple(shapes)))
    # int8 x int8 on the int8 MXU: bf16 activations quantized per token in the kernel (quantize_x), int8
    # weights with per-channel scales; chips without an int8 MXU path (v4, 7x) reject it and store nothing.
    configs.append(TunedConfig(key=f"int8 x int8{suffix}", static={"quantize_x": True},
                               shapes=(f"x={m}x{k}:bf16", f"w={k}x{n}:int8", bias, scale)))
    # Packed int4 weights (two per byte, [K/2, N] uint8), unpacked in VMEM onto the bf16 MXU path.
    configs.append(TunedConfig(key=f"bf16 x int4{suffix}", static={"w_dtype": "int4"},
                               shapes=(f"x={m}x{k}:bf16", f"w={k // 2}x{n}:uint8", bias, scale)))
    # w4a8: packed int4 weights unpacked to int8 codes in VMEM against the per-token int8 x codes, on the int8
    # MXU path (v4 and 7x store nothing, as for int8 x int8).
    configs.append(TunedConfig(key=f"int8 x int4{suffix}", static={"quantize_x": True, "w_dtype": "int4"},
                               shapes=(f"x={m}x{k}:bf16", f"w={k // 2}x{n}:uint8", bias, scale)))
    return configs


def _blockwise_configs(mnk: tuple[int, int, int], decode: tuple[int, int, int]) -> list[TunedConfig]:
    """Blockwise weight scales (one per 128 rows of K) where the call runs another route than with per-channel
    ones, keys "... blockwise": int8 x int8 and w4a8 at large M (on chips whose MXU is deeper than a scale group
    the codes go to the bf16 MXU, perfmodel.model.gemm.blockwise_codes_on_bf16_mxu) and bf16 x int4 at decode
    (int4_decode_on_int8_mxu runs per-channel calls on the int8 MXU, blockwise ones on v6e stay on the bf16 MXU)."""
    m, n, k = mnk
    bias, scale = f"bias={n}:f32", f"w_scale={k // 128}x{n}:f32"
    dm, dn, dk = decode
    return [TunedConfig(key="int8 x int8 blockwise", static={"quantize_x": True},
                        shapes=(f"x={m}x{k}:bf16", f"w={k}x{n}:int8", bias, scale)),
            TunedConfig(key="int8 x int4 blockwise", static={"quantize_x": True, "w_dtype": "int4"},
                        shapes=(f"x={m}x{k}:bf16", f"w={k // 2}x{n}:uint8", bias, scale)),
            TunedConfig(key="bf16 x int4 blockwise decode", static={"w_dtype": "int4"},
                        shapes=(f"x={dm}x{dk}:bf16", f"w={dk // 2}x{dn}:uint8", f"bias={dn}:f32",
                                f"w_scale={dk // 128}x{dn}:f32"))]


def _configs() -> tuple[TunedConfig, ...]:
    # Decode: a few rows against the whole weight matrix, HBM-bound; the "... decode" keys are what the kernel
    # uses when x has at most DECODE_MAX_M rows.
    return tuple(_configs_at(TUNED_SHAPE_MNK, PAIRS) + _blockwise_configs(TUNED_SHAPE_MNK, DECODE_SHAPE_MNK)
                 + _configs_at(DECODE_SHAPE_MNK, DECODE_PAIRS, " decode"))


TUNED = TunedKernel(
    kernel="matmul", entry="matmul", configs=_configs(), compile_raised=1,
    problem=("an M=N=K=%d GEMM with a fused bias (and per-channel scales for int8/fp8/int4 weights; \"int8 x int8\": "
             "bf16 activations quantized in the kernel, quantize_x=True; \"bf16 x int4\": packed weights, "
             "w_dtype='int4'; \"int8 x int4\": both, w4a8; \"... blockwise\": those two, and bf16 x int4 at "
             "decode, with one scale per 128 rows of K); \"... decode\": x=%dx%d against w=%dx%d, the blocks of "
             "calls with at most %d rows"
             % (TUNED_SHAPE_MNK[0], DECODE_SHAPE_MNK[0], DECODE_SHAPE_MNK[2], DECODE_SHAPE_MNK[2], DECODE_SHAPE_MNK[1],
                DECODE_SHAPE_MNK[0])))
