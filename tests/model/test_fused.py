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
    # write one f32 per row), a variance pass (read x and the mean, write one f32 per row), the normalizing pass
    # (read x, the two statistics, the weight; write y).
    t, h = 384 * 384, 128
    act = t * h * 2
    ln = rms_norm(tokens=t, hidden=h, residual=False, subtract_mean=True, fused=False, chip=v5e)
    rms = rms_norm(tokens=t, hidden=h, residual=False, fused=False, chip=v5e)
    assert ln.hbm_read_bytes == 3 * act + 3 * t * 4 + h * 2
    assert ln.hbm_write_bytes == act + 2 * t * 4
    # the mean pass reads x; the variance pass and the normalizing pass each read the mean
    assert ln.hbm_read_bytes - rms.hbm_read_bytes == act + 2 * t * 4
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


def test_a_norm_one_or_two_vregs_wide_says_its_xlu_work_is_priced(v5e):
    from perfmodel.hw import get_chip

    h100 = get_chip("h100-sxm")
    # hidden = 128 = a TPU vreg's lanes: each row's sums and broadcasts are cross-lane (XLU) work as large as its
    # HBM traffic, priced at the spec's XLU rate; said in a note for both passes. Wide rows, narrow rows (XLA sums
    # them on sublanes) and GPUs (no lanes in their spec) get no note.
    for backward in (False, True):
        (note,) = [n for n in rms_norm(tokens=1024, hidden=128, backward=backward, chip=v5e).notes if "XLU" in n]
        assert note.startswith("hidden of 128-256 lanes") and "priced at the compiler's XLU cadence" in note
    for hidden, chip in ((4096, v5e), (64, v5e), (128, h100)):
        assert not any("XLU" in n for n in rms_norm(tokens=1024, hidden=hidden, chip=chip).notes)


# XLU work of norms: x [384 x 384 rows, hidden] bf16 on 7x (8 sublanes): 147,456 rows = 18,432 row groups of 8
# (9,216 of 16 packed bf16 rows). Per pass, one push per row group for each row sum and for each per-row value
# broadcast across lanes; a sum over the bf16 input itself, one vreg wide (hidden 128), per packed row group:
# half that.
ROWS, GROUPS, PACKED = 384 * 384, 18432, 9216


@pytest.mark.parametrize("subtract_mean,backward,fused,pushes,wide_pushes", [
    # layer norm, unfused: mean pass (sum of bf16 x) + variance pass (mean broadcast, sum) + normalizing pass
    # (mean and rstd broadcast); past one vreg wide the mean pass sums in f32: GROUPS, not PACKED
    (True, False, False, PACKED + 2 * GROUPS + 2 * GROUPS, GROUPS + 2 * GROUPS + 2 * GROUPS),
    (True, False, True, 4 * GROUPS, 4 * GROUPS),  # one kernel: two sums, two broadcasts
    (False, False, False, GROUPS + GROUPS, GROUPS + GROUPS),  # RMS: the sum of squares, the rstd broadcast
    (False, False, True, 2 * GROUPS, 2 * GROUPS),
    # backward: reduction pass (2 statistics broadcast, 2 row sums) + dx pass (statistics and sums broadcast)
    (True, True, False, 4 * GROUPS + 4 * GROUPS, 4 * GROUPS + 4 * GROUPS),
    (True, True, True, 6 * GROUPS, 6 * GROUPS),
    (False, True, False, 2 * GROUPS + 2 * GROUPS, 2 * GROUPS + 2 * GROUPS),
])
def test_norm_xlu_pushes_hand_worked(tpu7x, subtract_mean, backward, fused, pushes, wide_pushes):
    for hidden, want in ((128, pushes), (256, wide_pushes), (4096, wide_pushes)):  # does not grow with hidden
        cost = rms_norm(tokens=ROWS, hidden=hidden, residual=False, subtract_mean=subtract_mean,
                        backward=backward, fused=fused, chip=tpu7x)
        assert float(cost.xlu_ops) == want
    narrow = rms_norm(tokens=ROWS, hidden=64, residual=False, subtract_mean=subtract_mean, backward=backward,
                      fused=fused, chip=tpu7x)
    leading = rms_norm(tokens=ROWS, hidden=128, residual=False, subtract_mean=subtract_mean, backward=backward,
                       fused=fused, normalized_axis="leading", chip=tpu7x)
    assert float(narrow.xlu_ops) == float(leading.xlu_ops) == 0  # summed on the VPU


def test_unfused_norm_passes_run_in_sequence(tpu7x):
    # 7x-norm-fwd-xla-002's shape: the mean pass is HBM-bound, the variance and normalizing passes XLU-bound;
    # one after another, each pass waits for its own slowest unit, so the floor is the sum of the passes' floors,
    # above the slowest unit's total
    cost = rms_norm(tokens=ROWS, hidden=128, residual=False, subtract_mean=True, fused=False, chip=tpu7x)
    assert cost.parts_in_sequence and [p.name for p in cost.parts] == ["mean pass", "reduction pass",
                                                                      "normalising pass"]
    r = evaluate(cost, tpu7x)
    each = [evaluate(p, tpu7x) for p in cost.parts]
    assert [e.limiter for e in each] == ["hbm", "xlu", "xlu"] and r.limiter == "xlu"
    assert r.floor_s == pytest.approx(sum(e.floor_s for e in each))
    assert r.expected_s == pytest.approx(sum(e.expected_s for e in each))
    assert r.floor_s > max(r.unit_s.values())
    # the XLU at 1.9e9 pushes/s: 82,944 pushes = 43.7 us over the whole chip
    assert r.unit_s["xlu"] == pytest.approx(82944 / 1.9e9)


def test_norm_xlu_work_without_a_rate_is_said(tpu_v2):
    cost = rms_norm(tokens=ROWS, hidden=128, residual=False, chip=tpu_v2)
    assert float(cost.xlu_ops) > 0 and any("gives no rate" in n for n in cost.notes)
    assert evaluate(cost, tpu_v2).unit_s["xlu"] == 0


def test_normalized_axis_is_checked(tpu7x):
    with pytest.raises(InputError, match="normalized_axis"):
        rms_norm(tokens=8, hidden=128, normalized_axis="middle", chip=tpu7x)
