"""Issue 14: `--csv` writes an unset value as an empty cell (never "None"); `tune` reports an input error that
does not depend on the block sizes as that error (not as "no legal block sizes (4x)")."""

from __future__ import annotations

import csv
import io

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main


def test_csv_writes_unset_parameters_as_empty_cells():
    # copy --bytes sets neither --shape nor --elements: both columns are unset
    res = CliRunner().invoke(main, ["predict", "copy", "--bytes", "1000000", "--csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert len(rows) == 1
    assert "None" not in rows[0].values()
    assert rows[0]["shape"] == "" and rows[0]["array_elements"] == ""
    assert float(rows[0]["hbm_read_bytes"]) == 1e6


def test_csv_of_a_gemm_has_no_none_cell():
    res = CliRunner().invoke(main, ["predict", "gemm", "-m", "8", "-n", "128", "-k", "128", "--csv"])
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader(io.StringIO(res.output)))
    assert "None" not in row.values()
    assert row["weight_scale"] == ""


def test_tune_reports_a_shape_error_as_itself():
    # w is [512, 256] but x's K is 256: no block size can fix that
    res = CliRunner().invoke(main, ["tune", "matmul", "--shape", "x=128x256:bf16", "--shape", "w=512x256:bf16"])
    assert res.exit_code == 2
    assert "no legal block sizes" not in res.output
    assert "tune matmul: w: shape (512, 256) does not match x's K=256" in res.output


def test_tune_library_raises_the_shape_error():
    from perfmodel.errors import InputError
    from perfmodel.schedule.tune import tune

    with pytest.raises(InputError, match=r"^tune rms_norm: residual: shape \(8, 128\) must equal x's \(8, 256\)$"):
        tune("rms_norm", ["x=8x256:bf16", "residual=8x128:bf16", "weight=256:f32"], "v5e")
