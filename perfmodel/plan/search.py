"""``perfmodel plan``: simulate every candidate that fits (perfmodel.plan.space) under the workload, on
perfmodel.runner's backends, and find the Pareto front of output tokens/s per chip against tokens/s per user.

Each finished candidate is appended to the results file (JSON Lines, flushed and fsynced) as it finishes, so a
search that is stopped loses nothing; ``resume`` reads the file and simulates only the candidates not in it.
A candidate meets the SLOs when its p90 TTFT and p90 TPOT are within the bounds given (and every ``--goodput`` SLO
holds for at least 90% of its requests).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from perfmodel.errors import InputError
from perfmodel.plan.space import Candidate, SearchSpace, expand, per_user, prune


@dataclass(frozen=True, kw_only=True)
class Slo:
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None
    goodput_ms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One simulated candidate."""

    candidate: Candidate
    output_throughput: float
    tokens_per_s_per_chip: float
    tokens_per_s_per_user: float
    p90_ttft_ms: float
    p90_tpot_ms: float
    mean_tpot_ms: float
    slo_met: bool

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidate"] = self.candidate.as_dict()
        return d


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    model: str
    outcomes: tuple[Outcome, ...]
    pruned: tuple[tuple[Candidate, str], ...]
    failed: tuple[tuple[Candidate, str], ...]
    front: tuple[Outcome, ...]
    best_per_chip: tuple[Outcome, ...]
    slo: Slo


#: This process's engine configurations and step tables of recent deployments (a candidate's concurrency does
#: not change them, and the search runs a deployment's concurrencies one after another): building the tables is
#: about a third of a 2,000-request simulation.
_DEPLOYMENTS: "OrderedDict[tuple, tuple[Any, Any]]" = OrderedDict()
DEPLOYMENTS_KEPT = 8


def _deployment(model_ref: str, c: Candidate, max_model_len: int) -> tuple[Any, Any]:
    """(EngineConfig, StepTimes) of the candidate's deployment, remembered per process."""
    from perfmodel.model.configs import get_model
    from perfmodel.plan.space import engine_for
    from perfmodel.serve.steptime import StepTimes

    key = (model_ref, max_model_len, replace(c, concurrency=0))
    hit = _DEPLOYMENTS.get(key)
    if hit is None:
        cfg = engine_for(get_model(model_ref), c, max_model_len=max_model_len)
        hit = _DEPLOYMENTS[key] = (cfg, StepTimes(cfg))
        while len(_DEPLOYMENTS) > DEPLOYMENTS_KEPT:
            _DEPLOYMENTS.popitem(last=False)
    return hit


def simulate_candidate(task: dict[str, Any]) -> dict[str, Any]:
    """One candidate's simulation (module level: the runner's workers import and call it)."""
    from perfmodel.serve.run import simulate
    from perfmodel.serve.workload import Workload

    c = Candidate(**task["candidate"])
    w = Workload(**{**task["workload"], "max_concurrency": c.concurrency})
    cfg, times = _deployment(task["model"], c, task["max_model_len"])
    m = simulate(cfg, w, percentiles=(90.0,), goodput_ms=dict(task["goodput_ms"]) or None, times=times).metrics
    p90 = {k: dict(m.distributions[k].percentiles_ms)[90.0] for k in ("ttft", "tpot")}
    slo = task["slo"]
    met = ((slo["ttft_p90_ms"] is None or p90["ttft"] <= slo["ttft_p90_ms"])
           and (slo["tpot_p90_ms"] is None or p90["tpot"] <= slo["tpot_p90_ms"])
           and (m.request_goodput is None or m.request_goodput >= 0.9 * m.request_throughput))
    tpot = m.distributions["tpot"].mean_ms
    return {"output_throughput": m.output_throughput, "tokens_per_s_per_chip": m.output_throughput / c.chips,
            "tokens_per_s_per_user": per_user(tpot), "p90_ttft_ms": p90["ttft"], "p90_tpot_ms": p90["tpot"],
            "mean_tpot_ms": tpot, "slo_met": bool(met)}


def pareto_front(points: Sequence[Outcome]) -> list[Outcome]:
    """The outcomes no other beats on both tokens/s per chip and tokens/s per user (ties kept), by per-user speed."""
    front = []
    for p in points:
        dominated = any(q.tokens_per_s_per_chip >= p.tokens_per_s_per_chip
                        and q.tokens_per_s_per_user >= p.tokens_per_s_per_user
                        and (q.tokens_per_s_per_chip > p.tokens_per_s_per_chip
                             or q.tokens_per_s_per_user > p.tokens_per_s_per_user) for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda o: (o.tokens_per_s_per_user, o.tokens_per_s_per_chip))


def best_per_chip(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Per chip type, the SLO-meeting outcome with the most tokens/s per chip."""
    best: dict[str, Outcome] = {}
    for o in outcomes:
        if o.slo_met and (o.candidate.chip not in best
                          or o.tokens_per_s_per_chip > best[o.candidate.chip].tokens_per_s_per_chip):
            best[o.candidate.chip] = o
    return list(best.values())


class ResultsFile:
    """The JSON Lines results of a search: one line per candidate ({"candidate", "result"} or {"candidate",
    "error"}), appended and fsynced as each finishes."""

    def __init__(self, path: str, *, resume: bool, force: bool):
        self.path = Path(path)
        self.done: dict[tuple, dict[str, Any]] = {}
        if self.path.exists():
            if resume:
                self._read()
            elif not force:
                raise InputError(f"`out` {path} exists; pass --resume to continue that search or --force to start "
                                 "over")
        elif resume:
            raise InputError(f"`resume`: {path} does not exist; run without --resume to start the search")
        if not self.path.parent.is_dir():
            raise InputError(f"`out`: the directory of {path} does not exist; create it first")
        self._fh = open(self.path, "a" if resume else "w", encoding="utf-8")

    @staticmethod
    def key(candidate: dict[str, Any]) -> tuple:
        return tuple(sorted(candidate.items()))

    def _read(self) -> None:
        with open(self.path, encoding="utf-8") as fh:
            text = fh.read()
        lines = text.splitlines()
        for i, line in enumerate(lines, 1):
            try:
                rec = json.loads(line)
                self.done[self.key(rec["candidate"])] = rec
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                if i == len(lines) and not text.endswith("\n"):  # a line cut by a crash: dropped, simulated again
                    with open(self.path, "r+", encoding="utf-8") as fh:
                        fh.truncate(len(text.encode("utf-8")) - len(line.encode("utf-8")))
                    continue
                raise InputError(f"{self.path}:{i}: not a plan result line; give a file `perfmodel plan --out` "
                                 "wrote") from None

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def plan(model_ref: str, space: SearchSpace, workload: Any, *, max_model_len: int, slo: Slo,
         backend: str = "auto", workers: int | None = None, address: str | None = None,
         results: ResultsFile | None = None, progress: Callable[..., None] | None = None) -> PlanResult:
    """The search (module docstring)."""
    import dataclasses

    from perfmodel.model.configs import get_model
    from perfmodel.runner import run_tasks

    model = get_model(model_ref)
    keep, dropped = prune(model, expand(model, space), max_model_len=max_model_len)
    base = {"model": model_ref, "workload": {k: v for k, v in dataclasses.asdict(workload).items()},
            "max_model_len": max_model_len, "slo": {"ttft_p90_ms": slo.ttft_p90_ms, "tpot_p90_ms": slo.tpot_p90_ms},
            "goodput_ms": list(slo.goodput_ms)}
    done = results.done if results else {}
    todo = [c for c in keep if ResultsFile.key(c.as_dict()) not in done]

    def record(r: Any) -> None:
        line = {"candidate": r.inputs["candidate"]}
        line.update({"result": r.value} if r.ok else {"error": r.error})
        done[ResultsFile.key(line["candidate"])] = line
        if results is not None:
            results.write(line)

    # a deployment's concurrencies are consecutive in ``todo``: batched, one worker simulates them on one set of
    # step tables; batches stay small enough for at least 4 per worker (the load stays balanced)
    lanes = workers or os.cpu_count() or 1
    batch = max(1, min(len(space.concurrencies), len(todo) // (4 * lanes)))
    run_tasks(simulate_candidate, [{**base, "candidate": c.as_dict()} for c in todo], backend=backend,
              workers=workers, address=address, on_result=record, progress=progress, batch=batch)
    outcomes, failed = [], []
    for c in keep:
        rec = done.get(ResultsFile.key(c.as_dict()))
        if rec is None:
            continue
        if "error" in rec:
            failed.append((c, rec["error"]))
        else:
            outcomes.append(Outcome(candidate=c, **rec["result"]))
    return PlanResult(model=model.name, outcomes=tuple(outcomes), pruned=tuple(dropped), failed=tuple(failed),
                      front=tuple(pareto_front(outcomes)), best_per_chip=tuple(best_per_chip(outcomes)), slo=slo)
