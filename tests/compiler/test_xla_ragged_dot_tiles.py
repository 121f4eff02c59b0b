"""XLA's ragged-dot tiles as perfmodel predicts them (perfmodel.model.xla_ragged_dot) against the tiles libtpu
writes into the compiled HLO (its ``ragged_dot_tiling`` attribute), live, on a 128-wide and a 256-wide MXU."""

import re
from pathlib import Path

import pytest

from perfmodel.compiler.api import CompileCall, compile_report
from perfmodel.hw.registry import get_chip
from perfmodel.model.xla_ragged_dot import xla_ragged_dot_tiling

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]


@pytest.mark.parametrize("chip,m,k,n", [("tpu-v5e", 4096, 1024, 7168), ("tpu-7x", 4096, 1536, 4096),
                                        ("tpu-7x", 2048, 16384, 2048)])
def test_predicted_tiles_are_the_compiled_ones(chip, m, k, n):
    groups = 8
    call = CompileCall(kind="function", target="perfmodel.harness.tokamax_compiled:ragged_dot",
                       shapes=(f"lhs={m}x{k}:bf16", f"rhs={groups}x{k}x{n}:bf16"),
                       args=(f"group_sizes={[m // groups] * groups!r}", "lhs_contracting=[1]",
                             "rhs_contracting=[1]", "rhs_group=[0]"))
    report = compile_report(call, get_chip(chip))
    assert report.compiled, report.error
    found = re.search(r'ragged_dot_tiling="(\d+),(\d+),(\d+)"', Path(report.hlo_path).read_text())
    assert found, "no ragged-dot kernel in the compiled program"
    t = xla_ragged_dot_tiling(get_chip(chip), m=m, k=k, n=n, lhs_itemsize=2, rhs_itemsize=2, out_itemsize=4)
    assert (t.tile_m, t.tile_k, t.tile_n) == tuple(int(v) for v in found.groups())
