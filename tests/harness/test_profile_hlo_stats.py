"""perfmodel profile's TPU / GPU path: xprof's hlo_stats table (a Google-charts DataTable, the layout xprof's
`hlo_stats` tool returns for a device profile) turned into ops and put on a chip's roofline. No TPU profile is
at hand, so the table is written by hand in that layout; the CPU path is tested on real captures in
tests/cli/test_profile_cli.py."""

import pytest

from perfmodel.harness import profile as pr
from perfmodel.hw.registry import get_chip

COLS = ["rank", "program_id", "category", "hlo_op_name", "hlo_op_expression", "occurrences", "total_time",
        "avg_time", "total_self_time", "model_flop_rate", "measured_memory_bw", "hbm_bw", "bound_by"]


def _table(*rows):
    return {"cols": [{"id": c} for c in COLS], "rows": [{"c": [{"v": v} for v in row]} for row in rows]}


def test_hlo_stats_rows_become_ops_with_their_counts():
    table = _table(
        # a bf16 4096^3 dot: 137.4 GFLOP in 1,000 us -> model_flop_rate 137,438.95 GFLOP/s; 100.7 MB over HBM
        # -> 93.75 GiB/s x 1e-3 s = 100,663,296 B
        (1, "7", "convolution", "fusion.1", "%fusion.1 = bf16[4096,4096] dot(bf16[4096,4096] %a, bf16[4096,4096] %b)",
         1, 1000.0, 1000.0, 1000.0, 137438.953472, 93.75, 93.75, "Compute"),
        # an elementwise fusion: 16.7 M FLOP, 64 MiB in 200 us (320 GiB/s)
        (2, "7", "loop fusion", "fusion.2", "%fusion.2 = f32[4096,4096] add(f32[4096,4096] %x, f32[4096,4096] %y)",
         2, 200.0, 100.0, 200.0, 83.886, 320.0, 320.0, "HBM"))
    ops = pr._from_hlo_stats(pr._table_rows(table))
    dot, add = ops
    assert dot.matmul and dot.mxu_dtype == "bf16" and not add.matmul
    assert dot.flops == pytest.approx(2 * 4096**3, rel=1e-9)
    assert dot.bytes == pytest.approx(3 * 4096 * 4096 * 2, rel=1e-9)
    assert add.measured_s == pytest.approx(200e-6) and add.occurrences == 2
    assert add.bytes == pytest.approx(320 * 2**30 * 200e-6)


def test_hlo_stats_ops_on_the_v5e_roofline():
    table = _table((1, "7", "convolution", "fusion.1", "dot(bf16[4096,4096] %a, bf16[4096,4096] %b)",
                    1, 1000.0, 1000.0, 1000.0, 137438.953472, 93.75, 93.75, "Compute"))
    ops = tuple(pr._from_hlo_stats(pr._table_rows(table)))
    profile = pr.Profile(source="hlo_stats", device_type="TPU v5 lite", path="made-up", xplanes=(), ops=ops)
    report = pr.profile_report(profile, get_chip("tpu-v5e"))
    (row,) = report.ops
    # 137.4 GFLOP at v5e's 197 TFLOP/s bf16 peak = 697.7 us: MXU-bound, measured 1,000 us = 1.43x the floor
    assert row.bound == "MXU-bound"
    assert row.floor_s == pytest.approx(2 * 4096**3 / 197e12, rel=1e-3)
    assert row.ratio == pytest.approx(1000e-6 / row.floor_s)
    assert report.total_lost_s == pytest.approx(1000e-6 - row.floor_s)
