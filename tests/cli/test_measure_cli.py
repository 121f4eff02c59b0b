"""`perfmodel measure / compare / calibrate / report` through click's CliRunner (CPU: interpret mode)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.harness.roofline_report import build_report

YAML = os.path.join(os.path.dirname(__file__), "..", "..", "perfmodel", "data", "validation", "tpu_v5e_matmul.yaml")
RMS = ["--shape", "x=16x256:bf16", "--shape", "residual=16x256:bf16", "--shape", "weight=256:f32"]


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def _one_line_error(res, *needles):
    assert res.exit_code != 0
    err = res.output.strip()
    assert err.startswith("Error:") and "\n" not in err, err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One interpret-mode measurement of rms_norm, appended to a results file (text output kept)."""
    path = tmp_path_factory.mktemp("measure") / "results.jsonl"
    res = run("measure", "rms_norm", "--hw", "v5e", "--repeat", "2", *RMS, "--out", str(path), "--wide")
    assert res.exit_code == 0, res.output
    return path, res.output


def test_measure_text_labels_interpret_time_as_not_tpu_performance(measured):
    path, out = measured
    assert "backend cpu (cpu), mode interpret" in out
    # the default timer where a trace can be read: the device span of the CPU backend's trace (still not TPU speed)
    assert "interpret-mode xprof device span on the host (not TPU performance): median" in out
    assert "2 repeats after 1 warm-up" in out
    # HBM floor: 4 x 16 x 256 x 2 B + 256 x 4 B = 33792 B at 819 GB/s = 41.3 ns
    assert "predicted on tpu-v5e: op floor 41.3 ns (HBM-bound)" in out
    assert "efficiency: n/a (interpret mode" in out
    assert f"appended 1 record(s) to {path}" in out
    assert "measured:" not in out  # never presented as a measured kernel time


def test_measure_json_is_the_record_written(tmp_path):
    path = tmp_path / "r.jsonl"
    res = run("measure", "matmul", "--hw", "v5e", "--repeat", "1", "--shape", "x=32x128:f32",
              "--shape", "w=128x256:f32", "--block", "bm=16,32", "--block", "bk=128", "--block", "bn=256",
              "--out", str(path), "--json")
    assert res.exit_code == 0, res.output
    printed = json.loads(res.output)
    assert [r["blocks"] for r in printed] == [{"bm": 16, "bk": 128, "bn": 256}, {"bm": 32, "bk": 128, "bn": 256}]
    assert all(r["mode"] == "interpret" and r["backend"] == "cpu" and r["efficiency"] is None for r in printed)
    assert [json.loads(line) for line in path.read_text().splitlines()] == printed


@pytest.mark.parametrize("args, needles", [
    (["measure", "rms_norm", *RMS], ["--hw: the cpu device 'cpu' is not a TPU perfmodel knows", "--hw CHIP"]),
    (["measure", "nope", "--hw", "v5e"], ["KERNEL 'nope' is not known"]),
    (["measure", "matmul", "--hw", "v5e", "--block", "bm=abc"], ["--block 'bm=abc': expected FIELD=N[,N...]"]),
    (["measure", "matmul", "--hw", "v5e", "--block", "bm=16"], ["--block: give every block field of matmul"]),
    (["measure", "matmul", "--hw", "v5e"], ["--shape: the cpu backend runs the kernel in interpret mode"]),
    (["measure", "rms_norm", "--hw", "v5e", "--shape", "y=8x128:bf16"], ["--shape: 'y' is not an array argument"]),
    (["compare", "missing.jsonl"], ["missing.jsonl: no such results file"]),
    (["report", "missing.json", "--out", "r.md"], ["INPUT 'missing.json': no such file"]),
])
def test_user_errors_are_one_line(args, needles):
    _one_line_error(run(*args), *needles)


def test_calibrate_refuses_interpret_only_results(measured):
    path, _ = measured
    _one_line_error(run("calibrate", str(path)), f"{path}: only interpret-mode records (1)",
                    "compiled on a real TPU")


def test_compare_shows_interpret_records_apart_with_a_note(measured, tmp_path):
    path, _ = measured
    plot = tmp_path / "c.png"
    res = run("compare", str(path), "--plot", str(plot))
    assert res.exit_code == 0, res.output
    assert "interpret mode (host wall time of an emulation: not TPU performance):" in res.output
    assert "no real-TPU records: no efficiency statistics" in res.output
    assert "left out of the statistics" in res.output
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_truncated_last_line_is_reported_with_file_and_line(measured, tmp_path):
    path, _ = measured
    broken = tmp_path / "broken.jsonl"
    line = path.read_text()
    broken.write_text(line + line[:100])
    res = run("compare", str(broken))
    assert res.exit_code == 0, res.output
    assert f"warning: {broken}:2: truncated last line skipped (an interrupted write?)" in res.output
    # appending to it is refused, naming the line
    _one_line_error(run("measure", "rms_norm", "--hw", "v5e", *RMS, "--out", str(broken)),
                    f"--out {broken}:2: the last line is truncated")


def test_compare_and_calibrate_the_published_v5e_yaml():
    res = run("compare", YAML, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["records"]) == 9 and data["efficiency"]["count"] == 9
    # 8192^3 Pallas with 512x1024x1024 blocks: the guide reports 91.5% of peak; so does our efficiency.
    big = [r for r in data["records"] if r["blocks"] == {"bm": 512, "bk": 1024, "bn": 1024}
           and r["arrays"][0]["shape"] == [8192, 8192]]
    assert big[0]["efficiency"] == pytest.approx(0.915, abs=5e-4)
    res = run("calibrate", YAML, "--wide")  # whole lines to match
    assert res.exit_code == 0, res.output
    mxu = next(line.split() for line in res.output.splitlines() if line.startswith("tpu-v5e  MXU"))
    assert mxu[3] == "4"  # four usable points
    assert "limited by the per-grid-step overhead" in res.output and "dispatch-dominated" in res.output


def test_report_of_a_predict_model_step(tmp_path):
    step = run("predict", "model", "llama-3.1-8b", "--hw", "v5e", "--batch", "1", "--context", "1024", "--json")
    assert step.exit_code == 0, step.output
    md = tmp_path / "out" / "step.md"
    res = run("report", "-", "--out", str(md), input=step.output)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    # gate_up: 2 matrices of 4096 x 14336 bf16 per layer = 234.9 MB; x 32 layers = 7.52 GB / 819 GB/s = 9.18 ms,
    # an intensity of 1 FLOP/B (2 FLOP per 2-byte weight at batch 1), 100% of HBM bandwidth.
    assert "| gate_up | 32 | 9.18 ms |" in text
    row = next(line for line in text.splitlines() if line.startswith("| gate_up |"))
    assert row.endswith("| HBM-bound | 49.6% | 1.00 FLOP/B | 0.4% | 100.0% |")
    assert "![roofline](step.png)" in text
    assert (tmp_path / "out" / "step.png").read_bytes()[:4] == b"\x89PNG"


def test_report_of_measured_records(measured, tmp_path):
    path, _ = measured
    res = run("report", str(path), "--out", str(tmp_path / "k.md"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    [row] = data["sections"][0]["rows"]
    # numbers in SI base units: the measured interpret wall time in seconds, no efficiency (null)
    assert row["kernel"] == "rms_norm" and row["backend_mode"] == "cpu/interpret" and row["efficiency"] is None
    assert isinstance(row["measured_s"], float) and row["measured_s"] > 0
    assert data["files"] == [str(tmp_path / "k.md"), str(tmp_path / "k.png")]


def test_compare_calibrate_report_of_a_results_file_do_not_import_jax(measured, tmp_path):
    path, _ = measured
    script = textwrap.dedent(f"""
        import sys
        from click.testing import CliRunner
        from perfmodel.cli.main import main
        for args in (["compare", {str(path)!r}, "--plot", {str(tmp_path / "c.png")!r}],
                     ["calibrate", {str(path)!r}],
                     ["report", {str(path)!r}, "--out", {str(tmp_path / "r.md")!r}]):
            CliRunner().invoke(main, args)
        print(sorted(m for m in sys.modules if m == "jax" or m.startswith("jax.")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert (tmp_path / "r.md").exists() and (tmp_path / "c.png").exists()


def test_report_stdin_names_what_report_accepts(tmp_path):
    gemm = run("predict", "gemm", "-m", "8", "-n", "8", "-k", "8", "--json")
    assert gemm.exit_code == 0, gemm.output
    res = run("report", "-", "--out", str(tmp_path / "r.md"), input=gemm.output)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert re.fullmatch(r"Error: INPUT -: not `perfmodel predict model --json` or `perfmodel serve --json` output; "
                        r"report reads those .*"
                        r"a measure results file or the published results YAML given by path", lines[0])
    # the library names its argument; the CLI wrote it as INPUT
    with pytest.raises(InputError, match=r"^`input_path` -: not `perfmodel predict model --json` or `perfmodel serve "
                                         r"--json` output; .*measure "
                                         r"results file.*published results YAML"):
        build_report("-", stdin_text=gemm.output)
