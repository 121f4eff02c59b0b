"""Formatting helpers: SI prefixes, binary capacities, ratios and tables."""

import pytest

from perfmodel import units


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (1.97e14, "FLOP/s", "197 TFLOP/s"),
        (8.19e11, "B/s", "819 GB/s"),
        (3.5e-7, "s", "350 ns"),
        (0.00609, "s", "6.09 ms"),
        (999.96, "B", "1.00 kB"),  # rounds up into the next prefix, not "1000 B"
        (0, "s", "0 s"),
        (None, "s", "n/a"),
    ],
)
def test_si(value, unit, text):
    assert units.si(value, unit) == text


def test_binary_capacities():
    assert units.binary(2**27) == "128 MiB"
    assert units.binary(16 * 2**30) == "16.0 GiB"


def test_intensity_has_no_milli_prefix():
    # 2*1*1*8 FLOPs over 34 bytes = 0.471 FLOP/B: a ratio, not "471 mFLOP/B"
    assert units.intensity(16 / 34) == "0.471 FLOP/B"
    assert units.intensity(2730.67) == "2.73 kFLOP/B"


def test_table_aligns_and_leaves_unheaded_columns_unruled():
    text = units.table(["chip", "time", ""], [["v5e", "1 ms", "<- here"], ["tpu-v6e", "10 ms", ""]])
    lines = text.splitlines()
    assert lines[0].split() == ["chip", "time"]
    assert lines[1] == "-------  -----"
    assert lines[2].endswith("<- here")
    assert lines[3] == "tpu-v6e  10 ms"


def test_counted_units_get_no_milli_prefix_and_large_values_reach_exa():
    from perfmodel.units import seconds, si

    assert si(0.0625, "tok/s") == "0.0625 tok/s"  # was "62.5 mtok/s", which reads as mega
    assert si(62500, "tok/s") == "62.5 ktok/s"
    assert si(1.31e18, "B") == "1.31 EB"  # was "1310 PB"
    assert seconds(2730) == "2.73 ks"
    assert si(float("inf"), "s") == "inf s"


def test_sub_nanosecond_times_take_pico_and_femto_prefixes():
    # A 5.75e-12 s prologue is 5.75 ps, not "0.00575 ns"; 2e-15 s is 2.00 fs.
    from perfmodel.units import seconds

    assert seconds(5.75e-12) == "5.75 ps"
    assert seconds(2e-15) == "2.00 fs"
