"""Collectives from the chip's topology: torus blocks, switch, full mesh, DCN between slices."""

import pytest

from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.model.collectives import (
    DCN_STEP_LATENCY_S,
    ICI_STEP_LATENCY_S,
    all_gather,
    all_reduce,
    plan,
    reduce_scatter,
    torus_block,
)
from perfmodel.model.core import ACHIEVABLE, evaluate

V = 1e8  # bytes each chip holds before an all-reduce (the whole array)


def _floor(chip, n, **kw):
    return evaluate(all_reduce(bytes_per_chip=V, num_chips=n, chip=chip, **kw), chip).floor_s


@pytest.mark.parametrize("chips,dims,block", [
    (4, 2, (2, 2)), (8, 2, (2, 4)), (256, 2, (16, 16)),
    (8, 3, (2, 2, 2)), (32, 3, (2, 4, 4)), (64, 3, (4, 4, 4)), (128, 3, (4, 4, 8)),
    (2, 3, (1, 1, 2)), (6, 2, (2, 3)), (1, 2, (1, 1)),
])
def test_torus_block_is_the_most_compact(chips, dims, block):
    assert torus_block(chips, dims) == block


def test_v5e_tp4_uses_both_dimensions(v5e):
    # 4 chips on v5e's 2-D torus: a 2x2 block; an axis of 2 has no wraparound (v5e wraps only a full 16-chip
    # axis), so each axis is a line: 1 link each, 2 links of 50 GB/s per chip.
    p = plan(4, chip=v5e)
    assert (p.links, p.steps, p.slices) == (2, 2, 1)
    # all-reduce sends 2 x 3/4 of the array: 1.5e8 B over 2 x 5e10 B/s = 1.5 ms
    assert _floor(v5e, 4) == pytest.approx(2 * 3 / 4 * V / (2 * 5e10))


def test_v5e_full_pod_axes_wrap(v5e):
    # 256 chips = the whole 16x16 pod: both axes wrap (rings), 2 links each = all 4 links (2e11 B/s)
    assert plan(256, chip=v5e).links == 4
    assert _floor(v5e, 256) == pytest.approx(2 * 255 / 256 * V / 2e11)


def test_v5p_tp8_uses_three_dimensions_and_a_cube_wraps():
    v5p = get_chip("tpu-v5p")
    # 8 chips: 2x2x2, three lines (v5p wraps axes of a multiple of 4): 3 links of 100 GB/s
    assert plan(8, chip=v5p).links == 3
    assert _floor(v5p, 8) == pytest.approx(2 * 7 / 8 * V / (3 * 1e11))
    # 64 chips: one 4x4x4 cube, every axis a ring: all 6 links (6e11 B/s)
    assert plan(64, chip=v5p).links == 6
    assert _floor(v5p, 64) == pytest.approx(2 * 63 / 64 * V / 6e11)


def test_switch_runs_at_the_gpus_whole_nvlink_bandwidth():
    h100 = get_chip("h100-sxm")
    # TP 8 over NVSwitch: a ring at 450 GB/s one way per GPU (18 links x 25 GB/s), not 2 links (50 GB/s)
    assert _floor(h100, 8) == pytest.approx(2 * 7 / 8 * V / 4.5e11)
    # 7 ring steps per round, two rounds, 1 us each, in the expected time only
    r = evaluate(all_reduce(bytes_per_chip=V, num_chips=8, chip=h100), h100)
    assert r.expected_s == pytest.approx(r.floor_s / ACHIEVABLE["ici"][0] + 14 * ICI_STEP_LATENCY_S)


def test_full_mesh_uses_one_link_per_peer():
    mi300x = get_chip("mi300x")
    # 8 GPUs, each linked to the 7 others at 64 GB/s one way: 448 GB/s; 2 GPUs: 1 link
    assert _floor(mi300x, 8) == pytest.approx(2 * 7 / 8 * V / (7 * 6.4e10))
    assert _floor(mi300x, 2) == pytest.approx(2 * 1 / 2 * V / 6.4e10)
    assert plan(8, chip=mi300x).steps == 1


def test_dcn_between_slices():
    h100 = get_chip("h100-sxm")
    # TP 16 = 2 nodes of 8: reduce-scatter + all-gather inside the node over NVLink (2 x 7/8 of V at 450 GB/s)
    # and an all-reduce of V/8 across the 2 nodes over 400 Gb/s NICs (2 x 1/2 x V/8 at 50 GB/s)
    cost = all_reduce(bytes_per_chip=V, num_chips=16, chip=h100)
    r = evaluate(cost, h100)
    nvlink, dcn = 2 * 7 / 8 * V / 4.5e11, 2 * 1 / 2 * V / 8 / 5e10
    assert r.floor_s == pytest.approx(nvlink + dcn)
    assert cost.metrics["slices"] == 2
    # latency: 2 rounds x (7 NVLink steps + 1 DCN step)
    assert float(cost.fixed_s) == pytest.approx(2 * (7 * ICI_STEP_LATENCY_S + DCN_STEP_LATENCY_S))
    # all-gather across slices first: the shard once over DCN, then 7 x (2 shards) inside the node
    ag = all_gather(bytes_per_chip=V, num_chips=16, chip=h100)
    assert evaluate(ag, h100).floor_s == pytest.approx(7 * 2 * V / 4.5e11 + V / 5e10)


def test_slice_size_can_be_given(v5e):
    # 8 v5e chips as 2 slices of 4 (2x2 each): ICI 2 x 3/4 V at 2 links, DCN 2 x 1/2 x V/4 at 3.125e9 B/s
    got = _floor(v5e, 8, slice_chips=4)
    assert got == pytest.approx(2 * 3 / 4 * V / 1e11 + 2 * 1 / 2 * V / 4 / 3.125e9)


def test_v2_collectives_have_a_bandwidth():
    v2 = get_chip("tpu-v2")
    # 4 chips as 2x2 lines at 62 GB/s per link (496 Gbit/s): 2 links
    assert _floor(v2, 4) == pytest.approx(2 * 3 / 4 * V / (2 * 6.2e10))


def test_named_topologies(v5e):
    kw = dict(bytes_per_chip=32e6, num_chips=16, chip=v5e)
    ring, line, torus = (evaluate(all_gather(topology=t, **kw), v5e).floor_s for t in ("ring", "line", "torus"))
    # ring: 15 shards over 2 links of 50 GB/s; line: 1 link; torus: all 4 links (2e11 B/s)
    assert ring == pytest.approx(15 * 32e6 / 1e11)
    assert line == pytest.approx(2 * ring)
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


def test_sweeps_over_group_sizes(v5e):
    # one call, three group sizes: 2 (a line, 1 link), 4 (2x2, 2 links), 8 (2x4, 2 links)
    cost = all_reduce(bytes_per_chip=V, num_chips=[2, 4, 8], chip=v5e)
    assert list(cost.ici_links) == [1, 2, 2]
    floors = evaluate(cost, v5e).floor_s
    assert list(floors) == pytest.approx([V / 5e10, 1.5 * V / 1e11, 1.75 * V / 1e11])


def test_one_chip_moves_nothing(v5e):
    cost = all_reduce(bytes_per_chip=1e6, num_chips=1, chip=v5e)
    r = evaluate(cost, v5e)
    assert cost.ici_bytes == 0 and r.floor_s == 0
    # nothing bounds an op that does nothing (not "MXU-bound", the first unit of an all-zero argmax)
    assert r.limiter == "none" and r.bound == "no work"


def test_device_view_halves_the_links():
    core = get_chip("tpu-7x/core")
    # one 7x device owns 3 of the chip's 6 links (3e11 B/s); TP 2 over devices is one line: 1 link
    assert core.interconnect.ici_links_per_chip == 3
    assert _floor(core, 2) == pytest.approx(V / 1e11)


@pytest.mark.parametrize("kwargs,match", [
    (dict(bytes_per_chip=1e6, shape=(4, 4)), r"^give exactly one of `bytes_per_chip` and `shape`$"),
    (dict(), r"^give exactly one of `bytes_per_chip` and `shape`$"),
    (dict(bytes_per_chip=1e6, topology="mesh"), r"^`topology`: got 'mesh'; use one of auto, ring, line, torus$"),
    (dict(bytes_per_chip=1e6, num_chips=0), r"^`num_chips` must be >= 1"),
    (dict(shape=(4, 0)), r"^`shape` must be >= 1"),
    (dict(bytes_per_chip=1e6, dtype="fp5"), r"^`dtype`: unknown dtype 'fp5'"),
    (dict(bytes_per_chip=1e6, chip=None), r"^`topology` auto needs a chip"),
])
def test_bad_input(v5e, kwargs, match):
    args = dict(num_chips=4, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        all_gather(**args)


def test_groups_that_do_not_fit():
    h100, mi300x = get_chip("h100-sxm"), get_chip("mi300x")
    with pytest.raises(InputError, match=r"^`num_chips` 12 does not split into whole slices of 8 chips"):
        all_reduce(bytes_per_chip=V, num_chips=12, chip=h100)
    with pytest.raises(InputError, match=r"^`num_chips` 16 spans 2 slices of 8 chips, and mi300x has no DCN"):
        all_reduce(bytes_per_chip=V, num_chips=16, chip=mi300x)
