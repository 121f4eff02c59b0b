"""Flash attention (prefill) Pallas TPU kernel, its block sizes and a pure-jnp reference.

Exports load lazily so that ``kernels.flash_attention.blocks`` and ``.entry`` import without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.flash_attention.blocks",
    "FlashAttentionBlockSizes": "kernels.flash_attention.blocks",
    "default_block_sizes": "kernels.flash_attention.blocks",
    "flash_attention": "kernels.flash_attention.kernel",
    "attention_mask": "kernels.flash_attention.reference",
    "flash_attention_reference": "kernels.flash_attention.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
