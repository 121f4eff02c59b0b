"""The vectorized pipeline simulation on hand-worked sequences (numpy only, no jax)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfmodel.schedule import pipeline as pl_sim


def _idx(*rows):
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)


def test_input_fetched_only_when_block_index_changes():
    # indices 0,0,1,1,0 -> fetch at steps 0 (first), 2 (0->1), 4 (1->0): 3 fetches of 128*4 bytes.
    seg = pl_sim.single_segment(5)
    t = pl_sim.simulate_block(_idx(0, 0, 1, 1, 0), role="input", block_shape=(128,), block_kinds=("blocked",),
                              array_shape=(256,), itemsize_bytes=4, seg=seg)
    assert t.transfers == 3
    assert t.total_bytes == 3 * 128 * 4
    assert list(t.step_bytes) == [512, 0, 512, 0, 512]
    # Distinct windows: block 0 and block 1 -> 256 elements x 4 B, the whole array once.
    assert t.ideal_bytes == 256 * 4


def test_output_written_back_before_its_index_changes_and_at_the_end():
    # indices 0,0,1,1,0 -> write-backs after steps 1 (0->1), 3 (1->0) and 4 (last): 3.
    seg = pl_sim.single_segment(5)
    t = pl_sim.simulate_block(_idx(0, 0, 1, 1, 0), role="output", block_shape=(128,), block_kinds=("blocked",),
                              array_shape=(256,), itemsize_bytes=2, seg=seg)
    assert t.transfers == 3
    assert list(np.nonzero(t.step_bytes)[0]) == [1, 3, 4]


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_partial_edge_block_moves_only_its_valid_rows(itemsize):
    # Array of 200 rows in blocks of 128: block 1 covers rows 128..255, of which 72 exist.
    seg = pl_sim.single_segment(2)
    t = pl_sim.simulate_block(_idx([0, 0], [1, 0]), role="input", block_shape=(128, 256),
                              block_kinds=("blocked", "blocked"), array_shape=(200, 256), itemsize_bytes=itemsize,
                              seg=seg)
    assert list(t.step_bytes) == [128 * 256 * itemsize, 72 * 256 * itemsize]
    assert t.ideal_bytes == 200 * 256 * itemsize


def test_squeezed_and_element_dims_use_the_index_as_an_offset():
    # A squeezed leading dim (size 1) indexed 0..2 and an element dim whose windows of 16 start at 0, 8, 8.
    seg = pl_sim.single_segment(3)
    t = pl_sim.simulate_block(_idx([0, 0], [1, 8], [1, 8]), role="input", block_shape=(1, 16),
                              block_kinds=("squeezed", "element"), array_shape=(3, 20), itemsize_bytes=4, seg=seg)
    # Windows: row 0 cols 0..15 (16 valid), row 1 cols 8..23 (12 valid); the third repeats the second.
    assert t.transfers == 2
    assert list(t.step_bytes) == [16 * 4, 12 * 4, 0]


def test_megacore_split_restarts_the_pipeline_on_each_core():
    # Grid (4, 3), first dim parallel, 2 cores: core 0 runs steps 0..5, core 1 steps 6..11.
    seg = pl_sim.split_over_cores((4, 3), ("parallel", "arbitrary"), 2)
    assert seg.cores == 2
    assert list(np.nonzero(seg.starts)[0]) == [0, 6]
    assert list(np.nonzero(seg.ends)[0]) == [5, 11]
    # A block whose index never changes is fetched once per core.
    const = np.zeros((12, 1), dtype=np.int64)
    t = pl_sim.simulate_block(const, role="input", block_shape=(8,), block_kinds=("blocked",), array_shape=(8,),
                              itemsize_bytes=4, seg=seg)
    assert t.transfers == 2
    # Output: written once per core as well.
    o = pl_sim.simulate_block(const, role="output", block_shape=(8,), block_kinds=("blocked",), array_shape=(8,),
                              itemsize_bytes=4, seg=seg)
    assert o.transfers == 2


def test_megacore_split_rounds_up_an_odd_parallel_extent():
    # Parallel extent 3 over 2 cores: ceil(3/2)=2 points on core 0 (steps 0..3), 1 on core 1 (steps 4..5).
    seg = pl_sim.split_over_cores((3, 2), ("parallel", "arbitrary"), 2)
    assert list(seg.core) == [0, 0, 0, 0, 1, 1]


def test_no_split_without_a_leading_parallel_dimension():
    seg = pl_sim.split_over_cores((4, 3), ("arbitrary", "parallel"), 2)
    assert seg.cores == 1


def test_dma_schedule_prefetches_one_step_early_and_writes_back_one_step_late():
    # fetch bytes a,b,c = 10,20,30; write-backs x,y,z = 1,2,3 in one core's sequence:
    # during step 0: next fetch b (20) and no write-back -> 20
    # during step 1: next fetch c (30) + write-back of step 0 (1) -> 31
    # during step 2: nothing to fetch + write-back of step 1 (2) -> 2
    # prologue a = 10, epilogue z = 3.
    seg = pl_sim.single_segment(3)
    d = pl_sim.dma_schedule(np.array([10.0, 20, 30]), np.array([1.0, 2, 3]), seg)
    assert list(d.overlapped_bytes) == [20, 31, 2]
    assert list(d.prologue_bytes) == [10]
    assert list(d.epilogue_bytes) == [3]


def test_dma_schedule_does_not_overlap_across_cores():
    seg = pl_sim.split_over_cores((2, 2), ("parallel", "arbitrary"), 2)
    d = pl_sim.dma_schedule(np.array([1.0, 2, 4, 8]), np.array([16.0, 32, 64, 128]), seg)
    # core 0: steps 0,1 -> during 0: fetch 2; during 1: write-back 16. core 1: steps 2,3 -> 8; 64.
    assert list(d.overlapped_bytes) == [2, 16, 8, 64]
    assert list(d.prologue_bytes) == [1, 4]
    assert list(d.epilogue_bytes) == [32, 128]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=40), st.booleans())
def test_counts_match_a_step_by_step_reference(rows, dense):
    """Vectorized counts equal a plain Python loop over the steps (both distinct-window paths)."""
    idx = np.asarray(rows, dtype=np.int64)
    seg = pl_sim.single_segment(len(rows))
    old = pl_sim.DENSE_KEY_SPACE
    pl_sim.DENSE_KEY_SPACE = old if dense else 0
    try:
        t = pl_sim.simulate_block(idx, role="input", block_shape=(4, 8), block_kinds=("blocked", "blocked"),
                                  array_shape=(14, 20), itemsize_bytes=2, seg=seg)
    finally:
        pl_sim.DENSE_KEY_SPACE = old

    def nbytes(r):
        return min(4, 14 - 4 * r[0]) * min(8, 20 - 8 * r[1]) * 2

    fetches, total, seen, prev = 0, 0, {}, None
    for r in rows:
        if r != prev:
            fetches += 1
            total += nbytes(r)
            seen[r] = nbytes(r)
        prev = r
    assert t.transfers == fetches
    assert t.total_bytes == total
    assert t.ideal_bytes == sum(seen.values())
