"""The vectorized numpy interpreter against JAX's own evaluation of the same jaxprs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from perfmodel.schedule.interpreter import Interpreter, evaluate_index_map
from perfmodel.schedule.values import UNKNOWN, Hook, RefValue


def _run(fn, *cols):
    """Evaluate fn's jaxpr over columns of int32 values with the interpreter and with jax.vmap."""
    closed = jax.make_jaxpr(fn)(*[jnp.int32(0)] * len(cols))
    interp = Interpreter(len(cols[0]))
    ours = interp.run_closed(closed, [np.asarray(c, dtype=np.int32) for c in cols])
    theirs = jax.vmap(fn)(*[jnp.asarray(c, dtype=jnp.int32) for c in cols])
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    return [np.broadcast_to(o.reshape(-1), (len(cols[0]),)) for o in ours], [np.asarray(t) for t in theirs]


def test_integer_division_rounds_toward_zero_like_lax():
    # lax.div(-7, 2) = -3 and lax.rem(-7, 2) = -1 (C semantics), unlike numpy's floor division.
    a = [-7, 7, -7, 7, 0, 5]
    b = [2, 2, -2, -2, 3, 5]
    ours, theirs = _run(lambda x, y: (lax.div(x, y), lax.rem(x, y)), a, b)
    assert list(ours[0]) == [-3, 3, 3, -3, 0, 1]
    assert list(ours[1]) == [-1, 1, -1, 1, 0, 0]
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o, t)


def test_select_clamp_compare_and_casts_match_jax():
    def f(i, j):
        c = lax.select(i * 128 + 127 > j * 256, j, jnp.int32(0))
        return c, lax.clamp(1, i - j, 5), (i == j).astype(jnp.int32), jnp.minimum(i, j) * 3 + jnp.maximum(i, j)

    rng = np.random.default_rng(0)
    i, j = rng.integers(-4, 9, 50), rng.integers(-4, 9, 50)
    ours, theirs = _run(f, i, j)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o, t)


def _paged_index_map(table_shape):
    """The index-map jaxpr of a real pallas_call whose block index is page_table[b, j] (scalar prefetch)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(table_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    b, j = table_shape
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(b, j),
        in_specs=[pl.BlockSpec((8, 128), lambda bi, ji, t: (t[bi, ji], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda bi, ji, t: (bi * j + ji, 0)),
    )
    out = jax.ShapeDtypeStruct((8 * b * j, 128), jnp.float32)
    call = pl.pallas_call(body, grid_spec=grid_spec, out_shape=out)
    closed = jax.make_jaxpr(call)(jax.ShapeDtypeStruct(table_shape, jnp.int32), jax.ShapeDtypeStruct((80, 128), jnp.float32))
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call")
    return eqn.params["grid_mapping"].block_mappings[0].index_map_jaxpr


def test_index_map_reading_scalar_prefetch():
    # Paged-attention style: block index = page_table[b, j] for grid (b, j).
    table = np.array([[5, 9, 2], [7, 1, 4]], dtype=np.int32)
    closed = _paged_index_map(table.shape)
    bs, js = np.repeat(np.arange(2), 3), np.tile(np.arange(3), 2)
    outs = evaluate_index_map(closed, (2, 3), [bs, js], [table])
    assert list(outs[0]) == [5, 9, 2, 7, 1, 4]
    assert list(outs[1]) == [0] * 6


def test_unknown_prefetch_values_give_unknown_indices():
    closed = _paged_index_map((2, 3))
    outs = evaluate_index_map(closed, (2, 3), [np.zeros(6, np.int32), np.zeros(6, np.int32)], [None])
    assert outs[0] is UNKNOWN
    assert list(outs[1]) == [0] * 6


class _Weights(Hook):
    """Sums the weight of every executed `exp`."""

    def __init__(self):
        self.total = 0.0

    def eqn(self, eqn, weight, interp):
        if eqn.primitive.name == "exp":
            self.total = self.total + weight


def test_cond_weights_each_step_by_the_branch_it_takes():
    # exp runs only where i % 3 == 0: for i in 0..8 that is steps 0, 3, 6.
    def f(i, x):
        return lax.cond(lax.rem(i, 3) == 0, lambda v: jnp.exp(v), lambda v: v, x)

    closed = jax.make_jaxpr(f)(jnp.int32(0), jnp.zeros((8, 128), jnp.float32))
    hook = _Weights()
    Interpreter(9, hook=hook).run_closed(closed, [np.arange(9, dtype=np.int32), UNKNOWN])
    assert list(np.asarray(hook.total)) == [1, 0, 0, 1, 0, 0, 1, 0, 0]


def test_while_loop_counts_its_body_per_iteration_with_a_data_dependent_bound():
    # fori_loop(0, n_i, ...) with n_i = 0, 1, 2, 5 per lane: exp runs n_i times.
    def f(n, x):
        return lax.fori_loop(0, n, lambda t, v: jnp.exp(v), x)

    closed = jax.make_jaxpr(f)(jnp.int32(0), jnp.zeros((8, 128), jnp.float32))
    hook = _Weights()
    Interpreter(4, hook=hook).run_closed(closed, [np.array([0, 1, 2, 5], np.int32), UNKNOWN])
    assert list(np.asarray(hook.total)) == [0, 1, 2, 5]


def test_static_fori_loop_is_a_scan_counted_length_times():
    def f(x):
        return lax.fori_loop(0, 4, lambda t, v: jnp.exp(v), x)

    closed = jax.make_jaxpr(f)(jnp.zeros((8, 128), jnp.float32))
    hook = _Weights()
    Interpreter(1, hook=hook).run_closed(closed, [UNKNOWN])
    assert float(np.sum(hook.total)) == 4


def test_reading_an_unknown_ref_propagates_unknown():
    closed = _paged_index_map((2, 3))
    outs = Interpreter(2).run_closed(closed, [np.zeros(2, np.int32), np.zeros(2, np.int32), RefValue(UNKNOWN, "smem")])
    assert outs[0] is UNKNOWN
    assert np.all(np.asarray(outs[1]) == 0)  # the literal 0 broadcasts over the steps


@pytest.mark.parametrize("n", [1, 7])
def test_program_id_is_the_grid_coordinate(n):
    from jax.experimental import pallas as pl

    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] + pl.program_id(0)

    x = jax.ShapeDtypeStruct((8 * n, 128), jnp.float32)
    call = pl.pallas_call(body, grid=(n,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)), out_shape=x)
    closed = jax.make_jaxpr(call)(x)
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == "pallas_call")
    kernel = eqn.params["jaxpr"]
    pid = next(e for e in kernel.eqns if e.primitive.name == "program_id")
    interp = Interpreter(n, (n,), [np.arange(n)])
    (value,) = interp.eqn(pid, [], 1.0)
    assert list(value) == list(range(n))
