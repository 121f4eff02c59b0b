"""``perfmodel serve``'s library entry: simulate a benchmark run of a server and measure it as vLLM's client would.

:func:`simulate` builds the request stream (perfmodel.serve.workload), sizes the KV cache
(perfmodel.serve.capacity), runs every data-parallel replica (round robin over the stream, each with its share
of ``max_concurrency``) through its engine (perfmodel.serve.scheduler or perfmodel.serve.jetstream) with step
times from perfmodel.serve.steptime, and computes ``vllm bench serve``'s metrics (perfmodel.serve.metrics).
:func:`serve` adds the ``--op-speedup`` comparison (the same stream again, with the named ops faster) and
:func:`sweep` a latency-throughput curve over request rates or concurrencies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from perfmodel.errors import InputError
from perfmodel.serve.capacity import KVCapacity, kv_capacity
from perfmodel.serve.config import EngineConfig
from perfmodel.serve.metrics import BenchMetrics, bench_metrics
from perfmodel.serve.records import EngineStats, RequestRecord, RunResult, Timeline
from perfmodel.serve.workload import Request, Workload, build_requests

SWEEPABLE = ("request_rate", "max_concurrency")


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    engine: EngineConfig
    workload: Workload
    capacity: KVCapacity
    run: RunResult
    metrics: BenchMetrics


@dataclass(frozen=True, kw_only=True)
class ServeComparison:
    """A run and the same stream with ``--op-speedup`` applied (``faster`` None without speedups)."""

    base: ServeResult
    faster: ServeResult | None = None


@dataclass(frozen=True, kw_only=True)
class ServeSweep:
    """One run per value of ``swept`` (request_rate or max_concurrency)."""

    swept: str
    values: tuple[float, ...]
    points: tuple[ServeComparison, ...]


def _replica_engine(cfg: EngineConfig, times: Any, capacity: KVCapacity, replica: int, seed: int,
                    sink: Callable[[RequestRecord], None] | None) -> Any:
    """One replica's engine over the step times ``times`` (shared by the replicas: the tables depend on the
    configuration only)."""
    from perfmodel.serve.steptime import StepTimes

    if cfg.engine == "jetstream":
        from perfmodel.serve.jetstream import JetstreamEngine

        return JetstreamEngine(cfg, times, replica=replica, sink=sink)
    from perfmodel.serve.scheduler import DraftCost, VllmEngine

    draft = None
    if cfg.speculative is not None:
        draft_times = None
        if cfg.speculative.method == "draft_model":
            from perfmodel.model.configs import get_model

            with_model = get_model(cfg.speculative.draft_model)
            draft_times = StepTimes(cfg, model=with_model)
        draft = DraftCost(cfg, times, draft_times)
    return VllmEngine(cfg, times, capacity.num_blocks, seed=seed, replica=replica, draft=draft, sink=sink)


def simulate(cfg: EngineConfig, workload: Workload, requests: Sequence[Request] | None = None, *,
             percentile_metrics: tuple[str, ...] = ("ttft", "tpot", "itl"), percentiles: tuple[float, ...] = (99.0,),
             goodput_ms: dict[str, float] | None = None,
             on_record: Callable[[RequestRecord], None] | None = None,
             progress: Callable[..., None] | None = None, times: Any = None) -> ServeResult:
    """One simulated benchmark run (module docstring). ``on_record`` sees every finished request (in finish order
    per replica) -- the ``--save-requests`` writer; ``progress(message, done=, total=)`` about every 1% of the
    requests; ``times``: the StepTimes of ``cfg`` from an earlier run (its tables depend on the configuration
    only, so runs of one configuration under different workloads share them), else built here."""
    reqs = list(requests) if requests is not None else list(build_requests(workload))
    if progress is not None:
        on_record = _with_progress(on_record, progress, len(reqs))
    capacity = kv_capacity(cfg)
    if cfg.engine == "jetstream" and capacity.tokens < cfg.max_num_seqs * cfg.max_model_len:
        slots = capacity.tokens // cfg.max_model_len
        raise InputError(f"`max_num_seqs` {cfg.max_num_seqs}: JetStream keeps {cfg.max_model_len} KV tokens per slot "
                         f"and {cfg.chip.name} x{cfg.tp} holds {capacity.tokens} tokens: at most {slots} slots; lower "
                         "--max-num-seqs or --max-model-len")
    from perfmodel.serve.steptime import StepTimes

    if times is None:
        times = StepTimes(cfg)
    elif times.cfg is not cfg:
        raise ValueError("simulate: `times` was built for another configuration")
    engines = []
    for r in range(cfg.dp):
        share = reqs[r::cfg.dp]
        if not share:
            continue
        conc = workload.max_concurrency
        if conc is not None:
            conc = max(conc // cfg.dp + (1 if r < conc % cfg.dp else 0), 1)
        eng = _replica_engine(cfg, times, capacity, r, workload.seed, on_record)
        eng.run(share, conc)
        engines.append(eng)
    run = _merge(engines)
    metrics = bench_metrics(run, percentile_metrics=percentile_metrics, percentiles=percentiles,
                            goodput_ms=goodput_ms)
    return ServeResult(engine=cfg, workload=workload, capacity=capacity, run=run, metrics=metrics)


def _with_progress(sink: Callable[[RequestRecord], None] | None, progress: Callable[..., None],
                   total: int) -> Callable[[RequestRecord], None]:
    every = max(total // 100, 1)
    done = 0

    def record(r: RequestRecord) -> None:
        nonlocal done
        done += 1
        if sink is not None:
            sink(r)
        if done % every == 0 or done == total:
            progress(f"{done}/{total} requests", done=done, total=total)

    return record


def _merge(engines: list[Any]) -> RunResult:
    records = tuple(sorted((r for e in engines for r in e.rec.records), key=lambda r: r.index))
    pairs = [e.rec.itl() for e in engines]
    itl_values = np.concatenate([v for v, _ in pairs])
    itl_counts = np.concatenate([c for _, c in pairs])
    stats = [e.stats() for e in engines]
    steps = sum(s.steps for s in stats) or 1

    def mean(field: str) -> float:
        return sum(getattr(s, field) * s.steps for s in stats) / steps

    merged = EngineStats(
        steps=sum(s.steps for s in stats), mean_running=mean("mean_running"),
        mean_step_tokens=mean("mean_step_tokens"), mean_step_s=mean("mean_step_s"),
        preemptions=sum(s.preemptions for s in stats),
        prefix_cache_queries=sum(s.prefix_cache_queries for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats), kv_blocks=stats[0].kv_blocks,
        block_size=stats[0].block_size, peak_kv_usage=max(s.peak_kv_usage for s in stats),
        mean_kv_usage=mean("mean_kv_usage"), busy_s=max(s.busy_s for s in stats))
    times = np.concatenate([np.asarray(e.rec.chunk_times, dtype=float) for e in engines])
    counts = np.concatenate([np.asarray(e.rec.chunk_counts, dtype=np.int64) for e in engines])
    notes = ()
    if len(engines) > 1:
        notes = (f"{len(engines)} data-parallel replicas, requests dealt round robin; the timeline is replica 0's",)
    return RunResult(records=records, itl_values_s=itl_values, itl_counts=itl_counts, stats=merged,
                     timeline=engines[0].timeline(), chunk_times=times, chunk_counts=counts, notes=notes)


def serve(cfg: EngineConfig, workload: Workload, **kw: Any) -> ServeComparison:
    """The run, and with ``cfg.op_speedups`` the baseline (no speedups) beside it: ``base`` is always the
    unmodified server, ``faster`` the one with the faster ops."""
    requests = build_requests(workload)
    if not cfg.op_speedups:
        return ServeComparison(base=simulate(cfg, workload, requests, **kw))
    on_record = kw.pop("on_record", None)
    base = simulate(dataclasses.replace(cfg, op_speedups=()), workload, requests, **kw)
    faster = simulate(cfg, workload, requests, on_record=on_record, **kw)
    return ServeComparison(base=base, faster=faster)


def parse_sweep(text: str) -> tuple[str, tuple[float, ...]]:
    """``request-rate=1,2,4,inf`` or ``max-concurrency=1,8,64`` into (field, values)."""
    name, sep, values = text.partition("=")
    field = name.strip().replace("-", "_")
    if not sep or field not in SWEEPABLE:
        raise InputError(f"`sweep` '{text}': give request-rate=R1,R2,... or max-concurrency=C1,C2,...")
    out = []
    for v in values.split(","):
        v = v.strip()
        try:
            x = math.inf if v == "inf" else float(v)
        except ValueError:
            raise InputError(f"`sweep` '{text}': '{v}' is not a number") from None
        if field == "max_concurrency" and (not x.is_integer() or x < 1):
            raise InputError(f"`sweep` '{text}': concurrencies are whole numbers >= 1")
        if not x > 0:
            raise InputError(f"`sweep` '{text}': rates are > 0 requests/s (or inf)")
        out.append(int(x) if field == "max_concurrency" else x)
    if not out:
        raise InputError(f"`sweep` '{text}': give at least one value")
    return field, tuple(out)


def _sweep_point(task: tuple[EngineConfig, Workload, dict[str, Any]]) -> ServeComparison:
    """One point of a sweep (module level: perfmodel.runner's workers call it)."""
    cfg, workload, kw = task
    return serve(cfg, workload, **kw)


def sweep(cfg: EngineConfig, workload: Workload, swept: str, values: Sequence[float], *,
          progress: Callable[..., None] | None = None, backend: str = "inprocess", workers: int | None = None,
          address: str | None = None, **kw: Any) -> ServeSweep:
    """One :func:`serve` per value of ``swept``; the same seed (so the same lengths) at every point. The points
    run on perfmodel.runner's ``backend`` (in process when ``on_record`` writes a file as requests finish)."""
    from perfmodel.runner import run_tasks

    if kw.get("on_record") is not None:
        backend = "inprocess"
    tasks = [(cfg, dataclasses.replace(workload, **{swept: v}), kw) for v in values]
    results = run_tasks(_sweep_point, tasks, backend=backend, workers=workers, address=address, progress=progress)
    failed = next((r for r in results if not r.ok), None)
    if failed is not None:
        raise InputError(f"`sweep` {swept}={values[failed.index]}: {failed.error}")
    return ServeSweep(swept=swept, values=tuple(values), points=tuple(r.value for r in results))
