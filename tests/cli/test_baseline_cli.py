"""`perfmodel baseline write|check`: the comparison on hand-made records, the reports, the file and YAML errors,
and (slow, with libtpu) a write-then-check round trip through the real compiler on one small call."""

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.compiler.toolchain import available
from perfmodel.errors import InputError
from perfmodel.harness import baseline as bl
from perfmodel.harness import baseline_report as rep

MIB = 1 << 20


def rec(name="k", chip="tpu-v5e", **kw):
    figures = dict(compiled=True, target=name, pallas_calls=1, loop_bundles_per_step=1000,
                   predicated_bundles_per_step=100, compiled_time_s=1e-3, scoped_vmem_bytes=8 * MIB,
                   vmem_limit_bytes=128 * MIB, spills_per_step=0, fills_per_step=0, dma_starts_per_step=3)
    figures.update(kw)
    return bl.BaselineRecord(name=name, chip=chip, **figures)


def one(old, new, tol=0.02):
    (row,) = bl.compare([old], [new], tol)
    return row


def run(*args, code=0):
    result = CliRunner().invoke(main, ["baseline", *args])
    assert result.exit_code == code, result.output
    return result.output


# ----------------------------------------------------------------------------- compare()


def test_tolerance_boundary_on_bundles_and_time():
    assert one(rec(), rec(loop_bundles_per_step=1020)).failing is False  # exactly 2%: passes
    row = one(rec(), rec(loop_bundles_per_step=1021))
    assert row.failing and row.verdict == "grew" and "every-step bundles" in row.reasons[0]
    assert one(rec(), rec(predicated_bundles_per_step=103)).failing  # 3% of 100
    assert not one(rec(), rec(compiled_time_s=1.02e-3)).failing
    assert one(rec(), rec(compiled_time_s=1.0201e-3)).failing
    assert not one(rec(), rec(loop_bundles_per_step=1040), tol=0.05).failing


def test_growth_from_zero_predicated_bundles_fails():
    row = one(rec(predicated_bundles_per_step=0), rec(predicated_bundles_per_step=5))
    assert row.failing and row.changes["predicated_bundles_per_step"] == float("inf")


def test_any_new_spill_or_fill_fails():
    assert one(rec(), rec(spills_per_step=1)).failing
    assert one(rec(fills_per_step=4), rec(fills_per_step=5)).failing
    assert not one(rec(spills_per_step=4), rec(spills_per_step=3)).failing


def test_vmem_past_the_chip_limit_fails_growth_below_it_does_not():
    assert not one(rec(), rec(scoped_vmem_bytes=100 * MIB)).failing
    row = one(rec(), rec(scoped_vmem_bytes=129 * MIB))
    assert row.failing and "scoped VMEM" in row.reasons[0]
    # a new call past the limit fails too
    (row,) = bl.compare([], [rec(scoped_vmem_bytes=129 * MIB)])
    assert row.verdict == "new" and row.failing


def test_shrink_passes_and_same_is_same():
    row = one(rec(), rec(loop_bundles_per_step=800, compiled_time_s=0.8e-3))
    assert row.verdict == "shrank" and not row.failing and row.changes["loop_bundles_per_step"] == pytest.approx(-0.2)
    assert one(rec(), rec()).verdict == "same"
    # DMA starts are reported, never failing
    row = one(rec(), rec(dma_starts_per_step=9))
    assert row.verdict == "grew" and not row.failing


def test_missing_and_new_calls_are_reported_not_failed():
    rows = bl.compare([rec("a"), rec("b")], [rec("a"), rec("c")])
    assert [(r.name, r.verdict, r.failing) for r in rows] == [("a", "same", False), ("c", "new", False),
                                                              ("b", "missing", False)]
    # the same name on another chip is another record
    rows = bl.compare([rec("a", "tpu-v5e")], [rec("a", "tpu-v6e")])
    assert sorted(r.verdict for r in rows) == ["missing", "new"]


def test_a_call_that_stops_compiling_fails():
    broken = bl.BaselineRecord(name="k", chip="tpu-v5e", target="k", compiled=False, error="RESOURCE_EXHAUSTED")
    row = one(rec(), broken)
    assert row.verdict == "failed" and row.failing and "RESOURCE_EXHAUSTED" in row.reasons[0]


def test_negative_tolerance_is_an_input_error():
    with pytest.raises(InputError, match="tolerance"):
        bl.compare([], [], -0.1)


# ----------------------------------------------------------------------------- reports


def test_markdown_shape():
    rows = bl.compare([rec("a"), rec("b|x"), rec("c")],
                      [rec("a", loop_bundles_per_step=1100), rec("b|x"), rec("c", spills_per_step=2)])
    md = rep.report_markdown(rows, 0.02)
    lines = md.splitlines()
    assert lines[0].startswith("### perfmodel baseline check :x:")
    assert "2 regression(s) in 3 call(s)" in md
    table = [ln for ln in lines if ln.startswith("|")]
    header = table[0]
    cols = header.count("|")
    # every table line has the header's column count (a '|' in a name is escaped)
    assert all(ln.replace("\\|", "").count("|") == cols for ln in table)
    assert table[1] == "|" + "---|" * (cols - 1)
    assert "1,000 -> 1,100 (+10.0%)" in md and "**FAIL** grew" in md
    assert "<details><summary>1 unchanged</summary>" in md and "b\\|x" in md
    ok = rep.report_markdown(bl.compare([rec()], [rec()]), 0.02)
    assert ":white_check_mark:" in ok and "no regression" in ok


def test_text_and_json_reports():
    rows = bl.compare([rec()], [rec(loop_bundles_per_step=2000)])
    text = rep.report_text(rows, 0.02)
    assert "FAIL k on tpu-v5e: every-step bundles +100.0% (past 2.0%)" in text
    data = rep.report_records(rows, 0.02)
    assert data["regressions"] == 1 and data["rows"][0]["old"]["loop_bundles_per_step"] == 1000
    json.dumps(data)


# ----------------------------------------------------------------------------- the file


def test_write_read_round_trip_is_atomic(tmp_path):
    path = tmp_path / "sub" / "b.json"
    bl.write(path, [rec("a"), rec("b", notes=("x",))], libtpu_version="0.0.1")
    got = bl.read(path)
    assert got.libtpu_version == "0.0.1" and got.records == (rec("a"), rec("b", notes=("x",)))
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no temporary file left


@pytest.mark.parametrize("content, match", [
    (None, r"baseline .*nope\.json does not exist; run `perfmodel baseline write .*nope\.json`"),
    ("{not json", r"is not valid JSON .*perfmodel baseline write"),
    ('{"schema_version": 1}', r"has no list of records"),
    ('{"schema_version": 99, "records": []}', r"schema version 99.*perfmodel baseline write"),
    ('{"schema_version": 1, "records": [{"name": "a", "chip": "c", "compiled": true, "bogus": 1}]}',
     r"record 1 is malformed \(unknown field 'bogus'\)"),
])
def test_bad_baseline_file(tmp_path, content, match):
    path = tmp_path / "nope.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=match):
        bl.read(path)


def test_check_with_a_missing_baseline_exits_2_in_one_line(tmp_path):
    out = run("check", str(tmp_path / "missing.json"), code=2)
    assert "does not exist; run `perfmodel baseline write" in out
    assert len(out.strip().splitlines()) == 1


def test_check_with_a_malformed_baseline_exits_2(tmp_path):
    path = tmp_path / "b.json"
    path.write_text("[1, 2]")
    out = run("check", str(path), code=2)
    assert f"baseline {path} has no list of records" in out


def test_markdown_and_json_together_exit_2(tmp_path):
    out = run("check", str(tmp_path / "b.json"), "--markdown", "--json", code=2)
    assert "pick one output format" in out


# ----------------------------------------------------------------------------- the YAML loader


def test_yaml_calls(tmp_path):
    path = tmp_path / "calls.yaml"
    path.write_text("calls:\n"
                    "  - target: rms_norm\n    shapes: [x=64x128:bf16]\n    chips: [v5e, tpu-v6e]\n"
                    "  - name: mine\n    target: pkg.mod:fn\n    shapes: [x=8x128:f32]\n    args: [bm=8]\n")
    a, b = bl.load_calls(path)
    assert a.name == "rms_norm x=64x128:bf16" and a.call.kind == "catalog" and a.chips == ("tpu-v5e", "tpu-v6e")
    assert b.name == "mine" and b.call.kind == "function" and b.call.args == ("bm=8",)
    assert b.chips == tuple(bl.default_calls()[0].chips)
    assert [c.chips for c in bl.select_chips([a, b], ["v6e"])] == [("tpu-v6e",), ("tpu-v6e",)]


@pytest.mark.parametrize("text, match", [
    ("- target: rms_norm\n  shape: [x=1x1:f32]\n", r"calls\.yaml: call 1: unknown field 'shape'; known fields: name, "
                                                     r"target, shapes"),
    ("- shapes: [x=1x1:f32]\n", r"call 1: `target` is required"),
    ("- target: rms_norm\n- target: rms_norm\n", r"call 2: name 'rms_norm' is already used by call 1"),
    ("- target: rms_norm\n  chips: [tpu-v3]\n", r"call 1: chip 'tpu-v3'|tpu-v3"),
    ("- target: a.b:c\n  blocks: {bm: 8}\n", r"call 1: `blocks` applies to bundled kernels"),
    ("- target: rms_norm\n  shapes: 3\n", r"call 1: `shapes` must be a list"),
    ("other: []\n", r"unknown top-level field 'other'"),
    ("[]\n", r"expected a non-empty list of calls"),
    ("- target: [\n", r"calls\.yaml:\d+: not valid YAML"),
])
def test_yaml_errors(tmp_path, text, match):
    path = tmp_path / "calls.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        bl.load_calls(path)


def test_yaml_error_through_the_cli_exits_2(tmp_path):
    calls = tmp_path / "calls.yaml"
    calls.write_text("- target: rms_norm\n  shape: [x=1x1:f32]\n")
    bl.write(tmp_path / "b.json", [])
    out = run("check", str(tmp_path / "b.json"), "--calls", str(calls), code=2)
    assert "unknown field 'shape'" in out


# ----------------------------------------------------------------------------- through the compiler

SMALL = ("- name: rms_norm small\n  target: rms_norm\n"
         "  shapes: [x=1024x1024:bf16, residual=1024x1024:bf16, weight=1024:f32]\n  chips: [tpu-v5e]\n")


@pytest.mark.slow
@pytest.mark.needs_libtpu
@pytest.mark.skipif(not available(), reason="libtpu not installed: pip install -e '.[tpu-compiler]'")
def test_write_then_check_round_trip(tmp_path):
    calls = tmp_path / "calls.yaml"
    calls.write_text(SMALL)
    path = tmp_path / "b.json"
    out = run("write", str(path), "--calls", str(calls))
    assert "wrote" in out
    (r,) = bl.read(path).records
    assert r.compiled and r.chip == "tpu-v5e" and r.loop_bundles_per_step > 0 and r.compiled_time_s > 0
    assert 0 < r.scoped_vmem_bytes < r.vmem_limit_bytes and r.dma_starts_per_step > 0
    assert "no regression" in run("check", str(path), "--calls", str(calls))
    data = json.loads(run("check", str(path), "--calls", str(calls), "--json"))
    assert data["regressions"] == 0 and data["rows"][0]["verdict"] == "same"
    # a baseline that claims fewer bundles: the same compile now regresses, exit 1, markdown names it
    bl.write(path, [bl.BaselineRecord(**{**rep.records_json([r])[0], "notes": (),
                                         "loop_bundles_per_step": r.loop_bundles_per_step // 2})])
    md = run("check", str(path), "--calls", str(calls), "--markdown", code=1)
    assert "**FAIL** grew" in md and "| rms_norm small | tpu-v5e |" in md
