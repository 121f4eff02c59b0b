"""Kernel-schedule model: what a Pallas TPU kernel's grid and BlockSpecs cost.

``analyze(fn, *args, chip=...)`` traces ``fn``, finds each ``pallas_call`` and
reports its HBM traffic (fetches when a block index changes, write-backs
likewise, ideal bytes and re-read factor), VMEM footprint against the chip's
limits, MXU / VPU / EUP work of the body, and an expected time next to the op
floor. ``tune`` (in :mod:`perfmodel.schedule.tune`) ranks block sizes by it.

Importing this package is cheap; jax is imported when a function needs it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["analyze", "analyze_call", "Analysis", "KernelAnalysis", "render", "find_pallas_calls"]

_LAZY = {
    "analyze": "perfmodel.schedule.analyze",
    "analyze_call": "perfmodel.schedule.analyze",
    "Analysis": "perfmodel.schedule.results",
    "KernelAnalysis": "perfmodel.schedule.results",
    "render": "perfmodel.schedule.analysis_render",
    "find_pallas_calls": "perfmodel.schedule.extract",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfmodel.schedule' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)
