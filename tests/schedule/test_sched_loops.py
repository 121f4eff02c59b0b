"""The fast paths of the schedule model against the step-by-step reference.

The interpreter counts a loop's body in one pass over expanded (grid step, iteration) lanes, simulates trip
counts on a slice of the body, solves counting loops in closed form, and evaluates the wrapper's prologue in
numpy. Each must give what the reference gives: one interpreter pass per iteration over the whole body
(``LoopOptions`` with every fast path off), index maps evaluated by JAX at each
grid point, and the prologue run by JAX. Small grids, unaligned shapes, data-dependent trip counts and index
maps, per-iteration predicates, data-dependent branches whose costliest side changes between iterations, and
writes to scalar-prefetch refs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from perfmodel.schedule.analyze import analyze_call, resolve_chip
from perfmodel.schedule.body import count_body_work
from perfmodel.schedule.catalog import get_entry
from perfmodel.schedule.extract import _numpy_eval, find_pallas_calls, trace
from perfmodel.schedule.indexmaps import _evaluate_with_jax, block_indices, grid_points
from perfmodel.schedule.interpreter import Interpreter
from perfmodel.schedule.loops import LoopOptions, counter_form, simulate_while
from perfmodel.schedule.slicing import loop_carries_needed, may_be_known, slice_jaxpr
from perfmodel.schedule.values import UNKNOWN, RefValue

#: The interpreter's per-iteration reference implementation: every fast path off.
REFERENCE = LoopOptions(expand_loops=False, slice_quiet_runs=False, closed_form_loops=False)


def _counts(call, chip, loop_options=LoopOptions()):
    points = grid_points(call.grid)
    c = count_body_work(call.body, chip, call.grid, points, call.prefetch_values, loop_options=loop_options)
    n = points.shape[0]

    def per_step(x):
        return np.broadcast_to(np.asarray(x, dtype=float), (n,)).copy()

    return {
        "useful": per_step(c.useful), "vpu": per_step(c.vpu), "eup": per_step(c.eup),
        "dma_read": per_step(c.dma_read), "dma_write": per_step(c.dma_write),
        "issued": {k: per_step(v) for k, v in c.issued.items()},
        "unpadded": {k: per_step(v) for k, v in c.unpadded.items()},
        "dots": c.dots, "notes": list(c.notes), "scoped": dict(c.scoped_bytes),
    }


def _assert_same(fast, ref):
    assert fast["dots"] == ref["dots"]
    assert fast["notes"] == ref["notes"]
    assert fast["scoped"] == ref["scoped"]
    for key in ("useful", "vpu", "eup", "dma_read", "dma_write"):
        np.testing.assert_allclose(fast[key], ref[key], rtol=1e-12, err_msg=key)
    for key in ("issued", "unpadded"):
        assert fast[key].keys() == ref[key].keys()
        for k in fast[key]:
            np.testing.assert_allclose(fast[key][k], ref[key][k], rtol=1e-12, err_msg=f"{key}[{k}]")


def _catalog_call(kernel, shapes, blocks, chip):
    entry = get_entry(kernel)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    fn = entry.make_function(specs, blocks, chip)
    return find_pallas_calls(trace(fn, *args), args)


CATALOG_CASES = [
    # Ragged batch: data-dependent trip counts (random context lengths), q tokens not a multiple of block_q,
    # sequences straddling q blocks, a slot carry that flips every iteration (no closed form).
    ("ragged_paged_attention", ["q=45x8x128:bf16", "kv_pages=64x16x4x128:bf16",
                                "kv_lens=5:int32=random", "page_table=5x12:int32=arange",
                                "cu_q_lens=6:int32=arange*7", "num_seqs=1:int32=5"], {"block_q": 16, "block_kv": 128}),
    ("ragged_paged_attention", ["q=40x8x128:bf16", "kv_pages=64x16x4x128:bf16",
                                "kv_lens=3:int32=150", "page_table=3x16:int32=arange",
                                "cu_q_lens=4:int32=arange*13", "num_seqs=1:int32=3"], {"block_q": 32, "block_kv": 256}),
    # Paged decode: a counting loop over kv heads x blocks (closed form), lengths not a multiple of a block.
    ("paged_attention", ["q=4x8x128:bf16", "k_pages=2x64x16x128:bf16", "v_pages=2x64x16x128:bf16",
                         "page_table=4x16:int32=arange", "lengths=4:int32=random"], {"pages_per_compute_block": 8}),
    ("paged_attention", ["q=3x8x128:bf16", "k_pages=2x64x16x128:int8", "v_pages=2x64x16x128:int8",
                         "page_table=3x16:int32=arange", "lengths=3:int32=200", "k_scales=2x64x16:f32",
                         "v_scales=2x64x16:f32"], {"pages_per_compute_block": 8}),
    # Flash attention: static loops (scans) over heads and compute slices, causal block skipping, odd length.
    ("flash_attention", ["q=1x4x300x128:bf16", "k=1x2x300x128:bf16", "v=1x2x300x128:bf16"],
     {"block_q": 64, "block_kv": 256, "block_kv_compute": 128}),
    # Token-major cache write: a fori_loop over the tokens of a block, slot mapping read per token.
    ("kv_cache_update_token_major", ["new_k=40x2x128:bf16", "new_v=40x2x128:bf16", "k_cache=32x16x2x128:bf16",
                                     "v_cache=32x16x2x128:bf16", "slot_mapping=40:int32=random"],
     {"tokens_per_block": 16}),
    # Sampling: data-dependent while loops (top-k / top-p searches) and a vocabulary loop.
    ("sampling", ["logits=10x3000:f32"], {"block_b": 8, "block_v": 1024}),
]


@pytest.mark.parametrize("kernel,shapes,blocks", CATALOG_CASES, ids=lambda x: x if isinstance(x, str) else None)
def test_bundled_kernels_count_the_same_work_as_the_per_iteration_reference(kernel, shapes, blocks, v5e):
    calls = _catalog_call(kernel, shapes, blocks, v5e)
    fast = [_counts(c, v5e) for c in calls]
    fast_time = [analyze_call(c, v5e).time.expected_s for c in calls]
    for c, f, t in zip(calls, fast, fast_time):
        _assert_same(f, _counts(c, v5e, REFERENCE))
        assert t == pytest.approx(analyze_call(c, v5e, loop_options=REFERENCE).time.expected_s, rel=1e-12)


# ----------------------------------------------------------------------------- hand-written loop kernels

ROWS = 8


def _loop_kernel(lens_ref, x_ref, o_ref, acc_ref):
    """A data-dependent fori_loop (trip count from scalar prefetch) whose body has predicates on the
    iteration, a carry recurrence, a nested loop whose trip count is the outer index, a while loop that
    steps by 2, and a branch on VMEM data whose costliest side depends on the iteration."""
    i = pl.program_id(0)
    n = lens_ref[i]
    acc_ref[...] = jnp.zeros_like(acc_ref)

    def body(j, carry):
        slot, k = carry

        @pl.when(j % 3 == 0)
        def _():
            acc_ref[...] += jnp.dot(x_ref[...], jnp.ones((128, 128), jnp.float32))

        @pl.when(slot == 1)
        def _():
            acc_ref[...] = jnp.exp(acc_ref[...])

        def inner(t, c):
            acc_ref[...] = acc_ref[...] * 2.0
            return c + 1

        lax.fori_loop(0, j, inner, 0)
        lax.while_loop(lambda c: c < j, lambda c: c + 2, 0)

        def big():
            @pl.when(j < 2)
            def _():
                acc_ref[...] = jnp.tanh(jnp.dot(acc_ref[...], jnp.ones((128, 128), jnp.float32)))

        def medium():
            acc_ref[...] = jnp.sin(acc_ref[...])

        lax.cond(acc_ref[0, 0] > 0, big, medium)  # data-dependent: the costliest branch is assumed
        return 1 - slot, k + 2

    lax.fori_loop(0, n, body, (jnp.int32(0), jnp.int32(0)))
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _write_prefetch_kernel(lens_ref, x_ref, o_ref):
    """A loop that writes the scalar-prefetch ref its own condition reads (trip count becomes unknown)."""
    i = pl.program_id(0)

    def cond(c):
        return c < lens_ref[i]

    def body(c):
        lens_ref[i] = lens_ref[i] - 1
        o_ref[...] = jnp.exp(x_ref[...].astype(jnp.float32)).astype(o_ref.dtype)
        return c + 1

    lax.while_loop(cond, body, jnp.int32(0))


def _scan_kernel(lens_ref, x_ref, o_ref, acc_ref):
    """A static loop (scan) with a carry-dependent predicate and a data-dependent bound inside."""
    i = pl.program_id(0)
    acc_ref[...] = jnp.zeros_like(acc_ref)

    def body(t, c):
        @pl.when(c + t > lens_ref[i] % 5)
        def _():
            acc_ref[...] += jnp.exp(x_ref[...].astype(jnp.float32))

        lax.fori_loop(0, lens_ref[i] % 4 + t, lambda u, a: a + 1, 0)
        return c + i % 2

    lax.fori_loop(0, 6, body, jnp.int32(0))
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _hand_call(kernel, grid, lens, scratch=True):
    x = jax.ShapeDtypeStruct((ROWS * grid, 128), jnp.float32)
    spec = pl.BlockSpec((ROWS, 128), lambda g, lens_ref: (g, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(grid,), in_specs=[spec], out_specs=spec,
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32)] if scratch else [])
    call = pl.pallas_call(kernel, grid_spec=grid_spec, out_shape=x)
    lens = jnp.asarray(lens, jnp.int32)
    return find_pallas_calls(trace(call, lens, x), [lens, x])[0]


@pytest.mark.parametrize("kernel,lens,scratch", [
    (_loop_kernel, [0, 1, 2, 5, 7, 3, 4], True),
    (_loop_kernel, [6], True),
    (_write_prefetch_kernel, [3, 0, 5], False),
    (_scan_kernel, [0, 9, 2, 7, 3], True),
], ids=["fori-mixed", "fori-one-step", "writes-prefetch", "scan"])
@pytest.mark.parametrize("chip_name", ["tpu-v5e", "tpu-v6e"])
def test_hand_written_loops_count_the_same_work_as_the_per_iteration_reference(kernel, lens, scratch, chip_name):
    chip = resolve_chip(chip_name)
    call = _hand_call(kernel, len(lens), lens, scratch)
    fast = _counts(call, chip)
    _assert_same(fast, _counts(call, chip, REFERENCE))


def test_the_costliest_branch_is_chosen_per_iteration():
    # In _loop_kernel the data-dependent branch's costlier side is `big` (dot + tanh) at iterations 0 and 1
    # and `medium` (sin) after: a single choice over all iterations would count tanh at every one.
    chip = resolve_chip("tpu-v5e")
    call = _hand_call(_loop_kernel, 1, [5])
    fast = _counts(call, chip)
    eup_per_iteration = {"exp": ROWS * 128, "tanh": ROWS * 128, "sin": ROWS * 128}
    # exp where slot == 1 (iterations 1, 3), tanh at iterations 0, 1, sin at 2, 3, 4.
    assert fast["eup"][0] == pytest.approx(2 * eup_per_iteration["exp"] + 2 * eup_per_iteration["tanh"]
                                           + 3 * eup_per_iteration["sin"])
    _assert_same(fast, _counts(call, chip, REFERENCE))


def test_expanded_lanes_beyond_the_cap_fall_back_to_the_per_iteration_pass():
    chip = resolve_chip("tpu-v5e")
    call = _hand_call(_loop_kernel, 4, [3, 9, 1, 6])
    capped = _counts(call, chip, LoopOptions(max_expanded_lanes=5))
    _assert_same(capped, _counts(call, chip, REFERENCE))


# ----------------------------------------------------------------------------- simulation and slicing

def _while_eqn(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    return closed, next(e for e in closed.jaxpr.eqns if e.primitive.name == "while")


def _operands(closed, eqn, values):
    env = dict(zip(closed.jaxpr.invars, values))
    return [np.asarray(v.val).reshape(1) if isinstance(v, jax.extend.core.Literal) else env[v] for v in eqn.invars]


@pytest.mark.parametrize("lo,hi", [([0, 3, 5, 2], [4, 3, 9, 0]), ([2], [7]), ([-3, 0], [2, 1]), ([1, 4], [3])])
@pytest.mark.parametrize("step", ["unchanged", "toggle", "affine"])
def test_counting_loops_in_closed_form_match_the_simulation(lo, hi, step):
    # A fori_loop whose other carries stay, flip like a double buffer's slot, or step by a constant.
    bodies = {
        "unchanged": lambda i, c: (c[0], c[1] * 2 + i),
        "toggle": lambda i, c: (1 - c[0], c[1] * 2 + i),
        "affine": lambda i, c: (c[0] - 3, c[1] * 2 + i),
    }

    def f(a, b, c):
        return lax.fori_loop(a, b, bodies[step], (c, c))

    closed, eqn = _while_eqn(f, jnp.int32(0), jnp.int32(1), jnp.int32(7))
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    ops = _operands(closed, eqn, [np.asarray(lo, np.int32), np.asarray(hi, np.int32), np.asarray([7], np.int32)])
    cconsts, bconsts, init = ops[:cn], ops[cn:cn + bn], ops[cn + bn:]
    lanes = max(len(lo), len(hi))
    # The counter, the bound and the first carry are simulated; the last (c * 2 + i) is not asked for.
    carries = tuple(j < len(init) - 1 for j in range(len(init)))
    assert counter_form(p["cond_jaxpr"], p["body_jaxpr"], carries) is not None
    closed_form = simulate_while(Interpreter(lanes), p["cond_jaxpr"], p["body_jaxpr"], cconsts, bconsts, init,
                                 carries, True)
    stepped = simulate_while(Interpreter(lanes, loop_options=LoopOptions(closed_form_loops=False)), p["cond_jaxpr"],
                             p["body_jaxpr"], cconsts, bconsts, init, carries, True)
    np.testing.assert_array_equal(closed_form[0], stepped[0])
    for a, b in zip(closed_form[1], stepped[1]):
        if a is UNKNOWN or b is UNKNOWN:
            assert a is b
            continue
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).shape == np.asarray(b).shape and np.asarray(a).dtype == np.asarray(b).dtype
    if stepped[2] is None:
        assert closed_form[2] is None
    else:
        np.testing.assert_array_equal(closed_form[2].lanes, stepped[2].lanes)
        np.testing.assert_array_equal(closed_form[2].iters, stepped[2].iters)
        for a, b in zip(closed_form[2].carries, stepped[2].carries):
            if a is UNKNOWN or b is UNKNOWN:
                assert a is b
                continue
            np.testing.assert_array_equal(a, b)


def test_loops_that_do_not_count_by_one_are_simulated():
    closed, eqn = _while_eqn(lambda n: lax.while_loop(lambda c: c < n, lambda c: c + 2, 0), jnp.int32(5))
    p = eqn.params
    assert counter_form(p["cond_jaxpr"], p["body_jaxpr"], (True,) * len(eqn.outvars)) is None
    outs = Interpreter(3).run_closed(closed, [np.array([5, 0, 6], np.int32)])
    assert list(outs[0]) == [6, 0, 6]


def test_a_slice_keeps_only_what_the_trip_count_needs():
    # The carry `v` (a vector) and the work on it are dropped; the counter and the bound stay.
    def f(n, x):
        return lax.fori_loop(0, n, lambda i, v: jnp.exp(jnp.sin(v) * 2.0 + i), x)

    closed, eqn = _while_eqn(f, jnp.int32(3), jnp.zeros((8, 128), jnp.float32))
    body = eqn.params["body_jaxpr"].jaxpr
    carries = loop_carries_needed(eqn, [may_be_known(v) for v in eqn.outvars])
    assert carries == (True, True, False)
    kept = slice_jaxpr(body, carries)
    assert [e.primitive.name for e, _ in kept.eqns] == ["add"]
    assert len(body.eqns) > 4


def test_sliced_and_whole_quiet_runs_agree_on_the_outputs_asked_for():
    def f(i, j, x):
        k = lax.cond(i > j, lambda: i * 3 + lax.rem(j, 4), lambda: j - i)
        m = lax.fori_loop(0, i, lambda t, c: c + t * j, k)
        return m, jnp.exp(x) * k, lax.div(m, jnp.int32(3)) - i

    closed = jax.make_jaxpr(f)(jnp.int32(0), jnp.int32(0), jnp.zeros((8, 128), jnp.float32))
    rng = np.random.default_rng(1)
    i, j = rng.integers(-3, 9, 40).astype(np.int32), rng.integers(-3, 9, 40).astype(np.int32)
    sliced = Interpreter(40).run_closed(closed, [i, j, UNKNOWN], needed=(True, False, True))
    whole = Interpreter(40, loop_options=LoopOptions(slice_quiet_runs=False)).run_closed(closed, [i, j, UNKNOWN])
    theirs = jax.vmap(lambda a, b: f(a, b, jnp.zeros((8, 128), jnp.float32)))(jnp.asarray(i), jnp.asarray(j))
    for k in (0, 2):
        np.testing.assert_array_equal(np.broadcast_to(sliced[k], (40,)), np.broadcast_to(whole[k], (40,)))
        np.testing.assert_array_equal(np.broadcast_to(sliced[k], (40,)), np.asarray(theirs[k]))


# ----------------------------------------------------------------------------- index maps and the prologue

def _index_map_call(grid, rows, table):
    """Data-dependent index maps (a scalar-prefetch table, clamped) over an unaligned array."""
    def body(t_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    g0, g1 = grid
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=grid,
        in_specs=[pl.BlockSpec((8, 128), lambda a, b, t: (jnp.minimum(t[a, b] + b // 2, rows // 8), a % 2))],
        out_specs=pl.BlockSpec((8, 128), lambda a, b, t: (a * g1 + b, 0)))
    x = jax.ShapeDtypeStruct((rows, 300), jnp.float32)
    out = jax.ShapeDtypeStruct((8 * g0 * g1, 128), jnp.float32)
    call = pl.pallas_call(body, grid_spec=grid_spec, out_shape=out)
    t = jnp.asarray(table, jnp.int32)
    return find_pallas_calls(trace(call, t, x), [t, x])[0]


@pytest.mark.parametrize("grid", [(3, 5), (1, 7), (4, 1)])
def test_vectorized_index_maps_match_jax_at_every_grid_point(grid):
    rng = np.random.default_rng(sum(grid))
    table = rng.integers(-2, 9, grid)
    call = _index_map_call(grid, 61, table)
    points = grid_points(call.grid)
    for b in call.blocks:
        ours = block_indices(call, b, points)
        theirs = _evaluate_with_jax(b, call, points)
        for o, t in zip(ours, theirs):
            np.testing.assert_array_equal(o, np.broadcast_to(np.asarray(t).reshape(-1), o.shape))


def test_the_wrapper_prologue_in_numpy_matches_jax():
    def prologue(cu, lens, n):
        live = jnp.arange(cu.shape[0] - 1) < n[0]
        start = jnp.arange(5, dtype=jnp.int32)[:, None] * 16
        end = jnp.minimum(start + 16, 70)
        before = live[None, :] & (cu[None, 1:] <= start)
        span = jnp.sum(before, axis=1, dtype=jnp.int32)
        return (span, lax.div(lens - 7, jnp.int32(3)), lax.rem(lens - 7, jnp.int32(-4)), jnp.cumsum(lens),
                jnp.concatenate([lens, cu[:3]]), lens.reshape(2, 3).T, jnp.max(lens), end.astype(jnp.int8),
                (lens > 2).astype(jnp.float32), jnp.clip(lens, 1, 4), jnp.where(lens > 3, lens, -lens))

    cu = np.array([0, 5, 9, 20, 41, 70, 70], np.int32)
    lens = np.array([3, -8, 11, 0, 5, 2], np.int32)
    n = np.array([4], np.int32)
    closed = jax.make_jaxpr(prologue)(cu, lens, n)
    seen = set()

    def check(jaxpr, env_in):
        env = dict(env_in)
        for eqn in jaxpr.eqns:
            invals = [np.asarray(v.val) if isinstance(v, jax.extend.core.Literal) else env[v] for v in eqn.invars]
            if eqn.primitive.name in ("jit", "pjit"):
                sub = eqn.params["jaxpr"]
                outs = check(sub.jaxpr, dict(zip(sub.jaxpr.invars, invals)))
            else:
                outs = eqn.primitive.bind(*invals, **eqn.params)
                outs = [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]
                ours = _numpy_eval(eqn, invals)
                if ours is not None:
                    seen.add(eqn.primitive.name)
                    np.testing.assert_array_equal(ours, outs[0], err_msg=eqn.primitive.name)
                    assert ours.dtype == outs[0].dtype, eqn.primitive.name
            for v, o in zip(eqn.outvars, outs):
                env[v] = o
        return [env[v] if not isinstance(v, jax.extend.core.Literal) else np.asarray(v.val) for v in jaxpr.outvars]

    check(closed.jaxpr, dict(zip(closed.jaxpr.invars, [cu, lens, n])))
    assert {"iota", "broadcast_in_dim", "lt", "le", "and", "reduce_sum", "div", "rem", "cumsum", "concatenate",
            "transpose", "reduce_max", "convert_element_type", "min", "slice", "select_n"} <= seen


def test_writes_to_known_refs_are_kept_in_quiet_runs():
    # The loop writes the scalar-prefetch ref its condition reads: a quiet (sliced) run must still make the
    # write, so the caller's ref is no longer known afterwards.
    call = _hand_call(_write_prefetch_kernel, 2, [2, 4], scratch=False)
    args = [RefValue(np.asarray([[2, 4]], np.int32), "smem"), RefValue(UNKNOWN, "vmem"), RefValue(UNKNOWN, "vmem")]
    Interpreter(2, call.grid, [np.arange(2)]).run(call.body, [], args, needed=())
    assert args[0].value is UNKNOWN


# ----------------------------------------------------------------------------- accumulation and grid order

@pytest.mark.parametrize("grid", [(1,), (7,), (3, 1, 4), (2, 5, 1, 3), (1, 1)])
def test_grid_points_are_row_major_like_unravel_index(grid):
    n = int(np.prod(grid))
    expected = np.stack(np.unravel_index(np.arange(n), grid), axis=1).astype(np.int32)
    np.testing.assert_array_equal(grid_points(grid), expected)


def test_work_under_weight_arrays_sums_like_adding_each_equation(v5e):
    # The counter defers work under a per-step weight array and multiplies it out on read; the totals and
    # the first-seen order of MXU rate keys must be those of adding weight * work at every equation.
    from perfmodel.schedule.body import WorkCounter

    rng = np.random.default_rng(3)
    weights = [rng.integers(0, 4, 9).astype(float) for _ in range(3)] + [2.0, np.ones(1)]
    counter = WorkCounter(v5e)
    expected = {"useful": np.zeros(9), "vpu": np.zeros(9), "bf16": np.zeros(9), "fp32": np.zeros(9)}
    order = []
    for step in range(40):
        w = weights[step % len(weights)]
        amount = float(rng.integers(1, 1000))
        key = "fp32" if step % 7 == 3 else "bf16"
        counter._add("useful", w, amount)
        counter._add("vpu", w, 2 * amount)
        counter._add("issued", w, 3 * amount, key)
        expected["useful"] = expected["useful"] + w * amount
        expected["vpu"] = expected["vpu"] + w * 2 * amount
        expected[key] = expected[key] + w * 3 * amount
        if key not in order:
            order.append(key)
    np.testing.assert_array_equal(np.broadcast_to(counter.useful, (9,)), expected["useful"])
    np.testing.assert_array_equal(np.broadcast_to(counter.vpu, (9,)), expected["vpu"])
    assert list(counter.issued) == order
    for key in order:
        np.testing.assert_array_equal(np.broadcast_to(counter.issued[key], (9,)), expected[key])
