"""Paged KV-cache update Pallas TPU kernel (head-major or token-major pages,
scalar-prefetched slot mapping, in place, optional int8 quantize on write).

Exports load lazily so that ``kernels.kv_cache_update.blocks`` imports without jax.
"""

import importlib
from typing import Any

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.kv_cache_update.blocks",
    "KvCacheUpdateBlockSizes": "kernels.kv_cache_update.blocks",
    "default_block_sizes": "kernels.kv_cache_update.blocks",
    "head_major_vmem_bytes": "kernels.kv_cache_update.blocks",
    "DEFAULT_LAYOUT": "kernels.kv_cache_update.blocks",
    "LAYOUTS": "kernels.kv_cache_update.blocks",
    "PADDING_SLOT": "kernels.kv_cache_update.kernel",
    "kv_cache_update": "kernels.kv_cache_update.kernel",
    "kv_cache_update_reference": "kernels.kv_cache_update.reference",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kernels.kv_cache_update' has no attribute '{name}'")
