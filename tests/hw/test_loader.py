"""The strict spec loader: every malformed input is one line naming file:line and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfmodel.errors import SpecError, UnknownChipError
from perfmodel.hw import registry
from perfmodel.hw.registry import get_chip, load_spec_file

BUILTIN = Path(__file__).resolve().parents[2] / "hwspecs" / "tpu-v5e.yaml"


def _variant(tmp_path: Path, old: str, new: str, name: str = "chip.yaml") -> Path:
    text = BUILTIN.read_text()
    assert old in text, f"fixture text '{old}' not in the template"
    out = tmp_path / name
    out.write_text(text.replace(old, new, 1))
    return out


def _line_of(path: Path, needle: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_builtin_template_loads():
    spec = load_spec_file(str(BUILTIN))
    assert spec.name == "tpu-v5e"
    # 197 TFLOP/s / 819 GB/s = 240.5 FLOP per byte
    assert spec.ridge_point("bf16") == pytest.approx(1.97e14 / 8.19e11)


def test_unknown_key_names_line_and_suggests(tmp_path):
    f = _variant(tmp_path, "hbm_bw_bytes_per_s_per_chip: 8.19e11", "hbm_bw_gbytes_per_s_per_chip: 8.19e11")
    line = _line_of(f, "hbm_bw_gbytes")
    with pytest.raises(SpecError, match=rf"chip.yaml:{line}: field 'memory.hbm_bw_gbytes_per_s_per_chip' unknown key.*did you mean 'hbm_bw_bytes_per_s_per_chip'"):
        load_spec_file(str(f))


def test_number_with_unit_string_is_rejected(tmp_path):
    f = _variant(tmp_path, "hbm_bw_bytes_per_s_per_chip: 8.19e11", "hbm_bw_bytes_per_s_per_chip: 819 GB/s")
    with pytest.raises(SpecError, match=r"memory.hbm_bw_bytes_per_s_per_chip' takes a plain number in bytes/s, not '819 GB/s'"):
        load_spec_file(str(f))


def test_negative_number_is_rejected(tmp_path):
    f = _variant(tmp_path, "vmem_bytes_per_core: 134217728", "vmem_bytes_per_core: -134217728")
    line = _line_of(f, "vmem_bytes_per_core: -")
    with pytest.raises(SpecError, match=rf":{line}: field 'memory.vmem_bytes_per_core' must be positive"):
        load_spec_file(str(f))


def test_zero_rate_is_rejected(tmp_path):
    f = _variant(tmp_path, "vpu_flops_per_s_per_chip: ", "vpu_flops_per_s_per_chip: 0 #")
    with pytest.raises(SpecError, match=r"compute.vpu_flops_per_s_per_chip' must be positive"):
        load_spec_file(str(f))


def test_malformed_yaml_names_line(tmp_path):
    f = _variant(tmp_path, "  megacore: false", "  megacore: [false")
    with pytest.raises(SpecError, match=r"chip.yaml:\d+: malformed YAML"):
        load_spec_file(str(f))


def test_missing_key_is_named(tmp_path):
    f = _variant(tmp_path, "  tdp_w: null\n", "")
    with pytest.raises(SpecError, match=r"missing key\(s\) tdp_w in 'overheads'"):
        load_spec_file(str(f))


def test_wrong_type_is_named(tmp_path):
    f = _variant(tmp_path, "  megacore: false", "  megacore: maybe")
    with pytest.raises(SpecError, match=r"field 'cores.megacore' must be true or false"):
        load_spec_file(str(f))


def test_fractional_count_is_rejected(tmp_path):
    f = _variant(tmp_path, "mxus_per_core: 4", "mxus_per_core: 4.5")
    with pytest.raises(SpecError, match=r"cores.mxus_per_core' must be a whole number"):
        load_spec_file(str(f))


def test_quoted_number_is_rejected(tmp_path):
    f = _variant(tmp_path, "mxus_per_core: 4", 'mxus_per_core: "4"')
    with pytest.raises(SpecError, match=r"cores.mxus_per_core' must be a number"):
        load_spec_file(str(f))


def test_number_without_source_is_rejected(tmp_path):
    f = _variant(tmp_path, "  memory.smem_bytes_per_core: jax-tpu-info\n", "")
    with pytest.raises(SpecError, match=r"field 'memory.smem_bytes_per_core' has no entry in 'sources'"):
        load_spec_file(str(f))


def test_source_must_name_a_reference(tmp_path):
    f = _variant(tmp_path, "  memory.smem_bytes_per_core: jax-tpu-info", "  memory.smem_bytes_per_core: nowhere")
    with pytest.raises(SpecError, match=r"names reference 'nowhere' that is not in 'references'"):
        load_spec_file(str(f))


def test_unknown_matmul_dtype(tmp_path):
    f = _variant(tmp_path, "{bf16: 1.97e14,", "{bf17: 1.97e14,")
    with pytest.raises(SpecError, match=r"matmul_flops_per_s_per_chip.bf17': unknown dtype"):
        load_spec_file(str(f))


def test_bad_native_pair(tmp_path):
    f = _variant(tmp_path, '"int4 x int4"', '"int4 * int4"')
    with pytest.raises(SpecError, match=r"'int4 \* int4' must read 'LHS x RHS'"):
        load_spec_file(str(f))


def test_empty_file(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("")
    with pytest.raises(SpecError, match=r"empty.yaml: empty file"):
        load_spec_file(str(f))


def test_missing_file_via_hw_path():
    with pytest.raises(SpecError, match=r"^spec file 'nope/chip.yaml' does not exist; give a chip name"):
        get_chip("nope/chip.yaml")


def test_spec_file_path_works_anywhere_a_name_does(tmp_path):
    f = _variant(tmp_path, "name: tpu-v5e", "name: my-chip")
    spec = get_chip(str(f))
    assert spec.name == "my-chip"


def test_env_var_directory_adds_chips(tmp_path, monkeypatch):
    d = tmp_path / "specs"
    d.mkdir()
    _variant(d, "name: tpu-v5e\n", "name: lab-chip\n", name="lab-chip.yaml")
    text = (d / "lab-chip.yaml").read_text().replace("aliases: [v5e, v5litepod, v5-lite, tpu-v5-lite]", "aliases: [lab]")
    text = text.replace('jax_device_kinds: ["TPU v5 lite", "TPU v5e"]', "jax_device_kinds: []")
    (d / "lab-chip.yaml").write_text(text)
    monkeypatch.setenv(registry.ENV_VAR, str(d))
    assert get_chip("lab").name == "lab-chip"
    assert "lab-chip" in {c.name for c in registry.all_chips()}


def test_env_var_must_name_directories(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, str(tmp_path / "missing"))
    with pytest.raises(SpecError, match=r"\$PERFMODEL_HW_PATH: '.*missing' is not a directory"):
        registry.all_chips()


def test_unknown_chip_lists_close_and_known():
    with pytest.raises(UnknownChipError, match=r"unknown chip 'v5ee'; did you mean tpu-v5e\? known chips: .*tpu-v5e"):
        get_chip("v5ee")


@pytest.mark.parametrize("name", ["tpu-v5e", "v5e", "TPU v5 lite", "tpu_v5e", "  V5E "])
def test_alias_resolution_is_case_and_space_insensitive(name):
    assert get_chip(name).name == "tpu-v5e"


def test_error_messages_are_one_line(tmp_path):
    f = _variant(tmp_path, "  megacore: false", "  megacore: [false")
    with pytest.raises(SpecError) as info:
        load_spec_file(str(f))
    assert "\n" not in str(info.value)
    assert re.search(r"chip.yaml:\d+", str(info.value))
