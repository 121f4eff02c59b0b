"""What a simulated run leaves behind: one :class:`RequestRecord` per request as the benchmark client sees it, the
inter-token gaps, and the engine's statistics and timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One finished request, times in seconds from the benchmark start."""

    index: int
    #: When the client sent it (after any --max-concurrency wait).
    send_s: float
    first_token_s: float
    finish_s: float
    input_tokens: int
    output_tokens: int
    #: Streamed chunks after the first (the ITL gaps it contributes): one per step that produced tokens.
    chunks: int
    #: Prompt tokens served from the prefix cache (summed over admissions, preemptions included).
    cached_tokens: int
    preemptions: int
    replica: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.send_s

    @property
    def e2el_s(self) -> float:
        return self.finish_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's TPOT: (latency - TTFT) / (output tokens - 1); None for one output token."""
        if self.output_tokens <= 1:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, kw_only=True)
class EngineStats:
    """Counters of one or more replicas over a run."""

    steps: int
    #: Mean sequences per step (decodes and prefill chunks), over steps.
    mean_running: float
    #: Mean scheduled tokens per step.
    mean_step_tokens: float
    #: Mean device + host seconds per step.
    mean_step_s: float
    preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    kv_blocks: int
    block_size: int
    #: Largest share of the KV blocks in use at once.
    peak_kv_usage: float
    #: Mean share of the KV blocks in use, over steps.
    mean_kv_usage: float
    #: Seconds the engine was busy (sum of step times).
    busy_s: float

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Engine state sampled at step ends: time, running and waiting requests, KV blocks in use (share)."""

    t_s: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """Everything one simulated benchmark run produced."""

    records: tuple[RequestRecord, ...]
    #: Every streamed-chunk gap of every request (vLLM's ITL list, in no particular order) as distinct values,
    #: seconds, and how many gaps have each.
    itl_values_s: np.ndarray
    itl_counts: np.ndarray
    stats: EngineStats
    timeline: Timeline
    #: Step ends at which requests received chunks, and how many requests each (peak output throughput).
    chunk_times: np.ndarray
    chunk_counts: np.ndarray
    notes: tuple[str, ...] = field(default=())
