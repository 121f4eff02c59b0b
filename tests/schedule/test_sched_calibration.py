"""The schedule model against the published TPU v5e timings of the JAX Pallas TPU matmul guide.

Data: perfmodel/data/validation/tpu_v5e_matmul.yaml (facts with their source).
Requirement: analyze's expected time of the guide's kernel (JAX's
pallas/ops/tpu/matmul) within 15% of every published Pallas time that is not
dominated by dispatch; the 1024^3 points are, and the model must flag them.
"""

from __future__ import annotations

import importlib.resources

import jax
import jax.numpy as jnp
import pytest
import yaml
from jax.experimental.pallas.ops.tpu import matmul as jmm

from perfmodel.model.core import evaluate
from perfmodel.model.gemm import gemm
from perfmodel.schedule.analyze import analyze
from perfmodel.schedule.timing import DEFAULT_HOST_DISPATCH


def _data():
    text = importlib.resources.files("perfmodel").joinpath("data/validation/tpu_v5e_matmul.yaml").read_text()
    return yaml.safe_load(text)


DATA = _data()
PALLAS = [p for p in DATA["points"] if p["kernel"] == "pallas"]
XLA = [p for p in DATA["points"] if p["kernel"] == "xla"]


def test_validation_data_cites_the_guide_not_a_local_copy():
    assert "docs.jax.dev/en/latest/pallas/tpu/matmul.html" in DATA["source"]["url"]
    assert DATA["source"]["notebook"].startswith("jax-ml/jax@")
    assert len(PALLAS) == 6 and len(XLA) == 3


def _expected(point):
    x = jax.ShapeDtypeStruct((point["m"], point["k"]), jnp.bfloat16)
    y = jax.ShapeDtypeStruct((point["k"], point["n"]), jnp.bfloat16)
    a = analyze(jmm.matmul, x, y, chip=DATA["chip"], block_shape=(point["bm"], point["bn"]), block_k=point["bk"])
    return a.kernels[0]


@pytest.mark.parametrize("point", PALLAS, ids=lambda p: f"{p['m']}^3-b{p['bm']}x{p['bk']}x{p['bn']}")
def test_expected_time_within_15_percent_of_published_unless_dispatch_dominated(point, rtol):
    kern = _expected(point)
    measured_s = point["measured_ms"] * 1e-3
    if point["m"] == 1024:
        # The guide's 1024^3 points are dominated by host dispatch; the model must say so.
        assert kern.time.dispatch_dominated
        assert any("dispatch-dominated" in n for n in kern.notes)
        # With the dispatch estimate added, the wall-clock prediction still lands near the measurement.
        assert kern.time.expected_wall_s == pytest.approx(measured_s, rel=rtol["published"])
        return
    assert not kern.time.dispatch_dominated
    assert kern.time.expected_s == pytest.approx(measured_s, rel=rtol["published"])


def test_small_blocks_are_limited_by_the_per_step_overhead():
    # 128^3 blocks: every step is shorter than the 0.35 us step overhead, which is what the guide's
    # 128-block timings show (4096^3: 32768 steps x 0.35 us = 11.5 ms vs 11.8 ms measured).
    kern = _expected(next(p for p in PALLAS if p["m"] == 4096 and p["bm"] == 128))
    assert kern.time.limiter == "overhead"
    assert kern.steps == 32 ** 3


def test_large_blocks_are_compute_limited():
    kern = _expected(next(p for p in PALLAS if p["m"] == 8192 and p["bm"] == 512))
    assert kern.time.limiter == "compute"
    assert kern.time.efficiency > 0.85


def test_host_dispatch_estimate_is_the_xla_1024_point_minus_its_roofline(v5e):
    # 0.11943 ms measured for jnp.matmul 1024^3 minus its floor (2*1024^3 / 197 TFLOP/s = 10.9 us).
    point = next(p for p in XLA if p["m"] == 1024)
    floor = evaluate(gemm(m=1024, n=1024, k=1024, chip=v5e), v5e).floor_s
    assert DEFAULT_HOST_DISPATCH.seconds == pytest.approx(point["measured_ms"] * 1e-3 - floor, rel=0.01)
