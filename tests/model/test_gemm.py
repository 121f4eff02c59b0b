"""GEMM model: hand-worked counts, padding, dtype paths, scales, epilogues, errors."""

import math

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.model.core import evaluate, to_cost_estimate
from perfmodel.model.gemm import gemm


def test_8192_cubed_bf16_on_v5e(v5e, rtol):
    # Public figures: 197 TFLOP/s bf16, 819 GB/s HBM.
    assert v5e.matmul_rate("bf16") == 1.97e14 and v5e.memory.hbm_bw_bytes_per_s_per_chip == 8.19e11
    cost = gemm(m=8192, n=8192, k=8192, chip=v5e)
    r = evaluate(cost, v5e)
    # 2*8192^3 = 1.0995e12 FLOPs, aligned to the 128 MXU: nothing padded.
    assert cost.mxu_flops == cost.useful_flops == 2 * 8192**3
    # A, B read once and C written once, bf16: 3 * 8192^2 * 2 bytes = 402.7 MB.
    assert cost.hbm_bytes == 3 * 8192**2 * 2
    # floor = 1.0995e12 / 1.97e14 = 5.58 ms; HBM would take 402.7e6 / 8.19e11 = 0.49 ms.
    assert r.floor_s == pytest.approx(2 * 8192**3 / 1.97e14, rel=rtol["time"])
    assert r.bound == "MXU-bound"
    # intensity = 2*8192^3 / (3*8192^2*2) = 8192/3 FLOP/B; ridge = 1.97e14 / 8.19e11 = 240.5 FLOP/B.
    assert r.arithmetic_intensity == pytest.approx(8192 / 3)
    assert r.ridge_point == pytest.approx(1.97e14 / 8.19e11)
    assert r.floor_s <= r.expected_s <= r.no_overlap_s


def test_decode_gemv_is_hbm_bound_and_pads_m(v5e, rtol):
    cost = gemm(m=1, n=8192, k=8192, chip=v5e)
    r = evaluate(cost, v5e)
    # bytes = x (8192*2) + W (8192^2*2) + y (8192*2)
    nbytes = 8192 * 2 + 8192**2 * 2 + 8192 * 2
    assert cost.hbm_bytes == nbytes
    assert r.bound == "HBM-bound"
    assert r.floor_s == pytest.approx(nbytes / 8.19e11, rel=rtol["time"])
    # M = 1 pads to the 8-row sublane tile: 7/8 of issued MXU work is padding.
    assert cost.mxu_flops == 2 * 8 * 8192 * 8192
    assert cost.padding_waste == pytest.approx(7 / 8)


@pytest.mark.parametrize("chip_name,mxu", [("tpu-v5e", 128), ("tpu-v6e", 256)])
@pytest.mark.parametrize("m,n,k", [(100, 300, 200), (1, 129, 1), (8, 256, 256), (17, 1000, 4097)])
def test_unaligned_shapes_pad_to_tiles(chip_name, mxu, m, n, k):
    from perfmodel.hw import get_chip

    chip = get_chip(chip_name)
    cost = gemm(m=m, n=n, k=k, chip=chip)
    pad = lambda x, t: math.ceil(x / t) * t  # noqa: E731
    assert chip.cores.mxu_dim == mxu
    assert cost.mxu_flops == 2 * pad(m, 8) * pad(n, mxu) * pad(k, mxu)
    assert cost.useful_flops == 2 * m * n * k
    assert cost.padding_waste == pytest.approx(1 - (m * n * k) / (pad(m, 8) * pad(n, mxu) * pad(k, mxu)))
    # The output cast runs on whole (8, 128) vregs.
    assert cost.vpu_ops == pad(m, 8) * pad(n, 128)
    assert cost.vpu_padding_ops == pad(m, 8) * pad(n, 128) - m * n


def test_int8_weights_only_on_v5e_converts_on_vpu(v5e):
    # v5e has int8 x int8 but no bf16 x int8 path: weights widen to bf16 on the VPU.
    m, n, k = 16, 4096, 4096
    cost = gemm(m=m, n=n, k=k, rhs_dtype="int8", chip=v5e)
    assert cost.mxu_dtype == "bf16"
    assert any("no native bf16 x int8" in note for note in cost.notes)
    # bytes: x 16*4096*2 + W 4096*4096*1 + per-channel f32 scales 4096*4 + y 16*4096*2
    assert cost.hbm_read_bytes == m * k * 2 + k * n + n * 4
    assert cost.hbm_write_bytes == m * n * 2
    # VPU: convert each weight once (3 ops: unpack, convert, repack) + scale each output (1) + cast each output (1).
    assert cost.vpu_ops == 3 * k * n + 2 * m * n
    # only the weight conversion sits on the critical path
    assert cost.serial_vpu_ops == 3 * k * n


def test_int8_both_quantized_runs_at_int8_rate(v5e):
    m, n, k = 256, 4096, 4096
    cost = gemm(m=m, n=n, k=k, lhs_dtype="int8", rhs_dtype="int8", chip=v5e)
    assert cost.mxu_dtype == "int8"
    # per-token activation scales (m*4) and per-channel weight scales (n*4)
    assert cost.hbm_read_bytes == m * k + k * n + m * 4 + n * 4
    r = evaluate(cost, v5e)
    assert r.unit_s["mxu"] == pytest.approx(2 * m * n * k / 3.94e14)


def test_bf16_x_int8_native_on_v4_has_no_conversion():
    from perfmodel.hw import get_chip

    cost = gemm(m=64, n=1024, k=1024, rhs_dtype="int8", chip=get_chip("tpu-v4"))
    assert not any("converts" in note for note in cost.notes)
    # per-channel scale + output cast only
    assert cost.vpu_ops == 2 * 64 * 1024


def test_per_block_scales_count_bytes(v5e):
    # K = 4096 in blocks of 128 -> 32 scales per output channel, f32.
    cost = gemm(m=8, n=1024, k=4096, rhs_dtype="int4", weight_scale="per-block", scale_block=128, chip=v5e)
    assert cost.hbm_read_bytes == 8 * 4096 * 2 + 4096 * 1024 * 0.5 + 32 * 1024 * 4


def test_fp8_on_v5e_vs_v6e(v5e, v6e):
    on_v5e = gemm(m=1024, n=1024, k=1024, lhs_dtype="fp8", rhs_dtype="fp8", chip=v5e)
    on_v6e = gemm(m=1024, n=1024, k=1024, lhs_dtype="fp8", rhs_dtype="fp8", chip=v6e)
    assert on_v5e.mxu_dtype == "bf16" and on_v6e.mxu_dtype == "fp8"
    # fp8 widening costs 3 ops per element on each operand on v5e only.
    assert on_v5e.vpu_ops - on_v6e.vpu_ops == 3 * (2 * 1024 * 1024)


def test_fp32_is_one_bf16_pass_at_default_precision_and_six_at_highest_on_v5e(v5e):
    kw = dict(m=128, n=128, k=128, lhs_dtype="fp32", rhs_dtype="fp32", out_dtype="fp32", chip=v5e)
    assert gemm(**kw).mxu_flops == 2 * 128**3
    cost = gemm(precision="highest", **kw)
    assert cost.mxu_flops == 6 * 2 * 128**3
    assert cost.useful_flops == 2 * 128**3


def test_epilogue_adds_bytes_and_work(v5e):
    m, n, k = 128, 256, 128
    plain = gemm(m=m, n=n, k=k, chip=v5e)
    fused = gemm(m=m, n=n, k=k, epilogue=("bias", "silu", "residual"), chip=v5e)
    # bias [n] and residual [m, n] in the output dtype (bf16)
    assert fused.hbm_read_bytes - plain.hbm_read_bytes == n * 2 + m * n * 2
    # bias 1 + silu 3 + residual 1 VPU ops, silu 2 EUP ops per output element
    assert fused.vpu_ops - plain.vpu_ops == 5 * m * n
    assert fused.eup_ops == 2 * m * n
    assert gemm(m=m, n=n, k=k, epilogue="bias,silu,residual", chip=v5e) == fused


def test_batch_scales_linearly(v5e):
    one = gemm(m=100, n=300, k=200, rhs_dtype="int8", chip=v5e)
    four = gemm(m=100, n=300, k=200, rhs_dtype="int8", batch=4, chip=v5e)
    for field in ("mxu_flops", "useful_flops", "vpu_ops", "hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(four, field) == pytest.approx(4 * getattr(one, field))


def test_no_chip_counts_are_unpadded():
    cost = gemm(m=100, n=300, k=200)
    assert cost.mxu_flops == cost.useful_flops == 2 * 100 * 300 * 200


def test_vectorized_matches_scalar(v6e):
    ms = np.array([1, 7, 100, 4096])
    ks = np.array([128, 300, 5000, 8192])
    batch = gemm(m=ms, n=1000, k=ks, rhs_dtype="int8", chip=v6e)
    rb = evaluate(batch, v6e)
    for i, (m, k) in enumerate(zip(ms, ks)):
        one = gemm(m=int(m), n=1000, k=int(k), rhs_dtype="int8", chip=v6e)
        r1 = evaluate(one, v6e)
        assert batch.mxu_flops[i] == one.mxu_flops and batch.hbm_bytes[i] == one.hbm_bytes
        assert rb.floor_s[i] == pytest.approx(r1.floor_s) and rb.bound[i] == r1.bound


def test_cost_estimate_uses_useful_counts():
    pytest.importorskip("jax")
    cost = gemm(m=256, n=512, k=128)
    est = to_cost_estimate(cost)
    # 2*256*512*128 matmul FLOPs + 256*512 output casts; bytes 2*(256*128 + 128*512 + 256*512)
    assert est.flops == 2 * 256 * 512 * 128 + 256 * 512
    assert est.bytes_accessed == 2 * (256 * 128 + 128 * 512 + 256 * 512)
    assert est.transcendentals == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(m=0), r"^`m` must be >= 1, got 0$"),
    (dict(n=-5), r"^`n` must be >= 1, got -5$"),
    (dict(k=1.5), r"^`k`: sizes must be whole numbers, got 1.5$"),
    (dict(m=np.array([4, 0])), r"^`m` must be >= 1, got 0$"),
    (dict(batch=0), r"^`batch` must be >= 1"),
    (dict(lhs_dtype="bf17"), r"^`lhs_dtype`: unknown dtype 'bf17'"),
    (dict(out_dtype="q"), r"^`out_dtype`: unknown dtype"),
    (dict(weight_scale="per-channel"), r"^`weight_scale` per-channel: weights of dtype bf16 are not quantized"),
    (dict(weight_scale="per-row", rhs_dtype="int8"), r"^`weight_scale`: got 'per-row'; use one of"),
    (dict(scale_block=64, rhs_dtype="int8"), r"^`scale_block` applies only with `weight_scale` per-block$"),
    (dict(rhs_dtype="int8", weight_scale="per-block", scale_block=0), r"^`scale_block` must be >= 1"),
    (dict(epilogue=("bias", "swish")), r"^`epilogue`: unknown epilogue 'swish'"),
])
def test_bad_input_is_one_line(v5e, kwargs, match):
    args = dict(m=8, n=128, k=128, chip=v5e) | kwargs
    with pytest.raises(InputError, match=match):
        gemm(**args)
