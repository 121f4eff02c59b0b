"""What perfmodel knows about the bundled paged attention by name: its catalog entry and tuned problem (no jax)."""

from __future__ import annotations

from typing import Any, Mapping

from kernels.perf import pallas_chips
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

ENTRIES = (
    KernelEntry(
        name="paged_attention", summary="bundled decode attention over a paged KV cache",
        function="kernels.paged_attention:paged_attention",
        reference="kernels.paged_attention:paged_attention_reference",
        arrays=("q", "k_pages", "v_pages", "page_table", "lengths"), optional_arrays=("k_scales", "v_scales"),
        example=("q=8x32x128:bf16", "k_pages=8x512x16x128:bf16", "v_pages=8x512x16x128:bf16",
                 "page_table=8x64:int32=arange", "lengths=8:int32=1000"),
        block_axes=(BlockAxis(field="pages_per_compute_block", array="page_table", dim=1, align=1, divides=True,
                              minimum=1),),
        block_class="kernels.paged_attention:PagedAttentionBlockSizes",
        production=ProductionCall(label="paged_attention decode 64 seqs x 2k", shapes=(
            "q=64x32x128:bf16", "k_pages=8x8192x16x128:bf16", "v_pages=8x8192x16x128:bf16",
            "page_table=64x128:int32=arange", "lengths=64:int32=2048")),
    ),
)


def _tokens(blocks: Mapping[str, int], specs: Mapping[str, Any]) -> dict[str, Any]:
    # The lookup keeps this many KV tokens per compute block for other page sizes and table widths.
    return {"tokens_per_compute_block": blocks["pages_per_compute_block"] * specs["k_pages"].shape[2]}


TUNED = TunedKernel(
    kernel="paged_attention", entry="paged_attention", chips=pallas_chips,
    configs=(TunedConfig(key="bf16", shapes=(
        "q=64x32x128:bf16", "k_pages=8x8192x16x128:bf16", "v_pages=8x8192x16x128:bf16",
        "page_table=64x128:int32=arange", "lengths=64:int32=2048")),),
    derived=_tokens,
    problem="decode of 64 sequences at 2048-token contexts, 32 q / 8 kv heads of 128, bf16 pages of 16 tokens; the "
            "kernel keeps tokens_per_compute_block for other page sizes",
    note="The model counts the kernel's manual K/V DMAs as a total, so pages_per_compute_block choices tie and the "
         "tie-break (least VMEM) decides.")
