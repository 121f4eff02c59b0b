"""Kernels perfmodel did not write: JAX's megablox grouped matmul (gmm), whose grid's middle dimension is the
number of active (group, row-tile) pairs computed from the group sizes at run time; JAX's splash attention
(block-sparse mask info as scalar prefetch); JAX's ragged paged attention (manual page DMAs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.megablox import gmm

from perfmodel.errors import InputError
from perfmodel.schedule.analyze import analyze, analyze_call
from perfmodel.schedule.extract import find_pallas_calls, trace

from tests.schedule.dynamic_kernels import smem_loop_copy, smem_sized_copy, tail_copy
from tests.schedule.recorder import record_traffic

M, K, N, TILE = 512, 256, 256, 128


def _gmm(lhs, rhs, sizes):
    return gmm(lhs, rhs, sizes, tiling=(TILE, TILE, TILE))


@pytest.mark.parametrize("sizes, active", [
    # 4 groups of 128 rows: one row tile each -> 4 active tiles.
    ([128, 128, 128, 128], 4),
    # 100 | 200 | 12 | 200 rows over row tiles [0,128) [128,256) [256,384) [384,512): group 0 [0,100) holds rows
    # of tile 0; group 1 [100,300) of tiles 0-2; group 2 [300,312) of tile 2; group 3 [312,512) of tiles 2-3.
    # gmm visits a tile once per group it holds rows of: 1 + 3 + 1 + 2 = 7.
    ([100, 200, 12, 200], 7),
])
def test_gmm_grid_is_evaluated_from_the_group_sizes(v5e, sizes, active):
    lhs = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((len(sizes), K, N), jnp.bfloat16)
    [kern] = analyze(_gmm, lhs, rhs, np.array(sizes, np.int32), chip=v5e).kernels
    assert kern.grid == (N // TILE, active, K // TILE)


def test_gmm_grid_needs_the_group_sizes_as_values(v5e):
    lhs = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, K, N), jnp.bfloat16)
    with pytest.raises(InputError, match="grid size is computed at run time from arguments given only as shapes"):
        analyze(_gmm, lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.int32), chip=v5e)


@pytest.mark.parametrize("sizes", [[128, 128, 128, 128], [100, 200, 12, 200]])
def test_gmm_transfers_equal_the_interpreter_run(v5e, sizes):
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), K, N)), jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    rec = record_traffic(_gmm, lhs, rhs, group_sizes)
    [call] = find_pallas_calls(trace(_gmm, lhs, rhs, group_sizes), (lhs, rhs, group_sizes))
    kern = analyze_call(call, v5e, order=np.array(rec.grid_points))
    assert kern.steps == len(rec.grid_points)
    for o in kern.operands:
        if o.pipelined:
            assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name), o.name


def _assert_transfers_match(v5e, fn, *args):
    rec = record_traffic(fn, *args)
    calls = find_pallas_calls(trace(fn, *args), args)
    assert len(calls) == 1
    kern = analyze_call(calls[0], v5e, order=np.array(rec.grid_points))
    assert kern.steps == len(rec.grid_points)
    for o in kern.operands:
        if o.pipelined:
            assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name), o.name
    return kern


@pytest.mark.parametrize("seq, block", [(512, 128), (768, 256)])
def test_splash_attention_causal_transfers_equal_the_interpreter_run(v5e, seq, block):
    # JAX's splash attention: block-sparse mask info as scalar prefetch decides which K/V blocks are fetched.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, dim = 2, 128
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                block_sizes=sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block))
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((heads, seq, dim)), jnp.bfloat16) for _ in range(3))
    kern = _assert_transfers_match(v5e, lambda q, k, v: kernel(q, k, v), q, k, v)
    n = seq // block
    k_op = next(o for o in kern.operands if o.name == "k_ref")
    # causal: q block row i needs kv blocks 0..i -> at most n(n+1)/2 fetches per head (fewer where consecutive
    # steps keep the same block), fewer than the n^2 grid steps
    assert k_op.transfers <= heads * n * (n + 1) // 2 < kern.steps


def _first_step_dot(x, w):
    """Grid of 2 steps over row blocks of x (16 x 128 f32); only step program_id(0) == 0 runs a dot with w
    (128 x 128), the other copies its block."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = x_ref[...]

        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    return pl.pallas_call(kernel, grid=(2,), out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
                          in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0)), pl.BlockSpec((128, 128), lambda i: (0, 0))],
                          out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)))(x, w)


def test_vmapped_call_body_reads_program_ids_without_the_vmapped_dimension(v5e):
    # jax.vmap over 3 batches prepends a parallel grid dimension: grid (3, 2). The body's program_id(0) is still
    # the row-block index (Mosaic skips vmapped dimensions), so the dot runs at 3 of the 6 steps:
    # 3 x 2 x 8 x 128 x 128 = 786,432 useful FLOPs (reading the batch index as program_id(0) would give 2 steps).
    x = jax.ShapeDtypeStruct((3, 16, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 128, 128), jnp.float32)
    [call] = find_pallas_calls(trace(jax.vmap(_first_step_dot), x, w), (x, w))
    assert call.grid == (3, 2) and call.vmapped_dims == (0,) and call.body_axes == (1,)
    assert call.dimension_semantics == ("parallel", "arbitrary")
    kern = analyze_call(call, v5e)
    assert kern.work.mxu_useful_flops == 3 * 2 * 8 * 128 * 128


def test_vmapped_splash_attention_counts_each_batch_like_the_unbatched_call(v5e):
    # Splash attention's causal block mask (scalar prefetch) is indexed by the body's program ids: vmapped over
    # a batch of 3, each batch element skips the same masked blocks as the unbatched call.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    heads, seq, dim, block = 2, 512, 128, 128
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq)) for _ in range(heads)])
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                block_sizes=sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block))
    one = jax.ShapeDtypeStruct((heads, seq, dim), jnp.bfloat16)
    batched = jax.ShapeDtypeStruct((3, heads, seq, dim), jnp.bfloat16)
    [single] = analyze(lambda q, k, v: kernel(q, k, v), one, one, one, chip=v5e).kernels
    [vmapped] = analyze(jax.vmap(lambda q, k, v: kernel(q, k, v)), batched, batched, batched, chip=v5e).kernels
    n = seq // block
    # causal: n (n + 1) / 2 of the n^2 blocks per head run their dots
    assert single.work.mxu_useful_flops == heads * n * (n + 1) // 2 * 2 * (2 * block * block * dim)
    assert vmapped.steps == 3 * single.steps
    assert vmapped.work.mxu_useful_flops == 3 * single.work.mxu_useful_flops


@pytest.mark.parametrize("kv_lens, cu_q_lens", [([256, 128, 0, 0], [0, 48, 64, 64, 64]),
                                                ([64, 64, 64, 64], [0, 1, 2, 3, 4])])
def test_jax_ragged_paged_attention_is_modeled_with_its_manual_page_dmas(v5e, kv_lens, cu_q_lens):
    # JAX's ragged paged attention (v2 layout: K and V heads combined in one page array). Its manual page copies
    # cover at least every page the sequences need: ceil(len / 16) pages x 16 tokens x 4 combined heads x 128 x 2 B.
    # (It does not run in interpret mode in this jax, so the exact count is not checked against a run.)
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    q = jnp.zeros((64, 8, 128), jnp.bfloat16)
    kv = jnp.zeros((64, 16, 4, 128), jnp.bfloat16)
    page_indices = jnp.arange(16, dtype=jnp.int32).reshape(4, 4)
    args = (q, kv, jnp.asarray(kv_lens, jnp.int32), page_indices, jnp.asarray(cu_q_lens, jnp.int32),
            jnp.asarray([4 if cu_q_lens[-1] == 4 else 2], jnp.int32))
    [kern] = analyze(lambda *a: rpa.ragged_paged_attention(*a, num_kv_pages_per_block=4, num_queries_per_block=16),
                     *args, chip=v5e).kernels
    needed = sum(-(-n // 16) for n in kv_lens) * 16 * 4 * 128 * 2
    assert kern.manual_dma and kern.work.manual_dma_bytes >= needed > 0



def _pipelined(m: int, n: int, bm: int, bn: int):
    """A pallas_call with no grid whose body runs its own pipeline (pltpu.emit_pipeline) over HBM operands:
    out[i, j] = y[i, j] + x[i, :bn] with x's row block held across the inner j steps."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def inner(x_ref, y_ref, o_ref):
        o_ref[...] = y_ref[...] + x_ref[:, :bn]

    def kernel(x_hbm, y_hbm, o_hbm):
        pltpu.emit_pipeline(inner, grid=(m // bm, n // bn),
                            in_specs=[pl.BlockSpec((bm, n), lambda i, j: (i, 0)),
                                      pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
                            out_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))])(x_hbm, y_hbm, o_hbm)

    def fn(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
                              out_specs=pl.BlockSpec(memory_space=pl.ANY))(x, y)

    return fn


@pytest.mark.parametrize("m, n, bm, bn", [(512, 512, 128, 256), (256, 1024, 64, 128)])
def test_an_in_kernel_pipeline_moves_what_the_interpreter_moves(v5e, m, n, bm, bn):
    from perfmodel.schedule.device_kind import as_device

    fn = _pipelined(m, n, bm, bn)
    x = jnp.ones((m, n), jnp.float32)
    y = jnp.ones((m, n), jnp.float32)
    [kern] = analyze(fn, x, y, chip=v5e).kernels
    with as_device(v5e):  # emit_pipeline asks for the chip's info while tracing
        rec = record_traffic(fn, x, y)
    # x once per row block (held across j), y read once, out written once: 3 x m x n x 4 bytes.
    assert kern.manual_dma and kern.work.manual_dma_bytes == rec.manual_hbm_bytes == 3 * m * n * 4


@pytest.mark.parametrize("m, n, bm, bn, iterations", [(512, 512, 128, 256, 8), (256, 1024, 64, 128, 32)])
def test_an_in_kernel_pipeline_waits_out_the_dma_latency_once_per_iteration(v5e, m, n, bm, bn, iterations):
    from perfmodel.schedule.timing import core_rates

    fn = _pipelined(m, n, bm, bn)
    x = jax.ShapeDtypeStruct((m, n), jnp.float32)
    [kern] = analyze(fn, x, x, chip=v5e).kernels
    rates = core_rates(v5e)
    # One grid step running (m/bm) x (n/bn) pipeline iterations, each waiting for copies an earlier one
    # started: DMA-bound (an add per element), so 3 m n 4 bytes at the HBM rate plus one latency per iteration
    # (512 x 512: 3.15 MB / 697 GB/s = 4.52 µs + 8 x 255 ns = 6.56 µs).
    assert kern.time.limiter == "dma"
    want = 3 * m * n * 4 / rates.hbm_bytes_per_s + iterations * rates.dma_latency_s
    assert kern.time.expected_s == pytest.approx(want, rel=1e-9)


def _start_all_then_wait_all(copies: int):
    """One grid step that starts ``copies`` DMAs of 8 rows each in one loop and waits for them in another:
    every copy is in flight at once (a paged kernel's gather), so the step waits out one latency."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm, o_ref, buf, sems):
        def copy(i):
            return pltpu.make_async_copy(x_hbm.at[pl.ds(8 * i, 8)], buf.at[pl.ds(8 * i, 8)], sems.at[i])

        jax.lax.fori_loop(0, copies, lambda i, c: (copy(i).start(), c)[1], 0)
        jax.lax.fori_loop(0, copies, lambda i, c: (copy(i).wait(), c)[1], 0)
        o_ref[...] = buf[...]

    def fn(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8 * copies, 128), jnp.float32),
                              in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((8 * copies, 128), lambda: (0, 0)),
                              scratch_shapes=[pltpu.VMEM((8 * copies, 128), jnp.float32),
                                              pltpu.SemaphoreType.DMA((copies,))])(x)

    return fn


def test_copies_all_in_flight_at_once_wait_out_one_latency(v5e):
    from perfmodel.schedule.timing import core_rates

    copies = 16
    [kern] = analyze(_start_all_then_wait_all(copies), jax.ShapeDtypeStruct((8 * copies, 128), jnp.float32),
                     chip=v5e).kernels
    rates = core_rates(v5e)
    # 16 copies of 8 x 128 f32 = 64 KiB read by the body: one wave, one latency (not 16); the output block
    # (64 KiB) is the pipeline's epilogue.
    assert kern.work.manual_dma_bytes == 16 * 8 * 128 * 4
    step = kern.time.steps_s
    assert step == pytest.approx(max(16 * 8 * 128 * 4 / rates.hbm_bytes_per_s + rates.dma_latency_s,
                                     rates.step_overhead_s), rel=1e-9)


def _dynamic_dma(rows: int = 64):
    """Each grid step copies its first n[i] rows of x from HBM with one DMA whose size is read from scalar
    prefetch at run time."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(n_ref, x_hbm, o_ref, buf, sem):
        n = n_ref[pl.program_id(0)]
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    def fn(n, x):
        steps = n.shape[0]
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((steps * rows, 128), jnp.float32),
                              grid_spec=pltpu.PrefetchScalarGridSpec(
                                  num_scalar_prefetch=1, grid=(steps,),
                                  in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                                  out_specs=pl.BlockSpec((rows, 128), lambda i, n: (i, 0)),
                                  scratch_shapes=[pltpu.VMEM((rows, 128), jnp.float32), pltpu.SemaphoreType.DMA]),
                              )(n, x)

    return fn


@pytest.mark.parametrize("sizes", [[8, 16, 40], [64, 1]])
def test_dma_sizes_computed_at_run_time_count_their_values(v5e, sizes):
    # [8, 16, 40]: 8 + 16 + 40 = 64 rows of 128 f32 = 32,768 bytes (the whole array would be 3 x 32,768).
    fn = _dynamic_dma()
    n, x = jnp.asarray(sizes, jnp.int32), jnp.ones((64, 128), jnp.float32)
    [kern] = analyze(fn, n, x, chip=v5e).kernels
    rec = record_traffic(fn, n, x)
    assert kern.work.manual_dma_bytes == rec.manual_hbm_bytes == sum(sizes) * 128 * 4


X64 = jax.ShapeDtypeStruct((64, 128), jnp.float32)


@pytest.mark.parametrize("n", [8, 40])
def test_dma_sizes_read_from_an_smem_input_count_its_values(v5e, n):
    # n comes from a whole-array SMEM input given as a value: n rows of 128 f32 = n x 512 bytes (8 -> 4,096).
    fn = smem_sized_copy
    n_arr = jnp.asarray([n], jnp.int32)
    [kern] = analyze(fn, n_arr, X64, chip=v5e).kernels
    assert kern.work.manual_dma_bytes == n * 128 * 4
    assert kern.work.manual_dma_bytes == record_traffic(fn, n_arr, jnp.ones((64, 128), jnp.float32)).manual_hbm_bytes


def test_dma_sizes_from_data_given_only_as_a_shape_count_the_whole_window_and_say_so(v5e):
    # n given only as a shape: the whole 64-row window (64 x 128 f32 = 32,768 B) counts, with a note.
    [kern] = analyze(smem_sized_copy, jax.ShapeDtypeStruct((1,), jnp.int32), X64, chip=v5e).kernels
    assert kern.work.manual_dma_bytes == 64 * 128 * 4
    assert any("slice size is computed at run time" in n for n in kern.notes)


@pytest.mark.parametrize("n", [3, 7])
def test_a_loop_bound_read_from_an_smem_input_runs_its_value(v5e, n):
    # n iterations of one 8-row copy: n x 8 x 128 x 4 = n x 4,096 bytes.
    fn = smem_loop_copy
    n_arr = jnp.asarray([n], jnp.int32)
    [kern] = analyze(fn, n_arr, X64, chip=v5e).kernels
    assert kern.work.manual_dma_bytes == n * 4096
    assert kern.work.manual_dma_bytes == record_traffic(fn, n_arr, jnp.ones((64, 128), jnp.float32)).manual_hbm_bytes


def test_a_loop_bound_given_only_as_a_shape_counts_once_and_says_how_to_fix_it(v5e):
    [kern] = analyze(smem_loop_copy, jax.ShapeDtypeStruct((1,), jnp.int32), X64, chip=v5e).kernels
    assert kern.work.manual_dma_bytes == 4096
    [note] = [n for n in kern.notes if "trip count" in n]
    assert "counted as one iteration" in note and "--loop-trips" in note and "FILL" in note


def test_loop_trips_is_the_explicit_input_for_such_a_loop(v5e):
    # --loop-trips 5: 5 x 4,096 bytes, and the note says the count was assumed.
    [kern] = analyze(smem_loop_copy, jax.ShapeDtypeStruct((1,), jnp.int32), X64, chip=v5e,
                     loop_trips=5).kernels
    assert kern.work.manual_dma_bytes == 5 * 4096
    assert any("counted as 5 iterations (--loop-trips)" in n for n in kern.notes)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_loop_trips_must_be_a_positive_whole_number(v5e, bad):
    with pytest.raises(InputError, match="`loop_trips` must be a positive whole number"):
        analyze(smem_loop_copy, jax.ShapeDtypeStruct((1,), jnp.int32), X64, chip=v5e, loop_trips=bad)


def test_dma_sizes_computed_from_the_program_id_count_each_steps_value(v5e):
    # Steps copy min(40 - 16 i, 16) rows: 16 + 16 + 8 = 40 rows of 128 f32 = 20,480 bytes (pl.multiple_of is a
    # hint: the value itself).
    x = jnp.ones((40, 128), jnp.float32)
    [kern] = analyze(tail_copy, x, chip=v5e).kernels
    assert kern.work.manual_dma_bytes == record_traffic(tail_copy, x).manual_hbm_bytes == 40 * 128 * 4
    assert not any("slice size is computed at run time" in n for n in kern.notes)
