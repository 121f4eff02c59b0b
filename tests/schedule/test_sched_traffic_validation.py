"""The schedule model's traffic against what a real Pallas TPU-interpret run does.

Each kernel runs in TPU interpret mode with its block copies instrumented
(tests/schedule/recorder.py): every block fetch and write-back the
interpreter performs is logged with its window, and the grid order it used
(it permutes "parallel" dimensions). analyze_call, given that order, must
predict exactly the same number of transfers and bytes per operand, and for
kernels that copy from HBM themselves (memory_space ANY), the same bytes of
manual DMA.
"""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.schedule.analyze import analyze_call
from perfmodel.schedule.catalog import get_entry
from perfmodel.schedule.extract import find_pallas_calls, trace
from tests.schedule.recorder import record_traffic
from tests.schedule.traffic import assert_traffic_is_the_models

slow = pytest.mark.slow
#: The bundled kernels' block copies are also checked, on the same interpret run as their reference match, by
#: tests/kernels/test_contract.py (every contract case, unaligned shapes included): their cases here run with
#: -m slow (make test-all); the default run keeps JAX's own matmul (not a bundled kernel).
covered = slow

# (kernel, --shape texts with random data, blocks or None for the kernel's default)
CASES = [
    pytest.param("matmul", ["x=200x384:bf16=random", "w=384x300:bf16=random"], {"bm": 128, "bk": 128, "bn": 128},
                 id="matmul-bf16-unaligned", marks=covered),
    pytest.param("matmul", ["x=256x256:f32=random", "w=256x384:f32=random", "bias=384:f32=random"],
                 {"bm": 128, "bk": 128, "bn": 128}, id="matmul-f32-bias", marks=slow),
    pytest.param("matmul", ["x=128x512:bf16=random", "w=512x256:int8=random", "w_scale=256:f32=random"],
                 {"bm": 64, "bk": 256, "bn": 128}, id="matmul-int8", marks=slow),
    pytest.param("rms_norm", ["x=100x256:bf16=random", "residual=100x256:bf16=random", "weight=256:f32=random"],
                 {"block_tokens": 32}, id="rms_norm-partial-last-block", marks=covered),
    pytest.param("flash_attention", ["q=1x4x256x128:bf16=random", "k=1x2x256x128:bf16=random",
                                     "v=1x2x256x128:bf16=random"], {"block_q": 128, "block_kv": 128},
                 id="flash-gqa2-causal", marks=covered),
    pytest.param("flash_attention", ["q=2x8x256x128:f32=random", "k=2x1x384x128:f32=random",
                                     "v=2x1x384x128:f32=random"], {"block_q": 128, "block_kv": 128},
                 id="flash-gqa8-f32", marks=slow),
    # Caches [kv_heads, num_pages, page_size, head_dim] (the kernel's default head-major layout).
    pytest.param("kv_cache_update", ["new_k=8x2x128:bf16=random", "new_v=8x2x128:bf16=random",
                                     "k_cache=2x16x16x128:bf16=random", "v_cache=2x16x16x128:bf16=random",
                                     "slot_mapping=8:int32=arange"], None, id="kv_cache_update", marks=covered),
    pytest.param("paged_attention", ["q=2x8x128:bf16=random", "k_pages=2x32x16x128:bf16=random",
                                     "v_pages=2x32x16x128:bf16=random", "page_table=2x8:int32=arange",
                                     "lengths=2:int32=100"], None, id="paged_attention-partial-page", marks=covered),
    pytest.param("ragged_paged_attention", ["q=16x8x128:bf16=random", "kv_pages=32x16x4x128:bf16=random",
                                            "kv_lens=2:int32=64",
                                            "page_table=2x8:int32=arange", "cu_q_lens=3:int32=arange",
                                            "num_seqs=1:int32=2"], None, id="ragged", marks=slow),
    pytest.param("sampling", ["logits=8x1024:f32=random"], None, id="sampling", marks=covered),
    pytest.param("jax-matmul", ["x=256x384:bf16=random", "y=384x256:bf16=random"], {"bm": 128, "bk": 128, "bn": 128},
                 id="jax-matmul"),
]


@pytest.mark.parametrize("kernel,shapes,blocks", CASES)
def test_predicted_transfers_equal_the_interpreter_run(v5e, kernel, shapes, blocks):
    entry = get_entry(kernel)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    fn = entry.make_function(specs, blocks, v5e)
    rec = record_traffic(fn, *args)
    kern = assert_traffic_is_the_models(fn, args, v5e, rec)
    assert kern.manual_dma == (rec.manual_hbm_bytes > 0 or any(not o.pipelined for o in kern.operands))


def test_row_major_order_matches_the_interpreter_when_nothing_is_parallel(v5e):
    # rms_norm's single grid axis: the interpreter's permutation of a parallel axis changes the
    # order but not which blocks are fetched; the default (row-major) prediction gives the same totals.
    entry = get_entry("rms_norm")
    specs = entry.specs(["x=64x256:f32=random", "residual=64x256:f32=random", "weight=256:f32=random"])
    args = entry.arguments(specs)
    fn = entry.make_function(specs, {"block_tokens": 16}, v5e)
    rec = record_traffic(fn, *args)
    call = find_pallas_calls(trace(fn, *args), args)[0]
    default = analyze_call(call, v5e)
    for o in default.operands:
        assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name)


def test_recording_keeps_the_jit_caches_and_records_every_run(v5e):
    # record_traffic must not flush the process's compiled programs (it did: jax.clear_caches around each run),
    # and a second recording of the same function must not reuse the first run's program: each run's forced
    # interpret parameters carry its own recorder, so both log the same copies.
    import jax

    entry = get_entry("rms_norm")
    specs = entry.specs(["x=64x256:f32=random", "residual=64x256:f32=random", "weight=256:f32=random"])
    args = entry.arguments(specs)
    fn = entry.make_function(specs, {"block_tokens": 16}, v5e)
    unrelated = jax.jit(lambda a: a * 2 + 1)
    unrelated(np.ones(3, np.float32))
    before = unrelated._cache_size()
    first, second = record_traffic(fn, *args), record_traffic(fn, *args)
    assert unrelated._cache_size() == before == 1
    # 64 rows in blocks of 16: 4 steps, each fetching x and residual and writing both outputs.
    assert len(first.grid_points) == len(second.grid_points) == 4
    assert len(first.transfers) == len(second.transfers) > 0
    assert [(t.role, t.name, t.block_indices) for t in first.transfers] == \
        [(t.role, t.name, t.block_indices) for t in second.transfers]
