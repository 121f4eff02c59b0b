"""Adding a chip is one YAML file: a fictional TPU (a copy of tpu-v6e.yaml under a new name) works everywhere a
chip is accepted, and its ``compiler:`` facts, not its name, drive the code that used to keep lists of chip names.

The spec is used as a file (``--hw ./tpu-fict.yaml``) and through ``$PERFMODEL_HW_PATH`` (hwspecs/README.md,
"Adding a chip"). Each variant is written to its own directory: specs are cached by path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernels.matmul.rules import quantizes_in_bf16
from perfmodel.cli.main import main
from perfmodel.harness.compile_matrix import chips as matrix_chips
from perfmodel.compiler.toolchain import compile_targets, topology_for
from perfmodel.hw.registry import ENV_VAR, get_chip
from perfmodel.schedule.catalog import pallas_chips

TEMPLATE = Path(__file__).resolve().parents[2] / "hwspecs" / "tpu-v6e.yaml"
NAME = "tpu-fict"


def _write(directory: Path, **facts: str) -> Path:
    """tpu-v6e.yaml as chip tpu-fict, with the compiler facts given (``vpu_bf16_arithmetic="false"``) replaced."""
    text = TEMPLATE.read_text()
    for old, new in (("name: tpu-v6e", f"name: {NAME}"), ("display_name: TPU v6e (Trillium)", "display_name: TPU Fict"),
                     ("aliases: [v6e, trillium, v6-lite, tpu-trillium]", "aliases: [fict, tpu-fictional]"),
                     ('jax_device_kinds: ["TPU v6 lite", "TPU v6e"]', 'jax_device_kinds: ["TPU fict"]'),
                     *((f"  {field}: {_value(text, field)}\n", f"  {field}: {value}\n")
                       for field, value in facts.items())):
        assert old in text, old
        text = text.replace(old, new, 1)
    directory.mkdir()
    path = directory / f"{NAME}.yaml"
    path.write_text(text)
    return path


def _value(text: str, field: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"  {field}: ")]
    return line.split(": ", 1)[1]


def _run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


QUANTIZED_GEMM = ("-m", "64", "-n", "8192", "-k", "8192", "--lhs-dtype", "bf16", "--rhs-dtype", "int8",
                  "--quantize-activations")
QUANTIZED_MODEL = ("--weight-dtype", "int8", "--quantize-activations", "--batch", "8", "--context", "1024")
BF16_CODES = "codes from a bf16 product on its bf16 VPU"


@pytest.fixture
def specs(tmp_path):
    """The fictional chip as is (a v6e: bf16 VPU arithmetic) and with the fact flipped."""
    return _write(tmp_path / "as-v6e"), _write(tmp_path / "flipped", vpu_bf16_arithmetic="false")


def test_the_new_chip_predicts_through_the_cli(specs):
    as_v6e, _ = specs
    out = _run("predict", "gemm", "--hw", str(as_v6e), "-m", "64", "-n", "8192", "-k", "8192")
    assert NAME in out and "HBM-bound" in out
    out = _run("predict", "model", "llama-3.1-8b", "--hw", str(as_v6e))
    assert "TPU Fict" in out
    # the same numbers as the chip it copies, quantized activations included: nothing is keyed by the name
    for args in (("gemm", *QUANTIZED_GEMM), ("model", "llama-3.1-8b", *QUANTIZED_MODEL)):
        new, v6e = (json.loads(_run("predict", *args, "--hw", hw, "--json"))[0] for hw in (str(as_v6e), "tpu-v6e"))
        assert new["chip"] == NAME and v6e["chip"] == "tpu-v6e"
        for key in ("floor_s", "expected_s"):
            ours = new["roofline"][key] if "roofline" in new else new[key]
            theirs = v6e["roofline"][key] if "roofline" in v6e else v6e[key]
            assert ours == theirs, (args[0], key)


def test_vpu_bf16_arithmetic_drives_the_quantization_in_gemm_and_model(specs):
    as_v6e, flipped = specs
    on, off = get_chip(str(as_v6e)), get_chip(str(flipped))
    assert on.name == off.name == NAME
    assert quantizes_in_bf16(on, "bf16") and not quantizes_in_bf16(off, "bf16")
    gemm_on = json.loads(_run("predict", "gemm", "--hw", str(as_v6e), *QUANTIZED_GEMM, "--json"))[0]
    gemm_off = json.loads(_run("predict", "gemm", "--hw", str(flipped), *QUANTIZED_GEMM, "--json"))[0]
    assert any(BF16_CODES in n for n in gemm_on["cost"]["notes"])
    assert not any(BF16_CODES in n for n in gemm_off["cost"]["notes"])
    assert gemm_on["cost"]["vpu_ops"] < gemm_off["cost"]["vpu_ops"]  # 4 VPU ops per element instead of 7
    model_on = _run("predict", "model", "llama-3.1-8b", "--hw", str(as_v6e), *QUANTIZED_MODEL, "--json")
    model_off = _run("predict", "model", "llama-3.1-8b", "--hw", str(flipped), *QUANTIZED_MODEL, "--json")
    assert BF16_CODES in model_on and BF16_CODES not in model_off
    assert json.loads(model_on)[0]["unit_s"]["vpu"] < json.loads(model_off)[0]["unit_s"]["vpu"]


def test_mosaic_narrow_vmem_temporaries_drives_the_kernels_vmem_estimates(tmp_path):
    from kernels.rms_norm.blocks import RmsNormBlockSizes
    from kernels.tiling import narrow_vmem_temporaries

    narrow = get_chip(str(_write(tmp_path / "narrow")))
    wide = get_chip(str(_write(tmp_path / "wide", mosaic_narrow_vmem_temporaries="false")))
    assert narrow_vmem_temporaries(narrow) and not narrow_vmem_temporaries(wide)
    blocks = RmsNormBlockSizes(block_tokens=256)
    kw = dict(hidden=4096, x_dtype="bfloat16", residual_dtype="bfloat16", out_dtype="bfloat16", quantize=False)
    assert blocks.vmem_bytes(**kw, chip=narrow) < blocks.vmem_bytes(**kw, chip=wide)
    assert blocks.vmem_bytes(**kw, chip=narrow) == blocks.vmem_bytes(**kw, chip=get_chip("tpu-v6e"))


def test_the_registry_lists_the_new_chip_by_its_facts(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(_write(tmp_path / "all").parent))
    assert get_chip("fict").name == NAME and topology_for(NAME) == "v6e:2x2"
    assert compile_targets()[NAME] == "v6e:2x2" and NAME in matrix_chips()
    assert NAME in pallas_chips() and set(pallas_chips()) - {NAME} == {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
                                                                      "tpu-7x"}
    _run("predict", "gemm", "--hw", "fict", "-m", "64", "-n", "8192", "-k", "8192")
    _run("predict", "model", "llama-3.1-8b", "--hw", "tpu-fictional")

    monkeypatch.setenv(ENV_VAR, str(_write(tmp_path / "none", deviceless_topology="null",
                                           bundled_pallas_kernels="false").parent))
    assert NAME not in compile_targets() and NAME not in pallas_chips() and NAME not in matrix_chips()
