"""perfmodel serve through click's CliRunner: output, JSON keys, errors (exit 2, one line), files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.hw import get_chip
from perfmodel.model.configs import get_model
from perfmodel.model.step import mixed_step
from perfmodel.model.transformer import predict_step
from perfmodel.serve.config import engine_config
from perfmodel.serve.steptime import StepTimes

SMALL = ["llama-3.1-8b", "--hw", "v6e", "--num-prompts", "30", "--random-input-len", "256",
         "--random-output-len", "32", "--max-concurrency", "8"]


def run(*args):
    return CliRunner().invoke(main, ["serve", *args])


def test_summary_block():
    r = run(*SMALL)
    assert r.exit_code == 0, r.output
    assert "============ Serving Benchmark Result ============" in r.output
    assert "Successful requests:                     30" in r.output
    assert "Maximum request concurrency:             8" in r.output


def test_json_keys_and_goodput_like_vllm():
    r = run(*SMALL, "--json", "--goodput", "ttft:1000", "tpot:100", "--metric-percentiles", "50,99.9")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["completed"] == 30 and d["max_concurrency"] == 8
    assert {"p50_ttft_ms", "p99.9_ttft_ms", "mean_itl_ms", "request_goodput"} <= set(d)
    assert 0 <= d["request_goodput"] <= d["request_throughput"]
    assert d["perfmodel"]["engine"] == "vllm"


def test_op_speedup_side_by_side():
    r = run(*SMALL, "--op-speedup", "attention=2")
    assert r.exit_code == 0, r.output
    assert "What attention x2 buys" in r.output
    d = json.loads(run(*SMALL, "--op-speedup", "attention=2", "--json").output)
    assert d["mean_tpot_ms"] < d["baseline"]["mean_tpot_ms"]


def test_sweep_plot_and_save_requests(tmp_path):
    out = tmp_path / "reqs.jsonl"
    r = run(*SMALL, "--sweep", "max-concurrency=1,8", "--plot", str(tmp_path / "p"), "--save-requests", str(out))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p" / "curve.png").exists() and (tmp_path / "p" / "timeline.png").exists()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 60 and {"ttft_ms", "tpot_ms", "e2el_ms"} <= set(lines[0])
    again = run(*SMALL, "--save-requests", str(out))
    assert again.exit_code == 2 and "--force" in again.output


@pytest.mark.parametrize("args, match", [
    (["--tp", "3"], "--tp 3 must divide"),
    (["--max-num-batched-tokens", "4"], "--max-num-batched-tokens"),
    (["--op-speedup", "nosuchop=2"], "no such op"),
    (["--op-speedup", "attention=0"], "--op-speedup"),
    (["--goodput", "ttfx:5"], "--goodput"),
    (["--max-model-len", "100"], "exceed --max-model-len"),
    (["--speculative-config", "{bad"], "--speculative-config"),
    (["--request-rate", "fast"], "request-rate"),
])
def test_errors_one_line_exit_2(args, match):
    r = run(*SMALL, *args)
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output


def test_trace_file_errors(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}\n{"arrival_s": -1, "input_tokens": 10}\n')
    r = run("llama-3.1-8b", "--dataset-name", "trace", "--dataset-path", str(f))
    assert r.exit_code == 2 and f"{f}:2" in r.output
    f.write_text('{"arrival_s": 0.5, "input_tokens": 100, "output_tokens": 5, "prefix_group": "a", '
                 '"prefix_tokens": 64}\n')
    r = run("llama-3.1-8b", "--dataset-name", "trace", "--dataset-path", str(f), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["completed"] == 1


@pytest.mark.parametrize("model, chip, tp", [("llama-3.1-8b", "v6e", 1), ("gemma-3-27b", "v6e", 4),
                                             ("mixtral-8x7b", "v5e", 8)])
def test_step_table_matches_the_step_model(model, chip, tp):
    # The cached/tabulated step time of a mixed step agrees with predict_step on the same ragged step.
    cfg = engine_config(model=get_model(model), chip=get_chip(chip), tp=tp, max_model_len=8192, padding=False,
                        host_overhead_s=0.0, max_num_batched_tokens=4096)
    st = StepTimes(cfg)
    dec = np.random.default_rng(0).integers(100, 4000, size=40)
    chunks = [(700, 1900), (300, 300)]
    got = st.step_s(dec, chunks)
    step = mixed_step(query_lens=[1] * 40 + [700, 300], context_lens=list(dec) + [1900, 300], tp=tp,
                      page_size=cfg.block_size)
    assert got == pytest.approx(predict_step(get_model(model), step, get_chip(chip)).expected_s, rel=0.02)


def test_report_takes_serve_results(tmp_path):
    src = tmp_path / "sweep.json"
    r = run(*SMALL, "--sweep", "max-concurrency=1,8", "--json")
    assert r.exit_code == 0, r.output
    src.write_text(r.output)
    for out in ("rep.md", "rep.html"):
        w = CliRunner().invoke(main, ["report", str(src), "--out", str(tmp_path / out)])
        assert w.exit_code == 0, w.output
    md = (tmp_path / "rep.md").read_text()
    assert "| metric | max-concurrency 1 | max-concurrency 8 |" in md and "mean TTFT" in md
    assert "Serving benchmark (simulated)" in (tmp_path / "rep.html").read_text()


def test_sweep_same_points_in_process_and_on_the_pool():
    one = json.loads(run(*SMALL, "--sweep", "max-concurrency=1,2,4,8,12,16,20,24", "--workers", "1", "--json").output)
    pool = json.loads(run(*SMALL, "--sweep", "max-concurrency=1,2,4,8,12,16,20,24", "--workers", "2",
                          "--json").output)
    assert [p["output_throughput"] for p in one] == [p["output_throughput"] for p in pool]
    assert [p["max_concurrency"] for p in pool] == [1, 2, 4, 8, 12, 16, 20, 24]
