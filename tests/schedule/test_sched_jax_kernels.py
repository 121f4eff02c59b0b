"""analyze() on kernels perfmodel did not write: JAX's own Pallas TPU matmul, flash attention and paged attention.

Expected counts are worked by hand from each kernel's grid and index maps.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu import flash_attention as fa
from jax.experimental.pallas.ops.tpu import matmul as jmm
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as jax_paged_attention

from perfmodel.errors import InputError
from perfmodel.schedule.analyze import analyze

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def _mm(m, k, n, bm, bk, bn, dtype, chip="tpu-v5e"):
    x = jax.ShapeDtypeStruct((m, k), dtype)
    y = jax.ShapeDtypeStruct((k, n), dtype)
    return analyze(jmm.matmul, x, y, chip=chip, block_shape=(bm, bn), block_k=bk).kernels[0]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    "m,k,n,bm,bk,bn",
    [
        (512, 512, 512, 128, 128, 128),  # square, every step changes k
        (256, 1024, 384, 128, 512, 128),  # non-square, unequal grid extents
        (384, 256, 512, 128, 256, 256),  # one k step: x changes only with i, y only with j
    ],
)
def test_jax_matmul_traffic_and_work(dtype, m, k, n, bm, bk, bn):
    kern = _mm(m, k, n, bm, bk, bn, DTYPES[dtype])
    size = np.dtype(dtype).itemsize
    nm, nn, nk = m // bm, n // bn, k // bk
    steps = nm * nn * nk
    assert kern.grid == (nm, nn, nk)
    assert kern.steps == steps
    x, y, o = kern.operands
    # Grid order (i, j, k), k fastest. x's block (i, k): with nk > 1 it changes every step;
    # with nk == 1 only when i changes (nm fetches). y's block (k, j): every step with nk > 1;
    # with nk == 1 when j changes, i.e. nm*nn times unless nn == 1 (then once).
    x_fetches = steps if nk > 1 else nm
    y_fetches = steps if nk > 1 else (nm * nn if nn > 1 else 1)
    assert (x.transfers, y.transfers, o.transfers) == (x_fetches, y_fetches, nm * nn)
    assert x.hbm_bytes == x_fetches * bm * bk * size
    assert y.hbm_bytes == y_fetches * bk * bn * size
    assert o.hbm_bytes == m * n * size  # each output block written once
    assert (x.ideal_hbm_bytes, y.ideal_hbm_bytes) == (m * k * size, k * n * size)
    # MXU: 2*M*N*K useful; the blocks are multiples of 128 so nothing pads on v5e's 128-wide MXU.
    assert kern.work.mxu_useful_flops == 2 * m * n * k
    assert kern.work.mxu_issued_flops >= kern.work.mxu_useful_flops
    # VMEM: 2 buffers of each (tile-aligned) block + the f32 accumulator scratch.
    assert kern.vmem.total_bytes == 2 * (bm * bk + bk * bn + bm * bn) * size + bm * bn * 4
    assert kern.vmem.status == "fits"


@pytest.mark.parametrize(
    "block,total_mib,status,note",
    [
        # 512^2 bf16 blocks: 0.5 MiB each, x/y/o double-buffered 3 MiB + f32 accumulator 1 MiB = 4 MiB.
        (512, 4, "fits", None),
        # 2048^2 bf16 blocks: 8 MiB each, 2 x 3 x 8 = 48 MiB + f32 accumulator 16 MiB = 64 MiB:
        # over v5e's 16 MiB default scoped limit, under its 128 MiB of VMEM.
        (2048, 64, "needs vmem_limit_bytes", "vmem_limit_bytes>=67108864"),
        # 4096^2: 32 MiB blocks, 2 x 3 x 32 = 192 MiB + 64 MiB accumulator = 256 MiB > 128 MiB.
        (4096, 256, "does not fit", "exceed the 128 MiB of VMEM per core"),
    ],
)
def test_vmem_verdict_of_a_kernel(block, total_mib, status, note):
    kern = _mm(8192, 8192, 8192, block, block, block, jnp.bfloat16)
    assert kern.vmem.total_bytes == total_mib * 2**20
    assert kern.vmem.status == status
    if note:
        assert any(note in n for n in kern.notes)
    else:
        assert not any(n.startswith("VMEM") for n in kern.notes)


def test_f32_matmul_pays_the_passes_of_its_dot_precision(v5e):
    # v5e lists no fp32 MXU rate; JAX's example matmul gives its dot no precision, so it runs at DEFAULT: one
    # bf16 pass (operands rounded to bf16), as on a TPU; HIGHEST would be six.
    kern = _mm(256, 256, 256, 128, 128, 128, jnp.float32)
    assert kern.work.mxu_issued_flops == 2 * 256**3
    assert any("Precision.DEFAULT modelled as 1 bf16 pass" in n for n in kern.notes)
    with jax.default_matmul_precision("highest"):
        kern = _mm(256, 256, 256, 128, 128, 128, jnp.float32)
    assert kern.work.mxu_issued_flops == 6 * 2 * 256**3


def test_mxu_padding_on_a_256_wide_mxu():
    # bm=bn=bk=128 on v6e's 256x256 MXU: K and N pad to 256 -> 4x the useful FLOPs issued.
    kern = _mm(256, 256, 256, 128, 128, 128, jnp.bfloat16, chip="tpu-v6e")
    assert kern.work.mxu_issued_flops == 4 * kern.work.mxu_useful_flops
    assert any("MXU padding: 75%" in n for n in kern.notes)


def test_expected_time_is_the_per_step_maximum_plus_prologue_and_epilogue(v5e):
    # 128^3 bf16 blocks on v5e: per step compute 2*128^3/(197e12*0.92) = 23 ns; a step copying the next x and y
    # blocks moves 2*32 KiB/(819e9*0.85) = 94 ns, + 0.255 us DMA latency = 0.349 us, under the 0.35 us step
    # overhead. The 15 steps that also write back the previous (i, j) output block move 3*32 KiB: 141 ns +
    # 0.255 us = 0.396 us, DMA-bound. expected = prologue (first x and y blocks) + 49 * 0.35 us + 15 * 0.396 us
    # + epilogue (last output block).
    kern = _mm(512, 512, 512, 128, 128, 128, jnp.bfloat16)
    bw = 819e9 * 0.85
    block = 128 * 128 * 2 / bw
    prologue, epilogue = 2 * block, block
    assert kern.time.limiter == "overhead"
    assert kern.time.steps_limited_by == {"compute": 0, "dma": 15, "overhead": 49}
    steps = 49 * 0.35e-6 + 15 * (3 * block + 0.255e-6)
    assert kern.time.expected_s == pytest.approx(prologue + steps + epilogue, rel=1e-9)
    # The op floor: 2*512^3 FLOPs at 197 TFLOP/s vs 3 arrays of 512 KiB once at 819 GB/s -> HBM-bound.
    assert kern.time.op_floor_s == pytest.approx(max(2 * 512**3 / 197e12, 3 * 512 * 512 * 2 / 819e9), rel=1e-9)
    assert kern.time.efficiency == pytest.approx(kern.time.op_floor_s / kern.time.expected_s)


def test_megacore_splits_the_parallel_grid_over_two_cores():
    # On v5p (megacore) the leading parallel dimension i is split: each core runs half of the steps.
    one = _mm(1024, 1024, 1024, 256, 256, 256, jnp.bfloat16, chip="tpu-v5e")
    two = _mm(1024, 1024, 1024, 256, 256, 256, jnp.bfloat16, chip="tpu-v5p")
    assert (one.cores_used, two.cores_used) == (1, 2)
    # Traffic is unchanged here (every step already fetches both blocks; outputs are per (i, j)).
    assert [o.transfers for o in two.operands] == [o.transfers for o in one.operands]
    # Each v5p core runs 32 of the 64 steps.
    assert two.time.steps_limited_by["overhead"] + two.time.steps_limited_by["compute"] + \
        two.time.steps_limited_by["dma"] == 64


def _kv_fetches_causal(n):
    """Per (batch, head): first fetch + sum_{i>=1} i forward moves + (n-2) returns to block 0 (see the test)."""
    return 1 + n * (n - 1) // 2 + max(n - 2, 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,seq,block", [(2, 512, 128), (3, 256, 128)])
def test_jax_flash_attention_traffic_and_block_skipping(causal, heads, seq, block):
    d = 128
    q = jax.ShapeDtypeStruct((1, heads, seq, d), jnp.bfloat16)
    sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
    kern = analyze(fa.flash_attention, q, q, q, chip="v5e", causal=causal, block_sizes=sizes).kernels[0]
    n = seq // block
    assert kern.grid == (1, heads, n, n)
    qo, k, v, o = kern.operands
    # q and o blocks depend on (b, h, qi) only: one fetch / write per q block.
    assert qo.transfers == heads * n and o.transfers == heads * n
    # Non-causal: the kv block index is the kv step, which changes every step (n > 1).
    # Causal: for skipped blocks the index map returns block 0, so per (b, h) the sequence is
    # q0: 0 0 .. 0 | q1: 0 1 0 .. | q2: 0 1 2 0 .. | ... | q_{n-1}: 0 1 .. n-1, giving
    # 1 + (1 + 2 + .. + n-1) forward moves + (n-2) returns to 0 fetches.
    expected = heads * (_kv_fetches_causal(n) if causal else n * n)
    assert k.transfers == v.transfers == expected
    assert k.hbm_bytes == expected * block * d * 2
    # MXU work: QK^T and PV, 2*2*block*block*d per computed block; causal computes n(n+1)/2 of n^2 blocks
    # (the skip is a pl.when on program ids, evaluated per step).
    blocks = n * (n + 1) // 2 if causal else n * n
    assert kern.work.mxu_useful_flops == heads * blocks * 4 * block * block * d


def test_jax_paged_attention_is_reported_as_manual_dma():
    q = jnp.ones((2, 8, 128), jnp.bfloat16)
    pages = jnp.ones((2, 32, 16, 128), jnp.bfloat16)
    lengths = jnp.array([100, 40], jnp.int32)
    table = jnp.arange(2 * 8, dtype=jnp.int32).reshape(2, 8)
    a = analyze(jax_paged_attention, q, pages, pages, lengths, table, chip="v5e", pages_per_compute_block=4)
    kern = a.kernels[0]
    assert kern.manual_dma
    assert kern.num_scalar_prefetch > 0
    hbm = [o for o in kern.operands if not o.pipelined]
    assert {o.memory_space for o in hbm} == {"any"}
    assert all(o.transfers == 0 for o in hbm)
    assert kern.work.manual_dma_bytes > 0
    assert any("manual DMA" in n for n in kern.notes)


def _gather_rows(table, x):
    """A kernel that copies row block table[i] of x to output block i (block index read from scalar prefetch)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(t_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    n = table.shape[0]
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(n,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, t: (t[i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0)),
    )
    return pl.pallas_call(body, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((8 * n, 128), x.dtype))(table, x)


def test_scalar_prefetch_index_maps_need_concrete_values():
    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    with pytest.raises(InputError, match="reads scalar-prefetch operand.*pass concrete arrays"):
        analyze(_gather_rows, jax.ShapeDtypeStruct((5,), jnp.int32), x)


def test_scalar_prefetch_values_drive_the_fetch_count():
    # Row blocks 3, 3, 0, 0, 3: fetched at steps 0, 2 and 4 -> 3 fetches of 8x128 f32 (4 KiB);
    # distinct blocks {3, 0} -> 8 KiB ideal.
    table = jnp.array([3, 3, 0, 0, 3], jnp.int32)
    kern = analyze(_gather_rows, table, jax.ShapeDtypeStruct((64, 128), jnp.float32)).kernels[0]
    x = kern.operands[0]
    assert (x.transfers, x.hbm_bytes, x.ideal_hbm_bytes) == (3, 3 * 4096, 2 * 4096)
    assert kern.num_scalar_prefetch == 1


def test_a_grid_with_an_empty_dimension_is_refused():
    # JAX's matmul takes grid (m // bm, n // bn, k // bk): 1000 // 1024 = 0, so the kernel runs no step.
    with pytest.raises(InputError, match=r"grid \(1, 0, .*\) has an empty dimension, so the kernel runs no step"):
        _mm(1000, 1000, 1000, 512, 1024, 1024, jnp.bfloat16)


def test_a_function_without_pallas_calls_says_so():
    a = analyze(lambda x: x @ x, jax.ShapeDtypeStruct((8, 8), jnp.float32))
    assert a.kernels == ()
    assert "no pallas_call" in a.notes[0]


def test_non_tpu_chip_is_rejected():
    with pytest.raises(InputError, match="--hw: h100-sxm is not a TPU"):
        _mm(256, 256, 256, 128, 128, 128, jnp.bfloat16, chip="h100-sxm")


def test_tracing_errors_name_the_function():
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    y = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    with pytest.raises(InputError, match="tracing matmul failed"):
        analyze(jmm.matmul, x, y, block_shape=(128, 128), block_k=128)


def test_ideal_bytes_sum_to_the_arrays_when_every_block_is_touched():
    kern = _mm(512, 256, 384, 128, 128, 128, jnp.bfloat16)
    assert kern.ideal_hbm_bytes == (512 * 256 + 256 * 384 + 512 * 384) * 2
    assert math.isclose(kern.operands[0].reread_factor, 384 / 128)  # x re-read once per column block


def test_perfmodel_analyze_is_the_library_entry_point():
    # The spelling, perfmodel.analyze(fn, *args), resolves lazily to the schedule model.
    import perfmodel

    assert perfmodel.analyze is analyze
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    a = perfmodel.analyze(jmm.matmul, x, x, block_shape=(128, 128), block_k=128)
    assert a.chip == "tpu-v5e" and a.kernels[0].grid == (2, 2, 2)


@pytest.mark.parametrize("lengths, pages_per_block", [([40, 300], 2), ([128, 7], 1)])
def test_jax_paged_attention_page_copies_equal_the_interpreter_run(v5e, lengths, pages_per_block):
    # JAX's paged attention carries a first-step flag and a buffer slot in scalar prefetch from grid step to
    # grid step: the first block is fetched only at the first step, every later block as the previous step's
    # prefetch. [40, 300] tokens, 16-token pages, 2 pages a block: 2 + 10 blocks = 24 pages per KV head for K
    # and for V; 24 x 2 heads x 2 x (16 x 128 x 4 B = 8 KiB) = 786,432 B.
    from perfmodel.schedule.extract import find_pallas_calls, trace
    from tests.schedule.recorder import record_traffic
    from perfmodel.schedule.analyze import analyze_call

    rng = np.random.default_rng(0)
    heads_kv, heads_q, dim, page, pages_per_seq = 2, 4, 128, 16, 32
    q = jnp.asarray(rng.standard_normal((2, heads_q, dim)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((heads_kv, 2 * pages_per_seq, page, dim)), jnp.float32) for _ in "kv")
    pages = jnp.asarray(rng.permutation(2 * pages_per_seq).reshape(2, pages_per_seq), jnp.int32)

    def fn(q, k, v, lengths, pages):
        return jax_paged_attention(q, k, v, lengths, pages, pages_per_compute_block=pages_per_block)

    args = (q, k, v, jnp.asarray(lengths, jnp.int32), pages)
    rec = record_traffic(fn, *args)
    [call] = find_pallas_calls(trace(fn, *args), args)
    kern = analyze_call(call, v5e, order=np.array(rec.grid_points))
    blocks = sum(math.ceil(math.ceil(n / page) / pages_per_block) for n in lengths)
    assert kern.work.manual_dma_bytes == rec.manual_hbm_bytes == blocks * pages_per_block * heads_kv * 2 * page * dim * 4
    assert not any("predicate depends on data" in n for n in kern.notes)


@pytest.mark.parametrize("b, h, s, d, causal", [(1, 2, 512, 128, True), (2, 1, 256, 64, False)])
def test_jax_flash_attention_block_fetches_equal_the_interpreter_run(v5e, b, h, s, d, causal):
    from perfmodel.schedule.analyze import analyze_call
    from perfmodel.schedule.extract import find_pallas_calls, trace
    from tests.schedule.recorder import record_traffic

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((b, h, s, d)), jnp.float32) for _ in range(3))
    sizes = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1, block_q_major_dkv=128,
                          block_k_major_dkv=128, block_k_dkv=128, block_q_dkv=128, block_k_major_dq=128,
                          block_k_dq=128, block_q_dq=128)

    def fn(q, k, v):
        return fa.flash_attention(q, k, v, causal=causal, block_sizes=sizes)

    rec = record_traffic(fn, q, k, v)
    [call] = find_pallas_calls(trace(fn, q, k, v), (q, k, v))
    kern = analyze_call(call, v5e, order=np.array(rec.grid_points))
    assert kern.steps == len(rec.grid_points) == b * h * (s // 128) ** 2
    for o in kern.operands:
        assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name), o.name
