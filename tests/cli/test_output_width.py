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


def test_optional_columns_are_left_out_first_and_named():
    # 1 + 2 + 10 + 2 + 20 = 35 columns; at 20, "record" (20 wide) goes: 1 + 2 + 10 = 13 fits.
    from perfmodel.units import table as tbl

    out = tbl(["#", "kernel", "record"], [["1", "k" * 10, "r" * 20]], align="lll", max_width=20,
              optional=("record",))
    assert out.splitlines() == ["#  kernel", "-  ----------", "1  kkkkkkkkkk",
                                "(record: left out to fit 20 columns; --wide shows every column)"]
    # Without a limit nothing is left out.
    assert "record" in tbl(["#", "record"], [["1", "r" * 200]], optional=("record",))


def test_prose_wraps_under_its_indent_and_tables_are_left_alone():
    from perfmodel.units import fit_text

    text = "\n".join(["a  b", "-  -", "1  2", "  note: " + "word " * 10])
    out = fit_text(text, 20).splitlines()
    assert out[:3] == ["a  b", "-  -", "1  2"]
    assert out[3] == "  note: word word" and all(line.startswith("    ") for line in out[4:])
    assert all(len(line) <= 20 for line in out)
    assert fit_text(text, None) == text


def test_every_report_command_fits_120_columns():
    v5e = "perfmodel/data/validation/tpu_v5e_matmul.yaml"
    for args in (["compare", v5e], ["calibrate", v5e], ["validate", "--no-kernels"], ["hw", "show", "v5e"],
                 ["tune", "--list"], ["predict", "model", "llama-3.1-8b", "--hw", "v5e,v6e,tpu-7x"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, (args, res.output)
        assert widest(res.output) <= 120, args
    wide = CliRunner().invoke(main, ["compare", v5e, "--wide"])
    assert widest(wide.output) > 120 and "record" in wide.output
