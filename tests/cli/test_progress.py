"""Issue 14: progress on stderr for long work, drawn only on a terminal (never under CliRunner, a pipe or
--json/--csv output); the library calls the callback it is given."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from perfmodel.cli.common import Progress
from perfmodel.cli.main import main


def test_a_sweep_of_300_points_writes_nothing_to_stderr_off_a_terminal():
    res = CliRunner().invoke(main, ["predict", "gemm", "-n", "128", "-k", "128", "--sweep",
                                    "m=" + ",".join(str(m) for m in range(1, 301)), "--csv"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert len(res.stdout.splitlines()) == 301  # header + one row per point: no bar in the CSV


def test_predict_op_calls_progress_once_per_chip_and_point():
    from perfmodel.hw.registry import get_chip
    from perfmodel.predict.ops import predict_op

    calls = []
    chips = [get_chip("v5e"), get_chip("v6e")]
    predict_op("copy", {"array_bytes": 1e6}, chips=chips, points=[{}, {}, {}],
               progress=lambda msg, done, total: calls.append((msg, done, total)))
    # 2 chips x 3 points = 6 predictions, counted 1..6
    assert [d for _, d, _ in calls] == [1, 2, 3, 4, 5, 6]
    assert {t for _, _, t in calls} == {6}
    assert [m for m, _, _ in calls] == ["tpu-v5e"] * 3 + ["tpu-v6e"] * 3


def test_tune_calls_progress_for_every_candidate_and_writes_nothing_to_stderr():
    from perfmodel.schedule.tune import tune

    calls = []
    result = tune("matmul", ["x=128x256:bf16", "w=256x256:bf16"], "v5e",
                  progress=lambda msg, done, total: calls.append((msg, done, total)))
    n = result.evaluated + result.pruned
    assert [d for _, d, _ in calls] == list(range(1, n + 1)) and {t for _, _, t in calls} == {n}
    assert all(m.startswith("bm=") for m, _, _ in calls)
    res = CliRunner().invoke(main, ["tune", "matmul", "--shape", "x=128x256:bf16", "--shape", "w=256x256:bf16"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""


def test_validate_passes_a_progress_callback(monkeypatch):
    from perfmodel.errors import InputError
    from perfmodel.harness import published_validation

    seen = []

    def fake_run(*, groups, kernels, progress, **options):
        seen.append(progress)
        progress("point-1")
        raise InputError("stop here")

    monkeypatch.setattr(published_validation, "run_validation", fake_run)
    res = CliRunner().invoke(main, ["validate", "--no-kernels"])
    assert isinstance(seen[0], Progress) and seen[0].calls == 1
    assert res.exit_code == 2 and res.stderr == "Error: stop here\n"  # no progress line off a terminal


def _draw(total, steps, **kw):
    @click.command()
    def cmd():
        with Progress("work", total=total, enabled=True, **kw) as bar:
            for i in range(steps):
                bar(f"item {i}")
    return CliRunner().invoke(cmd, [])


def test_progress_draws_a_bar_on_stderr_when_enabled_and_clears_it():
    res = _draw(3, 3)
    assert res.stdout == ""
    assert "work" in res.stderr and "3/3" in res.stderr
    assert res.stderr.endswith("\r\x1b[K\x1b[?25h")  # the bar's line is cleared at the end


def test_progress_below_min_total_and_disabled_draw_nothing():
    assert _draw(5, 5, min_total=200).stderr == ""
    with Progress("work", total=5, enabled=False) as bar:
        bar("x")
    assert bar.calls == 1


def test_progress_without_a_total_rewrites_one_line():
    res = _draw(None, 2)
    assert res.stderr == "\rwork: item 0\x1b[K\rwork: item 1\x1b[K\r\x1b[K"
