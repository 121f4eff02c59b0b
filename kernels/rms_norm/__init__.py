"""Fused residual add + RMSNorm Pallas TPU kernel, with optional per-row int8 quantization of the output."""

from kernels.rms_norm.blocks import DEFAULT_BLOCK_SIZES, RmsNormBlockSizes, default_block_sizes
from kernels.rms_norm.kernel import rms_norm
from kernels.rms_norm.reference import rms_norm_reference

__all__ = ["DEFAULT_BLOCK_SIZES", "RmsNormBlockSizes", "default_block_sizes", "rms_norm", "rms_norm_reference"]
