"""The serving simulator: hand-worked scheduler cases, preemption, prefix caching, metrics, reproducibility."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.model.configs import get_model
from perfmodel.serve.config import engine_config, parse_speculative_config
from perfmodel.serve.kvblocks import BlockPool
from perfmodel.serve.metrics import bench_metrics, parse_goodput, result_dict, summary_text
from perfmodel.serve.padding import Padding, jetstream_prefill_bucket
from perfmodel.serve.records import RunResult
from perfmodel.serve.run import simulate
from perfmodel.serve.scheduler import VllmEngine
from perfmodel.serve.workload import Request, Workload, arrival_times, build_requests


class FixedTimes:
    """Step times of a toy device: every step takes ``step_s`` whatever it runs (hand-worked cases)."""

    def __init__(self, step_s: float = 0.010):
        self.step_s = step_s

    def padded(self, tokens, seqs):
        return tokens, seqs

    def dense_s(self, tokens, seqs):
        return self.step_s

    def attention_s(self, dec_ctx, chunks=()):
        return 0.0

    def decode_sums(self, rows):  # [steps, kernel, unit + 1] of nothing
        return np.zeros((np.shape(rows)[0], 1, 6))

    def chunk_rows(self, q, contexts):
        return np.zeros((len(contexts), 1, 6))

    def attention_parts(self, dec_ctx, chunks=()):
        return np.zeros((1, 6))

    def chunk_parts(self, chunks):
        return np.zeros((1, 6))

    def kernel_time(self, parts):
        return 0.0

    def kernel_times(self, parts):
        return np.zeros(parts.shape[0])


def _cfg(**kw):
    base = dict(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_num_seqs=4, max_num_batched_tokens=64,
                max_model_len=256, block_size=16, host_overhead_s=0.0)
    base.update(kw)
    return engine_config(**base)


def _run(cfg, requests, blocks, *, concurrency=None, step_s=0.010):
    eng = VllmEngine(cfg, FixedTimes(step_s), blocks)
    eng.run(list(requests), concurrency)
    return eng


def _req(i, arrival, prompt, out, group=None, prefix=0):
    return Request(index=i, arrival_s=arrival, input_tokens=prompt, output_tokens=out, prefix_group=group,
                   prefix_tokens=prefix)


def test_two_requests_hand_worked():
    # Budget 64 tokens, 10 ms per step. A: 40-token prompt, 3 outputs; B: 40 tokens, 2 outputs, both at t=0.
    # step 1 (0-10 ms): A's 40 prompt tokens + 24 of B's (budget 64) -> A's first token at 10 ms.
    # step 2 (10-20): A decodes (1) + B's last 16 -> A's 2nd token, B's first token at 20 ms.
    # step 3 (20-30): A and B decode -> A's 3rd token (done, e2el 30 ms), B's 2nd (done, 30 ms).
    eng = _run(_cfg(), [_req(0, 0.0, 40, 3), _req(1, 0.0, 40, 2)], blocks=100)
    recs = {r.index: r for r in eng.rec.records}
    assert recs[0].ttft_s == pytest.approx(0.010) and recs[0].e2el_s == pytest.approx(0.030)
    assert recs[1].ttft_s == pytest.approx(0.020) and recs[1].e2el_s == pytest.approx(0.030)
    # A's TPOT: (30 - 10) / (3 - 1) = 10 ms; B's: (30 - 20) / 1 = 10 ms
    assert recs[0].tpot_s == pytest.approx(0.010) and recs[1].tpot_s == pytest.approx(0.010)
    assert eng.steps == 3
    assert sorted(eng.rec.itl_s()) == pytest.approx([0.010, 0.010, 0.010])


def test_no_chunked_prefill_waits_for_budget():
    # Chunked prefill off: B (40 tokens) does not fit the 24 tokens left after A in step 1, so it waits:
    # step 1: A's prompt (40) -> A token 1 at 10 ms; step 2: A decode (1) + B's 40 -> B's first token at 20 ms.
    cfg = _cfg(enable_chunked_prefill=False, max_model_len=64)
    eng = _run(cfg, [_req(0, 0.0, 40, 3), _req(1, 0.0, 40, 2)], blocks=100)
    recs = {r.index: r for r in eng.rec.records}
    assert recs[1].ttft_s == pytest.approx(0.020)


def test_max_num_seqs_and_concurrency():
    # max-num-seqs 1: the second request starts its prefill only once the first has finished (3 steps).
    eng = _run(_cfg(max_num_seqs=1), [_req(0, 0.0, 16, 3), _req(1, 0.0, 16, 1)], blocks=100)
    recs = {r.index: r for r in eng.rec.records}
    assert recs[1].ttft_s == pytest.approx(0.040)
    # Client concurrency 1: the second request is sent at 30 ms, so its TTFT is one step.
    eng = _run(_cfg(), [_req(0, 0.0, 16, 3), _req(1, 0.0, 16, 1)], blocks=100, concurrency=1)
    recs = {r.index: r for r in eng.rec.records}
    assert recs[1].send_s == pytest.approx(0.030) and recs[1].ttft_s == pytest.approx(0.010)


def test_preemption_by_recompute():
    # 4 blocks of 16 tokens. A (16-token prompt, 30 outputs) and B (16 tokens, 30 outputs): each needs a second
    # block after its first decode and a third at 33 tokens; 4 blocks run out, the later-admitted B is preempted
    # (its blocks freed, recomputed after A finishes); both still finish, with one preemption.
    eng = _run(_cfg(), [_req(0, 0.0, 16, 30), _req(1, 0.0, 16, 30)], blocks=4)
    recs = {r.index: r for r in eng.rec.records}
    assert eng.preemptions >= 1 and recs[1].preemptions >= 1 and recs[0].preemptions == 0
    assert recs[0].output_tokens == 30 and recs[1].output_tokens == 30
    assert recs[1].finish_s > recs[0].finish_s


def test_prefix_cache_hits():
    # Two requests share a 48-token prefix (3 blocks of 16). The second arrives after the first finished: its
    # first 3 blocks are cached, so only 16 of its 64 prompt tokens are computed (one step) and 48 are hits.
    reqs = [_req(0, 0.0, 64, 1, group="g", prefix=48), _req(1, 1.0, 64, 1, group="g", prefix=48)]
    eng = _run(_cfg(), reqs, blocks=100)
    recs = {r.index: r for r in eng.rec.records}
    assert recs[0].cached_tokens == 0 and recs[1].cached_tokens == 48
    assert eng.pool.hit_tokens == 48 and eng.pool.query_tokens == 128
    off = _run(_cfg(enable_prefix_caching=False), reqs, blocks=100)
    assert {r.index: r for r in off.rec.records}[1].cached_tokens == 0


def test_block_pool_lru_eviction():
    pool = BlockPool(3, 16, prefix_caching=True)
    assert pool.take(1) and pool.publish(("a", 0))
    pool.give_back(0, [("a", 0)])  # cached, evictable
    assert pool.free_blocks == 3 and pool.lookup("a", 1, 40) == [("a", 0)]
    assert pool.take(3)  # the 2 plain blocks, then the cached one is evicted
    assert pool.lookup("a", 1, 40) == [] and not pool.take(1)


def test_padding_buckets():
    p = Padding(max_num_batched_tokens=2048, max_num_seqs=256)
    assert [p.tokens(n) for n in (1, 16, 17, 1000, 2048)] == [16, 16, 32, 1024, 2048]
    assert [p.requests(n) for n in (1, 8, 9, 200, 256)] == [8, 8, 16, 256, 256]
    assert Padding(enabled=False, max_num_batched_tokens=64, max_num_seqs=4).tokens(17) == 17
    assert jetstream_prefill_bucket(300, 8192) == 512 and jetstream_prefill_bucket(9000, 8192) == 8192


def test_metrics_and_summary_keys():
    eng = _run(_cfg(), [_req(0, 0.0, 40, 3), _req(1, 0.0, 40, 2)], blocks=100)
    values, counts = eng.rec.itl()
    run = RunResult(records=tuple(eng.rec.records), itl_values_s=values, itl_counts=counts, stats=eng.stats(),
                    timeline=eng.timeline(), chunk_times=np.asarray(eng.rec.chunk_times),
                    chunk_counts=np.asarray(eng.rec.chunk_counts))
    m = bench_metrics(run, goodput_ms=parse_goodput(["ttft:15"]))
    # duration 30 ms; 2 requests -> 66.67 req/s; 5 output tokens -> 166.7 tok/s; goodput: only A's TTFT <= 15 ms
    assert m.duration_s == pytest.approx(0.030) and m.request_throughput == pytest.approx(2 / 0.030)
    assert m.output_throughput == pytest.approx(5 / 0.030) and m.request_goodput == pytest.approx(1 / 0.030)
    d = result_dict(m, header={"backend": "x"})
    for key in ("duration", "completed", "request_throughput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms"):
        assert key in d
    text = summary_text(m, max_concurrency=None, request_rate=math.inf)
    assert text.splitlines()[0] == "============ Serving Benchmark Result ============"
    assert "Mean TTFT (ms):" in text and "Request goodput (req/s):" in text


def test_workload_reproducible_and_ranges():
    w = Workload(num_prompts=500, random_input_len=100, random_output_len=50, random_range_ratio=0.5,
                 request_rate=10.0, seed=3)
    a, b = build_requests(w), build_requests(w)
    assert a == b
    ins = np.asarray([r.input_tokens for r in a])
    assert ins.min() >= 50 and ins.max() <= 150 and ins.min() < 60 and ins.max() > 140
    gaps = np.diff(arrival_times(20000, 5.0, 1.0, np.random.default_rng(0)))
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert build_requests(dataclasses.replace(w, seed=4)) != a


def test_spec_config_parsing():
    s = parse_speculative_config('{"method": "eagle3", "num_speculative_tokens": 3}', "0.5")
    assert s.acceptance == pytest.approx((0.5, 0.25, 0.125)) and s.mean_accepted == pytest.approx(0.875)
    with pytest.raises(InputError, match="acceptance_rate"):
        parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}', None)
    with pytest.raises(InputError, match="cannot increase"):
        parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2}', "0.5,0.7")
    with pytest.raises(InputError, match="not modelled"):
        parse_speculative_config('{"method": "medusa", "num_speculative_tokens": 2}', "0.5")


def test_config_errors():
    with pytest.raises(InputError, match="max_num_batched_tokens"):
        _cfg(max_num_batched_tokens=2)
    with pytest.raises(InputError, match="chunked prefill off"):
        _cfg(enable_chunked_prefill=False, max_model_len=4096)
    with pytest.raises(InputError, match="does not fit"):
        simulate(engine_config(model=get_model("llama-3.1-70b"), chip=get_chip("v5e"), max_model_len=2048,
                               host_overhead_s=0.0), Workload(num_prompts=2))


def test_simulate_small_run_and_speculation():
    cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_model_len=640,
                        max_num_batched_tokens=1024)
    w = Workload(num_prompts=40, random_input_len=512, random_output_len=64, max_concurrency=8)
    base = simulate(cfg, w)
    assert base.metrics.completed == 40 and base.metrics.total_output_tokens == 40 * 64
    again = simulate(cfg, w)
    assert again.metrics.output_throughput == base.metrics.output_throughput
    spec = dataclasses.replace(cfg, speculative=parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 3}', "0.8"))
    fast = simulate(spec, w)
    # accepted drafts: fewer steps, lower TPOT; ITL counts one gap per chunk, so it exceeds TPOT
    assert fast.metrics.distributions["tpot"].mean_ms < base.metrics.distributions["tpot"].mean_ms
    assert fast.metrics.distributions["itl"].mean_ms > fast.metrics.distributions["tpot"].mean_ms


@pytest.mark.parametrize("kv_tight", [False, True])
def test_decode_runs_equal_one_step_at_a_time(monkeypatch, kv_tight):
    # The vectorized block of decode steps must give what stepping one at a time gives: same steps, same
    # preemptions, same token times (up to summation order). KV-tight: 8B on one v6e at 60% of its HBM, so
    # runs end at the pool running short and preemptions happen inside them.
    if kv_tight:
        cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_model_len=1536,
                            gpu_memory_utilization=0.6)
        w = Workload(num_prompts=200, random_input_len=1024, random_output_len=500, max_concurrency=128)
    else:
        cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_model_len=1024)
        w = Workload(num_prompts=60, random_input_len=300, random_output_len=200, random_range_ratio=0.5,
                     request_rate=20.0)
    runs = simulate(cfg, w)
    monkeypatch.setattr(VllmEngine, "_decode_run", lambda self, client: False)
    steps = simulate(cfg, w)
    a, b = runs.run, steps.run
    assert a.stats.steps == b.stats.steps and a.stats.preemptions == b.stats.preemptions
    assert (a.stats.preemptions > 0) == kv_tight
    assert [r.index for r in a.records] == [r.index for r in b.records]
    for x, y in zip(a.records, b.records):
        assert x.finish_s == pytest.approx(y.finish_s, rel=1e-9)
        assert x.first_token_s == pytest.approx(y.first_token_s, rel=1e-9)
    assert runs.metrics.distributions["itl"].mean_ms == pytest.approx(steps.metrics.distributions["itl"].mean_ms,
                                                                       rel=1e-9)


def test_jetstream_engine():
    cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), engine="jetstream", max_num_seqs=8,
                        max_model_len=640)
    r = simulate(cfg, Workload(num_prompts=20, random_input_len=300, random_output_len=32))
    assert r.metrics.completed == 20 and r.run.stats.preemptions == 0


def test_progress_reports_finished_requests():
    cfg = engine_config(model=get_model("llama-3.1-8b"), chip=get_chip("v6e"), max_model_len=400)
    calls = []
    simulate(cfg, Workload(num_prompts=250, random_input_len=256, random_output_len=16, max_concurrency=16),
             progress=lambda msg, done, total: calls.append((done, total)))
    # about every 1% of the requests (every 2 of 250), the last at 250/250
    assert calls[-1] == (250, 250) and len(calls) == 125 and all(t == 250 for _, t in calls)


def test_weighted_distribution_equals_numpy_on_the_repeated_list():
    from perfmodel.serve.metrics import distribution

    rng = np.random.default_rng(1)
    values = rng.random(50)
    counts = rng.integers(0, 7, size=50)
    full = np.repeat(values, counts) * 1000
    d = distribution(values, (1.0, 50.0, 90.0, 99.0, 99.9, 100.0), counts)
    assert d.mean_ms == pytest.approx(np.mean(full)) and d.std_ms == pytest.approx(np.std(full))
    assert d.median_ms == pytest.approx(np.median(full))
    for p, v in d.percentiles_ms:
        assert v == pytest.approx(np.percentile(full, p)), p
    # hand-worked: [1, 1, 1, 3] ms -> mean 1.5, median 1, p75 at position 2.25: 1 + 0.25 * (3 - 1) = 1.5
    d = distribution(np.array([0.001, 0.003]), (75.0,), np.array([3, 1]))
    assert (d.mean_ms, d.median_ms, d.percentiles_ms[0][1]) == pytest.approx((1.5, 1.0, 1.5))
