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


# --------------------------------------------------------------------------- figure layout


def _annotations(ax):
    from matplotlib.text import Annotation

    return [t for t in ax.texts if isinstance(t, Annotation)]


def _no_two_overlap(fig, texts):
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            assert not box_a.overlaps(box_b), f"labels overprint: {a!r} and {b!r}"


def test_roofline_figure_tflops_ridge_every_sweep_point_labeled_legend_outside():
    # A sweep of two steps (batch 1 and batch 32): the gemm at two intensities. On v5e the roof is 197 TFLOP/s
    # and 819 GB/s: ridge 197e12 / 819e9 = 240.5 FLOP/B, written "241 FLOP/B".
    small = {**GEMM, "useful_flops": 1.638e8, "floor_s": 2e-4}  # 1 FLOP/B
    steps = [{**_step([small]), "point": {"batch": 1}}, {**_step([GEMM]), "point": {"batch": 32}}]
    rep = step_report(steps, source="sweep.json")
    assert {p.label for p in rep.roofline.points} == {"gemm [batch 1]", "gemm [batch 32]"}
    fig = roofline_figure(rep.roofline, "t")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "useful TFLOP/s"
    texts = [t.get_text() for t in _annotations(ax)]
    assert "ridge 241 FLOP/B" in texts
    assert "gemm [batch 1]" in texts and "gemm [batch 32]" in texts  # every point of the sweep, not just the first
    # the roof is not clipped: the axes reach past the ridge and above the 197 TFLOP/s peak
    (x_lo, x_hi), (y_lo, y_hi) = ax.get_xlim(), ax.get_ylim()
    assert x_lo < 240.5 < x_hi and y_hi > 197 and y_lo < 1.638e8 / 2e-4 / 1e12
    # the gemm at batch 32 sits at 197 TFLOP/s (its floor is MXU time): plotted in TFLOP/s, not FLOP/s
    floor_y = [y for coll in ax.collections for _, y in coll.get_offsets()]
    assert any(abs(y - 197) < 1e-6 for y in floor_y) and max(floor_y) < 1e3
    _no_two_overlap(fig, _annotations(ax))
    # the legend sits outside the axes: it covers neither the ridge nor a point
    renderer = fig.canvas.get_renderer()
    [legend] = fig.legends
    assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_grouped_labels_share_their_tag_once():
    from perfmodel.harness.plots import _grouped

    # 1.00 and 1.05 fall in one ~12% cell on log axes; 10 does not.
    got = _grouped([(1.0, 1.0, "qkv [batch 1]"), (1.05, 1.0, "down [batch 1]"), (10.0, 1.0, "up [batch 1]")])
    assert got == {(1.0, 1.0): "qkv, down [batch 1]", (10.0, 1.0): "up [batch 1]"}


def test_compare_figure_labels_apart_and_legend_says_the_tables_limiting_unit(synthetic_records):
    from perfmodel.harness.comparison import compare

    items = [Located(where=f"r.jsonl:{n}", record=r) for n, r in enumerate(synthetic_records, start=1)]
    fig = compare_figure(items)
    left, right = fig.axes
    _no_two_overlap(fig, _annotations(left))
    labelled = {part for t in _annotations(left) for part in t.get_text().split(", ")}
    assert labelled == {f"#{n}" for n in range(1, len(items) + 1)}
    [table] = compare(items).real
    units = {row[table.headers.index("limited by")] for row in table.rows}
    assert "step overhead" in units  # record 6 of the synthetic set
    legend_units = {t.get_text().removeprefix("limited by: ").removesuffix(" (real TPU)")
                    for t in fig.legends[0].get_texts() if t.get_text().startswith("limited by: ")}
    assert legend_units == units
    bar_units = {t.get_text().removeprefix("measured, limited by: ") for t in right.get_legend().get_texts()
                 if t.get_text().startswith("measured, ")}
    assert bar_units == units
