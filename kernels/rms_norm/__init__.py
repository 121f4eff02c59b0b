"""Fused residual add + RMSNorm Pallas TPU kernel, with optional per-row int8 quantization of the output.

Exports load lazily so that ``kernels.rms_norm.blocks`` imports without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.rms_norm.blocks",
    "RmsNormBlockSizes": "kernels.rms_norm.blocks",
    "default_block_sizes": "kernels.rms_norm.blocks",
    "rms_norm": "kernels.rms_norm.kernel",
    "rms_norm_reference": "kernels.rms_norm.reference",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
