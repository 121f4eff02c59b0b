"""Periodic grids evaluated on representative periods against every step.

A grid whose leading dimensions only choose which blocks a step works on (batch, heads, a matmul's row
blocks) is evaluated on each TensorCore's first, one middle and last period (pipeline.Traversal). Every
figure of the analysis must equal the step-by-step evaluation (``COMPRESS_PERIODIC_GRIDS`` off), on
megacore chips too, and grids that are not periodic (a leading index used in arithmetic, read by the body,
or ending in a partial block) must fall back to every step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from perfmodel.schedule import analyze as analyze_module
from perfmodel.schedule import pipeline as pl_sim
from perfmodel.schedule.analyze import analyze_call, resolve_chip
from perfmodel.schedule.catalog import get_entry
from perfmodel.schedule.extract import find_pallas_calls, trace
from perfmodel.schedule.indexmaps import periodic_leading_dims


def _figures(k):
    t, w = k.time, k.work
    return {
        "steps": k.steps, "cores": k.cores_used, "expected": t.expected_s, "prologue": t.prologue_s,
        "steps_s": t.steps_s, "epilogue": t.epilogue_s, "mean_compute": t.mean_step_compute_s,
        "mean_dma": t.mean_step_dma_s, "limited_by": t.steps_limited_by, "limiter": t.limiter, "floor": t.op_floor_s,
        "useful": w.mxu_useful_flops, "issued": w.mxu_issued_flops, "vpu": w.vpu_ops, "eup": w.eup_ops,
        "dma_read": w.manual_dma_read_bytes, "dma_write": w.manual_dma_write_bytes,
        "mean_issued": w.mean_step_mxu_issued_flops, "mean_vpu": w.mean_step_vpu_ops, "mean_eup": w.mean_step_eup_ops,
        "operands": [(o.name, o.transfers, o.hbm_bytes, o.ideal_hbm_bytes) for o in k.operands],
        "notes": list(k.notes), "vmem": k.vmem.total_bytes,
    }


def _assert_same(call, chip, monkeypatch):
    fast = _figures(analyze_call(call, chip))
    monkeypatch.setattr(analyze_module, "COMPRESS_PERIODIC_GRIDS", False)
    every = _figures(analyze_call(call, chip))
    monkeypatch.setattr(analyze_module, "COMPRESS_PERIODIC_GRIDS", True)
    for key, value in fast.items():
        if isinstance(value, float):
            assert value == pytest.approx(every[key], rel=1e-12, abs=0.0), key
        else:
            assert value == every[key], key


def _calls(kernel, shapes, blocks, chip):
    entry = get_entry(kernel)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    return find_pallas_calls(trace(entry.make_function(specs, blocks, chip), *args), args)


CASES = [
    # Flash attention: batch and kv heads periodic; causal steps and an odd length inside the period.
    ("flash_attention", "tpu-v5e", ["q=4x16x1000x128:bf16", "k=4x4x1000x128:bf16", "v=4x4x1000x128:bf16"],
     {"block_q": 128, "block_kv": 256, "block_kv_compute": 256}, 2),
    # Megacore: 3 x 7 leading points over two cores (11 and 10 periods).
    ("flash_attention", "tpu-v5p", ["q=3x28x512x128:bf16", "k=3x7x512x128:bf16", "v=3x7x512x128:bf16"],
     {"block_q": 256, "block_kv": 256, "block_kv_compute": 256}, 2),
    ("flash_attention", "tpu-v4", ["q=2x8x1024x128:bf16", "k=2x8x1024x128:bf16", "v=2x8x1024x128:bf16"],
     {"block_q": 128, "block_kv": 512, "block_kv_compute": 256}, 2),
    ("jax-flash-attention", "tpu-v5e", ["q=2x8x1024x128:bf16", "k=2x8x1024x128:bf16", "v=2x8x1024x128:bf16"],
     {"block_q": 128, "block_k": 128}, 2),
    # Matmul: the row blocks are periodic (x and the output follow them, w does not).
    ("matmul", "tpu-v5e", ["x=2048x1024:bf16", "w=1024x768:bf16"], {"bm": 128, "bk": 256, "bn": 256}, 1),
    ("matmul", "tpu-v5p", ["x=1280x512:bf16", "w=512x384:bf16", "bias=384:f32"], {"bm": 128, "bk": 128, "bn": 128}, 1),
    ("jax-matmul", "tpu-v4", ["x=1792x512:bf16", "y=512x640:bf16"], {"bm": 256, "bk": 128, "bn": 128}, 1),
    ("rms_norm", "tpu-v5e", ["x=1024x4096:bf16", "residual=1024x4096:bf16", "weight=4096:f32"],
     {"block_tokens": 16}, 1),
    ("sampling", "tpu-v6e", ["logits=64x10000:f32"], {"block_b": 8, "block_v": 1024}, 1),
    # Not periodic: the last row block is partial (1000 rows of 256), the body reads program id 0.
    ("matmul", "tpu-v6e", ["x=1000x3000:bf16", "w=3000x700:bf16"], {"bm": 256, "bk": 512, "bn": 256}, 0),
    ("kv_cache_update_token_major", "tpu-v5e", ["new_k=256x8x128:bf16", "new_v=256x8x128:bf16",
                                                "k_cache=1024x16x8x128:bf16", "v_cache=1024x16x8x128:bf16",
                                                "slot_mapping=256:int32=arange"], {"tokens_per_block": 16}, 0),
]


@pytest.mark.parametrize("kernel,chip_name,shapes,blocks,leading", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_periodic_grids_give_the_figures_of_every_step(kernel, chip_name, shapes, blocks, leading, monkeypatch):
    chip = resolve_chip(chip_name)
    for call in _calls(kernel, shapes, blocks, chip):
        assert periodic_leading_dims(call)[0] == leading
        _assert_same(call, chip, monkeypatch)


def test_representative_periods_are_few_steps():
    # 8 x 8 leading points of a 16 x 16 period: 3 periods of 256 steps stand for 64.
    trav = pl_sim.periodic_traversal((8, 8, 16, 16), ("parallel",) * 3 + ("arbitrary",), 1, 2)
    assert trav.points.shape == (3 * 256, 4) and trav.steps == 64 * 256
    assert trav.total(1.0) == 64 * 256
    assert list(np.unique(trav.mult)) == [1, 62]
    # Two cores of 32 periods each: 6 periods.
    two = pl_sim.periodic_traversal((8, 8, 16, 16), ("parallel",) * 3 + ("arbitrary",), 2, 2)
    assert two.points.shape[0] == 6 * 256 and two.seg.cores == 2
    # A core's share ending inside a period (3 x 16 parallel points over 2 cores: 24 each, periods of 16)
    # is evaluated step by step.
    assert pl_sim.periodic_traversal((3, 16, 4), ("parallel", "parallel", "arbitrary"), 2, 1) is None


def _custom_call(index_map, body=None, grid=(6, 4), rows=8):
    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0

    x = jax.ShapeDtypeStruct((rows * grid[0], 128 * grid[1]), jnp.float32)
    spec = pl.BlockSpec((rows, 128), index_map)
    call = pl.pallas_call(body or copy, grid=grid, in_specs=[spec],
                          out_specs=pl.BlockSpec((rows, 128), lambda i, j: (i, j)), out_shape=x,
                          compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")))
    return find_pallas_calls(trace(call, x))[0]


def _reads_program_id(x_ref, o_ref):
    o_ref[...] = x_ref[...] + pl.program_id(0).astype(jnp.float32)


@pytest.mark.parametrize("index_map,body,leading", [
    (lambda i, j: (i, j), None, 2),  # both indices are block indices: periods of one step
    (lambda i, j: (0, j), None, 1),  # the input ignores i, follows j; the output follows both: i only
    (lambda i, j: (5 - i, j), None, 0),  # arithmetic on the leading index
    (lambda i, j: (i // 2, j), None, 0),
    (lambda i, j: (i, j), _reads_program_id, 0),  # the body reads program id 0
], ids=["identity", "ignores-i", "reversed", "halved", "body-reads-i"])
@pytest.mark.parametrize("chip_name", ["tpu-v5e", "tpu-v4"])
def test_leading_indices_used_beyond_identity_are_not_periodic(index_map, body, leading, chip_name, monkeypatch):
    chip = resolve_chip(chip_name)
    call = _custom_call(index_map, body)
    assert periodic_leading_dims(call)[0] == leading
    _assert_same(call, chip, monkeypatch)
