"""`perfmodel hw` through click's CliRunner."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.hw import get_chip
from perfmodel.hw.describe import _fmt_field, compare_table, list_table, ridge_text, show_text


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
    assert len(rows) == 13


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
    assert res.exit_code == 2
    assert "bad.yaml:" in res.output and "malformed YAML" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_missing_spec_file_is_one_line():
    res = run("hw", "show", "./no-such-chip.yaml")
    assert res.exit_code == 2
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


@pytest.mark.parametrize("chips", [["v5e,v6e"], ["v5e,", "v6e"], ["v5e", "tpu-v6e"]])
def test_hw_compare_accepts_comma_lists(chips):
    result = run("hw", "compare", *chips)
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header == ["tpu-v5e", "tpu-v6e"]


def test_hw_compare_with_only_commas_is_one_line():
    result = run("hw", "compare", ",")
    assert result.exit_code == 2
    assert result.output.strip() == "Error: CHIPS: no chip name given; e.g. perfmodel hw compare tpu-v5e tpu-v6e"


def test_hw_show_disagreements_carry_units():
    result = run("hw", "show", "tpu-7x")
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("  memory.vmem_bytes_per_core: chose")]
    # 67108864 B = 64 MiB (67.1 MB) chosen over 134217728 B = 128 MiB (134 MB); no bare 6.71089e+07
    assert len(lines) == 1
    assert "chose 64.0 MiB (67.1 MB) [jax-tpu-info] over 128 MiB (134 MB) [jax-issue-38988]" in lines[0]
    assert "e+0" not in result.output.split("where sources disagree:")[1].split("notes:")[0]


# ----------------------------------------------------------------------------- integer fields


@pytest.mark.parametrize("value, text", [
    (8, "8"),
    (8.0, "8"),  # a count stored as a float (e.g. a disagreement's value) prints as an integer
    (9216, "9,216"),
    (1024.0, "1,024"),
    (2.5, "2.5"),
])
def test_unitless_counts_print_as_integers_with_separators(value, text):
    assert _fmt_field("max_chips_per_pod", value) == text


def test_show_prints_pod_sizes_as_integers():
    assert "  max_chips_per_pod: 9,216" in show_text(get_chip("tpu-7x"))
    # h100's disagreement stores 8 and 256 as floats; both print as integers.
    assert re.search(r"max_chips_per_pod: chose 8 \[[^]]+\] over 256 \[", show_text(get_chip("h100-sxm")))


# ----------------------------------------------------------------------------- ridge points


@pytest.mark.parametrize("ridge, text", [(1835.6, "1,836 FLOP/B"), (64.2, "64 FLOP/B"), (None, "-")])
def test_ridge_text(ridge, text):
    assert ridge_text(ridge) == text


def test_ridge_points_share_one_format_in_list_show_and_compare():
    v5e, v6e = get_chip("tpu-v5e"), get_chip("tpu-v6e")
    # v6e int8: 2 x 918 TOP/s / 1638 GB/s = 1120.9 -> "1,121 FLOP/B"; bf16: 918e12 / 1638e9 = 560.4 -> "560"
    assert "  int8: 1,121 FLOP/B" in show_text(v6e).splitlines()
    compare = [line for line in compare_table([v5e, v6e]).splitlines() if line.startswith("ridge int8")]
    assert compare and compare[0].endswith("1,121 FLOP/B")
    listed = [line for line in list_table([v6e]).splitlines() if line.startswith("tpu-v6e")]
    assert listed and listed[0].endswith("  560 FLOP/B")


# ----------------------------------------------------------------------------- one JAX device (issue 10 part 3)


def test_hw_show_says_how_many_jax_devices():
    assert "JAX devices per chip: 2 (each TensorCore is its own JAX device; one of them: --hw tpu-7x/core)" in \
        run("hw", "show", "tpu-7x").output
    assert "JAX devices per chip: 1 (megacore: JAX drives the 2 TensorCores as one device)" in \
        run("hw", "show", "tpu-v5p").output
    assert "JAX devices per chip: 1\n" in run("hw", "show", "tpu-v5e").output


def test_hw_show_device_view():
    res = run("hw", "show", "7x/core")
    assert res.exit_code == 0, res.output
    # 7x: 192 GiB and 7.37 TB/s per chip, 2 devices: 96 GiB and 3.69 TB/s per device
    assert "hbm_bytes_per_chip: 96.0 GiB" in res.output
    assert "hbm_bw_bytes_per_s_per_chip: 3.69 TB/s (derived)" in res.output
    assert "JAX devices per chip: 1 (this is the device view" in res.output


def test_hw_compare_chip_and_device():
    res = run("hw", "compare", "tpu-7x/core,tpu-7x", "--json")
    assert res.exit_code == 0, res.output
    # the whole chip is 2x its device in FLOP/s and HBM bandwidth
    ratios = json.loads(res.output)["ratios"]["tpu-7x"]
    assert (ratios["bf16_flops"], ratios["hbm_bw"]) == (2.0, 2.0)


@pytest.mark.parametrize("chip,match", [
    ("v4/core", r"^Error: chip 'v4/core': tpu-v4 is one JAX device per chip \(megacore: JAX drives its 2 TensorCores "
                r"as one device\); '/core' is only for chips whose TensorCores are separate JAX devices "
                r"\(tpu-7x, tpu-v2, tpu-v3\); use 'tpu-v4'$"),
    ("tpu-v5e/core", r"^Error: chip 'tpu-v5e/core': tpu-v5e is one JAX device per chip \(1 TensorCore\);"),
    ("h100/core", r"^Error: chip 'h100/core': h100-sxm is one JAX device per chip \(132 SMs\);"),
])
def test_device_view_of_a_one_device_chip_is_one_line(chip, match):
    res = run("hw", "show", chip)
    assert res.exit_code == 2
    assert re.match(match, res.output.strip()) and len(res.output.strip().splitlines()) == 1
