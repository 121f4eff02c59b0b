"""Paged KV-cache update Pallas TPU kernel (head-major or token-major pages,
scalar-prefetched slot mapping, in place, optional int8 quantize on write).

Exports load lazily so that ``kernels.kv_cache_update.blocks`` imports without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.kv_cache_update.blocks",
    "KvCacheUpdateBlockSizes": "kernels.kv_cache_update.blocks",
    "default_block_sizes": "kernels.kv_cache_update.blocks",
    "head_major_vmem_bytes": "kernels.kv_cache_update.blocks",
    "DEFAULT_LAYOUT": "kernels.kv_cache_update.blocks",
    "LAYOUTS": "kernels.kv_cache_update.blocks",
    "PADDING_SLOT": "kernels.kv_cache_update.plan",
    "kv_cache_update": "kernels.kv_cache_update.kernel",
    "kv_pages_update": "kernels.kv_cache_update.kernel",
    "kv_cache_update_reference": "kernels.kv_cache_update.reference",
    "kv_pages_update_reference": "kernels.kv_cache_update.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
