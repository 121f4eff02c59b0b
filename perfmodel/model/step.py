"""The inputs of one transformer step: :class:`Step` and its validated constructors.

:func:`make_step` (a prefill chunk or a decode step) and :func:`mixed_step` (a
ragged step of a serving engine) resolve the defaults and check their keyword
arguments, raising a one-line InputError that names the flag; the step model
(:mod:`perfmodel.model.transformer`) and the memory fit
(:mod:`perfmodel.model.sharding`) read the :class:`Step` they return.

No jax import here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.dtypes import is_quantized, parse_dtype
from perfmodel.model.gemm import resolve_weight_scale

PHASES: tuple[str, ...] = ("prefill", "decode")
#: A ragged step of a serving engine: prefill chunks and decode tokens of many sequences at once
#: (:func:`mixed_step`; the CLI's phases stay prefill and decode).
MIXED = "mixed"
DEFAULT_PAGE_SIZE = 16


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one step processes, on how many chips, in which dtypes."""

    #: "prefill" (a chunk of new tokens per sequence), "decode" (one new token per sequence) or "mixed" (a
    #: ragged step: ``query_lens[i]`` new tokens of sequence i over its ``context_lens[i]``, see :func:`mixed_step`).
    phase: str
    #: Sequences in the step.
    batch: int
    #: Decode: KV tokens each sequence attends to (its context, the new token included).
    #: Prefill: tokens already cached before this chunk (0 for a fresh prompt).
    context_tokens: int
    #: Prefill: new tokens per sequence in this chunk. Decode: 1.
    chunk_tokens: int
    weight_dtype: str
    act_dtype: str
    kv_dtype: str
    #: Tensor-parallel degree (chips, over ICI).
    tp: int
    page_size: int
    #: Decode only: one KV length per sequence (then ``batch`` is their count and ``context_tokens`` their
    #: maximum); None when all sequences share ``context_tokens``.
    context_lens: tuple[int, ...] | None = None
    #: Scales of quantized weights: "per-channel" (the default for int8/int4/fp8 weights) or "per-block"
    #: (``scale_block`` rows of K per scale); "none" for float weights.
    weight_scale: str = "none"
    #: K rows per scale with ``weight_scale`` per-block.
    scale_block: int | None = None
    #: int8 x int8 (w8a8) or int8 x int4 (w4a8) weight GEMMs: activations read in ``act_dtype`` and quantized per
    #: token inside each GEMM (the bundled matmul's ``quantize_activations``); the MoE expert GEMMs keep ``act_dtype``
    #: activations (the bundled grouped_matmul has no in-kernel quantization).
    quantize_activations: bool = False
    #: Mixed only: new tokens of each sequence in this step (prefill chunks > 1, decode tokens 1; a speculative
    #: verification k + 1); ``context_lens`` then holds each sequence's KV tokens after the step.
    query_lens: tuple[int, ...] | None = None

    def weight_gemm(self, high_precision: bool = False, *, in_kernel_quantization: bool = True) -> dict[str, Any]:
        """Keyword arguments of :func:`perfmodel.model.gemm.gemm` for a weight matrix of this step: the
        activation and weight dtypes, the weight scales and, with ``quantize_activations`` (and a kernel that
        quantizes, ``in_kernel_quantization``), int8 activations quantized in the kernel. ``high_precision``
        (router, ...): weights kept in the activation dtype."""
        if high_precision:
            return dict(lhs_dtype=self.act_dtype, rhs_dtype=self.act_dtype, out_dtype=self.act_dtype)
        kw: dict[str, Any] = dict(lhs_dtype=self.act_dtype, rhs_dtype=self.weight_dtype, out_dtype=self.act_dtype,
                                  weight_scale=self.weight_scale, scale_block=self.scale_block)
        if self.quantize_activations and in_kernel_quantization:
            kw.update(quantize_activations=True)
        return kw

    @property
    def tokens(self) -> int:
        """Tokens the step pushes through the layers."""
        if self.query_lens is not None:
            return sum(self.query_lens)
        return self.batch * self.chunk_tokens

    @property
    def kv_tokens(self) -> int:
        """KV tokens per sequence after the step (what attention reads and the cache holds; mixed: the longest)."""
        return self.context_tokens if self.phase in ("decode", MIXED) else self.context_tokens + self.chunk_tokens

    def sequence_kv_tokens(self) -> np.ndarray:
        """KV tokens of each sequence after the step (length ``batch``)."""
        if self.context_lens is not None:
            return np.asarray(self.context_lens, dtype=np.int64)
        return np.full(self.batch, self.kv_tokens, dtype=np.int64)


def make_step(*, phase: str = "decode", batch: int | None = None, context: int | None = None,
              prefill_len: int | None = None, context_lens: Any = None, weight_dtype: str = "bf16",
              act_dtype: str = "bf16", kv_dtype: str | None = None, tp: int = 1,
              page_size: int = DEFAULT_PAGE_SIZE, weight_scale: str | None = None, scale_block: int | None = None,
              quantize_activations: bool = False) -> Step:
    """Validated :class:`Step`; one-line InputError naming the flag for bad input.

    Decode: ``context`` = KV length each sequence attends to (default 1024),
    or ``context_lens`` = one length per sequence (a mixed batch; ``batch``
    is then their count). Prefill: ``prefill_len`` = new tokens per sequence
    (default 2048) and ``context`` = tokens already cached before the chunk
    (default 0). ``batch`` defaults to 1; ``kv_dtype`` to ``act_dtype``. ``weight_scale`` / ``scale_block`` /
    ``quantize_activations``: see :class:`Step`.
    """
    if phase not in PHASES:
        raise InputError(f"`phase`: got '{phase}'; use prefill or decode")
    lens = None
    if context_lens is not None:
        if phase != "decode":
            raise InputError("`context_lens` / `context_dist` apply to `phase` decode; prefill takes one `context`")
        if context is not None:
            raise InputError("give `context` or `context_lens` / `context_dist`, not both")
        arr = np.atleast_1d(np.asarray(context_lens))
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or np.any(arr < 1):
            raise InputError(f"`context_lens`: give whole numbers >= 1, one per sequence, got {context_lens!r}")
        if batch is not None and batch != arr.size:
            raise InputError(f"`batch` {batch} disagrees with the {arr.size} `context_lens` given; drop `batch`")
        lens, batch, context = tuple(int(x) for x in arr), int(arr.size), int(arr.max())
    batch = 1 if batch is None else batch
    _positive("`batch`", batch)
    _positive("`tp`", tp)
    _positive("`page_size`", page_size)
    if phase == "decode":
        if prefill_len is not None:
            raise InputError("`prefill_len` applies to `phase` prefill; for decode give `context`")
        context = 1024 if context is None else context
        _positive("`context`", context)
        chunk = 1
    else:
        chunk = 2048 if prefill_len is None else prefill_len
        _positive("`prefill_len`", chunk)
        context = 0 if context is None else context
        if not isinstance(context, (int, np.integer)) or context < 0:
            raise InputError(f"`context` must be >= 0 for prefill (tokens cached before the chunk), got {context}")
    weights, acts = parse_dtype(weight_dtype, "`weight_dtype`"), parse_dtype(act_dtype, "`act_dtype`")
    scale, block = resolve_weight_scale(weights, weight_scale, scale_block, dtype_field="weight_dtype")
    if quantize_activations and (weights not in ("int8", "int4") or is_quantized(acts)):
        raise InputError(f"`quantize_activations`: int8 x int8 / int8 x int4 GEMMs quantize float activations for "
                         f"int8 or int4 weights; got `weight_dtype` {weights} and `act_dtype` {acts} (use "
                         "--weight-dtype int8 or int4 with --act-dtype bf16)")
    return Step(phase=phase, batch=int(batch), context_tokens=int(context), chunk_tokens=int(chunk),
                weight_dtype=weights, act_dtype=acts,
                kv_dtype=parse_dtype(kv_dtype or act_dtype, "`kv_dtype`"), tp=int(tp), page_size=int(page_size),
                context_lens=lens, weight_scale=scale, scale_block=int(block) if scale == "per-block" else None,
                quantize_activations=bool(quantize_activations))


def mixed_step(*, query_lens: Any, context_lens: Any, weight_dtype: str = "bf16", act_dtype: str = "bf16",
               kv_dtype: str | None = None, tp: int = 1, page_size: int = DEFAULT_PAGE_SIZE,
               weight_scale: str | None = None, scale_block: int | None = None,
               quantize_activations: bool = False) -> Step:
    """Validated ragged :class:`Step` of a serving engine (vLLM TPU's unified step): sequence i pushes
    ``query_lens[i]`` new tokens (a prefill chunk, a decode token, a speculative verification) and attends over
    ``context_lens[i]`` KV tokens, the new ones included. Attention is one ragged paged-attention kernel over all
    of them; every other op sees the step's ``sum(query_lens)`` tokens, the LM head one row per sequence."""
    q = np.atleast_1d(np.asarray(query_lens))
    c = np.atleast_1d(np.asarray(context_lens))
    for name, arr in (("query_lens", q), ("context_lens", c)):
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or np.any(arr < 1):
            raise InputError(f"`{name}`: give whole numbers >= 1, one per sequence")
    if q.size != c.size:
        raise InputError(f"`query_lens` has {q.size} sequences but `context_lens` has {c.size}; give one of each")
    if np.any(q > c):
        raise InputError("`query_lens` exceeds `context_lens`: the context includes the step's new tokens")
    base = make_step(phase="decode", batch=int(q.size), context=int(c.max()), weight_dtype=weight_dtype,
                     act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp, page_size=page_size, weight_scale=weight_scale,
                     scale_block=scale_block, quantize_activations=quantize_activations)
    return dataclasses.replace(base, phase=MIXED, query_lens=tuple(int(x) for x in q),
                               context_lens=tuple(int(x) for x in c))


def _positive(flag: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{flag} must be a whole number >= 1, got {value}")
