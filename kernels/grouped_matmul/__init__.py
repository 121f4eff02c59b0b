"""Grouped matmul Pallas TPU kernel for mixture of experts (ragged groups of rows per expert; int8/fp8 weights).

Exports load lazily so that ``kernels.grouped_matmul.blocks`` (block-size tables) imports without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "default_block_table": "kernels.grouped_matmul.blocks",
    "GroupedMatmulBlockSizes": "kernels.grouped_matmul.blocks",
    "default_block_sizes": "kernels.grouped_matmul.blocks",
    "grouped_matmul": "kernels.grouped_matmul.kernel",
    "visit_metadata": "kernels.grouped_matmul.kernel",
    "grouped_matmul_reference": "kernels.grouped_matmul.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
