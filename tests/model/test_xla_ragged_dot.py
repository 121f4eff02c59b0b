"""The tiles of XLA's ragged-dot kernel (perfmodel.model.xla_ragged_dot) against the tiles libtpu 0.0.42.1 chose
in deviceless compiles (the ``ragged_dot_tiling`` attribute of the compiled HLO; tests/compiler checks a few live)."""

import pytest

from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.model.gemm import grouped_gemm
from perfmodel.model.xla_ragged_dot import xla_ragged_dot_tiling

# (chip, m, k, n, out bytes) -> (tile_m, tile_k, tile_n) as compiled.
COMPILED = [
    ("tpu-7x", 262144, 256, 7168, 4, (256, 256, 4608)),
    ("tpu-7x", 262144, 256, 7168, 2, (256, 256, 5888)),
    ("tpu-7x", 131072, 1024, 7168, 4, (256, 1024, 2816)),
    ("tpu-7x", 131072, 7168, 1024, 4, (256, 7168, 512)),
    ("tpu-7x", 327680, 2880, 2880, 4, (256, 2880, 1280)),
    ("tpu-7x", 131072, 4096, 1536, 4, (256, 4096, 768)),
    ("tpu-7x", 393216, 768, 2048, 4, (256, 768, 2048)),  # all of N fits
    ("tpu-7x", 8192, 16384, 4096, 4, (256, 11520, 256)),  # K split: not even one 256-wide column tile fits
    ("tpu-v6e", 8192, 512, 16384, 4, (256, 512, 3840)),
    ("tpu-v5e", 131072, 7168, 1024, 4, (128, 7168, 128)),
    ("tpu-v5e", 131072, 512, 7168, 4, (128, 512, 1920)),
    ("tpu-v5e", 131072, 1024, 7168, 4, (128, 1024, 1152)),
    ("tpu-v5e", 8, 4096, 4096, 4, (8, 4096, 384)),  # eight rows: an eight-row tile
    ("tpu-v5e", 64, 4096, 4096, 4, (64, 4096, 384)),
    ("tpu-v5e", 8192, 16384, 4096, 4, (128, 7808, 128)),
    ("tpu-v5p", 8192, 2048, 16384, 4, (128, 2048, 640)),
    ("tpu-v4", 8192, 512, 16384, 4, (128, 512, 1920)),
]


@pytest.mark.parametrize("chip,m,k,n,out_b,tiles", COMPILED)
def test_tiles_are_the_compilers(chip, m, k, n, out_b, tiles):
    t = xla_ragged_dot_tiling(get_chip(chip), m=m, k=k, n=n, lhs_itemsize=2, rhs_itemsize=2, out_itemsize=out_b)
    assert (t.tile_m, t.tile_k, t.tile_n) == tiles
    assert t.n_tiles == -(-n // tiles[2]) and t.k_tiles == -(-k // tiles[1])


def test_the_widest_tile_stays_strictly_under_the_budget():
    # 7x, K = 256, f32 out: 4864 columns would take 2*256*256*2 + 2*256*4864*2 + 256*4864*(2*4 + 8) bytes =
    # 262,144 + 4,980,736 + 19,922,944 = 25,165,824 = exactly 24 MiB (32 MiB scoped less 8): not taken.
    t = xla_ragged_dot_tiling(get_chip("tpu-7x"), m=262144, k=256, n=7168, lhs_itemsize=2, rhs_itemsize=2,
                              out_itemsize=4)
    assert t.tile_n == 4864 - 256


@pytest.mark.parametrize("chip", ["h100-sxm", "tpu-v3"])
def test_no_tiles_without_a_scoped_vmem_limit(chip):
    assert xla_ragged_dot_tiling(get_chip(chip), m=512, k=512, n=512, lhs_itemsize=2, rhs_itemsize=2,
                                 out_itemsize=2) is None


def test_xla_grouped_gemm_issues_every_visit_at_full_tile_width():
    # v5e, 3 groups of 100, 0 and 156 rows (256 rows), K = 512, N = 7168, bf16 out. Tiles (128, 512, 2176):
    # 2*128*512*2 + 2*512*2176*2 + 128*2176*(2*2 + 8) = 262,144 + 4,456,448 + 3,342,336 = 8,060,928 bytes
    # < 8 MiB, 2304 would not fit; 4 column tiles (8704 columns). Row-tile visits: rows 0-99 in tile 0, rows
    # 100-255 in tiles 0 and 1: 3 visits. MXU: 3 x 128 rows x 8704 x 512 x 2 = 3.42 GFLOP. lhs (256 x 512 x 2 B)
    # is read once per column tile: 4 x 262,144 B, the weights of the two used groups once: 2 x 512 x 7168 x 2 B.
    chip = get_chip("tpu-v5e")
    c = grouped_gemm(group_sizes="100,0,156", k=512, n=7168, implementation="xla", chip=chip)
    assert (c.metrics["tile_m"], c.metrics["tile_k"], c.metrics["tile_n"]) == (128, 512, 2176)
    assert c.metrics["grid_steps"] == 3 * 4
    assert float(c.mxu_flops) == 3 * 128 * 8704 * 512 * 2
    assert float(c.hbm_read_bytes) == 4 * 256 * 512 * 2 + 2 * 512 * 7168 * 2
    kernel = grouped_gemm(group_sizes="100,0,156", k=512, n=7168, chip=chip)
    assert float(kernel.hbm_read_bytes) == 256 * 512 * 2 + 2 * 512 * 7168 * 2
    assert float(kernel.mxu_flops) < float(c.mxu_flops)


def test_xla_grouped_gemm_without_a_kernel_model_says_so():
    c = grouped_gemm(group_sizes="128,128", k=512, n=512, implementation="xla", chip=get_chip("h100-sxm"))
    assert any("no model of XLA's ragged-dot kernel" in n for n in c.notes)


def test_xla_grouped_gemm_refuses_a_row_tile():
    with pytest.raises(InputError, match="XLA picks its own tiles"):
        grouped_gemm(group_sizes="128,128", k=512, n=512, implementation="xla", block_m=64,
                     chip=get_chip("tpu-v5e"))


# ----------------------------------------------------------------------------- the ragged contraction


def test_ragged_contraction_kernel_is_one_gemm_per_group():
    from perfmodel.model.gemm import gemm

    # Groups of 128, 0, 128 and 256 rows of the contraction, [256 x rows] @ [rows x 1024] each: two GEMMs of
    # K = 128 and one of K = 256, 2 x 256 x 1024 x 512 rows = 268,435,456 FLOPs; the empty group costs nothing.
    cost = grouped_gemm(group_sizes=[128, 0, 128, 256], m=256, n=1024, ragged="contraction")
    parts = [gemm(m=256, n=1024, k=128, batch=2), gemm(m=256, n=1024, k=256)]
    assert cost.useful_flops == 268_435_456
    for field in ("mxu_flops", "hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(cost, field) == sum(getattr(p, field) for p in parts)
    assert cost.serial_hbm_bytes == 0


@pytest.mark.parametrize("chip_name", ["tpu-7x/core", "tpu-v5e"])
@pytest.mark.parametrize("n", [512, 1536, 7168])
def test_ragged_contraction_xla_adds_its_output_write_to_its_mxu_work(chip_name, n):
    from perfmodel.model.core import evaluate
    from perfmodel.model.efficiency import unit_shares

    chip = get_chip(chip_name)
    g, m, rows = 8, 1024, 65536
    cost = grouped_gemm(group_sizes=[rows // g] * g, m=m, n=n, out_dtype="fp32", implementation="xla",
                        ragged="contraction", chip=chip)
    # The MXU work at 0.247 + 4.05e-5 x n of the bf16 peak (2 x 1024 x n x 65536 FLOPs), then all 8 groups'
    # f32 [1024 x n] outputs written alone at the achievable HBM rate; the inputs' reads (65536 x (1024 + n)
    # x 2 B) are under the MXU work.
    share = 0.247 + 4.05e-5 * n
    peak = chip.compute.matmul_flops_per_s_per_chip["bf16"]
    out = g * m * n * 4
    hbm_rate = chip.memory.hbm_bw_bytes_per_s_per_chip * unit_shares(chip, "bf16")["hbm"]
    assert cost.hbm_write_bytes == cost.serial_hbm_bytes == out
    assert cost.hbm_read_bytes == rows * (m + n) * 2
    r = evaluate(cost, chip)
    mxu = 2 * m * n * rows / (peak * share)
    assert mxu > rows * (m + n) * 2 / hbm_rate  # the reads hide under the MXU work
    fixed = sum(v for k, v in r.fixed_parts_s.items() if k != "serial_hbm")
    assert r.fixed_parts_s["serial_hbm"] == pytest.approx(out / hbm_rate)
    assert r.expected_s == pytest.approx(mxu + out / hbm_rate + fixed, rel=1e-9)
    assert r.floor_s == pytest.approx(max(2 * m * n * rows / peak, (out + cost.hbm_read_bytes)
                                          / chip.memory.hbm_bw_bytes_per_s_per_chip))


def test_ragged_contraction_xla_on_a_gpu_is_priced_as_a_kernel():
    chip = get_chip("h100-sxm")
    xla = grouped_gemm(group_sizes=[64, 64], m=256, n=256, implementation="xla", ragged="contraction", chip=chip)
    kernel = grouped_gemm(group_sizes=[64, 64], m=256, n=256, ragged="contraction", chip=chip)
    assert xla.mxu_flops == kernel.mxu_flops and xla.serial_hbm_bytes == 0
    assert any("modelled on TPUs only" in note for note in xla.notes)


@pytest.mark.parametrize("kwargs, match", [
    ({"ragged": "cols"}, r"`ragged` 'cols': one of rows .*, contraction"),
    ({"ragged": "contraction", "block_m": 128}, "`block_m` is a row tile of the rows-ragged form"),
    ({"ragged": "contraction", "m": None}, r"`m`: with `ragged` contraction, the rows of each group's"),
    ({"ragged": "contraction", "k": 100}, "`group_sizes` sum to 128 rows of the contraction, more than `k`=100"),
    ({"ragged": "contraction", "group_sizes": [0, 0]}, "every group is empty"),
    ({"ragged": "rows", "k": None}, "`k`: the contraction of every group's GEMM"),
])
def test_ragged_contraction_errors(kwargs, match):
    args = {"group_sizes": [64, 64], "m": 256, "n": 256, "k": 128, **kwargs}
    with pytest.raises(InputError, match=match):
        grouped_gemm(**args)


def test_predict_gemm_groups_split_k_with_ragged_contraction():
    from perfmodel.predict.ops import predict_op

    chip = get_chip("tpu-v5e")
    with pytest.raises(InputError, match=r"`groups` splits `k` evenly: give `k` \(or `group_sizes`\)"):
        predict_op("gemm", {"m": 512, "n": 1024, "groups": 4, "ragged": "contraction"}, chips=[chip])
    (pred,) = predict_op("gemm", {"m": 512, "n": 1024, "k": 4096, "groups": 4, "ragged": "contraction"},
                         chips=[chip]).predictions
    assert pred.roofline.cost.metrics["groups"] == 4  # 4 groups of 1024 rows of the contraction
    assert pred.roofline.cost.useful_flops == 2 * 512 * 1024 * 4096
