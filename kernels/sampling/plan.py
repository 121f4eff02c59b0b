"""Static facts of a fused sampling call: the limits the call checks (largest vocabulary, the lane groups the
passes fold chunks into), the filters a call passed (:class:`Filters`), the row and vocabulary block grid shared
with the rejection sampler (:class:`RowVocabGrid`), the plan that sizes the pallas_call and the kernel body
(:class:`SamplingPlan`, made and checked by :func:`make_plan`), and the layout of the packed per-row option arrays
the kernel reads (column indices, :func:`_packed_options`)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.perf import DEFAULT_CHIP
from kernels.sampling.blocks import SamplingBlockSizes, default_block_sizes
from kernels.tiling import LANES

#: Columns of the packed per-row option arrays.
_F_INV_TEMP, _F_TOP_P, _F_MIN_P, _F_GREEDY, _F_PRESENCE, _F_FREQUENCY, _F_REPETITION = range(7)
_I_TOP_K, _I_SEED = range(2)
N_OPTS_F, N_OPTS_I = 7, 2
#: Widest lane group the passes fold a chunk into (see :func:`lane_group`).
LANE_GROUP = 256
#: Largest vocabulary: indices are reduced as exact f32 integers.
MAX_VOCAB = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Filters:
    """Which filters and inputs a call passed (static): the others are compiled out and left out of the cost
    estimate. ``logprobs`` None: no logprobs; 0: the chosen token's; n: also the n most likely tokens'."""

    top_k: bool
    top_p: bool
    min_p: bool
    penalties: bool = False
    bias: bool = False
    logprobs: int | None = None


class RowVocabGrid:
    """The row and vocabulary block counts of a sampling kernel's plan (a frozen dataclass with ``batch``,
    ``vocab``, ``block_b`` and ``block_v``): shared by :class:`SamplingPlan` and the rejection sampler's plan."""

    batch: int
    vocab: int
    block_b: int
    block_v: int

    @property
    def row_blocks(self) -> int:
        """Row blocks (a grid axis)."""
        return pl.cdiv(self.batch, self.block_b)

    @property
    def vocab_blocks(self) -> int:
        """Vocabulary blocks (the last grid axis, and the resident copy's leading dimension)."""
        return pl.cdiv(self.vocab, self.block_v)


@dataclass(frozen=True, kw_only=True)
class SamplingPlan(RowVocabGrid):
    """Static facts of one call, made once from its arguments, the chip and the blocks (:func:`make_plan`): they
    size the pallas_call (grid, BlockSpecs, scratch, compiler params, cost estimate) and the kernel body.
    Hashable: the jitted function and the body take it as a static argument."""

    batch: int
    vocab: int
    #: numpy dtype name of the logits (float32 or bfloat16).
    logits_dtype: str
    #: The draw: "greedy" (no key, seeds or noise), "key" (hashed per-row seeds) or "noise" (pre-drawn uniforms).
    mode: str
    filters: Filters
    #: Rows per grid step and vocabulary entries per grid step and pass chunk (the checked block sizes).
    block_b: int
    block_v: int

    @property
    def padded(self) -> int:
        """Padding rows of the last row block."""
        return self.row_blocks * self.block_b - self.batch

    @property
    def width(self) -> int:
        """Lanes the passes fold a chunk into (:func:`lane_group`)."""
        return lane_group(self.block_v)

    @property
    def n_top(self) -> int:
        """Top-n log-probabilities returned (0: none)."""
        return self.filters.logprobs or 0

    @property
    def resident(self) -> bool:
        """Whether phase 0 keeps the whole row block in VMEM for phase 1's passes."""
        return self.mode != "greedy" or self.n_top > 0

    @property
    def phases(self) -> int:
        """Grid phases (:func:`phases_of`)."""
        return phases_of(self.mode, self.n_top)

    @property
    def rows_dtype(self) -> str:
        """Dtype of the resident rows: f32 where penalties or a bias adjust the logits, else the logits'."""
        return "float32" if (self.filters.penalties or self.filters.bias) else self.logits_dtype


def make_plan(logits, *, mode: str, filters: Filters, block_sizes: SamplingBlockSizes | None = None,
              chip: str = DEFAULT_CHIP) -> SamplingPlan:
    """The plan of a :func:`sampling` call whose arguments passed its checks (``mode`` and ``filters`` as it
    derives them): the chip's defaults fitted to the dtype and vocabulary unless ``block_sizes`` is given, then
    the blocks' checks (sublane tiling, the chip's scoped VMEM; ValueError naming the field). ``logits`` is read
    for its shape and dtype only (a jax.ShapeDtypeStruct will do)."""
    batch, vocab = logits.shape
    if block_sizes is None:
        block_sizes = default_block_sizes(chip, logits_dtype=logits.dtype, vocab=vocab)
    block_sizes.validate(vocab=vocab, logits_dtype=logits.dtype, with_noise=mode == "noise", chip=chip,
                         greedy=mode == "greedy", penalties=filters.penalties,
                         bias=filters.bias, top_logprobs=filters.logprobs or 0)
    return SamplingPlan(batch=batch, vocab=vocab, logits_dtype=jnp.dtype(logits.dtype).name, mode=mode,
                        filters=filters, block_b=block_sizes.block_b, block_v=block_sizes.block_v)


def lane_group(block_v: int) -> int:
    """Lanes the passes fold a chunk into (per-row accumulators of this width): the widest of 256 / 128 dividing
    block_v. Wider groups give the VLIW more independent chains; narrower ones fewer live vregs."""
    return next(w for w in (LANE_GROUP, LANES) if block_v % w == 0)


def _packed_options(inv_temperature, top_p, min_p, greedy, presence, frequency, repetition, top_k, seeds, *,
                    padded: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """The per-row options as the kernel reads them: [rows, N_OPTS_F] f32 and [rows, N_OPTS_I] int32, with
    ``padded`` padding rows that are greedy with every filter off, so they never keep a search running."""
    opts_f = jnp.stack([inv_temperature, top_p, min_p, greedy.astype(jnp.float32), presence, frequency, repetition],
                       axis=1)
    opts_f = jnp.pad(opts_f, ((0, padded), (0, 0)), constant_values=1.0)
    opts_i = jnp.pad(jnp.stack([top_k, seeds], axis=1), ((0, padded), (0, 0)), constant_values=vocab)
    return opts_f, opts_i


def phases_of(mode: str, n_top: int) -> int:
    """Grid phases: 1 (streaming only) for a greedy call without top-n log-probabilities, else 2."""
    return 1 if mode == "greedy" and n_top == 0 else 2
