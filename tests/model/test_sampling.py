"""Sampling model: greedy, filters, the two top-p algorithms, projection, errors."""

import math

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.model.core import evaluate
from perfmodel.model.sampling import sampling


def test_greedy_hand_worked(v5e):
    cost = sampling(batch=8, vocab=1024, temperature=False, chip=v5e)
    # argmax: compare + select value + select index per logit; fp32 logits read once; one int32 id per row written
    assert cost.vpu_ops == 3 * 8 * 1024
    assert cost.hbm_read_bytes == 8 * 1024 * 4
    assert cost.hbm_write_bytes == 8 * 4
    assert cost.eup_ops == 0


def test_batch_one_pads_to_sublanes(v5e):
    cost = sampling(batch=1, vocab=1024, temperature=False, chip=v5e)
    assert cost.vpu_padding_waste == pytest.approx(7 / 8)


def test_threshold_beats_sort_for_top_p(v5e):
    vocab = 128256
    thr = sampling(batch=64, vocab=vocab, top_p=0.9, method="threshold", chip=v5e)
    srt = sampling(batch=64, vocab=vocab, top_p=0.9, method="sort", chip=v5e)
    # bitonic network over 2^17 elements: 17*18/2 = 153 stages of 3 ops, vs 32 bisection passes of 3 ops
    stages = math.ceil(math.log2(vocab)) * (math.ceil(math.log2(vocab)) + 1) // 2
    assert stages == 153
    assert srt.metrics["vpu_ops_per_logit"] - thr.metrics["vpu_ops_per_logit"] == pytest.approx(
        3 * 153 + (2 * 7 + 1) - 3 * 32)
    # the sort path round-trips HBM, the threshold path reads the logits once
    assert thr.hbm_read_bytes == 64 * vocab * 4
    assert srt.hbm_bytes > 5 * thr.hbm_bytes
    assert evaluate(thr, v5e).floor_s < evaluate(srt, v5e).floor_s


def test_passes_scale_threshold_work(v6e):
    a = sampling(batch=8, vocab=32000, top_k=50, passes=16, chip=v6e)
    b = sampling(batch=8, vocab=32000, top_k=50, passes=32, chip=v6e)
    # 16 more passes of 3 ops per logit, padded rows and lanes: 8 x 32000 (32000 = 250 * 128)
    assert b.vpu_ops - a.vpu_ops == 16 * 3 * 8 * 32000


def test_penalties_read_count_table(v5e):
    base = sampling(batch=4, vocab=32000, chip=v5e)
    pen = sampling(batch=4, vocab=32000, penalties=True, chip=v5e)
    assert pen.hbm_read_bytes - base.hbm_read_bytes == 4 * 32000 * 4


def test_projection_is_a_part(v5e):
    cost = sampling(batch=16, vocab=32000, include_projection_hidden=4096, chip=v5e)
    assert [p.name for p in cost.parts] == ["vocab projection", "sampling"]
    assert cost.parts[0].useful_flops == 2 * 16 * 32000 * 4096


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_k=0), r"^`top_k` must be >= 1, got 0$"),
    (dict(top_k=40000), r"^`top_k` 40000 exceeds `vocab` 32000"),
    (dict(top_p=0.0), r"^`top_p` must be in \(0, 1\], got 0.0$"),
    (dict(top_p=1.5), r"^`top_p` must be in \(0, 1\]"),
    (dict(min_p=1.0), r"^`min_p` must be in \[0, 1\), got 1.0$"),
    (dict(method="heap"), r"^`method`: got 'heap'; use one of threshold, sort$"),
    (dict(vocab=0), r"^`vocab` must be >= 1"),
    (dict(dtype="fp64"), r"^`dtype`: unknown dtype 'fp64'"),
    (dict(passes=0, top_p=0.9), r"^`passes` must be >= 1"),
])
def test_bad_input(v5e, kwargs, match):
    args = dict(batch=4, vocab=32000, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        sampling(**args)


@pytest.mark.parametrize("filters, passes, expected", [
    # top-p only: one bisection; fp32 logits default to 32 passes (the dtype's bits)
    (dict(top_p=0.9), None, "threshold bisection (1 filter(s) x 32 passes)"),
    # top-k and top-p: two bisections of 16 passes each
    (dict(top_k=50, top_p=0.9), 16, "threshold bisection (2 filter(s) x 16 passes)"),
])
def test_stage_note_names_the_pass_count(filters, passes, expected):
    cost = sampling(batch=8, vocab=4096, passes=passes, **filters)
    assert any(expected in note for note in cost.notes), cost.notes


def test_stage_note_with_swept_passes():
    cost = sampling(batch=8, vocab=4096, top_k=50, passes=np.array([8, 24]))
    assert any("threshold bisection (1 filter(s) x 8-24 passes)" in note for note in cost.notes), cost.notes


def test_logit_bias_and_logprobs_hand_worked(v5e):
    base = sampling(batch=8, vocab=1024, chip=v5e)
    cost = sampling(batch=8, vocab=1024, logit_bias=True, logprobs=3, chip=v5e)
    elems = 8 * 1024
    # bias: one add and a 4-byte f32 read per logit; logprobs: log-sum-exp 4 VPU + 2 EUP per logit, and 3 top-n
    # passes of 7 VPU ops; writes the chosen + 3 ids + 3 log-probabilities per row (7 x 4 B).
    assert cost.vpu_ops - base.vpu_ops == (1 + 4 + 3 * 7) * elems
    assert cost.eup_ops - base.eup_ops == 2 * elems
    assert cost.hbm_read_bytes - base.hbm_read_bytes == 4 * elems
    assert cost.hbm_write_bytes - base.hbm_write_bytes == 8 * 7 * 4
    assert any("logprobs (chosen + top 3)" in n for n in cost.notes)


def test_draft_tokens_model_the_rejection_sampler(v5e):
    from perfmodel.model.sampling import REJECTION_EUP_OPS, rejection_sampling

    cost = sampling(batch=8, vocab=1024, draft_tokens=4, chip=v5e)
    assert cost == rejection_sampling(batch=8, vocab=1024, draft_tokens=4, chip=v5e)
    # Target probabilities of 5 positions and draft probabilities of 4, f32, read once: 9 x 8 x 1024 x 4 B;
    # 5 x 8 tokens written as int32.
    assert cost.hbm_read_bytes == 9 * 8 * 1024 * 4
    assert cost.hbm_write_bytes == 5 * 8 * 4
    assert cost.eup_ops == REJECTION_EUP_OPS * 5 * 8 * 1024
    # HBM-bound on v5e at a Llama-3 vocabulary (36 B read per element of a position vs ~30 VPU ops).
    assert evaluate(sampling(batch=64, vocab=128256, draft_tokens=4, chip=v5e), v5e).bound == "HBM-bound"


@pytest.mark.parametrize("kwargs,match", [
    (dict(draft_tokens=4, top_k=5), r"^`top_k` does not apply with `draft_tokens`"),
    (dict(draft_tokens=4, penalties=True), r"^`penalties` does not apply with `draft_tokens`"),
    (dict(draft_tokens=0), r"^`draft_tokens` must be >= 1, got 0"),
    (dict(logprobs=-1), r"^`logprobs` must be >= 0, got -1"),
])
def test_bad_speculative_and_logprob_input(v5e, kwargs, match):
    with pytest.raises(InputError, match=match):
        sampling(batch=4, vocab=32000, chip=v5e, **kwargs)
