"""Dtype names, sizes and the per-generation MXU dtype rules."""

import pytest

from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.model.dtypes import FP32_EMULATION_PASSES, itemsize, matmul_path, parse_dtype


@pytest.mark.parametrize("text,name", [("bf16", "bf16"), ("bfloat16", "bf16"), ("BF16", "bf16"), ("f32", "fp32"),
                                       ("float32", "fp32"), ("e4m3", "fp8"), ("float8_e4m3fn", "fp8"),
                                       ("i8", "int8"), ("int4", "int4"), ("fp8-e5m2", "fp8")])
def test_aliases(text, name):
    assert parse_dtype(text) == name


@pytest.mark.parametrize("name,nbytes", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("fp8", 1), ("int8", 1), ("int4", 0.5)])
def test_itemsize(name, nbytes):
    assert itemsize(name) == nbytes


def test_unknown_dtype_names_the_flag():
    with pytest.raises(InputError, match=r"^--kv-dtype: unknown dtype 'fp9'; use one of"):
        parse_dtype("fp9", "--kv-dtype")


def test_native_pair_keeps_its_rate(v5e):
    path = matmul_path(v5e, "int8", "int8")
    assert (path.compute_dtype, path.converts_lhs, path.converts_rhs, path.notes) == ("int8", False, False, ())


def test_fp8_on_v5e_is_converted_to_bf16(v5e):
    # v5e has no fp8 MXU path (its spec lists no fp8 rate or pair): both operands widen to bf16.
    path = matmul_path(v5e, "fp8", "fp8")
    assert path.compute_dtype == "bf16" and path.converts_lhs and path.converts_rhs
    assert "no native fp8 x fp8" in path.notes[0]


def test_fp8_native_on_v6e(v6e):
    assert matmul_path(v6e, "fp8", "fp8").compute_dtype == "fp8"


def test_int8_weights_on_ironwood_are_converted():
    chip = get_chip("tpu-7x")
    path = matmul_path(chip, "bf16", "int8")
    assert path.compute_dtype == "bf16" and path.converts_rhs and not path.converts_lhs
    path = matmul_path(chip, "int8", "int8")
    assert path.compute_dtype == "bf16" and path.converts_lhs and path.converts_rhs


def test_mixed_native_pair_runs_at_wider_rate():
    chip = get_chip("tpu-v4")  # lists "bf16 x int8" as native
    path = matmul_path(chip, "bf16", "int8")
    assert path.compute_dtype == "bf16" and not path.converts_rhs


def test_fp32_without_rate_is_emulated(v5e):
    path = matmul_path(v5e, "fp32", "fp32")
    assert path.compute_dtype == "bf16" and path.passes == FP32_EMULATION_PASSES
    assert any("fp32" in n for n in path.notes)


def test_no_chip_assumes_native():
    path = matmul_path(None, "bf16", "int8")
    assert path.compute_dtype == "bf16" and not path.converts_rhs and path.passes == 1
