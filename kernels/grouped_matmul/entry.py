"""What perfmodel knows about the bundled grouped matmul by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from kernels.perf import pallas_chips
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

#: The MoE problem the defaults are tuned on and the compile matrix compiles: 8 experts, 8192 token rows sorted by
#: expert (1024 each), hidden 4096 -> expert width 14336 (Mixtral-8x7B's gate/up projection).
EXPERTS, TOKENS, HIDDEN, WIDTH = 8, 8192, 4096, 14336
_GROUPS = f"group_sizes={EXPERTS}:int32={TOKENS // EXPERTS}"
#: The decode problem the "... decode" defaults are tuned on (calls with at most 64 rows,
#: kernels/matmul/blocks.py DECODE_MAX_M): 64 token-expert rows, 8 per expert.
DECODE_TOKENS = 64

ENTRIES = (
    KernelEntry(
        name="grouped_matmul",
        summary="bundled grouped GEMM for mixture of experts (ragged rows per expert; int8/fp8 weights with scales)",
        function="kernels.grouped_matmul:grouped_matmul", reference="kernels.grouped_matmul:grouped_matmul_reference",
        arrays=("lhs", "rhs", "group_sizes"), optional_arrays=("rhs_scale",),
        example=("lhs=512x1024:bf16", "rhs=8x1024x1024:bf16", "group_sizes=8:int32=64"),
        block_axes=(BlockAxis(field="bm", array="lhs", dim=0, align=16, minimum=16),
                    BlockAxis(field="bk", array="lhs", dim=1, align=128),
                    BlockAxis(field="bn", array="rhs", dim=2, align=128)),
        block_class="kernels.grouped_matmul:GroupedMatmulBlockSizes",
        production=ProductionCall(label=f"grouped_matmul {EXPERTS} experts x {TOKENS // EXPERTS} rows, "
                                        f"{HIDDEN} -> {WIDTH} bf16",
                                  shapes=(f"lhs={TOKENS}x{HIDDEN}:bf16", f"rhs={EXPERTS}x{HIDDEN}x{WIDTH}:bf16", _GROUPS)),
    ),
)

#: Operand dtype pairs of the defaults table: (key, rhs --shape dtype, per-channel scales).
PAIRS: tuple[tuple[str, str, bool], ...] = (
    ("bf16 x bf16", "bf16", False),
    ("bf16 x int8", "int8", True),
    ("bf16 x fp8", "fp8", True),
)


def _configs() -> tuple[TunedConfig, ...]:
    configs = []
    for key, rhs, scaled in PAIRS:
        shapes = [f"lhs={TOKENS}x{HIDDEN}:bf16", f"rhs={EXPERTS}x{HIDDEN}x{WIDTH}:{rhs}", _GROUPS]
        if scaled:
            shapes.append(f"rhs_scale={EXPERTS}x{WIDTH}:f32")
        configs.append(TunedConfig(key=key, shapes=tuple(shapes)))
    for key, rhs, scaled in PAIRS:  # decode: a few rows per expert against every expert's weights, HBM-bound
        shapes = [f"lhs={DECODE_TOKENS}x{HIDDEN}:bf16", f"rhs={EXPERTS}x{HIDDEN}x{WIDTH}:{rhs}",
                  f"group_sizes={EXPERTS}:int32={DECODE_TOKENS // EXPERTS}"]
        if scaled:
            shapes.append(f"rhs_scale={EXPERTS}x{WIDTH}:f32")
        configs.append(TunedConfig(key=f"{key} decode", shapes=tuple(shapes)))
    return tuple(configs)


TUNED = TunedKernel(
    kernel="grouped_matmul", entry="grouped_matmul", chips=pallas_chips, configs=_configs(), compile_raised=1,
    problem=(f"a mixture-of-experts projection: {TOKENS} token rows sorted over {EXPERTS} experts ({TOKENS // EXPERTS} "
             f"each), K={HIDDEN}, N={WIDTH} (per-channel scales for int8/fp8 weights; fp8 only on chips with an fp8 "
             "MXU path); \"... decode\": the same experts with %d rows (%d each), the blocks of calls with at most that "
             "many rows" % (DECODE_TOKENS, DECODE_TOKENS // EXPERTS)))
