"""Compiler-backed times of tokamax's XLA points (perfmodel.harness.tokamax_compiled): the rebuilt functions trace
with the recorded output shapes, the --sample choice, `perfmodel validate --compile`'s errors and (slow, libtpu)
a compile through the --compile path."""

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.compiler.toolchain import available
from perfmodel.harness import published_validation as pv
from perfmodel.harness import tokamax_compiled as tc
from perfmodel.harness import tokamax_validation as tv
from perfmodel.hw.registry import get_chip


def run(*args, code=0):
    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture(scope="module")
def points():
    return {p.id: p for p in tv.load_points()[0]}


def traced(point):
    import jax

    from perfmodel.schedule.binding import bind_function

    call = tc.compiled_call(point.call)
    fn, arrays = bind_function(call.target, call.shapes, call.args, get_chip(point.chip))
    return jax.tree.map(lambda a: (tuple(a.shape), str(a.dtype)), jax.eval_shape(fn, *arrays))


# one recorded point of each op kind (ids of perfmodel/data/validation/tokamax_tpu_calibration.yaml)
@pytest.mark.parametrize("point_id, expected", [
    # lhs [131072, 7168] x rhs [256, 7168, 1024] (row-ragged, one weight per group), with its residual: the
    # result twice (tokamax's residual of a ragged dot is its result)
    ("v5e-rd-fwd-xla-002", (((131072, 1024), "bfloat16"),) * 2),
    # ragged contraction: out [groups, K, N]
    ("v5e-rd-fwd-xla-028", ((128, 4096, 1536), "bfloat16")),
    # q [768, 768, 4, 64] with a bias and a boolean mask
    ("7x-attn-fwd-xla-009", ((768, 768, 4, 64), "bfloat16")),
    # dq, dk, dv in the inputs' dtype (f16)
    ("7x-attn-vjp-xla-005", (((8, 2048, 32, 64), "float16"),) * 3),
    ("7x-lse-fwd-xla-001", ((), "bfloat16")),
    # dx [B, H], dw [H, V]
    ("7x-lse-vjp-xla-001", (((1024, 4096), "bfloat16"), ((4096, 151936), "bfloat16"))),
    ("7x-norm-fwd-xla-002", ((384, 384, 128), "bfloat16")),
    ("7x-norm-fwd-xla-004", ((128, 384, 384), "bfloat16")),  # normalized over axis 0
    # x [384, 384, 64] -> [N, N, D = 64], incoming and outgoing
    ("7x-tri-fwd-xla-002", ((384, 384, 64), "bfloat16")),
    ("7x-tri-fwd-xla-003", ((640, 640, 64), "bfloat16")),
])
def test_functions_trace_with_the_recorded_output_shapes(points, point_id, expected):
    got = traced(points[point_id])
    assert (tuple(got) if isinstance(got, list) else got) == expected


def test_attention_with_residuals_returns_the_softmax_statistics(points):
    p = next(q for q in points.values() if q.call["op"] == "attention" and q.call["pass"].endswith("residuals)"))
    out, (peak, total) = traced(p)
    *lead, s, h, _ = out[0]
    assert peak == total == ((*lead, h, s), "float32")


def test_compiled_call_is_a_perfmodel_xla_command(points):
    call = tc.compiled_call(points["v5e-rd-fwd-xla-002"].call)
    assert call.target == "perfmodel.harness.tokamax_compiled:ragged_dot"
    assert call.shapes == ("lhs=131072x7168:bf16", "rhs=256x7168x1024:bf16")
    assert "rhs_group=[0]" in call.args and call.command.startswith("perfmodel xla perfmodel.harness")
    assert tc.compiled_call(points["7x-lse-vjp-xla-001"].call).shapes[-2:] == ("dout=scalar:bf16", "lse=1024:bf16")


def test_pallas_and_unknown_calls_have_no_function(points):
    pallas = next(p for p in points.values() if p.call["implementation"].startswith("pallas"))
    with pytest.raises(ValueError, match="compiled with --pallas analyze"):
        tc.compiled_call(pallas.call)
    with pytest.raises(ValueError, match="triangle_multiplication vjp: no function yet"):
        tc.compiled_call({"op": "triangle_multiplication", "pass": "vjp", "implementation": "xla", "args": {}})


def test_triangle_multiplication_call_passes_every_array_and_the_type(points):
    call = tc.compiled_call(points["7x-tri-fwd-xla-002"].call)
    assert call.target == "perfmodel.harness.tokamax_compiled:triangle_multiplication"
    assert call.shapes[:2] == ("x=384x384x64:bf16", "mask=384x384:bool") and len(call.shapes) == 10
    assert "triangle_type='incoming'" in call.args


def test_triangle_multiplication_ends_worked_by_hand():
    # C = H = D = 1: a layer norm over one channel leaves only its offset, so whatever x and the triangle are,
    # out = offset_out (2) @ W_out (3) * sigmoid(offset_in (1) @ W_gate_out (1)) = 6 x 0.73106 = 4.3864.
    # (test_tokamax_analyze.py compares the whole op with tokamax's own on a random case.)
    import jax.numpy as jnp

    n, one, zero = 3, jnp.ones, jnp.zeros(1)
    out = tc.triangle_multiplication(
        jnp.arange(n * n, dtype=jnp.float32).reshape(n, n, 1), one((n, n), bool), one((1, 2, 1)), one((1, 2, 1)),
        jnp.full((1, 1), 3.0), one((1, 1)), zero, one(1), zero, jnp.full(1, 2.0), triangle_type="outgoing")
    assert out.shape == (n, n, 1)
    assert jnp.allclose(out, 6 / (1 + jnp.exp(-1.0)), atol=1e-5)


_NORM_VJP_ARGS = {"residuals": ["f32[384,384,1]", "f32[384,384,1]"], "out": "bf16[384,384,128]",
                  "dout": "bf16[384,384,128]", "x": "bf16[384,384,128]", "scale": "f32[128]", "offset": "f32[128]",
                  "axis": -1, "epsilon": 1e-6, "scale_offset": 0.0, "subtract_mean": True}


def test_normalization_backward_call_takes_the_residuals():
    # NormalizationVjp's recorded call: x, the cotangent, the residuals (rstddev, and the mean of a layer norm),
    # the parameters; dx in x's shape and dtype, the parameters' gradients in theirs.
    call = {"op": "normalization", "pass": "vjp", "implementation": "xla", "args": _NORM_VJP_ARGS}
    c = tc.compiled_call(call)
    assert c.target == "perfmodel.harness.tokamax_compiled:layer_norm_vjp"
    assert c.shapes == ("x=384x384x128:bf16", "dout=384x384x128:bf16", "rstddev=384x384x1:f32",
                        "mean=384x384x1:f32", "scale=128:f32", "offset=128:f32")
    rms = tc.compiled_call({**call, "args": {**_NORM_VJP_ARGS, "residuals": [None, "f32[384,384,1]"]}})
    assert not any(s.startswith("mean=") for s in rms.shapes)
    point = pv.ValidationPoint(id="n", group="g", chip="tpu-7x/core", source="test", role="held-out",
                               measured_s=1e-4, includes_dispatch=False, timed="test", parts=(), call=call)
    assert traced(point) == (((384, 384, 128), "bfloat16"), ((128,), "float32"), ((128,), "float32"))


@pytest.mark.parametrize("subtract_mean", [True, False])
@pytest.mark.parametrize("axis", [-1, 0])
def test_normalization_backward_is_the_forwards_gradient(subtract_mean, axis):
    # layer_norm_vjp (tokamax's NormalizationVjp, rebuilt) from the forward's statistics equals jax.vjp of the
    # rebuilt forward (x [6, 5, 8] f32, random scale, offset and cotangent).
    import jax
    import jax.numpy as jnp

    kx, ks, ko, kg = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(kx, (6, 5, 8)) * 3 + 1
    width = x.shape[axis]
    scale, offset = jax.random.normal(ks, (width,)), jax.random.normal(ko, (width,))
    dout = jax.random.normal(kg, x.shape)
    fwd = lambda x_, s_, o_: tc.layer_norm(x_, s_, o_, axis=axis, subtract_mean=subtract_mean, scale_offset=0.5)
    _, pullback = jax.vjp(fwd, x, scale, offset)
    want = pullback(dout)
    mean = jnp.mean(x, axis, keepdims=True) if subtract_mean else None
    centred = x - mean if subtract_mean else x
    rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis, keepdims=True) + 1e-6)
    got = tc.layer_norm_vjp(x, dout, rstd, mean, scale, offset, axis=axis, scale_offset=0.5)
    for g, w in zip(got, want):
        assert g.shape == w.shape and jnp.allclose(g, w, rtol=1e-4, atol=1e-4)


def test_compile_chip_is_the_whole_chip_of_a_core():
    assert tc.compile_chip("tpu-7x/core") == "tpu-7x"
    assert tc.compile_chip("tpu-v5e") == "tpu-v5e"


def test_sample_is_deterministic_and_evenly_spaced():
    groups = {"a": [f"a{i}" for i in range(10)], "b": ["b0", "b1"]}
    chosen = tc.sample(groups, 3)
    assert chosen == tc.sample(dict(reversed(groups.items())), 3)  # the same whatever the order of the groups
    assert chosen == {"a0", "a3", "a6", "b0", "b1"}  # every 10/3-th of a; all of the smaller group
    assert tc.sample(groups, None) == set(groups["a"] + groups["b"])
    assert tc.sample(groups, 1) == {"a0", "b0"}


def test_without_compile_nothing_changes():
    report = json.loads(run("--group", "tokamax-v5e-ragged-dot-fwd-xla", "--json"))
    assert "compiled" not in report and "compiled_expected_s" not in report["points"][0]
    assert "compiled_fit" not in report["groups"][0]


@pytest.mark.parametrize("args, flag", [(("--compile",), "--compile"),
                                        (("--group", "xla-matmul", "--compile"), "--compile"),
                                        (("--group", "tokamax", "--sample", "2"), "--sample"),
                                        (("--group", "tokamax", "--compile", "--sample", "0"), "--sample")])
def test_compile_errors_are_one_line(args, flag):
    out = run(*args, code=2)
    assert len(out.strip().splitlines()) == 1 and flag in out


def _hand_made_point():
    """A 256x256x256 row-ragged dot in 2 groups on TPU v5e."""
    args = {"lhs": "bf16[256,256]", "rhs": "bf16[2,256,256]", "group_sizes": [100, 156],
            "ragged_dot_dimension_numbers": {"dot_dimension_numbers": [[[1], [1]], [[], []]],
                                             "lhs_ragged_dimensions": [0], "rhs_group_dimensions": [0]},
            "precision": ["DEFAULT", "DEFAULT"]}
    return pv.ValidationPoint(
        id="hand-rd", group="tokamax-v5e-ragged-dot-fwd-xla", chip="tpu-v5e", source="test", role="held-out",
        measured_s=10e-6, includes_dispatch=False, timed="test", parts=tuple(tv.parts_of("ragged_dot", False, "xla",
                                                                                           args, {})),
        call={"op": "ragged_dot", "pass": "fwd", "implementation": "xla", "args": args})


def test_a_doubted_compiled_time_is_listed(monkeypatch):
    # A compiled time whose program has a fusion XLA's cost model gave up on keeps its value and says so: the
    # --json row's compiled_note, and one line of the text report naming the point.
    from perfmodel.xla.program import NO_ESTIMATE_NOTE

    doubt = f"fusion.26: {NO_ESTIMATE_NOTE} (estimated_cycles = INT64_MAX); its 36,131,219 bundles ..."
    monkeypatch.setattr(tc, "compile_points", lambda points, **_: {
        p.id: tc.CompiledTime(id=p.id, expected_s=2 * p.measured_s, reason=doubt) for p in points})
    report = pv.run_validation([_hand_made_point()], with_compile=True)
    (row,) = report.rows
    assert row.compiled_expected_s == pytest.approx(20e-6) and row.compiled_note == doubt
    text = pv.report_text(report)
    assert "compiled times to doubt" in text and "hand-rd" in text.split("compiled times to doubt")[1]


needs_libtpu = pytest.mark.skipif(not available(), reason="libtpu not installed: pip install -e '.[tpu-compiler]'")


@pytest.mark.slow
@pytest.mark.needs_libtpu
@needs_libtpu
def test_hand_made_ragged_dot_compiles_for_v5e():
    report = pv.run_validation([_hand_made_point()], with_compile=True)
    (row,) = report.rows
    assert row.compiled_expected_s > 0 and row.compiled_note == ""
    assert row.compiled_error == pytest.approx(row.compiled_expected_s / 10e-6 - 1)
    (group,) = report.groups
    assert group.compiled_held_out.compiled.count == 1 and group.compiled_fit.compiled.count == 0
    rec = pv.report_records(report)
    assert rec["compiled"] is True and rec["points"][0]["compiled_expected_s"] == row.compiled_expected_s
    assert "compiled median |err|" in pv.report_text(report)


@pytest.mark.slow
@pytest.mark.needs_libtpu
@needs_libtpu
def test_cli_compile_json_carries_the_compiled_fields():
    report = json.loads(run("--group", "tokamax-v5e-ragged-dot-fwd-xla", "--compile", "--sample", "1", "--json"))
    assert report["compiled"] is True and report["sample"] == 1
    done = [p for p in report["points"] if p["compiled_expected_s"] is not None]
    assert len(done) == 1 and done[0]["compiled_expected_s"] > 0 and done[0]["compiled_error"] is not None
    assert {p["compiled_note"] for p in report["points"] if p["compiled_expected_s"] is None} <= {tc.NOT_SAMPLED}
    (group,) = report["groups"]
    assert group["compiled_held_out"]["compiled"]["count"] + group["compiled_fit"]["compiled"]["count"] == 1


@pytest.mark.slow
@pytest.mark.needs_libtpu
@needs_libtpu
def test_normalization_backward_compiles_for_7x():
    # A NormalizationVjp point (x [64, 32, 128] bf16 over its last axis) through --compile on one 7x core: the
    # compiled program's HBM traffic is the op model's two passes (x and dout read twice, dx written once:
    # 5 x 524,288 B = 2.6 MB, give or take the statistics), and its time is positive.
    from perfmodel.compiler.api import CompileCall, compile_many
    from perfmodel.xla.program import build_program

    args = {**_NORM_VJP_ARGS, "residuals": ["f32[64,32,1]", "f32[64,32,1]"], "x": "bf16[64,32,128]",
            "dout": "bf16[64,32,128]", "out": "bf16[64,32,128]"}
    point = pv.ValidationPoint(id="n", group="g", chip="tpu-7x/core", source="test", role="held-out",
                               measured_s=1e-4, includes_dispatch=False, timed="test", parts=(),
                               call={"op": "normalization", "pass": "vjp", "implementation": "xla", "args": args})
    (compiled,) = tc.compile_points([point]).values()
    assert compiled.reason in (None, "") and compiled.expected_s > 0
    c = tc.compiled_call(point.call)
    (rep,) = compile_many([CompileCall(kind="function", target=c.target, shapes=c.shapes, args=c.args)],
                          get_chip("tpu-7x"))
    prog = build_program(rep, get_chip("tpu-7x/core"))
    moved = sum(o.hbm_bytes * o.count for o in prog.ops)
    assert 5 * 64 * 32 * 128 * 2 <= moved <= 6 * 64 * 32 * 128 * 2
