"""Reports and plots: pure functions from data to text / figures."""

from __future__ import annotations

import pytest

from perfmodel.errors import InputError
from perfmodel.harness.plots import compare_figure, roofline_figure, save
from perfmodel.harness.records import Located
from perfmodel.harness.roofline_report import as_dict, records_report, step_report, to_markdown

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _step(ops):
    return {"model": "toy", "chip": "tpu-v5e", "step": {"phase": "decode", "batch": 4, "context_tokens": 1024,
                                                        "weight_dtype": "bf16", "kv_dtype": "bf16", "tp": 1},
            "floor_s": sum(o["floor_s"] for o in ops), "expected_s": sum(o["expected_s"] for o in ops),
            "bound": "MXU-bound", "ops": ops}


# On v5e (197 TFLOP/s bf16, 819 GB/s):
# gemm: 3.94e11 FLOP in a 2.00 ms floor = 197 TFLOP/s -> 100.0% MXU; 1.638e8 B / 2 ms = 81.9 GB/s -> 10.0% HBM;
#       intensity 3.94e11 / 1.638e8 = 2405 FLOP/B.
# norm: no FLOPs; 4.095e8 B in 0.5 ms = 819 GB/s -> 100.0% HBM; not on the roofline.
GEMM = {"name": "gemm", "count": 2, "floor_s": 2e-3, "expected_s": 2.2e-3, "bound": "MXU-bound", "share": 0.8,
        "hbm_bytes": 1.638e8, "useful_flops": 3.94e11, "mxu_dtype": "bf16"}
NORM = {"name": "norm", "count": 1, "floor_s": 5e-4, "expected_s": 5.9e-4, "bound": "HBM-bound", "share": 0.2,
        "hbm_bytes": 4.095e8, "useful_flops": 0.0, "mxu_dtype": "bf16"}


def test_step_report_table_rows_and_roofline_points():
    rep = step_report(_step([GEMM, NORM]), source="step.json")
    md = to_markdown(rep, plot_name="step.png")
    assert "| gemm | 2 | 2.00 ms | 2.20 ms | MXU-bound | 80.0% | 2.41 kFLOP/B | 100.0% | 10.0% |" in md
    assert "| norm | 1 | 500 µs | 590 µs | HBM-bound | 20.0% | - | - | 100.0% |" in md
    assert "![roofline](step.png)" in md
    assert "not on the roofline (no matrix FLOPs): norm" in md
    [roof] = rep.roofline.roofs
    assert (roof.chip, roof.dtype, roof.peak_flops_per_s, roof.hbm_bytes_per_s) == ("tpu-v5e", "bf16", 197e12, 819e9)
    floor = next(p for p in rep.roofline.points if p.kind == "floor")
    assert floor.intensity_flop_per_byte == pytest.approx(3.94e11 / 1.638e8)
    assert floor.flops_per_s == pytest.approx(197e12)
    # --json: numbers in SI base units (seconds, fractions, FLOP/B), null where the table shows "-"
    gemm, norm = as_dict(rep)["sections"][0]["rows"]
    assert gemm == {"op": "gemm", "count": 2, "floor_s": 2e-3, "expected_s": 2.2e-3, "bound": "MXU-bound",
                    "share_of_step": 0.8, "intensity_flop_per_byte": pytest.approx(2405.37, abs=0.01),
                    "mxu_share_at_floor": pytest.approx(1.0), "hbm_share_at_floor": pytest.approx(0.1)}
    assert (norm["intensity_flop_per_byte"], norm["mxu_share_at_floor"]) == (None, None)
    assert norm["hbm_share_at_floor"] == pytest.approx(1.0)
    totals = as_dict(rep)["sections"][0]["totals"]
    assert totals == {"floor_s": pytest.approx(2.5e-3), "expected_s": pytest.approx(2.79e-3), "bound": "MXU-bound"}
    assert as_dict(rep)["roofline"]["roofs"][0]["ridge_flop_per_byte"] == pytest.approx(197e12 / 819e9)


def test_step_report_names_the_missing_field():
    with pytest.raises(InputError, match=r"^step.json: record 1, op 1: field 'mxu_dtype' missing"):
        step_report(_step([{k: v for k, v in GEMM.items() if k != "mxu_dtype"}]), source="step.json")
    with pytest.raises(InputError, match=r"^step.json: record 1: field 'ops' missing"):
        step_report({k: v for k, v in _step([GEMM]).items() if k != "ops"}, source="step.json")


def test_records_report_shows_interpret_times_as_not_tpu_performance(synthetic_records):
    items = [Located(where=f"r.jsonl:{n}", record=r) for n, r in enumerate(synthetic_records, start=1)]
    rep = records_report(items, source="r.jsonl")
    rows = {r[0]: r for r in rep.sections[0].text_rows}
    headers = rep.sections[0].headers
    interp = dict(zip(headers, rows["9"]))
    assert interp["backend/mode"] == "cpu/interpret"
    assert interp["measured"].endswith("interpret wall (not TPU)")
    assert (interp["efficiency"], interp["MXU share"], interp["HBM share"]) == ("-", "-", "-")
    real = dict(zip(headers, rows["1"]))
    # record 1: floor 0.92 ms over 1.12 ms measured -> 82.1%; it is all MXU time, so the MXU share is the same.
    assert (real["efficiency"], real["MXU share"], real["limited by"]) == ("82.1%", "82.1%", "MXU-bound")
    assert dict(zip(headers, rows["6"]))["limited by"] == "step overhead"
    kinds = {(p.label, p.kind) for p in rep.roofline.points}
    assert ("#9", "measured") not in kinds and ("#9", "floor") in kinds and ("#1", "measured") in kinds
    md = to_markdown(rep, plot_name=None)
    assert "1 interpret-mode record(s)" in md and "![roofline]" not in md
    # --json: the measured time is a number of seconds; an interpret record has no efficiency (null, not "-")
    json_rows = {r["record"]: r for r in as_dict(rep)["sections"][0]["rows"]}
    assert json_rows[9]["measured_s"] == synthetic_records[8].timing.measured_s
    assert json_rows[9]["backend_mode"] == "cpu/interpret" and json_rows[9]["efficiency"] is None
    assert json_rows[1]["efficiency"] == pytest.approx(0.92 / 1.12, abs=1e-3)


def test_figures_are_written_as_png(tmp_path, synthetic_records):
    items = [Located(where=f"r.jsonl:{n}", record=r) for n, r in enumerate(synthetic_records, start=1)]
    for name, fig in [("cmp.png", compare_figure(items)),
                      ("roof.png", roofline_figure(records_report(items, source="r").roofline, "t")),
                      ("step.png", roofline_figure(step_report(_step([GEMM, NORM]), source="s").roofline, "t"))]:
        path = save(fig, tmp_path / name)
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_compare_figure_with_only_interpret_records(tmp_path, make_record):
    items = [Located(where="r:1", record=make_record(mode="interpret", expected_s=1e-6, device_s=1e-2))]
    path = save(compare_figure(items), tmp_path / "c.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_save_wants_a_png_path(tmp_path, synthetic_records):
    items = [Located(where="r:1", record=synthetic_records[0])]
    with pytest.raises(InputError, match=r"^`plot` '.*c.pdf': give a .png path") as err:
        save(compare_figure(items), tmp_path / "c.pdf")
    assert err.value.fields == ("plot",)  # the CLI writes it as its flag, --plot
