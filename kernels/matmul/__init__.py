"""Tiled GEMM Pallas TPU kernel with int8/fp8 weight quantization and a fused bias/activation epilogue.

Exports load lazily so that ``kernels.matmul.blocks`` / ``.tiling`` (block-size tables and
tiling rules) import without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "default_block_table": "kernels.matmul.blocks",
    "MatmulBlockSizes": "kernels.matmul.blocks",
    "default_block_sizes": "kernels.matmul.blocks",
    "matmul": "kernels.matmul.kernel",
    "quantizes_x_in_bf16": "kernels.matmul.plan",
    "ACTIVATIONS": "kernels.matmul.reference",
    "matmul_reference": "kernels.matmul.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
