"""`perfmodel hw` through click's CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from perfmodel.cli.main import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_version():
    res = run("--version")
    assert res.exit_code == 0
    assert "perfmodel, version" in res.output


def test_help_has_examples():
    res = run("--help")
    assert res.exit_code == 0
    assert "perfmodel hw list" in res.output and "hw" in res.output


def test_hw_list_table_has_units_and_ridge():
    res = run("hw", "list")
    assert res.exit_code == 0, res.output
    assert "tpu-v5e" in res.output
    # v5e ridge: 1.97e14 / 8.19e11 = 240.5 -> printed rounded
    assert "241 FLOP/B" in res.output
    assert "819 GB/s" in res.output


def test_hw_list_columns():
    res = run("hw", "list")
    header, rule, *rows = res.output.splitlines()
    assert header.split("  ")[0] == "chip"
    for column in ("year", "bf16 TFLOP/s", "int8 TOP/s", "fp8 TFLOP/s", "HBM", "HBM BW", "VMEM/core", "ridge bf16"):
        assert column in header
    v5e = next(r.split() for r in rows if r.startswith("tpu-v5e "))
    # 2023, 197 bf16, 394 int8, no fp8, 16 GiB = 17.2 GB, 819 GB/s, 128 MiB VMEM, 1.97e14 / 8.19e11 = 241 FLOP/B
    assert v5e == ["tpu-v5e", "2023", "197", "394", "-", "17.2", "GB", "819", "GB/s", "128", "MiB", "241", "FLOP/B"]
    assert len(rows) == 12


def test_hw_list_json():
    res = run("hw", "list", "--json")
    assert res.exit_code == 0
    rows = json.loads(res.output)
    v5e = next(r for r in rows if r["name"] == "tpu-v5e")
    assert v5e["matmul_flops_per_s_per_chip"]["bf16"] == 1.97e14
    assert v5e["ridge_point_flops_per_byte"]["bf16"] == 1.97e14 / 8.19e11


def test_hw_show_prints_sources_and_units():
    res = run("hw", "show", "TPU v5 lite")
    assert res.exit_code == 0, res.output
    assert "hbm_bw_bytes_per_s_per_chip: 819 GB/s  [gcloud-v5e]" in res.output
    assert "references:" in res.output


def test_hw_show_json_is_the_whole_spec():
    res = run("hw", "show", "v5e", "--json")
    data = json.loads(res.output)
    assert data["memory"]["vmem_bytes_per_core"] == 128 * 2**20
    assert data["sources"]["memory.hbm_bw_bytes_per_s_per_chip"] == "gcloud-v5e"


def test_hw_compare_ratios():
    res = run("hw", "compare", "tpu-v5e", "v5e")
    assert res.exit_code == 0
    assert "1.00x" in res.output
    data = json.loads(run("hw", "compare", "tpu-v5e", "v5e", "--json").output)
    assert data["ratios"]["tpu-v5e"]["bf16_flops"] == 1.0


def test_unknown_chip_is_one_line_exit_2():
    res = run("hw", "show", "v5ee")
    assert res.exit_code == 2
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert len(lines) == 1
    assert "unknown chip 'v5ee'; did you mean tpu-v5e?" in lines[0]
    assert "Traceback" not in res.output


def test_bad_spec_file_is_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: [unclosed\n")
    res = run("hw", "show", str(f))
    assert res.exit_code == 1
    assert "bad.yaml:" in res.output and "malformed YAML" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_missing_spec_file_is_one_line():
    res = run("hw", "show", "./no-such-chip.yaml")
    assert res.exit_code == 1
    assert res.output.strip() == (
        "Error: spec file './no-such-chip.yaml' does not exist; give a chip name (see `perfmodel hw list`) "
        "or the path of a chip spec YAML")


def test_hw_list_does_not_import_jax():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from perfmodel.cli.main import main\n"
        "for args in (['hw', 'list'], ['hw', 'show', 'v6e'], ['hw', 'compare', 'v5e', 'v6e', '--json']):\n"
        "    res = CliRunner().invoke(main, args)\n"
        "    assert res.exit_code == 0, res.output\n"
        "print('jax' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
