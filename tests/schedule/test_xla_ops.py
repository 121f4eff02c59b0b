"""The XLA ops around a function's pallas_calls: on the roofline with producer-consumer fusion, hand-worked."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from perfmodel.hw.registry import get_chip
from perfmodel.schedule.analyze import analyze
from perfmodel.schedule.xla_ops import xla_ops


def _double(x):
    """A one-step pallas_call that doubles a (256, 512) f32 array."""
    return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def _ops(fn, *args, chip="tpu-v5e"):
    return xla_ops(jax.make_jaxpr(fn)(*args), get_chip(chip))


def test_a_transpose_around_a_kernel_is_one_hbm_round_trip():
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    a = analyze(lambda x: _double(x.T), x)
    [op] = a.xla.ops
    # transpose of 512x256 f32: 512 KiB read + 512 KiB written = 1,048,576 B; at v5e's 819 GB/s / 0.9 achievable.
    assert (op.primitive, op.count, op.hbm_bytes) == ("transpose", 1, 2 * 512 * 256 * 4)
    hbm = get_chip("tpu-v5e").memory.hbm_bw_bytes_per_s_per_chip
    assert op.expected_s == pytest.approx(2 * 512 * 256 * 4 / hbm, rel=0.2)
    assert a.total_s == pytest.approx(a.expected_s + op.expected_s)
    assert a.xla_s == op.expected_s > 0


def test_layout_only_and_scalar_ops_cost_nothing():
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    ops = _ops(lambda x: _double(x.reshape(256, 512)).reshape(-1)[None], x)
    assert ops.ops == () and ops.expected_s == 0


def test_dots_outside_kernels_follow_their_precision():
    # 1024^2 @ 1024^2 f32: 2*1024^3 useful FLOPs; HIGHEST issues 6 bf16 passes (MXU-bound then).
    a = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    default = _ops(lambda a, b: a @ b, a, a).ops[0]
    highest = _ops(lambda a, b: jnp.dot(a, b, precision="highest"), a, a).ops[0]
    assert default.flops == highest.flops == 2 * 1024**3
    assert highest.expected_s > default.expected_s
    assert default.hbm_bytes == 3 * 1024 * 1024 * 4


def test_scan_multiplies_its_body_cond_takes_the_costliest_branch_while_is_counted_once():
    x = jax.ShapeDtypeStruct((1024,), jnp.float32)

    def scanned(x):
        return jax.lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=5)[0]

    [op] = _ops(scanned, x).ops
    assert (op.primitive, op.count, op.hbm_bytes) == ("sin", 5, 5 * 2 * 4096)

    def branchy(p, x):
        return jax.lax.cond(p, lambda x: jnp.sin(x) + jnp.cos(x), lambda x: jnp.sin(x), x)

    # The first branch reads x twice (sin and cos fused into the add): 12 KiB against the second's 8 KiB.
    ops = _ops(branchy, jax.ShapeDtypeStruct((), jnp.bool_), x)
    assert sorted(o.primitive for o in ops.ops) == ["add", "cos", "sin"]
    assert sum(o.hbm_bytes for o in ops.ops) == 3 * 4096

    def looped(x):
        return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.exp(c[1])), (0, x))[1]

    ops = _ops(looped, x)
    assert [o.primitive for o in ops.ops] == ["exp"] and ops.ops[0].count == 1
    assert any("while loop" in n for n in ops.notes)


def test_analyze_renders_the_xla_ops_and_the_total():
    from perfmodel.schedule.analysis_render import render

    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    text = render(analyze(lambda x: _double(x.T), x))
    assert "XLA ops around the pallas_calls" in text and "transpose" in text
    assert "total expected" in text and "+ XLA ops" in text


def test_a_transpose_undone_inside_a_jitted_call_costs_nothing():
    # tokamax's tgmm wrapper: x.T handed to a jitted function whose first op transposes it back. XLA removes
    # the pair; so does the count (neither transpose is charged).
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    inner = jax.jit(lambda y: _double(y.T))
    ops = _ops(lambda x: inner(x.T), x)
    assert ops.ops == () and ops.expected_s == 0


def test_a_transpose_pair_whose_middle_is_read_elsewhere_keeps_the_first():
    # x.T is also returned: the first transpose is materialized (256 x 512 f32 read and written = 1,048,576 B);
    # the second one, which undoes it, still costs nothing.
    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    inner = jax.jit(lambda y: _double(y.T))

    def fn(x):
        t = x.T
        return inner(t), t

    [op] = _ops(fn, x).ops
    assert (op.primitive, op.count, op.hbm_bytes) == ("transpose", 1, 2 * 256 * 512 * 4)


def test_two_transposes_that_do_not_cancel_are_both_charged():
    # (1, 0, 2) then (2, 1, 0) is not the identity: both run, fused into one pass over 8 x 16 x 128 f32
    # (65,536 B read, 65,536 B written); the returned middle value is written too (its own 65,536 B).
    x = jax.ShapeDtypeStruct((8, 16, 128), jnp.float32)
    [op] = _ops(lambda x: jnp.transpose(jnp.transpose(x, (1, 0, 2)), (2, 1, 0)), x).ops
    assert (op.primitive, op.count, op.hbm_bytes) == ("transpose", 2, 2 * 8 * 16 * 128 * 4)

    def both(x):
        t = jnp.transpose(x, (1, 0, 2))
        return jnp.transpose(t, (2, 1, 0)), t

    [op] = _ops(both, x).ops
    assert (op.primitive, op.count, op.hbm_bytes) == ("transpose", 2, 4 * 8 * 16 * 128 * 4)


def test_a_value_one_pass_makes_for_one_other_stays_in_their_fusion():
    # tokamax's flash attention backward: delta = sum(o * do) in f32 over [4, 8, 256] bf16 arrays. The casts
    # and the product feed exactly one op each: one fused pass reads o and do (2 x 16 KiB) and writes the
    # [4, 8] f32 sums (128 B); unfused it was 2 casts (16 + 32 KiB each) + mul (96 KiB) + reduce (32.1 KiB).
    o = jax.ShapeDtypeStruct((4, 8, 256), jnp.bfloat16)

    def delta(o, do):
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)

    ops = _ops(delta, o, o)
    assert sum(op.hbm_bytes for op in ops.ops) == 2 * 4 * 8 * 256 * 2 + 4 * 8 * 4
    # A value read by two ops round-trips HBM: (x + 1) feeds both the sum and the returned product.
    x = jax.ShapeDtypeStruct((1024,), jnp.float32)

    def twice(x):
        y = x + 1
        return y * 2, jnp.sum(y)

    by = {op.primitive: op.hbm_bytes for op in _ops(twice, x).ops}
    # add: reads x, writes y (4 KiB each); mul: reads y, writes the result; the sum reads y, writes 4 B.
    assert by == {"add": 2 * 4096, "mul": 2 * 4096, "reduce_sum": 4096 + 4}
