"""The XLU rates in hwspecs (compute.xlu_vreg_ops_per_s_per_chip) and the norm model's XLU counts
(perfmodel.model.fused) against what libtpu schedules, live: tokamax's XLA layer norm over a 128-wide last axis."""

import math

import pytest

from perfmodel.compiler.api import CompileCall, compile_report
from perfmodel.hw.registry import get_chip
from perfmodel.model.fused import rms_norm

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]

XLU_CHIPS = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x"]


def _layer_norm(chip, rows, hidden, subtract_mean=True):
    call = CompileCall(kind="function", target="perfmodel.harness.tokamax_compiled:layer_norm",
                       shapes=(f"x={rows}x{rows}x{hidden}:bf16", f"scale={hidden}:f32", f"offset={hidden}:f32"),
                       args=("axis=-1", f"subtract_mean={subtract_mean}"))
    report = compile_report(call, chip)
    assert report.compiled, report.error
    return [o for o in report.other_ops if o.get("xlu_pushes")]


@pytest.mark.parametrize("name", XLU_CHIPS)
def test_spec_rate_is_the_compilers_cadence(name):
    # rate = cores x XLUs x clock / bundles between pushes to one XLU, read off the mean pass (a loop of
    # transposes only): 7x: 2 x 2 x 1.9e9 / 4 = 1.9e9 pushes/s
    chip = get_chip(name)
    ops = _layer_norm(chip, 384, 128)
    mean_pass = next(o for o in ops if "reduce" in o["hlo_name"])
    units = {u for o in ops for u in o["xlu_pushes"]}
    rate = chip.cores.cores_per_chip * len(units) * chip.compute.clock_hz / mean_pass["xlu_spacing"]
    assert math.isclose(chip.compute.xlu_vreg_ops_per_s_per_chip, rate, rel_tol=1e-3), (units, mean_pass)


@pytest.mark.parametrize("rows,hidden,subtract_mean", [(384, 128, True), (384, 256, True), (384, 128, False),
                                                       (192, 512, True)])
def test_norm_model_counts_the_compiled_pushes(rows, hidden, subtract_mean):
    chip = get_chip("tpu-7x")
    compiled = sum(sum(o["xlu_pushes"].values()) for o in _layer_norm(chip, rows, hidden, subtract_mean))
    model = float(rms_norm(tokens=rows * rows, hidden=hidden, residual=False, subtract_mean=subtract_mean,
                           fused=False, chip=chip).xlu_ops)
    # the compiled loops' pushes, their pipeline's fill and drain iterations left out: the model's count at
    # x [384, 384, 128 | 256]; x [192, 192, 512] pushes 22% more (its mean and variance passes push more per
    # row group there), never fewer
    assert model <= compiled <= (1.0 if rows == 384 else 1.25) * model


def test_narrow_rows_take_no_xlu():
    # hidden 64 < 128 lanes: XLA lays the normalized axis on sublanes; the model counts none
    chip = get_chip("tpu-7x")
    compiled = sum(sum(o["xlu_pushes"].values()) for o in _layer_norm(chip, 384, 64))
    wide = sum(sum(o["xlu_pushes"].values()) for o in _layer_norm(chip, 384, 128))
    assert compiled < 0.01 * wide
    assert float(rms_norm(tokens=384 * 384, hidden=64, residual=False, subtract_mean=True, fused=False,
                          chip=chip).xlu_ops) == 0
