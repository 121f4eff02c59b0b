"""Every notebook in notebooks/ executes top to bottom without error, shows its figures inline and computes the
numbers its story tells (read back from the executed kernel, not from printed text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _run(name: str, probe: str, tmp_path: Path) -> tuple[dict, list]:
    """Execute notebooks/NAME with one more cell at the end that prints `probe` (an expression over the notebook's
    variables) as JSON; return that value and the notebook's own outputs."""
    nb = nbformat.read(NOTEBOOKS[0].parent / name, as_version=4)
    own = len(nb.cells)
    nb.cells.append(nbformat.v4.new_code_cell(f"import json as _json\nprint('PROBE ' + _json.dumps({probe}))"))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells[:own] if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("ok" in o.get("text", "") for o in outputs if o.get("output_type") == "stream")  # its own checks ran
    # the probe's own line only: a warning the kernel writes to stderr meanwhile (a thread's fork notice) is another
    # output of the same cell
    [line] = [ln for o in nb.cells[-1].outputs if o.get("output_type") == "stream" and o.get("name") == "stdout"
              for ln in o["text"].splitlines() if ln.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE ")), outputs


def _inline_images(outputs: list) -> int:
    return sum("image/png" in o.get("data", {}) for o in outputs if o.get("output_type") in ("display_data",
                                                                                            "execute_result"))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"decode_gemm_roofline.ipynb", "kernel_engineer.ipynb"}


def test_no_notebook_forces_a_backend():
    for path in NOTEBOOKS:
        assert "matplotlib.use(" not in path.read_text(), path.name  # figures show inline in Jupyter


def test_decode_gemm_story(tmp_path):
    got, outputs = _run("decode_gemm_roofline.ipynb",
                        "{'ridge': ridge, 'flip': {f'{c} {w}': v for (c, w), v in flip.items()}, "
                        "'floor_m1_v5e_bf16': float(results['tpu-v5e', 'bf16'].floor_s[0]), "
                        "'bound_m1_7x_int8': str(results['tpu-7x', 'int8'].bound[0])}", tmp_path)
    assert _inline_images(outputs) >= 1
    # v5e: 197 TFLOP/s / 819 GB/s = 240.5 FLOP/B; bf16 weights give ~M FLOP/B, so the first power of two past it,
    # 256, is the first batch that is not HBM-bound; int8 weights (2M FLOP/B) flip at 128.
    assert got["ridge"]["tpu-v5e"] == pytest.approx(240.5, abs=0.1)
    assert (got["flip"]["tpu-v5e bf16"], got["flip"]["tpu-v5e int8"]) == (256, 128)
    # v6e: 918 TFLOP/s / 1.64 TB/s = 560 FLOP/B -> 1024 with bf16 weights
    assert got["flip"]["tpu-v6e bf16"] == 1024
    # M=1 on v5e: 8192 * 8192 * 2 B / 819 GB/s = 164 us
    assert got["floor_m1_v5e_bf16"] == pytest.approx(8192 * 8192 * 2 / 819e9, rel=0.01)
    # 7x has no int8 MXU rate: the int8 weights' conversion on the VPU bounds the GEMM
    assert got["bound_m1_7x_int8"] == "VPU-bound"


def test_kernel_engineer_walk(tmp_path):
    got, outputs = _run("kernel_engineer.ipynb",
                        "{'x_hbm': k.operands[0].hbm_bytes, 'best': dict(best.blocks), 'best_s': best.expected_s, "
                        "'base_s': base.expected_s, 'again_s': again.expected_s, 'floor_s': k.time.op_floor_s, "
                        "'mo_e': [cmp.measured_over_expected.lowest, cmp.measured_over_expected.highest], "
                        "'n_real': len(cmp.real[0].rows)}", tmp_path)
    assert _inline_images(outputs) >= 1  # the compare figure
    # default blocks: x's row block stays in VMEM across the 2 N-blocks, so x (512 * 1024 * 2 B = 1 MiB) is read
    # once; the tuned blocks win on the exposed prologue and epilogue, not on traffic
    assert got["x_hbm"] == 512 * 1024 * 2
    # op floor: 2 * 512 * 1024 * 2048 FLOP / 197 TFLOP/s = 10.9 us; nothing beats it
    assert got["floor_s"] == pytest.approx(2 * 512 * 1024 * 2048 / 197e12)
    assert got["floor_s"] <= got["best_s"] < got["base_s"]
    assert got["again_s"] == pytest.approx(got["best_s"])  # analyze with the tuned blocks agrees with tune
    assert got["n_real"] == 9 and 0.95 < got["mo_e"][0] <= got["mo_e"][1] < 1.05


def test_serving_tradeoffs_story(tmp_path):
    got, outputs = _run("serving_tradeoffs.ipynb", "{'rows': rows, 'gain': gain}", tmp_path)
    assert _inline_images(outputs) >= 1
    rows = {int(k): v for k, v in got["rows"].items()}
    # chunking: TPOT grows with the token budget; power-of-two padding of 2048-token prefills past a 2048 budget
    assert rows[512]["tpot_ms"] < rows[2048]["tpot_ms"] < rows[8192]["tpot_ms"]
    assert rows[4096]["ttft_ms"] > 5 * rows[2048]["ttft_ms"]
    low, sat = got["gain"]["low load, 1 req/s"], got["gain"]["saturation, 128 in flight"]
    assert sat["tok_s"] > 0.05 and abs(low["tok_s"]) < 0.01
