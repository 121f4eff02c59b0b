"""What perfmodel knows about the bundled grouped matmul by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from kernels.grouped_matmul.variants import VARIANTS
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

def _configs() -> tuple[TunedConfig, ...]:
    """The tuned table's configurations: every variant on the MoE problem, then on the decode problem (a few rows
    per expert against every expert's weights, HBM-bound)."""
    problems = ((TOKENS, False), (DECODE_TOKENS, True))
    return tuple(TunedConfig(key=v.tuned_key(decode=decode).text(),
                             shapes=v.shapes(m, HIDDEN, WIDTH, experts=EXPERTS))
                 for m, decode in problems for v in VARIANTS)


TUNED = TunedKernel(
    kernel="grouped_matmul", entry="grouped_matmul", chips=pallas_chips, configs=_configs(), compile_raised=1,
    problem=(f"a mixture-of-experts projection: {TOKENS} token rows sorted over {EXPERTS} experts ({TOKENS // EXPERTS} "
             f"each), K={HIDDEN}, N={WIDTH} (per-channel scales for int8/fp8 weights; fp8 only on chips with an fp8 "
             "MXU path); \"... decode\": the same experts with %d rows (%d each), the blocks of calls with at most that "
             "many rows" % (DECODE_TOKENS, DECODE_TOKENS // EXPERTS)))
