"""Paged attention (decode) Pallas TPU kernel, its block sizes, a pure-jnp reference and KV quantization.

Exports load lazily so that ``kernels.paged_attention.blocks`` and ``.entry`` import without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_TOKENS_PER_COMPUTE_BLOCK": "kernels.paged_attention.blocks",
    "PagedAttentionBlockSizes": "kernels.paged_attention.blocks",
    "default_block_sizes": "kernels.paged_attention.blocks",
    "paged_attention": "kernels.paged_attention.kernel",
    "dequantize_pages": "kernels.paged_attention.reference",
    "paged_attention_reference": "kernels.paged_attention.reference",
    "quantize_pages": "kernels.paged_attention.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
