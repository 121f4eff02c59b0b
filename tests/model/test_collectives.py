"""Collectives over ICI."""

import pytest

from perfmodel.model.core import ACHIEVABLE

from perfmodel.errors import InputError
from perfmodel.model.collectives import ICI_STEP_LATENCY_S, all_gather, all_reduce, reduce_scatter
from perfmodel.model.core import evaluate


def test_all_gather_ring_hand_worked(v5e):
    shard = 64e6
    cost = all_gather(bytes_per_chip=shard, num_chips=8, chip=v5e)
    r = evaluate(cost, v5e)
    # each chip sends (8-1) shards; a bidirectional ring drives 2 links of 50 GB/s (v5e: 4 links of 50 GB/s)
    assert v5e.interconnect.ici_bw_bytes_per_s_per_link == 5e10
    assert cost.ici_bytes == 7 * shard
    assert r.bound == "ICI-bound"
    assert r.floor_s == pytest.approx(7 * shard / (2 * 5e10))
    # 7 ring steps of latency enter the expected time, never the floor:
    # expected = ICI time at its achievable 80% + 7 latencies
    assert r.expected_s == pytest.approx(r.floor_s / ACHIEVABLE["ici"][0] + 7 * ICI_STEP_LATENCY_S)


def test_topologies(v5e):
    kw = dict(bytes_per_chip=32e6, num_chips=16, chip=v5e)
    ring, line, torus = (evaluate(all_gather(topology=t, **kw), v5e).floor_s for t in ("ring", "line", "torus"))
    assert line == pytest.approx(2 * ring)
    # v5e's 2D torus: all 4 links at once (2e11 B/s), twice a ring axis
    assert torus == pytest.approx(ring / 2)


def test_reduce_scatter_and_all_reduce(v6e):
    full = 8 * 8192 * 2  # [8, 8192] bf16 activations
    rs = reduce_scatter(shape=(8, 8192), dtype="bf16", num_chips=4, chip=v6e)
    ar = all_reduce(bytes_per_chip=full, num_chips=4, chip=v6e)
    # reduce-scatter sends 3/4 of the array and adds 3/4 of its elements
    assert rs.ici_bytes == pytest.approx(full * 3 / 4)
    assert rs.vpu_ops == pytest.approx(8 * 8192 * 3 / 4)
    # all-reduce = reduce-scatter + all-gather: twice the traffic
    assert ar.ici_bytes == pytest.approx(2 * rs.ici_bytes)


def test_one_chip_moves_nothing(v5e):
    cost = all_reduce(bytes_per_chip=1e6, num_chips=1, chip=v5e)
    r = evaluate(cost, v5e)
    assert cost.ici_bytes == 0 and r.floor_s == 0
    # nothing bounds an op that does nothing (not "MXU-bound", the first unit of an all-zero argmax)
    assert r.limiter == "none" and r.bound == "no work"


@pytest.mark.parametrize("kwargs,match", [
    (dict(bytes_per_chip=1e6, shape=(4, 4)), r"^give exactly one of `bytes_per_chip` and `shape`$"),
    (dict(), r"^give exactly one of `bytes_per_chip` and `shape`$"),
    (dict(bytes_per_chip=1e6, topology="mesh"), r"^`topology`: got 'mesh'; use one of ring, line, torus$"),
    (dict(bytes_per_chip=1e6, num_chips=0), r"^`num_chips` must be >= 1"),
    (dict(shape=(4, 0)), r"^`shape` must be >= 1"),
    (dict(bytes_per_chip=1e6, dtype="fp5"), r"^`dtype`: unknown dtype 'fp5'"),
])
def test_bad_input(v5e, kwargs, match):
    args = dict(num_chips=4, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        all_gather(**args)
