"""Fixes from a first-use review of the CLI: sweep vs an explicit flag, comma lists in
`hw compare`, the pass count in the sampling model's stage note."""

import re

import numpy as np
import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.model.sampling import sampling


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("args, match", [
    (["predict", "gemm", "-m", "4", "--sweep", "m=1,2", "-n", "8", "-k", "8"],
     r"^Error: --sweep m: --m is also given and would be ignored; drop --m or the sweep$"),
    (["predict", "decode-attention", "--context", "100", "--batch", "4", "--sweep", "batch=1,2"],
     r"^Error: --sweep batch: --batch is also given and would be ignored; drop --batch or the sweep$"),
    (["predict", "model", "llama-3.1-8b", "--batch", "4", "--sweep", "batch=1,32"],
     r"^Error: --sweep batch: --batch is also given and would be ignored; drop --batch or the sweep$"),
])
def test_sweep_and_explicit_flag_conflict_is_one_line(args, match):
    result = invoke(*args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert re.match(match, lines[0]), lines[0]


def test_sweep_without_the_flag_still_sweeps():
    result = invoke("predict", "gemm", "--sweep", "m=1,2", "-n", "8", "-k", "8", "--csv")
    assert result.exit_code == 0, result.output
    rows = result.output.strip().splitlines()
    assert len(rows) == 3  # header + one row per swept m


@pytest.mark.parametrize("chips", [["v5e,v6e"], ["v5e,", "v6e"], ["v5e", "tpu-v6e"]])
def test_hw_compare_accepts_comma_lists(chips):
    result = invoke("hw", "compare", *chips)
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header == ["tpu-v5e", "tpu-v6e"]


def test_hw_compare_with_only_commas_is_one_line():
    result = invoke("hw", "compare", ",")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: CHIPS: no chip name given; e.g. perfmodel hw compare tpu-v5e tpu-v6e"


@pytest.mark.parametrize("filters, passes, expected", [
    # top-p only: one bisection; fp32 logits default to 32 passes (the dtype's bits)
    (dict(top_p=0.9), None, "threshold bisection (1 filter(s) x 32 passes)"),
    # top-k and top-p: two bisections of 16 passes each
    (dict(top_k=50, top_p=0.9), 16, "threshold bisection (2 filter(s) x 16 passes)"),
])
def test_sampling_stage_note_names_the_pass_count(filters, passes, expected):
    cost = sampling(batch=8, vocab=4096, passes=passes, **filters)
    assert any(expected in note for note in cost.notes), cost.notes


def test_sampling_stage_note_with_swept_passes():
    cost = sampling(batch=8, vocab=4096, top_k=50, passes=np.array([8, 24]))
    assert any("threshold bisection (1 filter(s) x 8-24 passes)" in note for note in cost.notes), cost.notes


def _spec_copy(tmp_path, name):
    """tpu-v5e's spec saved under tmp_path with its name changed (aliases dropped so they cannot collide)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "hwspecs" / "tpu-v5e.yaml").read_text()
    text = re.sub(r"(?m)^name: tpu-v5e$", f"name: {name}", text)
    text = re.sub(r"(?m)^aliases: .*$", "aliases: []", text)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["my-tpu", "tpu-v5e"])
def test_chip_argument_resolves_back_to_a_spec_file(tmp_path, name):
    from perfmodel.hw.registry import chip_argument, get_chip

    builtin = get_chip("tpu-v5e")
    assert chip_argument(builtin) == "tpu-v5e"
    spec = get_chip(str(_spec_copy(tmp_path, name)))
    arg = chip_argument(spec)
    # the file's own spec comes back, not the built-in one of the same name
    assert get_chip(arg) is spec and arg.endswith(f"{name}.yaml")


def test_analyze_bundled_kernel_on_a_spec_file(tmp_path):
    path = _spec_copy(tmp_path, "my-tpu")
    result = invoke("analyze", "kernels.matmul:matmul", "--hw", str(path),
                    "--shape", "x=256x256:bf16", "--shape", "w=256x256:bf16")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "pallas_call matmul on my-tpu"


def test_hw_show_disagreements_carry_units():
    result = invoke("hw", "show", "tpu-7x")
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("  memory.vmem_bytes_per_core: chose")]
    # 67108864 B = 64 MiB (67.1 MB) chosen over 134217728 B = 128 MiB (134 MB); no bare 6.71089e+07
    assert len(lines) == 1
    assert "chose 64.0 MiB (67.1 MB) [jax-tpu-info] over 128 MiB (134 MB) [jax-issue-38988]" in lines[0]
    assert "e+0" not in result.output.split("where sources disagree:")[1].split("notes:")[0]
