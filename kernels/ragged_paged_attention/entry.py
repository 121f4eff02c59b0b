"""What perfmodel knows about the bundled ragged paged attention by name: its catalog entry and tuned problem
(no jax)."""

from __future__ import annotations

from kernels.perf import pallas_chips
from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

_ARRAYS = ("q", "kv_pages", "kv_lens", "page_table", "cu_q_lens", "num_seqs")
# block_q: multiples of 16 (the bf16 sublane tile, also legal for f32); block_kv: KV tokens, whole lanes.
_BLOCK_AXES = (BlockAxis(field="block_q", array="q", dim=0, align=16, minimum=16),
               BlockAxis(field="block_kv", array="page_table", dim=1, align=128, times_array="kv_pages", times_dim=1))

ENTRIES = (
    KernelEntry(
        name="ragged_paged_attention", summary="bundled mixed prefill/decode attention over a paged KV cache",
        function="kernels.ragged_paged_attention:ragged_paged_attention",
        reference="kernels.ragged_paged_attention:ragged_paged_attention_reference",
        arrays=_ARRAYS, optional_arrays=("kv_scales",),
        example=("q=64x32x128:bf16", "kv_pages=256x16x16x128:bf16",
                 "kv_lens=4:int32=512", "page_table=4x64:int32=arange", "cu_q_lens=5:int32=arange*16",
                 "num_seqs=1:int32=4"),
        block_axes=_BLOCK_AXES,
        block_class="kernels.ragged_paged_attention:RaggedPagedAttentionBlockSizes",
        production=ProductionCall(label="ragged_paged_attention 64 seqs x 16 tokens, 2k context", shapes=(
            "q=1024x32x128:bf16", "kv_pages=8192x16x16x128:bf16", "kv_lens=64:int32=2048",
            "page_table=64x128:int32=arange", "cu_q_lens=65:int32=arange*16", "num_seqs=1:int32=64")),
    ),
    KernelEntry(
        name="ragged_paged_attention_int8",
        summary="bundled mixed prefill/decode attention over an int8 paged KV cache with per-token scales",
        function="kernels.ragged_paged_attention:ragged_paged_attention",
        reference="kernels.ragged_paged_attention:ragged_paged_attention_reference",
        arrays=_ARRAYS, optional_arrays=("kv_scales",),
        example=("q=64x32x128:bf16", "kv_pages=256x16x16x128:int8", "kv_scales=256x16x16:f32",
                 "kv_lens=4:int32=512", "page_table=4x64:int32=arange", "cu_q_lens=5:int32=arange*16",
                 "num_seqs=1:int32=4"),
        block_axes=_BLOCK_AXES,
        block_class="kernels.ragged_paged_attention:RaggedPagedAttentionBlockSizes",
        production=ProductionCall(label="ragged_paged_attention int8 KV 64 seqs x 16 tokens, 2k context", shapes=(
            "q=1024x32x128:bf16", "kv_pages=8192x16x16x128:int8", "kv_scales=8192x16x16:f32",
            "kv_lens=64:int32=2048", "page_table=64x128:int32=arange", "cu_q_lens=65:int32=arange*16",
            "num_seqs=1:int32=64")),
    ),
)

TUNED = TunedKernel(
    kernel="ragged_paged_attention", entry="ragged_paged_attention", chips=pallas_chips,
    configs=(TunedConfig(key="bf16", shapes=(
        "q=256x32x128:bf16", "kv_pages=512x16x16x128:bf16",
        "kv_lens=8:int32=1024", "page_table=8x64:int32=arange", "cu_q_lens=9:int32=arange*32",
        "num_seqs=1:int32=8")),),
    problem="8 sequences of 32 new tokens over 1024-token contexts (chunked prefill), 32 q / 8 kv heads of 128, "
            "bf16 pages of 16 tokens (kept small: the model interprets the kernel's loops)",
    note="The model counts the kernel's manual K/V DMAs as a total and its data-dependent loops once, so block_kv "
         "choices mostly tie and the tie-break decides.")
