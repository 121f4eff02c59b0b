"""The schedule model's traffic against a recorded interpret run (tests/schedule/recorder.py), for the tests that
check it: tests/schedule/test_sched_traffic_validation.py and the kernel contract (tests/kernels/test_contract.py)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


def assert_traffic_is_the_models(fn: Callable, args: Sequence[Any], chip: Any, rec: Any) -> Any:
    """analyze_call on ``fn``'s one pallas_call, given the grid order the interpreter used, predicts exactly the
    block transfers and bytes per operand, and the manual-DMA bytes, that ``rec`` logged; returns its analysis."""
    from perfmodel.schedule.analyze import analyze_call
    from perfmodel.schedule.extract import find_pallas_calls, trace

    (call,) = find_pallas_calls(trace(fn, *args), list(args))
    kern = analyze_call(call, chip, order=np.array(rec.grid_points))
    assert kern.steps == len(rec.grid_points)
    moved = 0
    for o in kern.operands:
        count, nbytes = rec.count(o.role, o.name)
        if o.pipelined:
            assert (o.transfers, o.hbm_bytes) == (count, nbytes), o.name
            moved += count
        else:  # left in HBM: the interpreter copies nothing for it at step boundaries
            assert count == 0, o.name
    assert moved == len(rec.transfers)  # every logged copy belongs to a modelled operand
    # Manual DMA (operands in HBM copied by the body): same bytes as the interpreter's DMA engine moved.
    assert kern.work.manual_dma_bytes == rec.manual_hbm_bytes
    return kern
