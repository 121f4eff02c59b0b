"""Paged attention (decode) Pallas TPU kernel, its block sizes, a pure-jnp reference and KV quantization."""

from kernels.paged_attention.blocks import (
    DEFAULT_TOKENS_PER_COMPUTE_BLOCK,
    PagedAttentionBlockSizes,
    default_block_sizes,
)
from kernels.paged_attention.kernel import paged_attention
from kernels.paged_attention.reference import dequantize_pages, paged_attention_reference, quantize_pages

__all__ = [
    "DEFAULT_TOKENS_PER_COMPUTE_BLOCK",
    "PagedAttentionBlockSizes",
    "default_block_sizes",
    "dequantize_pages",
    "paged_attention",
    "paged_attention_reference",
    "quantize_pages",
]
