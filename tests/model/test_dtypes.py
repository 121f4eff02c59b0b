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
    with pytest.raises(InputError, match=r"^`kv_dtype`: unknown dtype 'fp9'; use one of"):
        parse_dtype("fp9", "`kv_dtype`")


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
    path = matmul_path(v5e, "fp32", "fp32", "highest")
    assert path.compute_dtype == "bf16" and path.passes == FP32_EMULATION_PASSES == 6
    assert any("fp32" in n and "HIGHEST" in n for n in path.notes)


TPUS = ("tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x")


@pytest.mark.parametrize("chip_name", TPUS)
@pytest.mark.parametrize("precision, passes", [(None, 1), ("default", 1), ("high", 3), ("HIGHEST", 6)])
def test_fp32_dot_passes_follow_the_precision_on_every_tpu(chip_name, precision, passes):
    # No TPU lists an fp32 MXU rate: an f32 x f32 dot is bf16 passes, 1 at DEFAULT (operands rounded to bf16),
    # 3 at HIGH (bf16_3x), 6 at HIGHEST (bf16_6x); f32 x bf16 widens the bf16 side and is priced the same.
    chip = get_chip(chip_name)
    assert chip.matmul_rate("fp32") is None
    for lhs, rhs in (("fp32", "fp32"), ("fp32", "bf16")):
        path = matmul_path(chip, lhs, rhs, precision)
        assert (path.compute_dtype, path.passes) == ("bf16", passes), (lhs, rhs)


def test_gemm_time_scales_with_the_precision_passes(v5e):
    from perfmodel.model.gemm import gemm

    # 4096^3 f32 on v5e: 2 * 4096^3 = 137.4 GFLOP useful; issued = useful x passes (aligned shapes, no padding).
    costs = {p: gemm(m=4096, n=4096, k=4096, lhs_dtype="fp32", rhs_dtype="fp32", out_dtype="fp32", precision=p,
                     chip=v5e) for p in ("default", "high", "highest")}
    useful = 2 * 4096**3
    assert [costs[p].mxu_flops for p in ("default", "high", "highest")] == [useful, 3 * useful, 6 * useful]


def test_bf16_dots_ignore_the_precision(v5e):
    assert matmul_path(v5e, "bf16", "bf16", "highest").passes == 1


def test_unknown_precision_names_the_flag(v5e):
    with pytest.raises(InputError, match="`precision` 'fastest' is not a dot precision; use one of default, high"):
        matmul_path(v5e, "fp32", "fp32", "fastest")


def test_no_chip_assumes_native():
    path = matmul_path(None, "bf16", "int8")
    assert path.compute_dtype == "bf16" and not path.converts_rhs and path.passes == 1
