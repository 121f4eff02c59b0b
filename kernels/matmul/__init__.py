"""Tiled GEMM Pallas TPU kernel with int8/fp8 weight quantization and a fused bias/activation epilogue."""

from kernels.matmul.blocks import DEFAULT_BLOCK_SIZES, MatmulBlockSizes, default_block_sizes
from kernels.matmul.kernel import matmul
from kernels.matmul.reference import ACTIVATIONS, matmul_reference

__all__ = ["ACTIVATIONS", "DEFAULT_BLOCK_SIZES", "MatmulBlockSizes", "default_block_sizes", "matmul", "matmul_reference"]
