"""`perfmodel baseline table`: the markdown tables rendered from baseline records (units, one row per call and
chip, ordering), the README's marked regions, the CLI, and kernels/README.md in step with kernels/baseline.json
(nothing is compiled: the committed baseline is read as it is)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.compiler.toolchain import compile_targets
from perfmodel.errors import InputError
from perfmodel.harness import baseline as bl
from perfmodel.harness import baseline_report as rep

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "kernels" / "baseline.json"
README = ROOT / "kernels" / "README.md"
REGENERATE = "perfmodel baseline table kernels/baseline.json --write-readme kernels/README.md"
MIB = 1 << 20


def rec(name="k 1x1", chip="tpu-v5e", target="k", **kw):
    figures = dict(compiled=True, pallas_calls=1, loop_bundles_per_step=12345, predicated_bundles_per_step=67,
                   compiled_time_s=1.5e-3, scoped_vmem_bytes=12 * MIB + 512 * 1024, vmem_limit_bytes=128 * MIB,
                   spills_per_step=1200, fills_per_step=3, dma_starts_per_step=4)
    figures.update(kw)
    return bl.BaselineRecord(name=name, chip=chip, target=target, **figures)


def body_rows(table):
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def run(*args, code=0):
    result = CliRunner().invoke(main, ["baseline", "table", *args])
    assert result.exit_code == code, result.output
    return result.output


# ----------------------------------------------------------------------------- the renderer


def test_a_row_in_si_and_binary_units_with_counts_grouped():
    (row,) = body_rows(rep.kernel_table([rec()]))
    assert row == ["tpu-v5e", "k 1x1", "12,345 / 67", "1.50 ms", "12.5 MiB", "1,200 / 3", "4"]
    (row,) = body_rows(rep.kernel_table([rec(compiled_time_s=2.5e-6, scoped_vmem_bytes=352 * 1024)]))
    assert row[3:5] == ["2.50 µs", "352 KiB"]


def test_missing_figures_and_a_call_that_does_not_compile():
    (row,) = body_rows(rep.kernel_table([rec(compiled_time_s=None, predicated_bundles_per_step=None)]))
    assert row[2:4] == ["12,345 / -", "-"]
    failed = bl.BaselineRecord(name="k 1x1", chip="tpu-v4", target="k", compiled=False, error="boom | bad")
    (row,) = body_rows(rep.kernel_table([failed]))
    assert row[:2] == ["tpu-v4", "k 1x1 (does not compile)"] and set(row[2:]) == {"-"}


def test_one_table_per_kernel_one_row_per_chip_in_chip_order():
    order = ("tpu-v4", "tpu-v5e", "tpu-v6e")
    # as `baseline write --chips tpu-v4` leaves a file: the rewritten chip's records at the end
    records = [rec(chip="tpu-v6e"), rec(chip="tpu-v5e"), rec(name="m 2x2", target="m", chip="tpu-v5e"),
               rec(chip="tpu-v4"), rec(name="k 3x3", chip="tpu-v4")]
    tables = rep.kernel_tables(records, order)
    assert list(tables) == ["k", "m"]  # kernels in order of first appearance
    assert [(r[1], r[0]) for r in body_rows(tables["k"])] == [
        ("k 1x1", "tpu-v4"), ("k 1x1", "tpu-v5e"), ("k 1x1", "tpu-v6e"), ("k 3x3", "tpu-v4")]
    assert [r[0] for r in body_rows(tables["m"])] == ["tpu-v5e"]
    # without an order: the records' order; a chip the order lacks goes last
    assert [r[0] for r in body_rows(rep.kernel_tables(records)["k"])][:3] == ["tpu-v6e", "tpu-v5e", "tpu-v4"]
    assert [r[0] for r in body_rows(rep.kernel_tables(records, ("tpu-v5e",))["k"])][:3] == \
        ["tpu-v5e", "tpu-v6e", "tpu-v4"]


def test_header_and_a_pipe_in_a_call_name_is_escaped():
    table = rep.kernel_table([rec(name="a|b")])
    head, rule, row = table.splitlines()
    assert head == "| " + " | ".join(rep.TABLE_HEADERS) + " |"
    assert rule.count("|") == len(rep.TABLE_HEADERS) + 1 and "a\\|b" in row


def test_one_kernel_and_an_unknown_one():
    records = [rec(), rec(name="m", target="m")]
    assert list(rep.kernel_tables(records, kernel="m")) == ["m"]
    with pytest.raises(InputError, match="'nope' has no records in the baseline; its kernels: k, m"):
        rep.kernel_tables(records, kernel="nope")
    assert [k["kernel"] for k in rep.tables_json(records, kernel="k")] == ["k"]


# ----------------------------------------------------------------------------- README regions

DOC = """# Title

prose before
<!-- baseline-table: k -->
stale text
<!-- /baseline-table -->
prose between

<!-- baseline-table: m -->
<!-- /baseline-table -->
prose after
"""


def test_fill_readme_rewrites_only_the_marked_regions():
    tables = {"k": "| K |", "m": "| M |"}
    out = rep.fill_readme(DOC, tables, "caption")
    assert out.replace(rep.region_body("| K |", "caption"), "stale text\n", 1) \
              .replace(rep.region_body("| M |", "caption"), "", 1) == DOC
    assert rep.stale_regions(DOC, tables, "caption") == ["k", "m"]
    assert rep.stale_regions(out, tables, "caption") == []
    assert rep.fill_readme(out, tables, "caption") == out  # idempotent
    only_m = rep.fill_readme(DOC, tables, "caption", only=["m"])
    assert "stale text" in only_m and "| M |" in only_m and "| K |" not in only_m


@pytest.mark.parametrize("text, message", [
    ("<!-- baseline-table: k -->\n", "doc.md:1: the baseline-table region of 'k' is never closed"),
    ("<!-- /baseline-table -->\n", "doc.md:1: <!-- /baseline-table --> without an opening"),
    ("<!-- baseline-table: k -->\n<!-- baseline-table: m -->\n", "doc.md:2: a baseline-table marker inside"),
    ("<!-- baseline-table: -->\n<!-- /baseline-table -->\n", "doc.md:1: the baseline-table marker names no kernel"),
    ("<!-- baseline-table: k -->\n<!-- /baseline-table -->\n" * 2, "doc.md:3: kernel 'k' already has"),
])
def test_malformed_markers_name_the_line(text, message):
    with pytest.raises(InputError, match=message):
        rep.readme_regions(text, "doc.md")


def test_a_region_of_a_kernel_the_baseline_lacks_is_an_error():
    with pytest.raises(InputError, match="region 'm' names no kernel of the baseline; its kernels: k"):
        rep.fill_readme(DOC, {"k": "| K |"}, "caption", where="doc.md")


# ----------------------------------------------------------------------------- the committed README


def test_kernels_readme_tables_match_the_baseline():
    """kernels/README.md's marked tables are what kernels/baseline.json renders, and every kernel of the baseline
    has one (after `perfmodel baseline write kernels/baseline.json`, regenerate them)."""
    stored = bl.read(BASELINE)
    tables = rep.kernel_tables(stored.records, tuple(compile_targets()))
    caption = rep.readme_caption("kernels/baseline.json", "kernels/README.md", stored.libtpu_version)
    text = README.read_text()
    stale = rep.stale_regions(text, tables, caption, "kernels/README.md")
    assert not stale, (f"kernels/README.md's baseline tables of {', '.join(stale)} differ from kernels/baseline.json; "
                       f"regenerate them from the repository root: {REGENERATE}")
    marked = {k for k, _, _ in rep.readme_regions(text)}
    missing = [k for k in tables if k not in marked]
    assert not missing, (f"kernels/baseline.json records {', '.join(missing)} but kernels/README.md has no table of "
                         f"it: add {rep.README_OPEN.format(kernel=missing[0])} and {rep.README_CLOSE} to its section, "
                         f"then run {REGENERATE}")


# ----------------------------------------------------------------------------- the CLI


def test_cli_prints_one_kernel_table():
    out = run(str(BASELINE), "--kernel", "rms_norm")
    lines = out.splitlines()
    assert lines[0].startswith("| chip | call | bundles / step") and len(lines) == 2 + len(compile_targets())
    assert [r[0] for r in body_rows(out)] == list(compile_targets())


def test_cli_prints_every_kernel_under_a_heading_and_json():
    out = run(str(BASELINE))
    assert "### rms_norm\n\n| chip |" in out and "### sampling" in out
    import json

    doc = json.loads(run(str(BASELINE), "--kernel", "sampling", "--json"))
    assert [k["kernel"] for k in doc["kernels"]] == ["sampling"]
    assert all("compiled_time_s" in r and "scoped_vmem_bytes" in r for r in doc["kernels"][0]["records"])


def test_cli_errors_are_one_line_exit_2(tmp_path):
    out = run(str(tmp_path / "none.json"), code=2)
    assert out.strip().count("\n") == 0 and "does not exist" in out and "perfmodel baseline write" in out
    out = run(str(BASELINE), "--kernel", "nope", code=2)
    assert out.strip().count("\n") == 0 and "--kernel 'nope'" in out
    out = run(str(BASELINE), "--write-readme", str(tmp_path / "missing.md"), code=2)
    assert out.strip().count("\n") == 0 and "--write-readme" in out and "cannot read it" in out
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- baseline-table: not_a_kernel -->\n<!-- /baseline-table -->\n")
    out = run(str(BASELINE), "--write-readme", str(bad), code=2)
    assert out.strip().count("\n") == 0 and "'not_a_kernel' names no kernel of the baseline" in out
    assert bad.read_text().endswith("<!-- /baseline-table -->\n")  # untouched


def test_cli_write_readme_rewrites_in_place_and_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- baseline-table: rms_norm -->\nold\n<!-- /baseline-table -->\nend\n")
    out = run(str(BASELINE), "--write-readme", "doc.md")
    assert out.startswith("doc.md: 1 table(s) rewritten (rms_norm), 0 unchanged; no marked region for matmul")
    text = doc.read_text()
    assert text.startswith("intro\n<!-- baseline-table: rms_norm -->\nGenerated from `") and text.endswith(
        "<!-- /baseline-table -->\nend\n") and "| tpu-v5e | rms_norm 8192x4096 bf16 |" in text and "old" not in text
    assert not list(tmp_path.glob(".doc.md.*"))  # no temporary file left
    assert run(str(BASELINE), "--write-readme", "doc.md", "--kernel", "rms_norm").startswith(
        "doc.md: 0 table(s) rewritten, 1 unchanged")
    assert doc.read_text() == text
