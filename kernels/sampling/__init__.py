"""Fused sampling (penalties, bias and masks, temperature, top-k, top-p, min-p, greedy / Gumbel-max draw, logprobs)
and a speculative-decoding rejection sampler as Pallas TPU kernels.

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
    "Verified": "kernels.sampling.rejection",
    "rejection_sample": "kernels.sampling.rejection",
    "rejection_sample_reference": "kernels.sampling.rejection",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
