"""What perfmodel knows about the bundled KV-cache update by name: its two layouts' catalog entries and the
tuned problem of the token-major layout (no jax)."""

from __future__ import annotations

from kernels.spec import BlockAxis, KernelEntry, ProductionCall, TunedConfig, TunedKernel

_ARRAYS = ("new_k", "new_v", "k_cache", "v_cache", "slot_mapping")

ENTRIES = (
    KernelEntry(
        name="kv_cache_update", summary="bundled paged KV-cache write (slot mapping as scalar prefetch)",
        function="kernels.kv_cache_update:kv_cache_update",
        reference="kernels.kv_cache_update:kv_cache_update_reference",
        arrays=_ARRAYS, optional_arrays=("k_scale_cache", "v_scale_cache"),
        example=("new_k=64x8x128:bf16", "new_v=64x8x128:bf16", "k_cache=8x256x16x128:bf16",
                 "v_cache=8x256x16x128:bf16", "slot_mapping=64:int32=arange"),
        block_class="kernels.kv_cache_update:KvCacheUpdateBlockSizes",
        production=ProductionCall(label="kv_cache_update 64 tokens", shapes=(
            "new_k=64x8x128:bf16", "new_v=64x8x128:bf16", "k_cache=8x8192x16x128:bf16", "v_cache=8x8192x16x128:bf16",
            "slot_mapping=64:int32=arange")),
    ),
    KernelEntry(
        name="kv_cache_update_token_major",
        summary="bundled paged KV-cache write, token-major cache layout (tokens_per_block new tokens per step)",
        function="kernels.kv_cache_update:kv_cache_update",
        reference="kernels.kv_cache_update:kv_cache_update_reference",
        arrays=_ARRAYS, optional_arrays=("k_scale_cache", "v_scale_cache"),
        example=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=2048x16x8x128:bf16",
                 "v_cache=2048x16x8x128:bf16", "slot_mapping=512:int32=arange"),
        static={"layout": "token-major"},
        block_axes=(BlockAxis(field="tokens_per_block", array="new_k", dim=0, align=1, minimum=8),),
        block_class="kernels.kv_cache_update:KvCacheUpdateBlockSizes",
    ),
    KernelEntry(
        name="kv_cache_update_combined",
        summary="bundled paged KV-cache write into ragged_paged_attention's combined K/V pages (one row DMA per token)",
        function="kernels.kv_cache_update:kv_pages_update",
        reference="kernels.kv_cache_update:kv_pages_update_reference",
        arrays=("new_k", "new_v", "kv_pages", "slot_mapping"), optional_arrays=("kv_scales",),
        example=("new_k=64x8x128:bf16", "new_v=64x8x128:bf16", "kv_pages=256x16x16x128:bf16",
                 "slot_mapping=64:int32=arange"),
        block_axes=(BlockAxis(field="tokens_per_block", array="new_k", dim=0, align=1, minimum=8),),
        block_class="kernels.kv_cache_update:KvCacheUpdateBlockSizes",
        production=ProductionCall(label="kv_cache_update combined 64 tokens", shapes=(
            "new_k=64x8x128:bf16", "new_v=64x8x128:bf16", "kv_pages=8192x16x16x128:bf16",
            "slot_mapping=64:int32=arange")),
    ),
)

TUNED = TunedKernel(
    kernel="kv_cache_update", entry="kv_cache_update_token_major",
    configs=(TunedConfig(key="bf16 -> int8", shapes=(
        "new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=2048x16x8x128:int8",
        "v_cache=2048x16x8x128:int8", "slot_mapping=512:int32=arange",
        "k_scale_cache=2048x16x8x1:f32", "v_scale_cache=2048x16x8x1:f32")),),
    problem="a 512-token write of bf16 K/V into a token-major int8 cache (quantize on write: the larger VMEM need, "
            "so the defaults fit bf16 caches too) of 8 kv heads of 128, pages of 16 tokens (layout='token-major'; "
            "the default head-major layout has no block sizes)")
