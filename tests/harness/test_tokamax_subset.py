"""The shipped tokamax subset as data (perfmodel.harness.tokamax_subset)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perfmodel.harness import tokamax_subset as ts


def test_recorded_point_by_id():
    p = ts.recorded_point("7x-norm-fwd-xla-004")
    # the layer norm over the leading axis of bf16[128, 384, 384] on one TPU7x core
    assert (p["op"], p["pass"], p["implementation"]) == ("normalization", "fwd", "xla")
    assert p["args"]["x"] == "bf16[128,384,384]" and p["args"]["axis"] == 0


def test_unknown_id_names_the_id_and_file():
    with pytest.raises(KeyError, match=r"no point 'v9-nothing-001' in validation/tokamax_tpu_calibration\.yaml"):
        ts.recorded_point("v9-nothing-001")


def test_rebuilding_a_recorded_call_leaves_the_validation_tables_out():
    # The compile process imports what recorded_call needs; a compile-cache entry is keyed on every module it
    # imported, so the validation tables (tokamax_validation, published_validation) must not be among them.
    code = ("import sys; import perfmodel.harness.tokamax_analyze; "
            "from perfmodel.harness.tokamax_subset import recorded_point; recorded_point('7x-fa-fwd-pl-006'); "
            "print(sorted(m for m in sys.modules if m.startswith('perfmodel.harness')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "perfmodel.harness.tokamax_subset" in out
    assert "tokamax_validation" not in out and "published_validation" not in out
