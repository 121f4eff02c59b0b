"""The bundled sampling kernel's feature variants (which function, which arrays, which static options), listed once
(no jax).

The compile checks (tests/compiler/kernel_variants.py) compile the :data:`CHECKED` variants; the benchmark
(tests/benchmarks/bench_sampling_kernel.py) compiles any of :data:`VARIANTS` and labels its vocabulary passes by
:attr:`Variant.passes`.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The serving problem of the compile checks and the benchmark's default: 64 requests over a 128,256-entry
#: vocabulary (Llama 3's).
BATCH, VOCAB = 64, 128256
#: --shape dtype text -> numpy name of the logits dtypes of the table.
_NUMPY_DTYPE = {"f32": "float32", "bf16": "bfloat16"}
#: --shape dtype text of each [batch, vocab] array a variant can pass, in the order the calls pass them.
_VOCAB_ARRAYS = {"token_counts": "int32", "logit_bias": "f32", "allowed_mask": "bool", "banned_mask": "bool"}


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One feature combination of the sampling kernel: ``sampling`` over ``logits`` ([batch, vocab]) with per-request
    ``seeds`` (none: greedy), the options named in ``per_request`` as [batch] f32 arrays, the [batch, vocab]
    ``vocab_arrays`` (token_counts, logit_bias, allowed_mask, banned_mask) and the static ``options``; or
    ``rejection_sample`` of ``draft`` tokens per request (f32 draft and target probabilities, per-request seeds)."""

    #: The variant's label in test ids and the benchmark's --variants.
    name: str
    function: str = "sampling"
    #: --shape dtype text of the logits: f32 or bf16.
    logits: str = "f32"
    seeds: bool = True
    per_request: tuple[str, ...] = ()
    vocab_arrays: tuple[str, ...] = ()
    #: Static keyword arguments as (name, value) pairs, in the order of the call's argument texts.
    options: tuple[tuple[str, float | int], ...] = ()
    #: rejection_sample: draft tokens per request.
    draft: int = 0
    #: Labels of the passes over the vocabulary chunks, in program order (the benchmark's rows).
    passes: tuple[str, ...] = ()
    #: Compiled by the compile checks; False: a feature subset of a checked variant, run by the benchmark alone.
    checked: bool = True

    @property
    def target(self) -> str:
        """The compile call's MODULE:FUNCTION."""
        return f"kernels.sampling:{self.function}"

    @property
    def logits_dtype(self) -> str:
        """numpy name of the logits dtype (rejection_sample: of its f32 probabilities)."""
        return _NUMPY_DTYPE[self.logits]

    @property
    def kwargs(self) -> dict[str, float | int]:
        """The static options as keyword arguments."""
        return dict(self.options)

    def shapes(self, batch: int = BATCH, vocab: int = VOCAB) -> tuple[str, ...]:
        """--shape texts of the call's arrays: rejection_sample's draft ids, draft and target probabilities and
        seeds; sampling's logits, seeds, per-request options, then the [batch, vocab] arrays."""
        seeds = (f"seeds={batch}:int32",) if self.seeds else ()
        if self.function == "rejection_sample":
            k = self.draft
            return (f"draft_token_ids={batch}x{k}:int32", f"draft_probs={k}x{batch}x{vocab}:f32",
                    f"target_probs={k + 1}x{batch}x{vocab}:f32") + seeds
        return ((f"logits={batch}x{vocab}:{self.logits}",) + seeds
                + tuple(f"{name}={batch}:f32" for name in self.per_request)
                + tuple(f"{name}={batch}x{vocab}:{_VOCAB_ARRAYS[name]}" for name in self.vocab_arrays))

    def args(self) -> tuple[str, ...]:
        """The static options as NAME=VALUE argument texts."""
        return tuple(f"{name}={value}" for name, value in self.options)


_TOP_K = ("lane top-5 capture", "top-k count")
_TOP_P = ("top-p mass of kept set", "top-p count+mass")

#: Every variant: the single searches first, then one per feature the compile checks compile.
VARIANTS: tuple[Variant, ...] = (
    Variant(name="top-k", options=(("temperature", 0.8), ("top_k", 50)), passes=_TOP_K, checked=False),
    Variant(name="top-p", options=(("temperature", 0.8), ("top_p", 0.9)), passes=_TOP_P, checked=False),
    Variant(name="top-k+top-p", options=(("temperature", 0.8), ("top_k", 50), ("top_p", 0.9)),
            passes=_TOP_K + _TOP_P),
    Variant(name="bf16 min-p, per-request temperatures", logits="bf16", per_request=("temperature",),
            options=(("min_p", 0.05),)),
    Variant(name="penalties+bias", vocab_arrays=("token_counts", "logit_bias"),
            options=(("temperature", 0.8), ("top_k", 50), ("presence_penalty", 0.5), ("frequency_penalty", 0.2),
                     ("repetition_penalty", 1.1)),
            passes=_TOP_K, checked=False),
    Variant(name="penalties, bias and masks",
            vocab_arrays=("token_counts", "logit_bias", "allowed_mask", "banned_mask"),
            options=(("presence_penalty", 0.5), ("frequency_penalty", 0.2), ("repetition_penalty", 1.1),
                     ("top_k", 50)),
            passes=_TOP_K),
    Variant(name="logprobs", options=(("top_k", 50), ("top_p", 0.9), ("logprobs", 5)),
            passes=_TOP_K + _TOP_P + ("top-n logprob",)),
    Variant(name="greedy", seeds=False),
    Variant(name="rejection k=4", function="rejection_sample", draft=4),
)
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: The variants the compile checks compile (one per feature).
CHECKED: tuple[Variant, ...] = tuple(v for v in VARIANTS if v.checked)
