"""Fixed costs (launch, DMA latency, per-row gather issue), efficiency ramps and serial dequantization."""

import dataclasses

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.model.core import evaluate, launch_overhead_s
from perfmodel.model.efficiency import contraction_ramp, wave_efficiency
from perfmodel.model.gemm import gemm
from perfmodel.model.memops import copy, gather

TPUS = ["tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x"]
GPUS = ["a100-sxm-80gb", "b200", "h100-sxm", "h200-sxm", "mi300x"]
OVERHEADS = ("op_launch_s", "pallas_call_launch_s", "host_dispatch_s", "dma_latency_s", "pallas_grid_step_overhead_s")


def test_copy_hand_worked_on_v5e(v5e, rtol):
    r = evaluate(copy(array_elements=1024 * 1024, dtype="bf16", chip=v5e), v5e)
    # 2 MiB read + 2 MiB written = 4,194,304 B at 819 GB/s = 5.121 us: the floor has no fixed cost
    assert r.floor_s == pytest.approx(4194304 / 819e9, rel=rtol["time"])
    # expected: 5.121 us / 0.85 + 1 us launch + 2 x 0.255 us DMA latency = 6.025 + 1.51 = 7.535 us
    assert r.expected_s == pytest.approx(4194304 / 819e9 / 0.85 + 1e-6 + 2 * 2.55e-7, rel=rtol["time"])
    assert r.fixed_parts_s == pytest.approx({"launch": 1e-6, "dma_latency": 5.1e-7, "op": 0.0, "serial_vpu": 0.0,
                                             "serial_hbm": 0.0})
    # host dispatch is reported apart: 7.535 us + 107 us
    assert r.expected_with_dispatch_s == pytest.approx(r.expected_s + 1.07e-4, rel=rtol["time"])


def test_a_2mib_copy_is_far_from_peak_bandwidth(v5e):
    # 1 MiB in + 1 MiB out: 2.56 us of traffic at peak, 1.51 us of fixed costs on top of it at 85%
    r = evaluate(copy(array_bytes=2**20, chip=v5e), v5e)
    assert 2 * 2**20 / r.expected_s < 0.6 * v5e.memory.hbm_bw_bytes_per_s_per_chip


def test_launches_never_touch_the_floor(v5e):
    cost = gemm(m=64, n=4096, k=4096, chip=v5e)
    bare = dataclasses.replace(cost, launches=0)
    assert evaluate(cost, v5e).floor_s == evaluate(bare, v5e).floor_s
    assert evaluate(cost, v5e).expected_s > evaluate(bare, v5e).expected_s


def test_gpu_kernel_pays_the_op_launch_for_pallas_too():
    h100 = get_chip("h100-sxm")
    # no pallas_call figure on a GPU: a kernel is a kernel
    assert launch_overhead_s(h100, "pallas") == launch_overhead_s(h100, "xla") == 2e-6


def test_unknown_launch_kind_is_an_error(v5e):
    with pytest.raises(InputError, match="`launch_kind` 'cuda'"):
        launch_overhead_s(v5e, "cuda")


def test_gather_is_bound_by_rows_on_one_7x_core(rtol):
    core = get_chip("tpu-7x/core")
    r = evaluate(gather(rows=4096, row_elements=128, dtype="int32", chip=core), core)
    # 4096 rows x 7.25 cycles / 1.9e9 Hz / 1 core = 15.6 us of row issue, in expected only
    assert r.fixed_parts_s["op"] == pytest.approx(4096 * 7.25 / 1.9e9, rel=rtol["time"])
    # bytes: 4096 x (512 + 4 index) read, 4096 x 512 written
    assert r.cost.hbm_read_bytes == 4096 * 516 and r.cost.hbm_write_bytes == 4096 * 512
    # the whole chip spreads the rows over its two TensorCores
    chip = get_chip("tpu-7x")
    assert evaluate(gather(rows=4096, row_elements=128, dtype="int32", chip=chip), chip).fixed_parts_s["op"] == \
        pytest.approx(r.fixed_parts_s["op"] / 2, rel=rtol["time"])


def test_gpu_gather_reads_whole_sectors():
    h100 = get_chip("h100-sxm")
    # a 40-byte row reads two 32-byte sectors (64 B) plus its 4-byte index; no per-row issue cost on a GPU
    cost = gather(rows=10, row_bytes=40, chip=h100)
    assert cost.hbm_read_bytes == 10 * (64 + 4) and cost.fixed_s == 0


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(array_bytes=10, array_elements=5), "exactly one of `array_bytes` and `array_elements`"),
    (dict(), "exactly one of `array_bytes` and `array_elements`"),
    (dict(array_bytes=-1), "`array_bytes` must be positive"),
])
def test_copy_input_errors(kwargs, match, v5e):
    with pytest.raises(InputError, match=match):
        copy(chip=v5e, **kwargs)


def test_wave_quantization_hand_worked():
    b200 = get_chip("b200")
    # 4096 x 4096 outputs in 128 x 256 tiles = 32 x 16 = 512 tiles on 148 SMs: 4 waves of 148 = 592 slots
    assert float(wave_efficiency(b200, 4096, 4096)) == pytest.approx(512 / 592)
    # 4224 x 2048 on H100: 33 x 8 = 264 tiles = exactly two waves of 132
    assert float(wave_efficiency(get_chip("h100-sxm"), 4224, 2048)) == pytest.approx(1.0)
    # TPUs pad to the MXU in the issued FLOPs instead: no waves
    assert float(wave_efficiency(get_chip("tpu-v5e"), 100, 100)) == 1.0


def test_contraction_ramp_hand_worked():
    # B200: k_half 1115 -> K = 4096 reaches 4096 / 5211 = 0.786 of the plateau
    assert float(contraction_ramp(get_chip("b200"), 4096)) == pytest.approx(4096 / (4096 + 1115))
    assert float(contraction_ramp(get_chip("tpu-v5e"), 4096)) == 1.0


def test_int8_decode_gemm_gains_about_1_3x_not_2x(v5e):
    # HBM-bound decode GEMM (M = 8): int8 weights halve the bytes, but the dequantization (3 VPU ops per weight,
    # on the critical path) adds back: 8192 x 8192 x 3 / (6.16e12 x 0.8) = 40.9 us against 82 us of HBM time.
    bf16 = evaluate(gemm(m=8, n=8192, k=8192, chip=v5e), v5e)
    int8 = evaluate(gemm(m=8, n=8192, k=8192, rhs_dtype="int8", chip=v5e), v5e)
    assert int8.fixed_parts_s["serial_vpu"] == pytest.approx(8192 * 8192 * 3 / (6.16e12 * 0.8))
    assert 1.2 < bf16.expected_s / int8.expected_s < 1.6
    # the floor still sees the full 2x of the bytes
    assert bf16.floor_s / int8.floor_s > 1.9


def test_serial_hbm_bytes_run_alone(v5e, rtol):
    # A copy of 1 MiB in and 1 MiB out whose whole write runs alone: the HBM unit keeps the read (1 MiB at
    # 819 GB/s x 0.85 = 1.506 us), the write's 1.506 us adds to it as a fixed part; the floor sees both.
    cost = copy(array_bytes=2**20, chip=v5e)
    serial = dataclasses.replace(cost, serial_hbm_bytes=2**20)
    plain, alone = evaluate(cost, v5e), evaluate(serial, v5e)
    one = 2**20 / (819e9 * 0.85)
    assert alone.fixed_parts_s["serial_hbm"] == pytest.approx(one, rel=rtol["time"])
    assert alone.expected_s == pytest.approx(plain.expected_s, rel=rtol["time"])  # nothing else runs: no change
    assert alone.floor_s == plain.floor_s
    # next to compute that covers the read: the write adds instead of hiding (8 MFLOP of VPU work at 6.16e12 x
    # 0.8 = 1.62 us > the read's 1.506 us, so expected = 1.62 + 1.506 us + the fixed launch and DMA latency)
    busy = dataclasses.replace(serial, vpu_ops=8e6)
    fixed = 1e-6 + 2 * 2.55e-7
    assert evaluate(busy, v5e).expected_s == pytest.approx(8e6 / (6.16e12 * 0.8) + one + fixed, rel=rtol["time"])


@pytest.mark.parametrize("name", TPUS + GPUS)
def test_every_overhead_is_sourced_or_an_estimate_with_its_derivation(name):
    spec = get_chip(name)
    for field in OVERHEADS:
        value = getattr(spec.overheads, field)
        path = f"overheads.{field}"
        if value is None:
            continue
        assert path in spec.sources
        if spec.sources[path] == "perfmodel-estimate":
            assert spec.derived[path].startswith("ESTIMATE:"), path
        else:
            assert spec.derived.get(path), f"{path}: a measured figure carries its derivation"


def test_tpus_have_every_fixed_cost_and_gpus_no_pallas_figures():
    for name in TPUS:
        o = get_chip(name).overheads
        assert all(getattr(o, f) for f in OVERHEADS)
    for name in GPUS:
        o = get_chip(name).overheads
        assert o.pallas_call_launch_s is None and o.pallas_grid_step_overhead_s is None
        assert o.op_launch_s and o.host_dispatch_s and o.dma_latency_s


def test_embedding_in_predict_model_is_the_gather(v5e):
    from perfmodel.model.configs import get_model
    from perfmodel.model.step import make_step
    from perfmodel.model.transformer import predict_step

    step = predict_step(get_model("llama-3.1-8b"), make_step(phase="decode", batch=4, context=128), v5e)
    (embed,) = [op for op in step.ops if op.name == "embed"]
    # 4 rows of 4096 bf16 = 8 KiB each + a 4-byte index; the row issue cost is in the expected time
    assert embed.cost.hbm_read_bytes == 4 * (8192 + 4)
    assert np.asarray(embed.roofline.fixed_parts_s["op"]) > 0


def test_per_shape_tile_rule_fills_the_sms_hand_worked():
    h800 = get_chip("h800-sxm")  # 132 SMs; DeepGEMM's rule (efficiency.yaml gpu_tile_rule)
    # M = 128, N = 2112: 128-row tiles (M > 64); BLOCK_N 16 gives 1 x 132 = 132 tiles, one full wave: 1.0
    # (a fixed 128 x 256 tile would give 9 tiles on 132 SMs: 9 / 132 = 0.068).
    assert float(wave_efficiency(h800, 128, 2112)) == pytest.approx(1.0)
    # M = 4096, N = 7168: 32 row tiles of 128; the widest BLOCK_N (160) gives the fewest tiles, 32 x ceil(7168 / 160)
    # = 32 x 45 = 1440, in the fewest waves, ceil(1440 / 132) = 11 (1452 slots): 1440 / 1452 = 0.992.
    assert float(wave_efficiency(h800, 4096, 7168)) == pytest.approx(1440 / 1452)
    # Arrays broadcast like the scalar case.
    got = wave_efficiency(h800, np.array([128, 4096]), np.array([2112, 7168]))
    assert got == pytest.approx([1.0, 1440 / 1452])


@pytest.mark.parametrize("rule, match", [
    ({"tile_m": 128, "tile_n": [16]}, "give exactly tile_m, tile_m_small, small_m_max, tile_n"),
    ({"tile_m": 128, "tile_m_small": 64, "small_m_max": 64, "tile_n": []}, "tile_n: a non-empty list"),
])
def test_bad_tile_rules_are_named(efficiency_table, rule, match):
    from perfmodel.model import efficiency

    efficiency_table({"chips": {"gpu-x": {"gpu_tile_rule": rule}}})
    with pytest.raises(ValueError, match=f"chips.gpu-x.gpu_tile_rule.*{match}"):
        efficiency.chip_efficiency("gpu-x")
