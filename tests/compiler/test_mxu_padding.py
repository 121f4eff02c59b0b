"""The MXU edge the models pad a dot's K and N to (hwspecs `cores.mxu_dim`; perfmodel.model.gemm.mxu_issued_flops,
perfmodel.schedule.body) against what libtpu schedules, live: a 2048-row bf16 dot with K (or N) 128 against the
same dot with 256. On a 256-wide MXU (v6e, 7x) the 128-wide dot takes as many bundles as the 256-wide one (the
array's other half idles); on a 128-wide MXU (v4, v5e, v5p) about half."""

import pytest

from perfmodel.compiler.api import CompileCall, compile_report
from perfmodel.hw.registry import get_chip
from perfmodel.model.gemm import mxu_issued_flops
from perfmodel.model.shapes import chip_tiles

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]

CHIPS = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x"]
ROWS = 2048


def _bundles(chip, k, n):
    # jnp.matmul(a [ROWS, k], b [k, n]): one fusion, its loop-weighted bundles
    call = CompileCall(kind="function", target="jax.numpy:matmul",
                       shapes=(f"a={ROWS}x{k}:bf16", f"b={k}x{n}:bf16"), args=())
    report = compile_report(call, chip)
    assert report.compiled, report.error
    return sum(o["weighted_bundles"] for o in report.other_ops)


@pytest.mark.parametrize("name", CHIPS)
@pytest.mark.parametrize("narrow", ["k", "n"])
def test_narrow_dots_cost_what_the_padding_says(name, narrow):
    chip = get_chip(name)
    tiles = chip_tiles(chip)
    k, n = (128, ROWS) if narrow == "k" else (ROWS, 128)
    wide_k, wide_n = (256, ROWS) if narrow == "k" else (ROWS, 256)
    # model: 7x (edge 256) pads 128 to 256, issued ratio 1.0; v5e (edge 128): 128 / 256 = 0.5
    model = float(mxu_issued_flops(ROWS, n, k, 1, tiles) / mxu_issued_flops(ROWS, wide_n, wide_k, 1, tiles))
    compiled = _bundles(chip, k, n) / _bundles(chip, wide_k, wide_n)
    # compiled: 0.95-1.0 on 256-wide MXUs, 0.25-0.54 on 128-wide ones (2026-12-06, libtpu 0.0.42.1)
    assert (compiled > 0.75) == (model == 1.0), (name, narrow, compiled, model)
