"""Fused sampling (temperature, top-k, top-p, min-p, greedy / Gumbel-max draw) as a Pallas TPU kernel."""

from kernels.sampling.blocks import DEFAULT_BLOCK_SIZES, SamplingBlockSizes, default_block_sizes
from kernels.sampling.kernel import sampling
from kernels.sampling.reference import kept_mask_reference, sampling_reference

__all__ = [
    "DEFAULT_BLOCK_SIZES",
    "SamplingBlockSizes",
    "default_block_sizes",
    "kept_mask_reference",
    "sampling",
    "sampling_reference",
]
