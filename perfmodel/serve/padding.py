"""The step shapes a TPU server precompiles, and the padding of each step to them.

tpu-inference (vllm-project/tpu-inference@b8692ff01fa191343836996c27a39dc95f008b88) compiles the model for a
fixed set of (tokens, requests) shapes and pads every step to the smallest that holds it:

* tokens: ``tpu_inference/runner/utils.py`` ``get_token_paddings`` with the default
  ``VLLM_TPU_BUCKET_PADDING_GAP=0``: powers of two from ``MIN_TOKEN_BUCKET`` (16) up to the first at or above
  ``max_num_batched_tokens``; a step's token count is padded by ``get_padded_token_len`` (the first bucket >= it);
* requests: ``get_padded_num_reqs_with_upper_limit``: 8 (``MIN_NUM_SEQS``) for up to 8 requests, else the next
  power of two, capped at ``max_num_seqs``.

The padded token count is what every layer's GEMMs, norms and the KV write see; the padded request count is the
rows of the LM head and the sampler. JetStream pads a whole prompt to ``DEFAULT_PREFILL_BUCKETS`` (powers of two
from 16, AI-Hypercomputer/JetStream@acd4f5ad jetstream/engine/token_utils.py) and runs its decode steps over
every slot.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKEN_BUCKET = 16
MIN_NUM_SEQS = 8


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True, kw_only=True)
class Padding:
    """How a step's token and request counts are padded (``enabled`` False: run them as they are)."""

    enabled: bool = True
    max_num_batched_tokens: int
    max_num_seqs: int

    def tokens(self, n: int) -> int:
        """Padded token count of a step of ``n`` tokens (a power of two >= 16 while padding is on)."""
        if not self.enabled:
            return n
        return max(MIN_TOKEN_BUCKET, next_power_of_2(n))

    def requests(self, n: int) -> int:
        """Padded request count of a step of ``n`` requests (8, then powers of two up to ``max_num_seqs``)."""
        if not self.enabled:
            return n
        return min(MIN_NUM_SEQS if n <= MIN_NUM_SEQS else next_power_of_2(n), max(self.max_num_seqs, MIN_NUM_SEQS))


def jetstream_prefill_bucket(n: int, max_prefill_length: int) -> int:
    """JetStream's padded prompt length: the first of 16, 32, ... (capped at ``max_prefill_length``) >= n."""
    return min(max(MIN_TOKEN_BUCKET, next_power_of_2(n)), max_prefill_length)
