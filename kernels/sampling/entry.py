"""What perfmodel knows about the bundled sampling kernel by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from typing import Any

from kernels.perf import pallas_chips
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

ENTRIES = (
    KernelEntry(
        name="sampling", summary="bundled fused temperature / top-k / top-p sampling",
        function="kernels.sampling:sampling", reference="kernels.sampling:sampling_reference",
        arrays=("logits",), example=("logits=64x128256:f32",),
        block_axes=(BlockAxis(field="block_b", array="logits", dim=0, align=8, minimum=8),
                    BlockAxis(field="block_v", array="logits", dim=1, align=128)),
        block_class="kernels.sampling:SamplingBlockSizes",
        production=ProductionCall(label="sampling 64 x 128256 f32", shapes=("logits=64x128256:f32",)),
    ),
)


def _extra() -> dict[str, Any]:
    import jax

    # A random draw with top-k and top-p: the bisection passes over the resident rows run.
    return {"key": jax.random.key(0), "temperature": 0.8, "top_k": 50, "top_p": 0.9}


TUNED = TunedKernel(
    kernel="sampling", entry="sampling", chips=pallas_chips, extra=_extra,
    configs=(TunedConfig(key="fp32", shapes=("logits=64x128256:f32",)),),
    problem="64 rows of f32 logits over a 128256-entry vocabulary (Llama-3), drawn with a key, top-k 50 and top-p "
            "0.9; the kernel rounds block_b up for bf16, shrinks block_v to small vocabularies and halves block_b "
            "for huge ones")
