"""What perfmodel knows about the bundled flash attention by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from kernels.perf import pallas_chips
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

ENTRIES = (
    KernelEntry(
        name="flash_attention", summary="bundled prefill flash attention (causal, GQA, sliding window)",
        function="kernels.flash_attention:flash_attention",
        reference="kernels.flash_attention:flash_attention_reference",
        arrays=("q", "k", "v"),
        example=("q=1x32x2048x128:bf16", "k=1x8x2048x128:bf16", "v=1x8x2048x128:bf16"),
        static={"causal": True},
        # block_kv_compute must divide block_kv; the block class rejects the other combinations. K/V blocks
        # stop at 2048: a block spanning a long context is fetched whole by every q block, which defeats the
        # kernel's skipping of blocks outside the causal range or a sliding window. Compute slices run from
        # 256 to 1024: wider slices only grow the f32 score tile.
        block_axes=(BlockAxis(field="block_q", array="q", dim=2, align=8),
                    BlockAxis(field="block_kv", array="k", dim=2, align=128, maximum=2048),
                    BlockAxis(field="block_kv_compute", array="k", dim=2, align=128, minimum=256,
                              maximum=1024)),
        block_class="kernels.flash_attention:FlashAttentionBlockSizes",
        production=ProductionCall(label="flash_attention causal prefill 8k, GQA 4", shapes=(
            "q=1x32x8192x128:bf16", "k=1x8x8192x128:bf16", "v=1x8x8192x128:bf16")),
    ),
)

TUNED = TunedKernel(
    kernel="flash_attention", entry="flash_attention", chips=pallas_chips,
    configs=(TunedConfig(key="bf16", shapes=("q=1x32x8192x128:bf16", "k=1x8x8192x128:bf16",
                                             "v=1x8x8192x128:bf16")),),
    problem="a causal 8192-token prefill with 32 q / 8 kv heads of 128 (Llama-3-8B); the kernel shrinks block_q, "
            "then block_kv, for larger GQA groups or f32 until a step fits",
    note="K/V block candidates stop at 2048 tokens (see entry.py) so that causal and sliding-window block skipping "
         "keep working on long contexts.")
