"""Flash attention (prefill) Pallas TPU kernel, its block sizes and a pure-jnp reference."""

from kernels.flash_attention.blocks import DEFAULT_BLOCK_SIZES, FlashAttentionBlockSizes, default_block_sizes
from kernels.flash_attention.kernel import flash_attention
from kernels.flash_attention.reference import attention_mask, flash_attention_reference

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "FlashAttentionBlockSizes",
    "attention_mask",
    "default_block_sizes",
    "flash_attention",
    "flash_attention_reference",
]
