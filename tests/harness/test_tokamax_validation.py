"""tokamax's real-TPU timings as validation points: the recorded calls turned into perfmodel ops, the fit /
held-out split, and `perfmodel validate --group tokamax` through click's runner."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.harness import published_validation as pv
from perfmodel.harness import tokamax_validation as tv
from perfmodel.hw.registry import get_chip
from perfmodel.predict.ops import predict_op

#: The calibration subset's size (perfmodel/data/validation/tokamax_tpu_calibration.yaml).
SUBSET_POINTS = 374


def run(*args, code=0):
    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture(scope="module")
def loaded():
    return tv.load_points()


@pytest.fixture(scope="module")
def report():
    return json.loads(run("--group", "tokamax", "--json"))


def test_array_spec():
    assert tv.array("bf16[8,2048,8,256]") == ("bf16", [8, 2048, 8, 256])
    assert tv.array("f32[]") == ("fp32", [])
    with pytest.raises(ValueError, match="not an array spec"):
        tv.array("bf16(8)")


def test_group_sizes_list_and_tokamax_representative_sizes():
    assert tv.group_sizes([4096, 0, 5]) == [4096, 0, 5]
    sizes = tv.group_sizes({"num_groups": 256, "total_size": 131072})
    # 131,072 draws over 256 groups: every row in some group, 512 rows per group on average.
    assert len(sizes) == 256 and sum(sizes) == 131072 and min(sizes) >= 0
    assert sizes == tv.group_sizes({"num_groups": 256, "total_size": 131072})  # seed 0: the same every time
    assert len(set(sizes)) > 1  # a multinomial draw, not an even split


def _ragged(lhs, rhs, contract, group_dims, sizes):
    return {"lhs": lhs, "rhs": rhs, "group_sizes": sizes, "ragged_dot_dimension_numbers": {
        "dot_dimension_numbers": [contract, [[], []]], "lhs_ragged_dimensions": [0], "rhs_group_dimensions": group_dims}}


def test_ragged_dot_row_ragged_and_transposed_weights():
    (op, p), *_ = tv.parts_of("ragged_dot", False, "xla",
                              _ragged("bf16[512,256]", "bf16[4,256,1024]", [[1], [1]], [0], [128, 0, 384, 0]), {})
    assert op == "gemm" and (p["m"], p["k"], p["n"]) == (512, 256, 1024) and p["group_sizes"] == "128,0,384,0"
    # rhs [G, N, K] contracting its last dim: N is rhs's middle dim.
    (_, p), = tv.parts_of("ragged_dot", False, "pallas_mosaic_tpu",
                          _ragged("bf16[512,256]", "bf16[4,1024,256]", [[1], [2]], [0], [128, 0, 384, 0]), {})
    assert (p["k"], p["n"]) == (256, 1024)


def test_ragged_contraction_is_the_contraction_ragged_grouped_gemm():
    # out[g] = lhs[rows of g]^T @ rhs[rows of g]: groups of 128, 0, 128 and 256 of lhs's 512 rows, each
    # [256 x rows] @ [rows x 1024]: one grouped GEMM ragged along its contraction (K = the 512 rows).
    args = _ragged("bf16[512,256]", "bf16[512,1024]", [[0], [0]], [], [128, 0, 128, 256])
    (op, p), cast = tv.parts_of("ragged_dot", False, "xla", args, {})
    assert op == "gemm" and (p["m"], p["n"], p["k"]) == (256, 1024, 512)
    assert p["ragged"] == "contraction" and p["group_sizes"] == "128,0,128,256" and p["implementation"] == "xla"
    # XLA writes all 4 groups' f32 [256 x 1024] outputs; the cast reads them
    assert cast[1]["array_elements"] == 4 * 256 * 1024 and cast[1]["dtype"] == "fp32"
    (_, kernel), = tv.parts_of("ragged_dot", False, "pallas_mosaic_tpu", args, {})
    assert "implementation" not in kernel and kernel["ragged"] == "contraction"


def test_unknown_layouts_and_ops_are_not_modelled():
    with pytest.raises(tv.NotModelled, match="dimension numbers"):
        tv.parts_of("ragged_dot", False, "xla", _ragged("bf16[512,256]", "bf16[4,256,1024]", [[1], [1]], [1], [1]), {})
    with pytest.raises(tv.NotModelled, match="triangle_multiplication vjp"):
        tv.parts_of("triangle_multiplication", True, "xla", {}, {})
    with pytest.raises(tv.NotModelled, match=r"flash_attention vjp \(pallas_mosaic_tpu\)"):
        tv.parts_of("flash_attention", True, "pallas_mosaic_tpu", {}, {})


def test_attention_and_cross_entropy_parts():
    args = {"q": "bf16[2,1,128,4,64]", "k": "bf16[2,1,256,4,64]", "v": "bf16[2,1,256,4,64]",
            "precision": ["BF16_BF16_F32", "BF16_BF16_F32"]}
    qk, softmax, pv_ = tv.parts_of("attention", False, "xla", args, {})
    # Leading dims are batch: 2 x 1 x 4 heads = 8 GEMMs of [128 x 64] @ [64 x 256] -> f32 logits.
    assert qk == ("gemm", {"batch": 8, "m": 128, "n": 256, "k": 64, "lhs_dtype": "bf16", "rhs_dtype": "bf16",
                           "out_dtype": "fp32"})
    assert softmax[1]["array_elements"] == 8 * 128 * 256 and pv_[1]["k"] == 256
    backward = tv.parts_of("attention", True, "xla", args, {})
    assert len(backward) == 7
    # dq = dS k and dk = dS^T q read the f32 dS (the compiled program's bytes); the other GEMMs bf16 operands.
    dq, dk = backward[-2][1], backward[-1][1]
    assert dq["lhs_dtype"] == dk["lhs_dtype"] == "fp32" and dq["rhs_dtype"] == "bf16"
    assert (dq["m"], dq["k"], dk["m"], dk["k"]) == (128, 256, 256, 128)
    ce = {"x": "f32[1024,4096]", "w": "bf16[4096,151936]"}
    logits, _ = tv.parts_of("linear_softmax_cross_entropy_loss", False, "xla", ce, {})
    assert (logits[1]["m"], logits[1]["k"], logits[1]["n"]) == (1024, 4096, 151936)
    assert len(tv.parts_of("linear_softmax_cross_entropy_loss", True, "xla", ce, {})) == 4


def test_chunked_attention_is_xlas_chunk_loop():
    # tokamax's xla_chunked at its default 128 x 128 chunks: one chunked-attention op, GQA heads kept (k and v are
    # repeated inside the op model), bias-and-mask where the call has a bias or a boolean mask
    mixtral = {"q": "bf16[32,4096,32,128]", "k": "bf16[32,4096,8,128]", "v": "bf16[32,4096,8,128]",
               "bias": None, "mask": {"bool_mask": None, "is_causal": True}}
    (op, p), = tv.parts_of("attention", False, "xla_chunked", mixtral, {})
    assert op == "chunked-attention" and (p["batch"], p["q_heads"], p["kv_heads"]) == (32, 32, 8)
    assert "bias_and_mask" not in p and p["v_head_dim"] == 128
    alphafold = {"q": "bf16[1,768,768,4,64]", "k": "bf16[1,768,768,4,64]", "v": "bf16[1,768,768,4,64]",
                 "bias": "bf16[1,1,4,768,768]", "mask": {"bool_mask": "bool[768,1,1,768]"}}
    (_, p), = tv.parts_of("attention", False, "xla_chunked", alphafold, {})
    assert p["bias_and_mask"] and p["batch"] == 768 and p["q_len"] == 768
    # the plain XLA implementation stays the materialized logits
    assert len(tv.parts_of("attention", False, "xla", mixtral, {})) == 3


def test_chunked_attention_points_are_within_their_band(report):
    # both subset points (one fit, one held out) within the forward band of issue 32: 0.85-1.15 measured / expected
    rows = [p for p in report["points"] if p["group"] == "tokamax-7x-attention-fwd-xla-chunked"]
    assert {p["role"][:3] for p in rows} == {"fit", "hel"}
    for p in rows:
        assert 0.85 <= p["measured_s"] / p["expected_s"] <= 1.15, p["id"]
        assert p["command"].startswith("perfmodel predict chunked-attention")


@pytest.mark.parametrize("x, dout, logits_dtype, grad_dtype", [
    ("f32[1024,4096]", "f32[]", "fp32", "fp32"), ("bf16[1024,4096]", "bf16[]", "bf16", "bf16"),
    ("bf16[1024,4096]", "f32[]", "bf16", "fp32")])
def test_cross_entropy_logits_are_in_the_promoted_dtype(x, dout, logits_dtype, grad_dtype):
    # tokamax's reference: logits = x @ w with no f32 accumulation asked for, so bf16 x bf16 -> bf16 logits and
    # f32 x bf16 -> f32; s = exp(logits - lse) - one_hot stays in that dtype; dx and dw are scaled by the
    # cotangent: bf16 x bf16 dout stays bf16, an f32 one promotes them to f32.
    ce = {"x": x, "w": "bf16[4096,151936]", "dout": dout}
    (_, logits), (_, softmax), (_, dx), (_, dw) = tv.parts_of("linear_softmax_cross_entropy_loss", True, "xla", ce, {})
    assert logits["out_dtype"] == softmax["dtype"] == dx["lhs_dtype"] == dw["rhs_dtype"] == logits_dtype
    assert dx["out_dtype"] == dw["out_dtype"] == grad_dtype
    assert (dx["m"], dx["n"], dx["k"], dw["m"], dw["n"], dw["k"]) == (1024, 4096, 151936, 4096, 151936, 1024)


def test_every_subset_point_is_loaded_or_listed(loaded):
    points, skipped = loaded
    assert len(points) + len(skipped) == SUBSET_POINTS
    assert {p.chip for p in points} == {"tpu-v5e", "tpu-7x/core"}  # one JAX device: one TensorCore of a 7x
    assert all(p.group.startswith("tokamax-") and p.parts for p in points)
    roles = {p.role for p in points}
    assert roles == {tv.FIT_ROLE, "held-out"}
    fit = sum(p.is_fit for p in points)
    assert 0.35 < fit / len(points) < 0.65  # the CRC-32 split is about even
    assert all(s.reason for s in skipped)


def test_parts_add_up():
    parts = (("gemm", {"m": 1024, "n": 1024, "k": 1024}), ("copy", {"array_elements": 1 << 20}))
    p = pv.ValidationPoint(id="two", group="g", chip="tpu-v5e", source="test", role="held-out", measured_s=1e-3,
                           includes_dispatch=False, timed="made up", parts=parts)
    row = pv.evaluate_point(p)
    each = [predict_op(op, params, chips=[get_chip("tpu-v5e")]).predictions[0].roofline for op, params in parts]
    assert row.floor_s == pytest.approx(sum(float(r.floor_s) for r in each))
    assert row.expected_s == pytest.approx(sum(float(r.expected_s) for r in each))
    assert p.command.count("perfmodel predict") == 2 and "; " in p.command


def test_validate_tokamax_groups(report, loaded):
    points, skipped = loaded
    groups = {p["group"] for p in report["points"]}
    assert groups == {p.group for p in points} and len(groups) >= 10
    assert report["beats_floor"] == [] and all(p["measured_s"] >= p["floor_s"] for p in report["points"])
    assert report["fit"]["count"] > 0 and report["held_out"]["count"] > 0
    assert len(report["not_modelled"]) == len(skipped)
    assert all(p["command"].startswith("perfmodel predict") for p in report["points"])
    assert not any(g.startswith("tokamax") for g in {p["group"] for p in json.loads(
        run("--group", "xla-matmul", "--json"))["points"]})  # only when asked


def test_validate_one_tokamax_group_text():
    out = run("--group", "tokamax-v5e-ragged-dot-fwd-pallas")
    assert "v5e-rd-fwd-pl-002" in out and "7x-" not in out and "held-out" in out and "median" in out


def test_unknown_tokamax_group_names_the_flag():
    out = run("--group", "tokamax-v9-nope", code=2)
    assert "--group" in out and "no such group" in out and "Traceback" not in out


def _fit_half_median(loaded, group):
    """Median measured / expected of a group's fit-half points."""
    import statistics

    points, _ = loaded
    rows = [pv.evaluate_point(p) for p in points if p.group == group and p.is_fit]
    return statistics.median(r.point.measured_s / r.expected_s for r in rows)


def test_one_7x_core_shares_are_the_fit_of_the_fit_half(loaded):
    # efficiency.yaml's tpu-7x/core MXU share is fitted on the fit half of the 7x cross-entropy points and its HBM
    # share on the fit half of the 7x XLA attention forward points: there, measured / expected is 1 (within 5%).
    assert 0.95 < _fit_half_median(loaded, "tokamax-7x-attention-fwd-xla") < 1.05
    assert 0.95 < _fit_half_median(loaded, "tokamax-7x-cross-entropy-fwd-xla") < 1.10


def test_the_whole_7x_chip_keeps_the_default_shares():
    from perfmodel.model.core import ACHIEVABLE
    from perfmodel.model.efficiency import chip_efficiency

    chip, core = chip_efficiency("tpu-7x"), chip_efficiency("tpu-7x/core")
    assert chip.hbm_share == ACHIEVABLE["hbm"][0] and "bf16" not in chip.mxu_share
    assert core.hbm_share < chip.hbm_share and core.mxu_share["bf16"] < ACHIEVABLE["mxu"][0]
    assert "tokamax" in core.fitted_on["hbm_share"] and "tokamax" in core.fitted_on["mxu_share.bf16"]


def test_xla_ragged_dot_needs_no_fitted_share(loaded):
    # XLA's ragged-dot kernel is priced from the tiles XLA picks (no constant fitted on these points): the
    # row-ragged points of both halves land within 10% in the median.
    import statistics

    points, _ = loaded
    for group in ("tokamax-v5e-ragged-dot-fwd-xla", "tokamax-7x-ragged-dot-fwd-xla"):
        ratios = [p.measured_s / pv.evaluate_point(p).expected_s for p in points if p.group == group
                  and any(params.get("implementation") == "xla" for _, params in p.parts)]
        assert len(ratios) >= 15 and 0.9 < statistics.median(ratios) < 1.1


def test_xla_ragged_dot_parts_follow_the_compiled_program():
    # lhs [512, 256] x rhs [4, 256, 1024]: the kernel writes f32 (tokamax asks for it), a convert writes bf16
    # (512 x 1024 = 524,288 elements); return_residuals adds one copy of the result.
    args = _ragged("bf16[512,256]", "bf16[4,256,1024]", [[1], [1]], [0], [128, 0, 384, 0])
    parts = tv.parts_of("ragged_dot", False, "xla", {**args, "return_residuals": True}, {})
    assert [op for op, _ in parts] == ["gemm", "copy", "copy"]
    assert parts[0][1]["out_dtype"] == "fp32"
    assert parts[1][1] == {"array_elements": 524_288, "dtype": "fp32", "out_dtype": "bf16"}
    assert parts[2][1] == {"array_elements": 524_288, "dtype": "bf16"}
    # rhs [4, 1024, 256] contracting its last dim: XLA lays the weights out as [4, 256, 1024] first (one copy).
    parts = tv.parts_of("ragged_dot", False, "xla",
                        _ragged("bf16[512,256]", "bf16[4,1024,256]", [[1], [2]], [0], [128, 0, 384, 0]), {})
    assert [op for op, _ in parts] == ["copy", "gemm", "copy"] and parts[0][1]["array_elements"] == 4 * 1024 * 256
    # K = N = 2880, not a multiple of 128: lhs and the weights are re-laid out before, the result after.
    parts = tv.parts_of("ragged_dot", False, "xla",
                        _ragged("bf16[512,2880]", "bf16[4,2880,2880]", [[1], [1]], [0], [128, 0, 384, 0]), {})
    assert [op for op, _ in parts] == ["copy", "copy", "gemm", "copy", "copy"]
    assert [p["array_elements"] for op, p in parts if op == "copy"] == [512 * 2880, 4 * 2880 * 2880,
                                                                        512 * 2880, 512 * 2880]


def test_normalization_is_xlas_three_passes():
    # x [128, 384, 384] normalized over axis 0 (128 wide): 147,456 rows of 128; a layer norm (mean subtracted),
    # unfused: the compiled program's mean, variance and normalizing fusions.
    args = {"x": "bf16[128,384,384]", "axis": 0, "subtract_mean": True}
    (op, p), = tv.parts_of("normalization", False, "xla", args, {})
    assert op == "rms-norm" and (p["tokens"], p["hidden"]) == (384 * 384, 128)
    assert p["subtract_mean"] and p["form"] == "unfused" and not p["residual"]


def test_normalization_backward_is_xlas_two_passes():
    # NormalizationVjp (not in the subset; tokamax's cache has a normalization_vjp file for 7x): the same rows,
    # priced as the norm's backward, unfused (the compiled program's reduction and dx fusions).
    args = {"x": "bf16[384,384,128]", "axis": -1, "subtract_mean": True}
    (op, p), = tv.parts_of("normalization", True, "xla", args, {})
    assert op == "rms-norm" and (p["tokens"], p["hidden"]) == (384 * 384, 128)
    assert p["backward"] and p["form"] == "unfused" and p["subtract_mean"]
    assert "backward" not in tv.parts_of("normalization", False, "xla", args, {})[0][1]


_VJP_POINT = """
cite_as: tokamax (test)
points:
- id: 7x-norm-vjp-xla-001
  chip: TPU7x
  op: normalization
  pass: vjp
  implementation: xla
  tokamax_op: tokamax._src.ops.normalization.base.NormalizationVjp
  args:
    residuals:
    - f32[1,384,384]
    - f32[1,384,384]
    out: bf16[128,384,384]
    dout: bf16[128,384,384]
    x: bf16[128,384,384]
    scale: f32[128]
    offset: f32[128]
    axis: 0
    epsilon: 1.0e-06
    scale_offset: 0.0
    subtract_mean: true
    return_residuals: false
  config: {}
  measured: {median_ms: 0.1}
  src: test
"""


def test_a_normalization_backward_point_is_modelled():
    # A point in the subset's format (the residuals (mean, rstddev) with the normalized axis kept as 1): a group of
    # its own, priced (not skipped), and its expected time from the backward's two passes.
    (point,), skipped = tv.load_points(_VJP_POINT)
    assert skipped == [] and point.group == "tokamax-7x-normalization-vjp-xla"
    (op, p), = point.parts
    assert p["backward"] and (p["tokens"], p["hidden"]) == (384 * 384, 128)
    row = pv.evaluate_point(point)
    # 5 passes of 37.7 MB (x and dout twice, dx once) at one 7x core's fitted HBM rate (0.59 x 3.69 TB/s):
    # 189 MB / 2.18 TB/s = 87 us, plus the two fusions' fixed costs
    assert 80e-6 < row.expected_s < 100e-6


def test_triangle_multiplication_is_xlas_fusions():
    # x [384, 384, 64], H = D = 64: 147,456 rows of C = 64.
    args = {"x": "bf16[384,384,64]", "projection_in_weights": "bf16[64,2,64]", "gate_out_weights": "bf16[64,64]"}
    parts = tv.parts_of("triangle_multiplication", False, "xla", args, {})
    assert [op for op, _ in parts] == ["rms-norm", "gemm", "gemm", "copy", "gemm", "rms-norm", "gemm", "gemm"]
    norm_in, left, gated, transpose, tri, norm_out, out_proj, out_gate = (p for _, p in parts)
    assert (norm_in["tokens"], norm_in["hidden"], norm_out["hidden"]) == (147456, 64, 64)
    # The projections: [147,456 x 64] @ [64 x 128], the second gated (sigmoid, times the first's output).
    assert (left["m"], left["k"], left["n"], left["epilogue"]) == (147456, 64, 128, [])
    assert gated["epilogue"] == ["sigmoid", "residual"] and out_gate["epilogue"] == ["sigmoid", "residual"]
    # The transpose to [2, H, N, N] passes over both projections: 147,456 x 128 elements.
    assert transpose["array_elements"] == 147456 * 128 and transpose["elementwise"]
    # The triangle: 64 GEMMs of [384 x 384] @ [384 x 384] = 64 x 2 x 384^3 = 7.25 GFLOP.
    assert (tri["batch"], tri["m"], tri["n"], tri["k"]) == (64, 384, 384, 384)
    assert (out_proj["m"], out_proj["k"], out_proj["n"]) == (147456, 64, 64)
    assert tv.parts_of("triangle_multiplication", False, "xla", {**args, "triangle_type": "outgoing"}, {}) == parts


def test_xla_ragged_dot_points_name_the_implementation():
    (op, p), *_ = tv.parts_of("ragged_dot", False, "xla",
                              _ragged("bf16[512,256]", "bf16[4,256,1024]", [[1], [1]], [0], [128, 0, 384, 0]), {})
    assert p["implementation"] == "xla"
    (op, p), = tv.parts_of("ragged_dot", False, "pallas_mosaic_tpu",
                           _ragged("bf16[512,256]", "bf16[4,256,1024]", [[1], [1]], [0], [128, 0, 384, 0]), {})
    assert "implementation" not in p


def test_flash_attention_parts_add_the_wrappers_layout_passes():
    # q [2, 128, 4, 64], k/v [2, 256, 2, 64]: q has 2 x 128 x 4 x 64 = 65,536 elements, k and v 65,536 too.
    # tokamax's wrapper scales q, transposes q, k and v to head-major and the output back: five passes around
    # the kernel, each one read and one write of its array.
    args = {"q": "bf16[2,128,4,64]", "k": "bf16[2,256,2,64]", "v": "bf16[2,256,2,64]", "mask": {"is_causal": True}}
    parts = tv.parts_of("flash_attention", False, "pallas_mosaic_tpu", args, {"block_q": 128, "block_kv": 128})
    assert [op for op, _ in parts] == ["copy", "copy", "copy", "copy", "attention", "copy"]
    assert [p["array_elements"] for op, p in parts if op == "copy"] == [65_536] * 5
    kernel = dict(parts)["attention"]
    assert (kernel["q_heads"], kernel["kv_heads"], kernel["kv_len"], kernel["causal"]) == (4, 2, 256, True)


def test_pallas_path_is_for_tokamax_groups_only():
    out = run("--group", "xla-matmul", "--pallas", "analyze", code=2)
    assert "--pallas" in out and "--group tokamax" in out and "Traceback" not in out


def test_pallas_analyze_without_tokamax_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tokamax", None)  # import tokamax -> ImportError
    out = run("--group", "tokamax-7x-flash-attention-fwd-pallas", "--pallas", "analyze", code=2)
    assert "--pallas" in out and "tokamax is not importable" in out and "thirdparty-checks" in out
    assert "Traceback" not in out


def test_pallas_path_names_the_choices():
    from perfmodel.errors import InputError

    with pytest.raises(InputError, match="`pallas` 'kernel': use one of op-model, analyze"):
        pv.run_validation(groups=("tokamax",), pallas="kernel")


def test_op_model_path_models_no_backward_pallas_kernel(loaded):
    points, skipped = loaded
    assert not any(p.tokamax_kernel for p in points)
    assert any("flash_attention vjp (pallas_mosaic_tpu)" in s.reason for s in skipped)


# ----------------------------------------------------------------------------- --tokamax-file: other timings


def _timings_file(tmp_path, points, **top):
    import yaml

    path = tmp_path / "timings.yaml"
    path.write_text(yaml.safe_dump({"cite_as": "test timings", **top, "points": points}, sort_keys=False))
    return str(path)


def _shipped_points(ids):
    from perfmodel.harness.tokamax_subset import recorded_point

    return [recorded_point(i) for i in ids]


_SOME = ["7x-norm-fwd-xla-002", "v5e-rd-fwd-xla-002", "7x-attn-fwd-xla-009", "7x-lse-vjp-xla-001"]


def test_a_timings_file_runs_its_points_all_held_out(tmp_path):
    # Points of another file (here: four of the subset's, copied) run through the same models: the same expected
    # times as from the shipped subset, but every point held out (nothing was fitted on another file's points).
    report = json.loads(CliRunner().invoke(main, ["validate", "--tokamax-file",
                                                  _timings_file(tmp_path, _shipped_points(_SOME)), "--json"]).output)
    got = {p["id"]: p for p in report["points"]}
    assert sorted(got) == sorted(_SOME) and all(not p["fit"] and p["role"] == "held-out" for p in got.values())
    shipped = {p.id: pv.evaluate_point(p) for p in tv.load_points()[0] if p.id in _SOME}
    for i in _SOME:
        assert got[i]["expected_s"] == pytest.approx(shipped[i].expected_s, rel=1e-12)
        assert got[i]["source"].startswith("test timings: ")
    assert {g["group"] for g in report["groups"]} == {r.point.group for r in shipped.values()}


def test_a_timings_file_keeps_the_subset_split_out_of_it(tmp_path):
    points, _ = tv.load_points(path=_timings_file(tmp_path, _shipped_points(_SOME[:2])))
    assert [p.call["timings_file"] for p in points] == [str(tmp_path / "timings.yaml")] * 2
    assert all(p.role == "held-out" for p in points)


@pytest.mark.parametrize("mutate, message", [
    (lambda pts: [{k: v for k, v in pts[0].items() if k != "tokamax_op"}], r"timings.yaml:\d+: point 1 lacks "
                                                                           r"tokamax_op"),
    (lambda pts: [{**pts[0], "measured": {"median_ms": -1}}], r"timings.yaml:\d+: point '7x-norm-fwd-xla-002': "
                                                              r"measured.median_ms must be a positive number"),
    (lambda pts: [pts[0], pts[0]], r"timings.yaml:\d+: point id '7x-norm-fwd-xla-002' appears twice"),
    (lambda pts: [{**pts[0], "chip": "TPU v99"}], r"timings.yaml:\d+: point '7x-norm-fwd-xla-002': unknown chip "
                                                  r"'TPU v99'"),
    (lambda pts: [{**pts[0], "args": {"x": "bf16[384,,128"}}], r"timings.yaml:\d+: point '7x-norm-fwd-xla-002': "
                                                               r"not an array spec"),
    (lambda pts: [{**pts[0], "args": {}}], r"timings.yaml:\d+: point '7x-norm-fwd-xla-002': no 'x' in its args"),
])
def test_a_bad_timings_file_is_one_line_naming_file_and_line(tmp_path, mutate, message):
    path = _timings_file(tmp_path, mutate(_shipped_points(_SOME[:1])))
    result = CliRunner().invoke(main, ["validate", "--tokamax-file", path])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(InputError, match=message):
        tv.load_points(path=path)


def test_timings_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("points:\n  - id: a\n    chip: [unclosed\n")
    with pytest.raises(InputError, match=r"bad.yaml:\d+: not valid YAML"):
        tv.load_points(path=str(bad))
    with pytest.raises(InputError, match="no such file"):
        tv.load_points(path=str(tmp_path / "missing.yaml"))
    empty = tmp_path / "empty.yaml"
    empty.write_text("points: []\n")
    with pytest.raises(InputError, match="non-empty 'points' list"):
        tv.load_points(path=str(empty))
    result = CliRunner().invoke(main, ["validate", "--group", "xla-matmul", "--tokamax-file", str(empty)])
    assert result.exit_code == 2 and "add --group tokamax" in result.output
