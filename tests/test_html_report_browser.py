"""`perfmodel report ... --out report.html`: one self-contained file, checked in a real headless browser.

The browser is Debian's `chromium` package (`.ci/run` installs it with apt-get where it can: as root or with
`sudo -n`); where it is missing the browser tests skip and say why. Chromium runs headless with
`--enable-logging=stderr --v=0`, which writes every page console message (and uncaught error) to stderr as
`CONSOLE` lines; `--dump-dom` gives the DOM after load and `--screenshot` a PNG, read with matplotlib.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.harness.records import ArraySpec, CallPrediction, Record, Timing, append_record

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: .ci/run installs Debian's chromium package with apt-get (as root "
                             "or with sudo -n); install it with `apt-get install -y chromium` to run this test")

SECTIONS = ("inputs", "roofline", "table-1", "measured-vs-predicted", "notes")


def _record(*, mode: str, floor_s: float, measured_s: float) -> Record:
    """A matmul record on v5e whose op floor is MXU time: useful FLOPs = floor x 197 TFLOP/s."""
    real = mode == "compiled"
    pred = CallPrediction(chip="tpu-v5e", op_floor_s=floor_s, op_floor_limiter="mxu", expected_s=floor_s / 0.92,
                          expected_source="schedule model", schedule_limiter="compute", limiting_unit="mxu",
                          model_factor=0.92, useful_flops=floor_s * 197e12, mxu_dtype="bf16", ideal_hbm_bytes=1e6)
    timing = Timing(statistic="median", measured_s=measured_s, min_s=measured_s, max_s=measured_s, iqr_s=0.0,
                    times_s=(measured_s,), repeats=1, warmup=1, includes_dispatch=False, dispatch_s=None)
    return Record(kernel="matmul", arrays=(ArraySpec(name="x", shape=(256, 256), dtype="bfloat16", fill="random"),),
                  backend="tpu" if real else "cpu", device_kind="TPU v5 lite" if real else "cpu",
                  device_chip="tpu-v5e" if real else None, mode=mode, source="test", timing=timing, prediction=pred,
                  efficiency=floor_s / measured_s if real else None)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """Two records: a compiled one (floor 1 ms, measured 1.25 ms: 80% efficient) and an interpret-mode one."""
    path = tmp_path_factory.mktemp("results") / "r.jsonl"
    append_record(path, _record(mode="compiled", floor_s=1e-3, measured_s=1.25e-3))
    append_record(path, _record(mode="interpret", floor_s=2e-6, measured_s=0.3))
    return path


@pytest.fixture(scope="module")
def html_report(results) -> Path:
    out = results.parent / "out" / "report.html"
    res = CliRunner().invoke(main, ["report", str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"wrote {out} (2 table rows, 5 roofline points, plots inline)"
    return out


def test_html_report_is_one_self_contained_file(html_report):
    assert sorted(p.name for p in html_report.parent.iterdir()) == ["report.html"]  # no PNG beside it
    text = html_report.read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f'<section id="{section}">' in text
    assert text.count("<svg") == 2  # the roofline and measured vs predicted, inline
    # nothing to fetch: no script, no stylesheet link, no image or anything else by URL
    # (the SVGs' clip paths refer to ids in the page: url(#...), href="#...")
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|url\((?!#)|href=\"(?!#)", text), "external resource"
    # the per-kernel table: the compiled record is 1 ms / 1.25 ms = 80.0% efficient; the inputs name the file:line
    assert "<td class=\"r\">80.0%</td>" in text and f"{html_report.parent.parent / 'r.jsonl'}:1" in text


def test_html_report_json_is_numbers_and_names_the_file(results, tmp_path):
    import json

    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(results), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["files"] == [str(out)]
    assert data["sections"][0]["rows"][0]["efficiency"] == pytest.approx(0.8)


def test_html_report_refuses_plot_and_existing_file(results, tmp_path):
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(results), "--out", str(out), "--plot", str(tmp_path / "r.png")])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --plot: an HTML report carries its plots inline; leave --plot out (or give a " \
                                 ".md OUT)"
    out.write_text("mine")
    res = CliRunner().invoke(main, ["report", str(results), "--out", str(out)])
    assert res.exit_code == 2 and f"--out '{out}' exists; give --force" in res.output
    assert out.read_text() == "mine"
    assert CliRunner().invoke(main, ["report", str(results), "--out", str(out), "--force"]).exit_code == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def _chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                           *args, page.resolve().as_uri()], capture_output=True, text=True, timeout=120)


def _console_messages(stderr: str) -> list[str]:
    """Page console messages and uncaught errors in chromium's stderr log."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@needs_chromium
def test_console_check_sees_a_page_error(tmp_path):
    """The check below can fail: a page that throws is seen."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction()</script></body></html>")
    res = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert any("undefinedFunction" in m for m in _console_messages(res.stderr)), res.stderr


@needs_chromium
def test_html_report_in_a_headless_browser(html_report, tmp_path):
    import numpy as np
    from matplotlib.image import imread

    dom = _chromium(html_report, tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console_messages(dom.stderr) == []
    for section in SECTIONS:
        assert re.search(rf'<section id="{section}">\s*<h2>', dom.stdout), section
    assert dom.stdout.count("<svg") == 2

    shot = tmp_path / "shot.png"
    res = _chromium(html_report, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400",
                    "--hide-scrollbars")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert _console_messages(res.stderr) == []
    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    assert float(np.var(pixels[..., :3])) > 0  # not blank: the tables and plots are drawn
