"""perfmodel serve --compile: the step model scaled by compiled reference steps (slow: two compiles, cached)."""

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]
TINY = "tests/xla/data/tiny-llama.json"


def test_serve_compile_scales_the_steps():
    args = ["serve", "--config", TINY, "--hw", "v5e", "--num-prompts", "20", "--random-input-len", "128",
            "--random-output-len", "16", "--max-concurrency", "1", "--max-num-batched-tokens", "256", "--json"]
    plain = json.loads(CliRunner().invoke(main, args).output)
    r = CliRunner().invoke(main, [*args, "--compile"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    comp = got["perfmodel"]["compiled"]
    assert comp is not None and comp["decode"] > 0 and comp["prefill"] > 0
    assert [s[0] for s in comp["shapes"]] == ["decode", "prefill"]
    # one request at a time: its decode steps run alone, so TPOT - host time is the decode step's device time,
    # scaled by the decode ratio
    host = got["perfmodel"]["host_overhead_s"] * 1e3
    assert got["mean_tpot_ms"] - host == pytest.approx((plain["mean_tpot_ms"] - host) * comp["decode"], rel=1e-6)
