"""Ragged paged attention (mixed prefill + decode over a paged KV cache) as a Pallas TPU kernel.

Exports load lazily so that ``kernels.ragged_paged_attention.blocks`` and ``.entry`` import without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.ragged_paged_attention.blocks",
    "RaggedPagedAttentionBlockSizes": "kernels.ragged_paged_attention.blocks",
    "default_block_sizes": "kernels.ragged_paged_attention.blocks",
    "dequantize_kv_pages": "kernels.ragged_paged_attention.reference",
    "quantize_kv_pages": "kernels.ragged_paged_attention.reference",
    "ragged_paged_attention": "kernels.ragged_paged_attention.kernel",
    "ragged_paged_attention_reference": "kernels.ragged_paged_attention.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
