"""What perfmodel knows about the bundled RMSNorm by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

ENTRIES = (
    KernelEntry(
        name="rms_norm", summary="bundled fused residual add + RMSNorm",
        function="kernels.rms_norm:rms_norm", reference="kernels.rms_norm:rms_norm_reference",
        arrays=("x", "residual", "weight"),
        example=("x=8192x4096:bf16", "residual=8192x4096:bf16", "weight=4096:f32"),
        block_axes=(BlockAxis(field="block_tokens", array="x", dim=0, align=8, minimum=8),),
        block_class="kernels.rms_norm:RmsNormBlockSizes",
        production=ProductionCall(label="rms_norm 8192x4096 bf16",
                                  shapes=("x=8192x4096:bf16", "residual=8192x4096:bf16", "weight=4096:f32")),
    ),
)

TUNED = TunedKernel(
    kernel="rms_norm", entry="rms_norm",
    configs=(TunedConfig(key="bf16", shapes=("x=8192x4096:bf16", "residual=8192x4096:bf16", "weight=4096:f32")),),
    problem="8192 tokens of a 4096-wide model (Llama-3-8B); the kernel halves block_tokens for wider rows until "
            "they fit")
