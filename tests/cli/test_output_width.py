"""Issue 14: tables fit 120 columns by default (text columns wrap, long headers wrap); --wide prints them whole."""

from __future__ import annotations

from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.units import table


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_table_wraps_its_widest_text_column_to_fit():
    # columns 1 + 2 + 30 + 2 + 1 = 36 wide; at 30 the text column narrows by 6 to 24 and wraps at the space
    out = table(["#", "reason", "n"], [["1", "a" * 10 + " " + "b" * 19, "7"]], align="llr", max_width=30)
    assert out.splitlines() == ["#  reason                    n",
                                "-  ------------------------  -",
                                "1  aaaaaaaaaa                7",
                                "   bbbbbbbbbbbbbbbbbbb"]
    assert widest(table(["#", "reason"], [["1", "x" * 50]], align="ll")) == 53  # no limit: unchanged


def test_table_wraps_a_long_header_over_short_numbers_first():
    # "op floor" (8) over "10.9 µs" (7): 8 + 2 + 1 = 11 > 10, so the header wraps to the cells' 7
    out = table(["op floor", "n"], [["10.9 µs", "1"]], max_width=10)
    assert out.splitlines() == ["op       n", "floor", "-------  -", "10.9 µs  1"]


def test_tune_fits_120_columns_and_wide_shows_the_whole_reason():
    args = ["tune", "matmul", "--shape", "x=128x256:bf16", "--shape", "w=256x256:bf16"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= 120
    wide = CliRunner().invoke(main, args + ["--wide"])
    assert wide.exit_code == 0 and widest(wide.output) > 120  # the reason column unwrapped


def test_predict_sweep_fits_120_columns():
    res = CliRunner().invoke(main, ["predict", "gemm", "-n", "128", "-k", "128", "--sweep", "m=1,2",
                                    "--hw", "v5e,v6e", "--rhs-dtype", "int8"])
    assert res.exit_code == 0, res.output
    assert widest(res.output) <= 120
