"""The grouped matmul (mixture of experts) in interpret mode against its jnp reference: dtypes x shapes (aligned,
unaligned M/K/N), ragged group patterns (empty groups, one group holding every row, boundaries inside a row tile,
rows past the groups), the visit list and the step tables of both grid orders (column-major and row-major panels),
the traffic (an empty group's weights are never read; row-major reads each row tile once), races on two cores,
input errors, and the grouped GEMM op model it shares with the transformer's MoE terms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.grouped_matmul import GroupedMatmulBlockSizes, grouped_matmul, grouped_matmul_reference, visit_metadata
from kernels.grouped_matmul import kernel as gmm_kernel
from kernels.grouped_matmul.kernel import COMPUTE, NOOP, ZERO, num_visits, panel_columns, step_metadata
from kernels.quant import quantize_int8
from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.model.gemm import gemm, group_size_list, grouped_gemm, tile_visits, uniform_group_sizes

#: Small tiles: several row tiles, K blocks and column blocks on the small shapes.
SMALL = GroupedMatmulBlockSizes(bm=16, bk=128, bn=128)
#: By output dtype: bf16 carries one bf16 rounding (2^-8 relative) of O(1) values plus bf16 weights (int8 / fp8
#: codes convert exactly); f32 differs from the reference only by accumulation order.
TOL = {"bfloat16": dict(rtol=1.6e-2, atol=1.6e-2), "float32": dict(rtol=2e-5, atol=2e-5)}
#: (M, K, N): aligned to the tiles; nothing aligned (K = 300: three K blocks, the last of 44 columns; N = 200: a
#: partial column block; M = 100: a partial row tile). The aligned case is marked slow (the unaligned one covers
#: more of the kernel: the masked K block and the partial tiles).
SHAPES = [pytest.param((64, 256, 256), id="64x256x256", marks=pytest.mark.slow),
          pytest.param((100, 300, 200), id="100x300x200")]
#: (lhs dtype, rhs dtype, chip): float weights, int8 with per-channel scales, fp8 where the chip has an fp8 MXU path.
DTYPES = [
    pytest.param(("float32", "float32", "tpu-v5e"), id="f32"),
    pytest.param(("bfloat16", "bfloat16", "tpu-v5e"), id="bf16"),
    pytest.param(("bfloat16", "int8", "tpu-v5e"), id="bf16xint8"),
    pytest.param(("float32", "int8", "tpu-v5e"), id="f32xint8"),
    pytest.param(("bfloat16", "float8_e4m3fn", "tpu-v6e"), id="bf16xfp8"),
]


def _operands(m: int, k: int, n: int, groups: int, rhs_dtype: str, lhs_dtype: str = "float32", seed: int = 0):
    """(lhs, rhs, rhs_scale): normal lhs, weights of std 1/sqrt(K) (outputs O(1)); int8 quantized per channel,
    fp8 cast with no scale."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(k1, (m, k), jnp.float32).astype(lhs_dtype)
    w = jax.random.normal(k2, (groups, k, n), jnp.float32) / np.sqrt(k)
    if rhs_dtype == "int8":
        q, s = quantize_int8(w, axis=1)  # per (group, output channel) over K
        return lhs, q, s[:, 0, :]
    return lhs, w.astype(rhs_dtype), None


def _check(out: jax.Array, ref: jax.Array) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
    assert np.isfinite(out32).all()  # interpret mode fills unwritten output with NaN
    np.testing.assert_allclose(out32, ref32, **TOL[jnp.dtype(out.dtype).name])


def _run(lhs, rhs, sizes, scale=None, blocks=SMALL, chip="tpu-v5e"):
    gs = jnp.asarray(sizes, jnp.int32)
    out = grouped_matmul(lhs=lhs, rhs=rhs, group_sizes=gs, rhs_scale=scale, block_sizes=blocks, chip=chip,
                         interpret=True)
    return out, grouped_matmul_reference(lhs, rhs, gs, rhs_scale=scale)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtypes", DTYPES)
def test_matches_the_reference(dtypes, shape):
    lhs_dtype, rhs_dtype, chip = dtypes
    m, k, n = shape
    lhs, rhs, scale = _operands(m, k, n, 4, rhs_dtype, lhs_dtype)
    # Uneven groups whose boundaries fall inside 16-row tiles (rows 0-22, 23-29, 30-60, 61-M).
    out, ref = _run(lhs, rhs, [23, 7, 31, m - 61], scale, chip=chip)
    _check(out, ref)


#: Group patterns over M = 100 rows of 16-row tiles (the last partial).
PATTERNS = [
    pytest.param([0, 40, 0, 60], id="empty-groups"),
    pytest.param([0, 0, 100, 0], id="one-group-holds-all"),
    pytest.param([1, 2, 3, 94], id="boundaries-in-one-tile"),
    pytest.param([5, 0, 20, 15], id="rows-past-the-groups"),  # rows 40-99 come out as zeros
    pytest.param([0, 0, 0, 0], id="all-empty"),
]


@pytest.mark.parametrize("sizes", PATTERNS)
def test_group_patterns(sizes):
    lhs, rhs, _ = _operands(100, 300, 200, 4, "float32")
    out, ref = _run(lhs, rhs, sizes)
    _check(out, ref)
    assert not np.asarray(out[sum(sizes):]).any()  # rows past the groups are zeros


def test_default_blocks_clamp_to_a_tiny_problem():
    # The chip's default blocks (or the fallback) clamp to M=24 -> bm 32 (bf16 sublane tile 16), K, N -> 128.
    lhs, rhs, _ = _operands(24, 72, 40, 3, "bfloat16", "bfloat16")
    gs = jnp.asarray([10, 0, 14], jnp.int32)
    out = grouped_matmul(lhs=lhs, rhs=rhs, group_sizes=gs, interpret=True)
    _check(out, grouped_matmul_reference(lhs, rhs, gs))


def test_decode_rows_take_the_decode_defaults():
    # At most 64 rows (all groups together) take the "<pair> decode" entry, more the large problem's.
    from kernels.grouped_matmul.blocks import default_block_sizes, default_block_table

    table = default_block_table()["tpu-v5e"]
    assert default_block_sizes("tpu-v5e", "bf16", "int8", m=64) == table["bf16 x int8 decode"]
    assert default_block_sizes("tpu-v5e", "bf16", "int8", m=65) == table["bf16 x int8"]
    assert default_block_sizes("tpu-v5e", "bf16", "bf16") == table["bf16 x bf16"]


def test_visit_list_hand_worked():
    # Sizes 3, 0, 5, 2 over M = 16 rows of 4-row tiles: group 0 rows 0-2 (tile 0), group 2 rows 3-7 (tiles 0, 1),
    # group 3 rows 8-9 (tile 2); tile 3 (rows 12-15) is past the groups: one zero visit. The list has room for
    # 4 tiles + 4 groups - 1 = 7 visits: 4 compute, 1 zero (the 5 the grid runs), 2 no-ops on the last tile.
    meta = {k: np.asarray(v) for k, v in visit_metadata(jnp.asarray([3, 0, 5, 2], jnp.int32), m=16, bm=4).items()}
    assert num_visits(16, 4, 4) == 7
    assert meta["mode"].tolist() == [COMPUTE] * 4 + [ZERO] + [NOOP] * 2
    assert meta["group"].tolist() == [0, 2, 2, 3, 3, 3, 3]  # zero / no-op visits keep the last group (no re-fetch)
    assert meta["lhs_tile"].tolist() == [0, 0, 1, 2, 2, 2, 2]
    assert meta["out_tile"].tolist() == [0, 0, 1, 2, 3, 3, 3]
    assert meta["bounds"].tolist() == [0, 3, 3, 8, 10]
    assert int(meta["used"]) == 5
    assert tile_visits([3, 0, 5, 2], 4) == 4  # the op model counts the same compute visits


def test_step_tables_hand_worked():
    # The visits of test_visit_list_hand_worked in panels of 2 column blocks: row tile by row tile, column by
    # column over the tile's visits. Tile 0 (visits 0 and 1, groups 0 and 2): (col 0: v0, v1), (col 1: v0, v1);
    # tile 1 (v2): cols 0, 1; tile 2 (v3): cols 0, 1; tile 3 (zero visit v4): cols 0, 1 -> 10 steps run; the
    # table has room for 2 x 7 = 14, the 4 past them no-ops on the last visit (group 3, tiles 2 / 3) and column.
    meta = visit_metadata(jnp.asarray([3, 0, 5, 2], jnp.int32), m=16, bm=4)
    steps = {k: np.asarray(v) for k, v in step_metadata(meta, cols=2).items()}
    assert int(steps["used"]) == 10
    assert steps["group"].tolist() == [0, 2, 0, 2, 2, 2, 3, 3, 3, 3] + [3] * 4
    assert steps["col"].tolist() == [0, 0, 1, 1, 0, 1, 0, 1, 0, 1] + [1] * 4
    assert steps["out_tile"].tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3] + [3] * 4
    assert steps["lhs_tile"].tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2] + [2] * 4
    assert steps["mode"].tolist() == [COMPUTE] * 8 + [ZERO] * 2 + [NOOP] * 4
    # One column block per panel: the visit list itself.
    one = step_metadata(meta, cols=1)
    assert all(np.array_equal(np.asarray(one[k]), np.asarray(meta[k])) for k in meta)
    assert not np.asarray(one["col"]).any()


@pytest.mark.parametrize("cols", [1, 2])
@pytest.mark.parametrize("sizes", [[23, 7, 31, 39], [1, 2, 3, 94], [5, 0, 20, 15], [0, 0, 0, 0]])
def test_both_orders_match_the_reference(monkeypatch, sizes, cols):
    # N = 300 over 128-column blocks: 3 column blocks, so panels of 2 leave the last panel a tail of one block;
    # panels of 1 are column-major (the small shapes above go row-major: panel_columns). Straddled tiles, empty
    # groups and rows past the groups in each order.
    monkeypatch.setattr(gmm_kernel, "panel_columns", lambda *a, **kw: cols)
    lhs, rhs, _ = _operands(100, 300, 300, 4, "float32")
    out, ref = _run(lhs, rhs, sizes)
    _check(out, ref)


def test_row_major_panels_have_no_dma_races(monkeypatch):
    # TPU interpret mode with race detection on two cores: 3 column blocks in panels of 2 (the "parallel" axis
    # gives each core a panel; the second panel's tail steps stay on its last block), straddled tiles, an empty
    # group and rows past the groups (a shape no other test uses, so nothing compiled without it is reused).
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as tpu_interpret
    from jax.experimental.pallas import tpu as pltpu

    params = pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)
    monkeypatch.setattr(gmm_kernel, "interpret_params", lambda interpret: params if interpret else False)
    monkeypatch.setattr(gmm_kernel, "panel_columns", lambda *a, **kw: 2)
    lhs, rhs, _ = _operands(72, 200, 384, 3, "float32", seed=3)
    out, ref = _run(lhs, rhs, [20, 0, 37])
    assert tpu_interpret.races is not None and not tpu_interpret.races.races_found
    _check(out, ref)


def test_panel_columns_pick_the_order_with_fewer_bytes():
    # 8 groups x 1024 rows, K = 4096, N = 14336 bf16 at bm=1024, bn=2048 (7 column blocks), 8 visits. bk = 2048:
    # column-major reads the lhs 7 x 64 MiB and the weights once per visit (8 x 112 MiB); row-major the lhs once
    # (one core) or twice (v5p's two cores, panels of 4 blocks) and the same weights: row-major.
    shape = dict(m=8192, k=4096, n=14336, groups=8, lhs_itemsize=2, rhs_itemsize=2)
    blocks = GroupedMatmulBlockSizes(bm=1024, bk=2048, bn=2048)
    assert panel_columns(get_chip("tpu-v6e"), blocks=blocks, **shape) == 7
    assert panel_columns(get_chip("tpu-v5p"), blocks=blocks, **shape) == 4
    # bm = 512, bk = K (16 visits): column-major reads each group's weights once (its two tiles' visits are
    # consecutive and share the block), row-major once per visit: row-major would save 6 x 64 MiB of lhs reads
    # and read 8 x 112 MiB more weights: column-major.
    assert panel_columns(get_chip("tpu-v6e"), blocks=GroupedMatmulBlockSizes(bm=512, bk=4096, bn=2048), **shape) == 1
    # One column block: nothing to order.
    assert panel_columns(get_chip("tpu-v6e"), blocks=GroupedMatmulBlockSizes(bm=1024, bk=2048, bn=14336),
                         **shape) == 1


def test_row_major_reads_each_row_tile_once():
    # M = 64 rows in 2 tiles of 32, K = 256 (2 K blocks), N = 512 (4 column blocks), groups of 32 rows: row-major
    # keeps each tile's [32, 256] f32 rows resident and reads them once (2 x 32 KiB), where column-major would
    # read them once per column block (4x).
    from tests.schedule.recorder import record_traffic

    lhs, rhs, _ = _operands(64, 256, 512, 2, "float32")
    gs = jnp.asarray([32, 32], jnp.int32)
    blocks = GroupedMatmulBlockSizes(bm=32, bk=128, bn=128)
    assert panel_columns(get_chip("tpu-v5e"), m=64, k=256, n=512, groups=2, blocks=blocks, lhs_itemsize=4,
                         rhs_itemsize=4) == 4
    rec = record_traffic(lambda a, b, c: grouped_matmul(lhs=a, rhs=b, group_sizes=c, block_sizes=blocks, chip="tpu-v5e"), lhs, rhs, gs)
    lhs_reads = [t for t in rec.transfers if t.role == "input" and "lhs" in t.name]
    assert sum(t.nbytes for t in lhs_reads) == 64 * 256 * 4
    np.testing.assert_allclose(np.asarray(rec.outputs), np.asarray(grouped_matmul_reference(lhs, rhs, gs)),
                               **TOL["float32"])


@pytest.mark.parametrize("sizes", [[23, 7, 31, 39], [0, 0, 100, 0], [1, 2, 3, 94], [0, 0, 0, 5]])
def test_op_model_counts_the_kernels_visits(sizes):
    meta = visit_metadata(jnp.asarray(sizes, jnp.int32), m=100, bm=16)
    assert int(np.sum(np.asarray(meta["mode"]) == COMPUTE)) == tile_visits(sizes, 16)


def test_weights_of_an_empty_group_are_never_read():
    # M = 64 rows in one 64-row tile, K = 256 (2 K blocks), N = 256 (2 column blocks), groups 1 and 3 empty:
    # each column block visits groups 0 and 2 once each, so rhs blocks (group, kk, j) are read once for groups
    # 0 and 2 and never for 1 and 3 (2 groups x 2 x 2 blocks of 128 x 128 f32 = 8 x 64 KiB).
    from tests.schedule.recorder import record_traffic

    lhs, rhs, _ = _operands(64, 256, 256, 4, "float32")
    gs = jnp.asarray([30, 0, 34, 0], jnp.int32)
    blocks = GroupedMatmulBlockSizes(bm=64, bk=128, bn=128)
    rec = record_traffic(lambda a, b, c: grouped_matmul(lhs=a, rhs=b, group_sizes=c, block_sizes=blocks, chip="tpu-v5e"), lhs, rhs, gs)
    rhs_reads = [t for t in rec.transfers if t.role == "input" and "rhs" in t.name]
    assert sorted({t.block_indices for t in rhs_reads}) == [(g, kk, j) for g in (0, 2) for kk in (0, 1) for j in (0, 1)]
    assert sum(t.nbytes for t in rhs_reads) == 8 * 128 * 128 * 4
    np.testing.assert_allclose(np.asarray(rec.outputs), np.asarray(grouped_matmul_reference(lhs, rhs, gs)),
                               **TOL["float32"])


# ----------------------------------------------------------------------------- input errors


def _args(**over):
    lhs, rhs, scale = _operands(32, 128, 128, 2, "int8")
    args = dict(lhs=lhs, rhs=rhs, group_sizes=jnp.asarray([16, 16], jnp.int32), rhs_scale=scale)
    args.update(over)
    return args


@pytest.mark.parametrize("over, match", [
    (dict(group_sizes=jnp.asarray([20, 16], jnp.int32)), r"group_sizes: they sum to 36 rows but lhs has M=32"),
    (dict(group_sizes=jnp.asarray([-1, 16], jnp.int32)), r"group_sizes: sizes must be >= 0, got -1 at group 0"),
    (dict(group_sizes=jnp.asarray([16, 16], jnp.int64 if jax.config.jax_enable_x64 else jnp.float32)),
     r"group_sizes: expected a 1-D int32 array"),
    (dict(group_sizes=jnp.asarray([[16, 16]], jnp.int32)), r"group_sizes: expected a 1-D int32 array"),
    (dict(group_sizes=jnp.asarray([16, 8, 8], jnp.int32)), r"group_sizes: 3 groups but rhs holds 2"),
    (dict(lhs=jnp.zeros((32,), jnp.float32)), r"lhs: expected a 2-D \[M, K\] array"),
    (dict(rhs=jnp.zeros((128, 128), jnp.int8)), r"rhs: expected a 3-D \[G, K, N\] array"),
    (dict(rhs=jnp.zeros((2, 64, 128), jnp.int8)), r"rhs: shape \(2, 64, 128\) does not match lhs's K=128"),
    (dict(lhs=jnp.zeros((32, 128), jnp.int8)), r"lhs: dtype int8 not supported"),
    (dict(rhs=jnp.zeros((2, 128, 128), jnp.bfloat16), rhs_scale=None), r"rhs: dtype bfloat16 must match lhs \(float32\)"),
    (dict(rhs_scale=None), r"rhs_scale: int8 weights need per-channel scales"),
    (dict(rhs=jnp.zeros((2, 128, 128), jnp.float32)), r"rhs_scale: only int8 / fp8 weights take scales"),
    (dict(rhs_scale=jnp.ones((128,), jnp.float32)), r"rhs_scale: expected a float array of shape \(2, 128\)"),
    (dict(rhs=jnp.zeros((2, 128, 128), jnp.float8_e4m3fn), rhs_scale=None), r"rhs: float8_e4m3fn weights need an fp8 MXU"),
    (dict(block_sizes=(16, 128, 128)), r"block_sizes: expected a GroupedMatmulBlockSizes"),
    (dict(out_dtype=jnp.int8), r"out_dtype: int8 not supported"),
    (dict(block_sizes=GroupedMatmulBlockSizes(bm=8, bk=128, bn=128), lhs=jnp.zeros((32, 128), jnp.bfloat16),
          rhs=jnp.zeros((2, 128, 128), jnp.bfloat16), rhs_scale=None), r"block_sizes.bm=8 must be a multiple of 16"),
    (dict(block_sizes=GroupedMatmulBlockSizes(bm=8192, bk=8192, bn=8192),
          lhs=jax.ShapeDtypeStruct((8192, 8192), jnp.float32), rhs=jax.ShapeDtypeStruct((2, 8192, 8192), jnp.int8),
          rhs_scale=jax.ShapeDtypeStruct((2, 8192), jnp.float32)),
     r"block_sizes \(bm=8192,bk=8192,bn=8192\) need .* of VMEM but tpu-v5e has 128 MiB per core"),
])
def test_input_errors(over, match):
    with pytest.raises(ValueError, match=match):
        grouped_matmul(**_args(**over), interpret=True)


@pytest.mark.parametrize("field, value, match", [
    ("bm", 12, r"block_sizes.bm=12 must be a multiple of 8"),
    ("bk", 100, r"block_sizes.bk=100 must be a multiple of 128"),
    ("bn", 0, r"block_sizes.bn=0 must be a positive int"),
])
def test_block_sizes_check_themselves(field, value, match):
    with pytest.raises(ValueError, match=match):
        GroupedMatmulBlockSizes(**{"bm": 16, "bk": 128, "bn": 128, field: value})


# ----------------------------------------------------------------------------- the grouped GEMM op model


def test_grouped_gemm_hand_worked():
    # Sizes 3, 0, 5 (M = 8), K = 256, N = 128, bf16, chip=None (the CostEstimate's counts):
    # useful 2 * 8 * 128 * 256 = 524,288 FLOPs; reads: lhs 8 * 256 * 2 B = 4,096 + the 2 touched groups' weights
    # 2 * 256 * 128 * 2 B = 131,072 (the empty group's are not read) = 135,168 B; writes 8 * 128 * 2 B = 2,048 B.
    cost = grouped_gemm(group_sizes=[3, 0, 5], n=128, k=256)
    assert cost.useful_flops == 524_288
    assert (cost.hbm_read_bytes, cost.hbm_write_bytes) == (135_168, 2_048)
    # With 16-row tiles on v5e (MXU 128): rows 0-2 and 3-7 share tile 0, computed once per group: 2 visits of
    # 16 rows issued, 2 * 32 * 128 * 256 = 2,097,152 FLOPs.
    tiled = grouped_gemm(group_sizes=[3, 0, 5], n=128, k=256, block_m=16, chip=get_chip("tpu-v5e"))
    assert tiled.mxu_flops == 2_097_152 and tiled.useful_flops == 524_288
    # 8 rows of lhs / out of which only 5 are grouped: the other 3 rows are written as zeros (+3 * 128 * 2 B).
    assert grouped_gemm(group_sizes=[0, 5], n=128, k=256, m=8).hbm_write_bytes == 8 * 128 * 2


def test_grouped_gemm_is_a_gemm_per_group_size():
    # Groups of 3, 3 and 2 rows: a batch of two 3-row GEMMs plus one 2-row GEMM, on a chip (padding counted).
    v5e = get_chip("tpu-v5e")
    cost = grouped_gemm(group_sizes=[3, 2, 3], n=512, k=1024, rhs_dtype="int8", chip=v5e)
    parts = [gemm(m=3, n=512, k=1024, batch=2, rhs_dtype="int8", chip=v5e),
             gemm(m=2, n=512, k=1024, rhs_dtype="int8", chip=v5e)]
    for field in ("mxu_flops", "useful_flops", "vpu_ops", "serial_vpu_ops", "hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(cost, field) == sum(getattr(p, field) for p in parts), field
    assert cost.launches == 1  # one kernel


def test_transformer_moe_terms_are_the_grouped_gemm():
    import perfmodel.model.transformer as tf
    from perfmodel.model.step import make_step

    r = tf.routing(64, 8, 2)  # 128 assignments over 8 touched experts: 16 each
    step = make_step(phase="decode", batch=64, context=1024)
    cost = tf._expert_gemm("experts_down", r, n=4096, k=14336, step=step, chip=None)
    ref = grouped_gemm(group_sizes=[16] * 8, n=4096, k=14336, lhs_dtype=step.act_dtype, rhs_dtype=step.weight_dtype,
                       out_dtype=step.act_dtype)
    assert (cost.hbm_bytes, cost.mxu_flops, cost.vpu_ops) == (ref.hbm_bytes, ref.mxu_flops, ref.vpu_ops)


def test_group_size_helpers():
    assert uniform_group_sizes(10, 4) == (3, 3, 2, 2)  # 10 = 4 * 2 + 2: two groups get one more
    assert group_size_list("3,0,5").tolist() == [3, 0, 5]
    with pytest.raises(InputError, match=r"`group_sizes`: expected comma-separated whole numbers"):
        group_size_list("3,x")
    with pytest.raises(InputError, match=r"`group_sizes`: every group is empty"):
        group_size_list([0, 0])
    with pytest.raises(InputError, match=r"`group_sizes` sum to 8 rows, more than `m`=4"):
        grouped_gemm(group_sizes=[3, 5], n=128, k=128, m=4)
