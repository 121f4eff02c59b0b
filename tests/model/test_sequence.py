"""Parts that run one after another (combine(..., in_sequence=True)): each bound by its own slowest unit."""

import pytest

from perfmodel.model.core import OpCost, additive_times, combine, evaluate


def test_parts_in_sequence_add_their_own_bounds(v5e):
    # v5e: 8.19e11 B/s HBM, 6.16e12 VPU op/s (hwspecs/tpu-v5e.yaml). Part a: 8.19e8 B = 1 ms of HBM, 6.16e8 VPU ops
    # = 0.1 ms; part b: 8.19e7 B = 0.1 ms, 6.16e9 VPU ops = 1 ms. Overlapped (one kernel): HBM 1.1 ms, VPU 1.1 ms,
    # floor 1.1 ms. In sequence: 1 ms + 1 ms = 2 ms.
    hbm, vpu = v5e.memory.hbm_bw_bytes_per_s_per_chip, v5e.compute.vpu_flops_per_s_per_chip
    a = OpCost(name="a", hbm_read_bytes=hbm * 1e-3, vpu_ops=vpu * 1e-4)
    b = OpCost(name="b", hbm_read_bytes=hbm * 1e-4, vpu_ops=vpu * 1e-3)
    together = evaluate(combine("ab", [a, b]), v5e)
    seq = evaluate(combine("ab", [a, b], in_sequence=True), v5e)
    assert together.floor_s == pytest.approx(1.1e-3)
    assert seq.floor_s == pytest.approx(2e-3)
    assert seq.expected_s == pytest.approx(evaluate(a, v5e).expected_s + evaluate(b, v5e).expected_s)
    assert seq.unit_s == pytest.approx(together.unit_s)  # the same work per unit
    assert seq.floor_s <= seq.expected_s <= seq.no_overlap_s
    with pytest.raises(ValueError, match="in sequence"):
        additive_times(combine("ab", [a, b], in_sequence=True), v5e)
