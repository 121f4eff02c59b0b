"""Ragged paged attention (mixed prefill + decode over a paged KV cache) as a Pallas TPU kernel."""

from kernels.ragged_paged_attention.blocks import (
    DEFAULT_BLOCK_SIZES,
    RaggedPagedAttentionBlockSizes,
    default_block_sizes,
)
from kernels.ragged_paged_attention.kernel import ragged_paged_attention
from kernels.ragged_paged_attention.reference import ragged_paged_attention_reference

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "RaggedPagedAttentionBlockSizes",
    "default_block_sizes",
    "ragged_paged_attention",
    "ragged_paged_attention_reference",
]
