"""Second CLI review: integer fields and ridge points in `hw`, units and counts in `predict` reports, the flag
named by the page-table error, `report -` with the wrong JSON, and tune's rejection summary."""

import io
import re

import pytest
from click.testing import CliRunner

from perfmodel.cli.analyze import render_tune
from perfmodel.cli.main import main
from perfmodel.cli.report import build_report
from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.hw.describe import _fmt_field, compare_table, list_table, ridge_text, show_text
from perfmodel.schedule import tune as tune_mod
from perfmodel.schedule.tune import Candidate, TuneResult


def invoke(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def _row(output: str, label: str) -> str:
    """The value column of one report row."""
    lines = [line for line in output.splitlines() if line.startswith(label + "  ")]
    assert len(lines) == 1, output
    return lines[0][len(label):].strip()


# ----------------------------------------------------------------------------- 1. integer fields


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


# ----------------------------------------------------------------------------- 2. ridge points


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


# ----------------------------------------------------------------------------- 3. predict report rows


def test_attention_report_vmem_in_binary_and_reread_factor_with_x():
    res = invoke("predict", "attention", "--q-len", "4096", "--kv-heads", "4")
    assert res.exit_code == 0, res.output
    assert re.fullmatch(r"\d+(\.\d+)? MiB", _row(res.output, "VMEM working set"))
    # 8 causal q blocks of 512 read 1 + 2 + ... + 8 = 36 KV tiles instead of 8: 36 / 8 = 4.50x
    assert _row(res.output, "kv reread factor") == "4.50x"


def test_counts_in_reports_have_thousands_separators():
    res = invoke("predict", "decode-attention", "--context", "127076", "--batch", "1")
    assert res.exit_code == 0, res.output
    assert _row(res.output, "context tokens") == "127,076"
    # ceil(127076 / 16) = 7943 pages (16 x 7942 = 127072, 4 tokens over)
    assert _row(res.output, "kv pages read") == "7,943"


# ----------------------------------------------------------------------------- 4. page-table error names the flag


@pytest.mark.parametrize("args, match", [
    # ceil(100 / 16) = 7 pages
    (["decode-attention", "--context", "100", "--batch", "2", "--pages-per-seq", "2"],
     r"^Error: --context: a context of 100 tokens needs 7 pages of 16 tokens but --pages-per-seq is 2; "
     r"give --pages-per-seq 7 or more, or a larger --page-size$"),
    # uniform:100:200 at batch 2 -> quantiles 125 and 175; ceil(125 / 16) = 8
    (["decode-attention", "--context-dist", "uniform:100:200", "--batch", "2", "--pages-per-seq", "2"],
     r"^Error: --context-dist: a context of 125 tokens needs 8 pages of 16 tokens but --pages-per-seq is 2; "),
    # ceil(1000 / 64) = 16
    (["mla-decode", "--context-lens", "100,1000", "--pages-per-seq", "2"],
     r"^Error: --context-lens: a context of 1000 tokens needs 16 pages of 64 tokens but --pages-per-seq is 2; "),
    (["ragged-attention", "--query-lens", "1,5", "--context-lens", "100,50", "--pages-per-seq", "2"],
     r"^Error: --context-lens: a context of 100 tokens needs 7 pages of 16 tokens but --pages-per-seq is 2; "),
])
def test_page_table_error_names_the_context_flag_given(args, match):
    res = invoke("predict", *args)
    assert res.exit_code == 1
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert re.search(match, res.output.strip())


# ----------------------------------------------------------------------------- 5. report - with the wrong JSON


def test_report_stdin_names_what_report_accepts(tmp_path, monkeypatch):
    gemm = invoke("predict", "gemm", "-m", "8", "-n", "8", "-k", "8", "--json")
    assert gemm.exit_code == 0, gemm.output
    res = invoke("report", "-", "--out", str(tmp_path / "r.md"), input=gemm.output)
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert re.fullmatch(r"Error: INPUT -: not `perfmodel predict model --json` output; report reads that .*"
                        r"a measure results file or the published results YAML given by path", lines[0])
    monkeypatch.setattr("sys.stdin", io.StringIO(gemm.output))
    with pytest.raises(InputError, match=r"^INPUT -: not `perfmodel predict model --json` output; .*measure "
                                         r"results file.*published results YAML"):
        build_report("-")


# ----------------------------------------------------------------------------- 6. tune rejection summary


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
