"""Calibration and comparison on hand-built real-TPU records and on the published TPU v5e matmul timings."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.harness.calibrate import calibrate
from perfmodel.harness.comparison import compare
from perfmodel.harness.records import Located, append_record
from perfmodel.harness.sources import load_results

YAML = os.path.join(os.path.dirname(__file__), "..", "..", "perfmodel", "data", "validation", "tpu_v5e_matmul.yaml")


def _located(records):
    return [Located(where=f"synthetic.jsonl:{n}", record=r) for n, r in enumerate(records, start=1)]


def _factor(cal, unit, chip="tpu-v5e"):
    return next(f for f in cal.factors if f.unit == unit and f.chip == chip)


def test_median_ratio_per_unit_on_synthetic_records(synthetic_records):
    cal = calibrate(_located(synthetic_records))
    # conftest's arithmetic: MXU median of (0.8364, 0.92, 1.0) = 0.92; HBM median of (0.68, 0.85) = 0.765.
    assert _factor(cal, "mxu").factor == pytest.approx(0.92)
    assert _factor(cal, "mxu").points == 3
    assert (_factor(cal, "mxu").lowest, _factor(cal, "mxu").highest) == pytest.approx((0.92 / 1.1, 1.0))
    assert _factor(cal, "hbm").factor == pytest.approx(0.765)
    assert _factor(cal, "hbm").points == 2
    assert cal.interpret_records == 1
    assert "median ratio per limiting unit" in cal.method
    reasons = {p.where: p.reason for p in cal.points if not p.used}
    assert reasons == {
        "synthetic.jsonl:6": "limited by the per-grid-step overhead, not by a unit's rate",
        "synthetic.jsonl:7": "dispatch-dominated: expected time under 2x the dispatch estimate",
        "synthetic.jsonl:8": "predicted for tpu-v6e, measured on tpu-v5e",
    }


def test_refuses_when_only_interpret_mode_records(make_record):
    items = _located([make_record(mode="interpret", expected_s=1e-3, device_s=5e-2)] * 2)
    with pytest.raises(InputError, match=r"^synthetic.jsonl: only interpret-mode records \(2\); calibration needs "
                                         r"timings of kernels compiled on a real TPU"):
        calibrate(items)


def test_unit_without_points_keeps_the_model_factor(make_record):
    cal = calibrate(_located([make_record(unit="mxu", expected_s=1e-3, device_s=1e-3)]))
    hbm = _factor(cal, "hbm")
    assert hbm.factor is None and hbm.points == 0 and hbm.model_factor == 0.85


def test_compare_statistics_leave_out_interpret_and_other_chip_records(synthetic_records):
    c = compare(_located(synthetic_records))
    # Efficiency = floor / (device + 20 us dispatch) over the 7 same-chip real records:
    # 0.92/1.12, 1.84/2.02, 3.68/3.70, 0.85/1.27, 1.70/2.02, 1.0/1.02, 0.0092/0.03 (ms) -> median 1.70/2.02.
    assert c.efficiency.count == 7
    assert c.efficiency.median == pytest.approx(1.70 / 2.02)
    assert c.efficiency.lowest == pytest.approx(0.0092 / 0.03)
    assert c.measured_over_expected.count == 7
    assert len(c.real[0].rows) == 8 and len(c.interpret[0].rows) == 1
    assert any("interpret-mode record(s) shown apart and left out of the statistics" in n for n in c.notes)


def test_published_v5e_yaml_calibrates_the_mxu_factor():
    loaded = load_results([YAML])
    cal = calibrate(loaded.items)
    used = [p for p in cal.points if p.used]
    # Usable: the large-block Pallas points and XLA's at 4096^3 and 8192^3 (YAML lines 26, 27, 31, 32); the
    # 128^3-block points are limited by the per-step overhead and the 1024^3 points are dispatch-dominated.
    assert [int(p.where.rsplit(":", 1)[1]) for p in used] == [26, 27, 31, 32]
    assert {p.unit for p in used} == {"mxu"}
    # XLA points, by hand: the op model's expected time is floor / 0.95 (v5e's fitted bf16 share) + 1.51 us of launch
    # and DMA latency, so implied = 0.95 x expected / (measured - dispatch) = (floor + 1.4345 us) / (measured - dispatch):
    # 4096^3: (2 x 4096^3 / 197 TFLOP/s = 697.7 us + 1.43 us) over (827.29 - 108.5) us = 0.9726
    # 8192^3: (5581.3 + 1.43) us over (6047.15 - 108.5) us = 0.9401
    xla = [p.implied_factor for p in used if p.kernel == "xla-matmul"]
    assert xla == pytest.approx([0.9726, 0.9401], rel=1e-3)
    mxu = _factor(cal, "mxu")
    implied = sorted(p.implied_factor for p in used)
    assert mxu.points == 4 and mxu.factor == pytest.approx((implied[1] + implied[2]) / 2)
    assert 0.85 < mxu.factor < 1.0
    assert _factor(cal, "hbm").points == 0


# ----- the same through the CLI, from a results file


@pytest.fixture
def synthetic_file(tmp_path, synthetic_records):
    path = tmp_path / "synthetic.jsonl"
    for r in synthetic_records:
        append_record(path, r)
    return path


def test_calibrate_cli_on_synthetic_file(synthetic_file):
    res = CliRunner().invoke(main, ["calibrate", str(synthetic_file)])
    assert res.exit_code == 0, res.output
    rows = {line.split()[1]: line.split() for line in res.output.splitlines() if line.startswith("tpu-v5e ")}
    assert rows["MXU"][2:4] == ["92.0%", "3"]
    assert rows["HBM"][2:4] == ["76.5%", "2"]
    assert "method: median ratio per limiting unit" in res.output
    assert "1 interpret-mode record(s) left out" in res.output
    data = json.loads(CliRunner().invoke(main, ["calibrate", str(synthetic_file), "--json"]).output)
    assert {(f["unit"], f["points"]) for f in data["factors"] if f["chip"] == "tpu-v5e"} == {("mxu", 3), ("hbm", 2)}


def test_compare_cli_on_synthetic_file(synthetic_file, tmp_path):
    plot = tmp_path / "cmp.png"
    res = CliRunner().invoke(main, ["compare", str(synthetic_file), "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    assert "efficiency (op floor / measured) over 7 real-TPU record(s): median 84.2%" in res.output
    assert "interpret mode (host wall time of an emulation: not TPU performance):" in res.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
