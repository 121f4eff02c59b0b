"""perfmodel plan: Pareto logic on hand-made points, pruning, resume after a kill, the runner's backends."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.model.configs import get_model
from perfmodel.plan.search import Outcome, ResultsFile, best_per_chip, pareto_front
from perfmodel.plan.space import Candidate, SearchSpace, expand, prune, tp_splits
from perfmodel.runner import run_tasks


def _c(chip="tpu-v6e", chips=1, tp=1, conc=8, seqs=256):
    return Candidate(chip=chip, chips=chips, tp=tp, dp=chips // tp, weight_dtype="bf16", kv_cache_dtype="bf16",
                     max_num_seqs=seqs, max_num_batched_tokens=2048, speculative_config=None, acceptance_rate=None,
                     concurrency=conc)


def _o(per_chip, per_user, met=True, **kw):
    return Outcome(candidate=_c(**kw), output_throughput=per_chip, tokens_per_s_per_chip=per_chip,
                   tokens_per_s_per_user=per_user, p90_ttft_ms=1.0, p90_tpot_ms=1.0, mean_tpot_ms=1.0, slo_met=met)


def test_pareto_hand_made():
    # (per chip, per user): A (100, 10), B (50, 50), C (40, 40) is beaten by B on both, D (100, 5) by A,
    # E (10, 60) is the fastest per user. Front: A, B, E (sorted by per-user speed).
    pts = [_o(100, 10, conc=1), _o(50, 50, conc=2), _o(40, 40, conc=3), _o(100, 5, conc=4), _o(10, 60, conc=5)]
    front = pareto_front(pts)
    assert [(o.tokens_per_s_per_chip, o.tokens_per_s_per_user) for o in front] == [(100, 10), (50, 50), (10, 60)]
    # best per chip: most per-chip among those meeting the SLO
    pts = [_o(100, 10, met=False), _o(50, 50), _o(70, 1, chip="tpu-v5e")]
    assert {o.candidate.chip: o.tokens_per_s_per_chip for o in best_per_chip(pts)} == {"tpu-v6e": 50, "tpu-v5e": 70}


def test_tp_splits_and_expand():
    m = get_model("llama-3.1-8b")  # 32 query heads, 8 KV heads
    assert tp_splits(m, 4) == [1, 2, 4] and tp_splits(m, 3) == [1, 3] or tp_splits(m, 3) == [1]
    space = SearchSpace(chips=("tpu-v6e",), chip_counts=(1, 4), weight_dtypes=("bf16", "int8"),
                        kv_cache_dtypes=("bf16",), max_num_seqs=(256,), max_num_batched_tokens=(2048,),
                        concurrencies=(8, 64))
    # chips 1: tp 1; chips 4: tp 1, 2, 4 -> 4 deployments x 2 dtypes x 2 concurrencies
    assert len(expand(m, space)) == 16


def test_prune_never_simulates_what_cannot_hold_its_weights():
    # 70B in bf16 is 141 GB: on one 32 GB v6e it cannot fit; on 8 it does
    m = get_model("llama-3.1-70b")
    keep, dropped = prune(m, [_c(chips=1, tp=1), _c(chips=8, tp=8)], max_model_len=2048)
    assert [c.chips for c in keep] == [8] and "does not fit" in dropped[0][1]


def _square(x):
    if x == 3:
        raise ValueError("three")
    return x * x


@pytest.mark.parametrize("backend, batch", [("inprocess", 1), ("process", 1), ("process", 3), ("thread", 2)])
def test_runner_same_results_and_failures_reported(backend, batch):
    seen = []
    res = run_tasks(_square, [1, 2, 3, 4], backend=backend, workers=2, on_result=seen.append, batch=batch)
    assert [r.value for r in res] == [1, 4, None, 16] and [r.index for r in res] == [0, 1, 2, 3]
    assert res[2].error == "ValueError: three" and res[2].inputs == 3 and len(seen) == 4
    with pytest.raises(InputError, match="`backend` 'threads': use one of auto, inprocess, process, thread, ray"):
        run_tasks(_square, [1], backend="threads")
    with pytest.raises(InputError, match="`batch` must be a whole number >= 1, got 0"):
        run_tasks(_square, [1], batch=0)


def test_compile_many_runs_on_the_runner_and_keeps_its_contract(monkeypatch):
    # compile_many is perfmodel.runner's thread backend over compile_report: reports in call order, a compile
    # error as its item, anything else a task raises as a CompileFailed naming the call and chip
    from perfmodel.compiler import api
    from perfmodel.errors import PerfmodelError

    def fake(call, chip, use_cache):
        if call.target == "bad":
            raise api.CompileFailed("Mosaic said no")
        if call.target == "crash":
            raise RuntimeError("worker lost")
        return f"report of {call.target}"

    monkeypatch.setattr(api, "compile_report", fake)
    calls = [api.CompileCall(kind="catalog", target=t, shapes=()) for t in ("a", "bad", "crash", "b")]
    messages = []
    out = api.compile_many(calls, "tpu-v5e", jobs=2, progress=messages.append)
    assert out[0] == "report of a" and out[3] == "report of b"
    assert isinstance(out[1], PerfmodelError) and str(out[1]) == "Mosaic said no"
    assert isinstance(out[2], api.CompileFailed) and "for tpu-v5e: RuntimeError: worker lost" in str(out[2])
    assert len(messages) == 4 and messages[-1].startswith("compiled 4/4")


def test_runner_ray_backend():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'perfmodel[ray]')")
    try:
        res = run_tasks(_square, [1, 2, 3, 4], backend="ray", workers=2, address="auto", batch=2)
    finally:
        ray.shutdown()
    assert [r.value for r in res] == [1, 4, None, 16] and res[2].error == "ValueError: three"


ARGS = ["plan", "llama-3.1-8b", "--hw", "v5e,v6e", "--chips", "1,4", "--concurrency", "4,16", "--num-prompts", "30",
        "--random-input-len", "256", "--random-output-len", "16", "--tpot-p90-ms", "40", "--workers", "1"]


def test_plan_cli_and_resume_after_a_kill(tmp_path):
    out = tmp_path / "plan.jsonl"
    full = CliRunner().invoke(main, [*ARGS, "--out", str(out), "--json", "--plot", str(tmp_path / "p.png")])
    assert full.exit_code == 0, full.output
    got = json.loads(full.output)
    assert got["pruned"] and all("v5e" in p["candidate"]["chip"] for p in got["pruned"])  # 8B bf16 on one v5e
    assert got["front"] and got["best_per_chip"][0]["vllm_serve"].startswith("vllm serve llama-3.1-8b")
    assert (tmp_path / "p.png").exists()
    lines = out.read_text().splitlines()
    assert len(lines) == len(got["outcomes"])
    # a killed search: the first three lines and half of the fourth survive; --resume simulates the rest only
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    again = CliRunner().invoke(main, [*ARGS, "--out", str(out), "--resume", "--json"])
    assert again.exit_code == 0, again.output
    resumed = json.loads(again.output)
    assert sorted(json.dumps(o, sort_keys=True) for o in resumed["outcomes"]) == \
        sorted(json.dumps(o, sort_keys=True) for o in got["outcomes"])
    assert len(ResultsFile(str(out), resume=True, force=False).done) == len(lines)


@pytest.mark.parametrize("extra, match", [
    (["--chips", "0"], "--chips"), (["--resume"], "--out"), (["--tpot-p90-ms", "-1"], "--tpot-p90-ms"),
    (["--hw", "nochip"], "unknown chip"), (["--weight-dtype", "int3"], "weight-dtype"),
])
def test_plan_errors(extra, match):
    r = CliRunner().invoke(main, [*ARGS, *extra])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output
