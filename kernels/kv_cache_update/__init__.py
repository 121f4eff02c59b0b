"""Paged KV-cache update Pallas TPU kernel (scalar-prefetched slot mapping, in-place, optional int8 quantize on write)."""

from kernels.kv_cache_update.blocks import DEFAULT_BLOCK_SIZES, KvCacheUpdateBlockSizes, default_block_sizes
from kernels.kv_cache_update.kernel import PADDING_SLOT, kv_cache_update
from kernels.kv_cache_update.reference import kv_cache_update_reference

__all__ = ["DEFAULT_BLOCK_SIZES", "KvCacheUpdateBlockSizes", "PADDING_SLOT", "default_block_sizes",
           "kv_cache_update", "kv_cache_update_reference"]
