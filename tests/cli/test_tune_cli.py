"""What `perfmodel tune` says about rejected candidates: one real message per group of like reasons, cut only
beyond 200 characters, and the rendered summary with its counts."""

import pytest

from perfmodel.schedule import tune as tune_mod
from perfmodel.schedule.tune import Candidate, TuneResult
from perfmodel.schedule.tune_render import render_tune


def test_rejections_keep_the_first_real_message_per_group():
    groups: dict = {}
    first = "--block: flash_attention block sizes {'block_q': 2048, 'block_kv': 512} rejected: 1024 does not divide 512"
    tune_mod._count(groups, first)
    tune_mod._count(groups, "--block: flash_attention block sizes {'block_q': 256, 'block_kv': 128} rejected: "
                            "1024 does not divide 128")
    tune_mod._count(groups, "VMEM needs vmem_limit_bytes on tpu-v5e")
    shown = {msg: n for msg, n in groups.values()}
    # numbers kept, tune's nonexistent --block flag dropped, like messages counted together
    assert shown == {
        "flash_attention block sizes {'block_q': 2048, 'block_kv': 512} rejected: 1024 does not divide 512": 2,
        "VMEM needs vmem_limit_bytes on tpu-v5e": 1,
    }


@pytest.mark.parametrize("length, shown", [(200, 200), (201, 200)])
def test_rejection_message_cut_only_beyond_200_chars(length, shown):
    text = "tracing k failed: " + "x" * length
    message = tune_mod._message(text)
    assert len(message) == shown
    assert message.endswith("...") == (length > 200)
    assert not message.startswith("tracing")


def test_render_tune_shows_examples_with_counts():
    cand = Candidate(blocks={"bm": 128}, expected_s=1e-3, hbm_bytes=100, ideal_hbm_bytes=100, vmem_bytes=2**20,
                     vmem_status="fits", vmem_limit_bytes=None, steps=4, limiter="compute", reason="ok")
    result = TuneResult(kernel="k", chip="tpu-v5e", shapes=(), ranked=(cand,), evaluated=4,
                        rejected={"bm=64 does not divide 100": 2, "VMEM needs vmem_limit_bytes on tpu-v5e": 1},
                        pruned=0, baseline=None, baseline_label="kernel default")
    lines = render_tune(result, 1).splitlines()
    assert lines[-2:] == ["  rejected 2x, e.g.: bm=64 does not divide 100",
                          "  rejected 1x: VMEM needs vmem_limit_bytes on tpu-v5e"]


def test_tune_write_rewrites_every_kernel_with_block_sizes_through_the_library(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from perfmodel.cli.main import main
    from perfmodel.schedule import tuned
    from perfmodel.schedule.catalog import tuned_kernels

    done, tasks = [], []
    # every (kernel, chip) pair is a runner task (in this process with --workers 1); each kernel's file is written
    # once from its pairs' results
    monkeypatch.setattr(tuned, "_tune_task", lambda task: tasks.append(task) or (task["chip"], {"c": task["chip"]}))
    monkeypatch.setattr(tuned, "_compiler_record", lambda spec, top: None)
    monkeypatch.setattr(tuned, "write_tuned_defaults",
                        lambda spec, **kw: done.append((spec.kernel, kw["compile_top"], sorted(kw["defaults"])))
                        or tmp_path / f"{spec.kernel}.json")
    result = CliRunner().invoke(main, ["tune", "--write", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert [(k, top) for k, top, _ in done] == [(t.kernel, None) for t in tuned_kernels()]
    assert len(tasks) == sum(len(tuned.tuned_chip_names(t)) for t in tuned_kernels())
    assert all(chips == sorted(tuned.tuned_chip_names(t)) for (_, _, chips), t in zip(done, tuned_kernels()))
    assert f"wrote {tmp_path / 'sampling.json'}" in result.output
    done.clear()
    result = CliRunner().invoke(main, ["tune", "--write", "rms_norm", "--json", "--workers", "1"])
    assert result.exit_code == 0 and [(k, top) for k, top, _ in done] == [("rms_norm", None)]
    done.clear()
    tasks.clear()
    # --compile N goes through to the library: the N preferred candidates compiled per chip
    result = CliRunner().invoke(main, ["tune", "--write", "rms_norm", "--compile", "3", "--workers", "1"])
    assert result.exit_code == 0 and [(k, top) for k, top, _ in done] == [("rms_norm", 3)]
    assert {t["compile_top"] for t in tasks} == {3}


@pytest.mark.parametrize("argv, match", [
    (["tune", "--write", "kv_cache_updat"], "--write: 'kv_cache_updat' has no tuned defaults; kernels with block"),
    (["tune", "--write", "matmul", "--shape", "x=8x8:bf16"], "--write: tunes each kernel's representative problem"),
])
def test_tune_write_errors_are_one_line_before_any_work(monkeypatch, argv, match):
    from click.testing import CliRunner

    from perfmodel.cli.main import main
    from perfmodel.schedule import tuned

    monkeypatch.setattr(tuned, "write_tuned_defaults", lambda name, **kw: pytest.fail("nothing may be re-tuned"))
    result = CliRunner().invoke(main, argv)
    assert result.exit_code != 0
    assert match in result.output and "Traceback" not in result.output


def test_tune_write_a_failed_pair_fails_the_run_naming_it_before_any_write(monkeypatch):
    from perfmodel.errors import InputError
    from perfmodel.schedule import tuned

    def task(t):
        if t["chip"] == "tpu-v5e":
            raise ValueError("boom")
        return t["chip"], {}

    monkeypatch.setattr(tuned, "_tune_task", task)
    monkeypatch.setattr(tuned, "write_tuned_defaults", lambda spec, **kw: pytest.fail("nothing may be written"))
    with pytest.raises(InputError, match="tune --write: rms_norm on tpu-v5e: ValueError: boom"):
        tuned.write_all(["rms_norm"], backend="inprocess")
