"""The configurations ``perfmodel plan`` searches, and which of them can run at all.

A :class:`Candidate` is one deployment and one load: chip, chips (= TP x DP), TP, weight and KV dtypes,
max-num-seqs, token budget, speculative decoding on or off, and the client concurrency it is measured at.
:func:`expand` lists the cross product of the asked values with every TP x DP split of each chip count that
the model's heads allow; :func:`prune` drops those whose weights, workspace and one max-model-len sequence do not fit
a replica's HBM (perfmodel.serve.capacity), with the reason, before anything is simulated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from perfmodel.errors import InputError, PerfmodelError

#: Most candidates one search may have (each is a simulation).
MAX_CANDIDATES = 100_000


@dataclass(frozen=True, kw_only=True)
class Candidate:
    chip: str
    chips: int
    tp: int
    dp: int
    weight_dtype: str
    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    #: The speculative config JSON and acceptance (None: off).
    speculative_config: str | None
    acceptance_rate: str | None
    concurrency: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    chips: tuple[str, ...]
    chip_counts: tuple[int, ...]
    weight_dtypes: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    max_num_seqs: tuple[int, ...]
    max_num_batched_tokens: tuple[int, ...]
    concurrencies: tuple[int, ...]
    #: (speculative config JSON, acceptance rate) pairs; (None, None) = off.
    speculative: tuple[tuple[str | None, str | None], ...] = ((None, None),)


def tp_splits(model: Any, chips: int) -> list[int]:
    """TP degrees of ``chips`` chips (DP = chips / TP) whose heads split evenly (perfmodel.model.sharding.shard)."""
    from perfmodel.model.sharding import shard

    out = []
    for tp in range(1, chips + 1):
        if chips % tp:
            continue
        try:
            shard(model, tp)
        except PerfmodelError:
            continue
        out.append(tp)
    return out


def expand(model: Any, space: SearchSpace) -> list[Candidate]:
    """Every candidate of ``space`` (module docstring), in a fixed order."""
    n = (len(space.chips) * sum(len(tp_splits(model, c)) for c in space.chip_counts) * len(space.weight_dtypes)
         * len(space.kv_cache_dtypes) * len(space.max_num_seqs) * len(space.max_num_batched_tokens)
         * len(space.concurrencies) * len(space.speculative))
    if n > MAX_CANDIDATES:
        raise InputError(f"the search has {n:,} configurations, more than {MAX_CANDIDATES:,}; narrow a list "
                         "(--chips, --max-num-seqs, --max-num-batched-tokens, --concurrency, ...)")
    out = []
    for chip in space.chips:
        for chips in space.chip_counts:
            for tp in tp_splits(model, chips):
                for w in space.weight_dtypes:
                    for kv in space.kv_cache_dtypes:
                        for seqs in space.max_num_seqs:
                            for budget in space.max_num_batched_tokens:
                                for spec, acc in space.speculative:
                                    for conc in space.concurrencies:
                                        out.append(Candidate(
                                            chip=chip, chips=chips, tp=tp, dp=chips // tp, weight_dtype=w,
                                            kv_cache_dtype=kv, max_num_seqs=seqs, max_num_batched_tokens=budget,
                                            speculative_config=spec, acceptance_rate=acc, concurrency=conc))
    return out


def engine_for(model: Any, c: Candidate, *, max_model_len: int) -> Any:
    """The EngineConfig of a candidate (InputError when the flags are inconsistent)."""
    from perfmodel.hw import get_chip
    from perfmodel.serve.config import engine_config, parse_speculative_config

    return engine_config(model=model, chip=get_chip(c.chip), tp=c.tp, dp=c.dp, max_num_seqs=c.max_num_seqs,
                         max_num_batched_tokens=c.max_num_batched_tokens, max_model_len=max_model_len,
                         weight_dtype=c.weight_dtype, kv_cache_dtype=c.kv_cache_dtype,
                         speculative=parse_speculative_config(c.speculative_config, c.acceptance_rate))


def prune(model: Any, candidates: Sequence[Candidate], *, max_model_len: int
          ) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """(candidates that fit, (candidate, why not) for the rest): each engine's KV capacity is computed once per
    deployment (the concurrency does not change it)."""
    from perfmodel.serve.capacity import kv_capacity

    verdicts: dict[tuple, str | None] = {}
    keep, dropped = [], []
    for c in candidates:
        key = (c.chip, c.tp, c.dp, c.weight_dtype, c.kv_cache_dtype, c.max_num_seqs, c.max_num_batched_tokens,
               c.speculative_config)
        if key not in verdicts:
            try:
                kv_capacity(engine_for(model, c, max_model_len=max_model_len))
                verdicts[key] = None
            except PerfmodelError as exc:
                verdicts[key] = str(exc)
        why = verdicts[key]
        (keep.append(c) if why is None else dropped.append((c, why)))
    return keep, dropped


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"`{flag}` '{text}': give whole numbers separated by commas, e.g. 1,4,8") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"`{flag}` '{text}': give whole numbers >= 1 separated by commas")
    return tuple(dict.fromkeys(values))


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def per_user(tpot_ms: float) -> float:
    """Output tokens per second one user sees at a mean TPOT (ms)."""
    return 1000.0 / tpot_ms if tpot_ms > 0 else math.inf
