"""``perfmodel validate --group tokamax --pallas analyze``: tokamax's Pallas points through perfmodel.analyze on
tokamax's own kernels. tokamax is not a perfmodel dependency: ``make thirdparty-checks`` installs it into
``.thirdparty/`` and runs this file with it on the path; elsewhere these tests skip, saying so."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.harness import published_validation as pv
from perfmodel.harness import tokamax_validation as tv

pytest.importorskip("tokamax", reason="tokamax is not installed (make thirdparty-checks installs it into .thirdparty/)")


@pytest.fixture(scope="module")
def analyzed():
    points, skipped = tv.load_points(pallas="analyze")
    return points, skipped


@pytest.fixture(scope="module")
def rows(analyzed):
    """Every 7x Pallas point, evaluated once (about a minute)."""
    points, _ = analyzed
    return [pv.evaluate_point(p) for p in points if p.tokamax_kernel and p.chip == "tpu-7x/core"]


def test_every_pallas_point_is_modelled(analyzed):
    points, skipped = analyzed
    kernels = [p for p in points if p.tokamax_kernel]
    # The subset's 123 Pallas points, backward flash attention and the fused cross-entropy among them.
    assert len(kernels) == 123 and all(p.call["implementation"].startswith("pallas") for p in kernels)
    assert {"tokamax-7x-flash-attention-vjp-pallas", "tokamax-7x-cross-entropy-fwd-pallas",
            "tokamax-7x-cross-entropy-vjp-pallas"} <= {p.group for p in kernels}
    assert skipped == []  # every XLA point has an op model (triangle multiplication's included)
    assert all("--pallas analyze" in p.command for p in kernels)


def _median(rows, group, fit):
    return statistics.median(r.point.measured_s / r.expected_s for r in rows
                             if r.point.group == group and r.point.is_fit == fit)


@pytest.mark.parametrize("group, low, high", [
    # The fit halves the 7x kernel shares were chosen on (efficiency.yaml tpu-7x.pallas_kernel_shares):
    # each group's median measured / expected within the targets (forward 0.85-1.15, backward 0.75-1.25).
    ("tokamax-7x-flash-attention-fwd-pallas", 0.85, 1.15),
    ("tokamax-7x-cross-entropy-fwd-pallas", 0.85, 1.15),
    ("tokamax-7x-cross-entropy-vjp-pallas", 0.75, 1.25),
    ("tokamax-7x-flash-attention-vjp-pallas", 0.75, 1.25),
])
def test_fit_half_group_medians(rows, group, low, high):
    assert low <= _median(rows, group, fit=True) <= high


def test_held_out_half_is_within_20_percent(rows):
    held = [abs(r.error) for r in rows if not r.point.is_fit]
    assert len(held) > 40 and statistics.median(held) < 0.20


def test_analyze_row_is_the_kernels_plus_their_xla_ops(rows):
    from perfmodel.harness.tokamax_analyze import bound_call
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.analyze import analyze

    row = next(r for r in rows if r.point.id == "7x-fa-fwd-pl-051")
    fn, arrays = bound_call(row.point.call)
    a = analyze(fn, *arrays, chip=get_chip("tpu-7x/core"))
    # The measured span covers the wrapper's XLA ops too (q scaled, q/k/v/out transposed).
    assert a.xla_s > 0 and len(a.kernels) == 1
    assert row.expected_s == pytest.approx(a.expected_s + a.xla_s)
    assert row.floor_s == pytest.approx(sum(k.time.op_floor_s for k in a.kernels)) and row.floor_s < row.expected_s


def test_a_kernels_extra_work_is_not_in_the_floor(rows):
    # tokamax's grouped matmul at 8 groups of about 512 rows, tile_m 512 (7x-rd-fwd-pl-030): for the seed-0
    # group sizes its kernel makes 15 row-tile visits (8 tiles, 7 of them straddled and visited twice). The
    # floor is the op's work (2 x 4096^3 FLOPs, the grouped GEMM op model's), under the kernel's and under the
    # measured 191 us.
    from perfmodel.harness.tokamax_analyze import bound_call
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.analyze import analyze

    row = next(r for r in rows if r.point.id == "7x-rd-fwd-pl-030")
    fn, arrays = bound_call(row.point.call)
    kernels = sum(k.time.op_floor_s for k in analyze(fn, *arrays, chip=get_chip("tpu-7x/core")).kernels)
    assert row.point.parts and row.floor_s < kernels
    assert row.floor_s < row.point.measured_s < kernels
    assert row.expected_s > row.point.measured_s  # the visits stay in the expected time


def test_cli_one_group():
    result = CliRunner().invoke(main, ["validate", "--group", "tokamax-7x-flash-attention-vjp-pallas", "--pallas",
                                       "analyze", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {p["group"] for p in report["points"]} == {"tokamax-7x-flash-attention-vjp-pallas"}
    assert len(report["points"]) == 12 and report["beats_floor"] == []


def test_a_timings_file_runs_pallas_points_through_analyze(tmp_path, monkeypatch):
    # A Pallas point of another timings file (here one of the subset's, copied): analyze prices it as it prices
    # the shipped one, and its --compile request names the file, so the compile process rebuilds its call from it.
    import yaml

    from perfmodel.errors import PerfmodelError
    from perfmodel.harness.tokamax_pallas_compiled import compiled_time
    from perfmodel.harness.tokamax_subset import recorded_point

    path = tmp_path / "timings.yaml"
    path.write_text(yaml.safe_dump({"points": [recorded_point("7x-fa-fwd-pl-051")]}))
    (mine,), _ = tv.load_points(pallas="analyze", path=str(path))
    shipped = next(p for p in tv.load_points(pallas="analyze")[0] if p.id == "7x-fa-fwd-pl-051")
    assert pv.evaluate_point(mine).expected_s == pytest.approx(pv.evaluate_point(shipped).expected_s, rel=1e-12)
    seen = {}

    def fake(target, shapes, args, chip, with_compile):
        seen["args"] = args
        raise PerfmodelError("stop here")

    monkeypatch.setattr("perfmodel.schedule.inspection.analyze_target", fake)
    assert compiled_time(mine) == (None, "stop here")
    assert seen["args"] == ["point='7x-fa-fwd-pl-051'", f"timings={str(path)!r}"]
    assert recorded_point("7x-fa-fwd-pl-051", str(path)) == recorded_point("7x-fa-fwd-pl-051")


@pytest.mark.slow
def test_compiled_time_of_a_pallas_point():
    # tokamax's flash attention forward (7x-fa-fwd-pl-051) compiled deviceless for TPU7x: the kernel's
    # compiler-backed time plus the analytic XLA ops around it, against the measured 0.53 ms.
    pytest.importorskip("libtpu", reason="the TPU compiler (libtpu) is not installed")
    report = pv.run_validation(groups=("tokamax-7x-flash-attention-fwd-pallas",), pallas="analyze",
                               with_compile=True, sample=1)
    done = [r for r in report.rows if r.compiled_expected_s is not None]
    assert [r.point.id for r in done] == ["7x-fa-fwd-pl-006"]  # the first of the group: --sample's rule
    r = done[0]
    assert r.point.tokamax_kernel and 0.5 < r.compiled_expected_s / r.point.measured_s < 2.0
    assert all(r.compiled_note == "not in the --sample" for r in report.rows if r.compiled_expected_s is None)
    # The XLA ops around the kernel are the compiled program's (cached: the compile above): its parameters take
    # the TPU's layout with the sequence axis minor, so the wrapper's transposes to the kernel's seq-minor
    # operands are bitcasts, which the analytic XLA ops price as HBM passes.
    from perfmodel.harness.tokamax_analyze import COMPILE_TARGET
    from perfmodel.harness.tokamax_pallas_compiled import compile_request
    from perfmodel.schedule.inspection import analyze_target

    target = analyze_target(COMPILE_TARGET, *compile_request(r.point), "tpu-7x", with_compile=True)
    kernels = sum(k.time.expected_s for k in target.compiled.compiled_kernels)
    assert kernels < r.compiled_expected_s < kernels + target.analysis.xla_s


@pytest.mark.parametrize("triangle_type", ["incoming", "outgoing"])
def test_rebuilt_triangle_multiplication_is_tokamaxs(triangle_type, monkeypatch):
    # perfmodel.harness.tokamax_compiled rebuilds tokamax's XLA triangle multiplication to compile it without
    # tokamax: the same values as tokamax's own op (its recorded-call form, as the subset's points are built) on a
    # small random case (N = 8, C = 16, H = 8, D = 4; f32).
    import jax
    import jax.numpy as jnp

    from perfmodel.harness import tokamax_compiled as tc
    from perfmodel.harness.tokamax_analyze import bound_call

    monkeypatch.setattr("sys.argv", ["pytest"])  # tokamax's inner ops read absl flags from the command line
    n, c, h, d = 8, 16, 8, 4
    specs = {"x": (n, n, c), "mask": (n, n), "projection_in_weights": (c, 2, h), "gate_in_weights": (c, 2, h),
             "projection_out_weights": (h, d), "gate_out_weights": (c, d), "layernorm_in_scale": (c,),
             "layernorm_in_offset": (c,), "layernorm_out_scale": (h,), "layernorm_out_offset": (h,)}
    args = {k: f"{'bool' if k == 'mask' else 'f32'}[{','.join(map(str, v))}]" for k, v in specs.items()}
    fn, arrays = bound_call({"tokamax_op": "tokamax._src.ops.triangle_multiplication.base.TriangleMultiplication",
                             "config": {}, "args": {**args, "triangle_type": triangle_type, "precision": ["DEFAULT"] * 2,
                                                     "epsilon": 1e-6, "return_residuals": False}})
    keys = iter(jax.random.split(jax.random.key(0), len(specs)))
    values = {k: jax.random.bernoulli(next(keys), 0.8, v) if k == "mask" else jax.random.normal(next(keys), v)
              for k, v in specs.items()}
    names = sorted(specs)  # the bound call takes its arrays in the flattened (key-sorted) order of its arguments
    assert [a.shape for a in arrays] == [specs[k] for k in names]
    want, _ = fn(*(values[k] for k in names))
    got = tc.triangle_multiplication(*values.values(), triangle_type=triangle_type)
    assert got.shape == want.shape == (n, n, d)
    assert jnp.allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_rebuilt_cross_entropy_is_tokamaxs_reference(dtype, reduction):
    # The compiled rebuild of tokamax's XLA cross-entropy against tokamax's own reference functions (B = 16,
    # H = 32, V = 256; w bf16, x in either dtype): the loss, its log-sum-exp residual and dx, dw.
    import jax
    import jax.numpy as jnp
    from tokamax._src.ops.linear_softmax_cross_entropy_loss import reference

    from perfmodel.harness import tokamax_compiled as tc

    kx, kw, kl = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (16, 32)).astype(dtype)
    w = jax.random.normal(kw, (32, 256)).astype(jnp.bfloat16)
    labels = jax.random.randint(kl, (16,), 0, 256)
    loss, lse = reference.linear_softmax_cross_entropy_loss_fwd_reference(x, labels, w, reduction=reduction)
    assert jnp.allclose(tc.cross_entropy(x, labels, w, reduction=reduction).astype(jnp.float32), loss,
                        rtol=1e-2)
    dout = jnp.asarray(0.5, dtype)
    want = reference.linear_softmax_cross_entropy_loss_bwd_reference(dout, lse, x, labels, w, reduction=reduction)
    got = tc.cross_entropy_vjp(x, labels, w, dout, lse, reduction=reduction)
    for g, h in zip(got, want):
        assert g.dtype == h.dtype and g.shape == h.shape
        assert jnp.allclose(g.astype(jnp.float32), h.astype(jnp.float32), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("subtract_mean", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
def test_rebuilt_normalization_backward_is_tokamaxs(subtract_mean, axis, monkeypatch):
    # The compiled rebuild of tokamax's XLA normalization backward against tokamax's NormalizationVjp on its own
    # forward's residuals (x [6, 5, 8] bf16, f32 parameters, random cotangent): dx, dscale, doffset. Over a
    # leading axis tokamax 0.0.12's backward multiplies the cotangent by the scale without broadcasting it to
    # that axis (a [6] scale against [6, 5, 8]), and fails: only the last axis has a tokamax backward to match
    # (the rebuild matches jax.vjp of the forward on both, test_tokamax_compiled.py).
    import jax
    import jax.numpy as jnp
    from tokamax._src.ops.normalization.base import Normalization, NormalizationVjp

    from perfmodel.harness import tokamax_compiled as tc

    monkeypatch.setattr("sys.argv", ["pytest"])
    kx, ks, ko, kg = jax.random.split(jax.random.key(3), 4)
    x = jax.random.normal(kx, (6, 5, 8)).astype(jnp.bfloat16)
    width = x.shape[axis]
    scale, offset = jax.random.normal(ks, (width,)), jax.random.normal(ko, (width,))
    kw = {"axis": axis, "epsilon": 1e-6, "scale_offset": 0.25, "subtract_mean": subtract_mean}
    out, residuals = Normalization()(x, scale, offset, return_residuals=True, **kw)
    dout = jax.random.normal(kg, x.shape).astype(jnp.bfloat16)
    if axis == 0:
        with pytest.raises(ValueError, match="Incompatible shapes for broadcasting"):
            NormalizationVjp()(residuals, out, dout, x, scale, offset, return_residuals=False, **kw)
        return
    want = NormalizationVjp()(residuals, out, dout, x, scale, offset, return_residuals=False, **kw)
    mean, rstddev = residuals
    got = tc.layer_norm_vjp(x, dout, rstddev, mean, scale, offset, axis=axis, scale_offset=0.25)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert jnp.allclose(g.astype(jnp.float32), w.astype(jnp.float32), rtol=1e-2, atol=1e-2)
