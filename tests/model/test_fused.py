"""Fused elementwise ops: fused vs unfused HBM traffic, same vector work."""

import pytest

from perfmodel.errors import InputError
from perfmodel.model.core import evaluate
from perfmodel.model.fused import dequant_gemm, geglu, rms_norm, rope, swiglu


def test_rms_norm_hand_worked(v5e):
    t, h = 4096, 8192
    act = t * h * 2  # one bf16 [tokens, hidden] array
    fused = rms_norm(tokens=t, hidden=h, chip=v5e)
    # read x and the residual and the weight; write the output and the new residual
    assert fused.hbm_read_bytes == 2 * act + h * 2
    assert fused.hbm_write_bytes == 2 * act
    unfused = rms_norm(tokens=t, hidden=h, fused=False, chip=v5e)
    # add: read x, r, write s; reduce: read s, write rms (f32 per token); normalize: read s, rms, weight, write out
    assert unfused.hbm_read_bytes == 3 * act + act + t * 4 + h * 2
    assert unfused.hbm_write_bytes == 2 * act + t * 4
    assert unfused.vpu_ops == fused.vpu_ops and unfused.eup_ops == fused.eup_ops == t
    assert unfused.metrics["kernels"] == 3 and fused.metrics["kernels"] == 1


def test_rms_norm_without_residual(v6e):
    t, h = 16, 4096
    fused = rms_norm(tokens=t, hidden=h, residual=False, chip=v6e)
    assert fused.hbm_read_bytes == t * h * 2 + h * 2 and fused.hbm_write_bytes == t * h * 2


def test_layer_norm_adds_a_mean_pass_unfused(v5e):
    # [384 x 384 rows, 128] bf16 (tokamax's 7x-norm-fwd-xla-002), no residual: x is 147,456 x 128 x 2 B =
    # 37,748,736 B. Unfused as XLA runs it: a mean pass (read x, write one f32 per row), a variance pass (read x,
    # write one f32 per row), the normalizing pass (read x, the two statistics, the weight; write y).
    t, h = 384 * 384, 128
    act = t * h * 2
    ln = rms_norm(tokens=t, hidden=h, residual=False, subtract_mean=True, fused=False, chip=v5e)
    rms = rms_norm(tokens=t, hidden=h, residual=False, fused=False, chip=v5e)
    assert ln.hbm_read_bytes == 3 * act + 2 * t * 4 + h * 2
    assert ln.hbm_write_bytes == act + 2 * t * 4
    assert ln.hbm_read_bytes - rms.hbm_read_bytes == act + t * 4
    assert ln.metrics["kernels"] == rms.metrics["kernels"] + 1 == 3
    fused = rms_norm(tokens=t, hidden=h, residual=False, subtract_mean=True, chip=v5e)
    assert fused.name == "layer-norm" and fused.hbm_read_bytes == act + h * 2 and fused.vpu_ops > rms.vpu_ops


def test_layer_norm_backward_hand_worked(v5e):
    # tokamax's normalization backward on x [384 x 384 rows, 128] bf16: x and dout are 147,456 x 128 x 2 B =
    # 37,748,736 B each; the statistics (rstd, mean) and the two row sums are 2 x 4 B per row; the weight is
    # 128 x 2 B, its and the offset's gradients 2 x 128 x 4 B (f32 sums).
    t, h = 384 * 384, 128
    act, stats, grads = t * h * 2, 2 * t * 4, 2 * h * 4
    fused = rms_norm(tokens=t, hidden=h, residual=False, subtract_mean=True, backward=True, chip=v5e)
    # one kernel: read x, dout, the statistics and the weight; write dx and the parameter gradients
    assert fused.name == "layer-norm backward" and fused.metrics["kernels"] == 1
    assert fused.hbm_read_bytes == 2 * act + stats + h * 2
    assert fused.hbm_write_bytes == act + grads
    unfused = rms_norm(tokens=t, hidden=h, residual=False, subtract_mean=True, backward=True, fused=False, chip=v5e)
    # XLA's two fusions: the reduction pass (x, dout, stats, weight -> row sums, gradients), the dx pass (the same
    # inputs and the row sums -> dx): 2 x 75.5 MB + 2.4 MB read against the compiled program's 2 x 75.5 MB
    assert unfused.hbm_read_bytes == 2 * (2 * act + stats + h * 2) + stats
    assert unfused.hbm_write_bytes == stats + grads + act and unfused.metrics["kernels"] == 2
    assert unfused.vpu_ops == fused.vpu_ops and fused.eup_ops == 0  # rstd is the forward's: no rsqrt
    rms = rms_norm(tokens=t, hidden=h, residual=False, backward=True, chip=v5e)
    assert rms.name == "rms-norm backward" and rms.vpu_ops < fused.vpu_ops
    assert rms.hbm_read_bytes == 2 * act + t * 4 + h * 2  # rstd only
    # with the residual add: its gradient is dx plus the residual stream's cotangent (one more read fused; one
    # more add kernel unfused: two reads, one write)
    res = rms_norm(tokens=t, hidden=h, subtract_mean=True, backward=True, chip=v5e)
    assert res.name == "add+layer-norm backward" and res.hbm_read_bytes == fused.hbm_read_bytes + act
    res_u = rms_norm(tokens=t, hidden=h, subtract_mean=True, backward=True, fused=False, chip=v5e)
    assert res_u.hbm_read_bytes == unfused.hbm_read_bytes + 2 * act
    assert res_u.hbm_write_bytes == unfused.hbm_write_bytes + act and res_u.metrics["kernels"] == 3


@pytest.mark.parametrize("fn", [swiglu, geglu])
def test_glu_traffic(v5e, fn):
    t, i = 512, 14336
    a = t * i * 2
    fused, unfused = fn(tokens=t, intermediate=i, chip=v5e), fn(tokens=t, intermediate=i, fused=False, chip=v5e)
    assert (fused.hbm_read_bytes, fused.hbm_write_bytes) == (2 * a, a)
    assert (unfused.hbm_read_bytes, unfused.hbm_write_bytes) == (3 * a, 2 * a)
    assert evaluate(unfused, v5e).floor_s > evaluate(fused, v5e).floor_s


def test_swiglu_eup_work(v5e):
    # SiLU: exp and reciprocal per element
    assert swiglu(tokens=8, intermediate=128, chip=v5e).eup_ops == 2 * 8 * 128


def test_rope_traffic(v5e):
    t, h, d = 1024, 32, 128
    x = t * h * d * 2
    tables = 2 * t * (d // 2) * 4
    fused = rope(tokens=t, heads=h, head_dim=d, chip=v5e)
    assert fused.hbm_read_bytes == x + tables and fused.hbm_write_bytes == x
    unfused = rope(tokens=t, heads=h, head_dim=d, fused=False, chip=v5e)
    assert unfused.hbm_read_bytes == 5 * x + tables and unfused.hbm_write_bytes == 4 * x


def test_dequant_gemm_unfused_writes_weights_back(v5e):
    m, n, k = 16, 4096, 4096
    fused = dequant_gemm(m=m, n=n, k=k, chip=v5e)
    unfused = dequant_gemm(m=m, n=n, k=k, fused=False, chip=v5e)
    assert [p.name for p in unfused.parts] == ["dequantize", "gemm"]
    deq = unfused.parts[0]
    # reads int8 weights + f32 per-channel scales, writes bf16 weights
    assert deq.hbm_read_bytes == k * n + n * 4 and deq.hbm_write_bytes == k * n * 2
    # fused: int8 weights + scales read once by the GEMM; unfused adds the bf16 write and re-read
    assert unfused.hbm_bytes - fused.hbm_bytes == pytest.approx(k * n * 2 * 2)


@pytest.mark.parametrize("fn,kwargs,match", [
    (rms_norm, dict(tokens=0, hidden=8), r"^`tokens` must be >= 1"),
    (rms_norm, dict(tokens=8, hidden=8, dtype="x"), r"^`dtype`: unknown dtype 'x'"),
    (swiglu, dict(tokens=8, intermediate=-1), r"^`intermediate` must be >= 1"),
    (rope, dict(tokens=8, heads=2, head_dim=64, rotary_dim=128), r"^`rotary_dim` must be <= `head_dim`, got 128 > 64$"),
    (rope, dict(tokens=8, heads=2, head_dim=64, rotary_dim=33), r"^`rotary_dim` must be even .*got 33$"),
    (dequant_gemm, dict(m=1, n=8, k=8, weight_dtype="bf16", weight_scale="per-channel"),
     r"^`weight_dtype` bf16: weights are not quantized, so there is nothing to dequantize; use int8"),
    (dequant_gemm, dict(m=1, n=8, k=8, weight_dtype="fp32", fused=False), r"^`weight_dtype` fp32: weights are not"),
])
def test_bad_input(v5e, fn, kwargs, match):
    with pytest.raises(InputError, match=match):
        fn(chip=v5e, **kwargs)


def test_a_norm_within_one_vreg_row_says_its_reductions_are_not_priced(v5e):
    from perfmodel.hw import get_chip

    h100 = get_chip("h100-sxm")
    # hidden = 128 = a TPU vreg's lanes: each row's sums are cross-lane reductions (XLU), not priced; said in a
    # note for both passes. Wider rows, and GPUs (no lanes in their spec), get no note.
    for backward in (False, True):
        (note,) = [n for n in rms_norm(tokens=1024, hidden=128, backward=backward, chip=v5e).notes if "XLU" in n]
        assert note.startswith("hidden <= 128 lanes")
    assert not any("XLU" in n for n in rms_norm(tokens=1024, hidden=4096, chip=v5e).notes)
    assert not any("XLU" in n for n in rms_norm(tokens=1024, hidden=128, chip=h100).notes)
