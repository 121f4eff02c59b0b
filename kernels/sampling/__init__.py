"""Fused sampling (temperature, top-k, top-p, min-p, greedy / Gumbel-max draw) as a Pallas TPU kernel.

Exports load lazily so that ``kernels.sampling.blocks`` and ``.entry`` import without jax.
"""

from kernels.common import lazy_exports

_EXPORTS = {
    "DEFAULT_BLOCK_SIZES": "kernels.sampling.blocks",
    "SamplingBlockSizes": "kernels.sampling.blocks",
    "default_block_sizes": "kernels.sampling.blocks",
    "sampling": "kernels.sampling.kernel",
    "kept_mask_reference": "kernels.sampling.reference",
    "sampling_reference": "kernels.sampling.reference",
    "logprobs_reference": "kernels.sampling.reference",
    "Sampled": "kernels.sampling.kernel",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
