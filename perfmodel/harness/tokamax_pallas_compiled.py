"""The compiler-backed time of a tokamax Pallas point (``perfmodel validate --group tokamax --pallas analyze
--compile``): its recorded call compiled deviceless and read as a whole program.

Kept apart from :mod:`perfmodel.harness.tokamax_analyze`, which the compile process imports for the call it
compiles (an edit there invalidates every cached compile of a Pallas point; this module it never imports).
"""

from __future__ import annotations

from typing import Any

from perfmodel.harness.tokamax_analyze import COMPILE_TARGET, bound_call


def compile_request(point: Any) -> tuple[list[str], list[str]]:
    """(``--shape`` texts, ``--arg`` texts) that hand a tokamax Pallas point's recorded call to the compiler
    through :data:`~perfmodel.harness.tokamax_analyze.COMPILE_TARGET` (its arrays as ``a0``, ``a1``, ...)."""
    import numpy as np

    from perfmodel.schedule.shapes import ShapeSpec

    _, arrays = bound_call(point.call)
    shapes = [ShapeSpec(name=f"a{i}", shape=tuple(a.shape), dtype=np.dtype(a.dtype).name).text()
              for i, a in enumerate(arrays)]
    timings = point.call.get("timings_file")
    return shapes, [f"point={point.id!r}"] + ([f"timings={timings!r}"] if timings else [])


def compiled_time(point: Any) -> tuple[float | None, str]:
    """(the compiler-backed time of a tokamax Pallas point, or None; why not): its call compiled deviceless for
    the point's chip (``tpu-7x/core`` compiles for ``tpu-7x``: the topology's first device is one TensorCore)
    and read as a whole program (:func:`perfmodel.xla.program.build_program` on the point's chip): each
    pallas_call at its compiler-backed time (:mod:`perfmodel.schedule.compiled`), the XLA ops around them
    (layout copies, casts, reductions) from the compiled program's own fusions, bundles and bytes, as for the
    XLA points."""
    from perfmodel.errors import PerfmodelError
    from perfmodel.hw.registry import get_chip
    from perfmodel.hw.views import split_device_suffix
    from perfmodel.schedule.inspection import analyze_target
    from perfmodel.xla.program import build_program

    shapes, args = compile_request(point)
    try:
        result = analyze_target(COMPILE_TARGET, shapes, args, split_device_suffix(point.chip)[0], with_compile=True)
        kernels = result.compiled.compiled_kernels
        if not kernels or any(k.time is None for k in kernels):
            return None, "a kernel has no compiler-backed time (no grid-step loop found in its program)"
        program = build_program(result.compiled.compile, get_chip(point.chip),
                                kernel_times={k.compile.hlo_name: k.time.expected_s for k in kernels})
    except PerfmodelError as exc:
        return None, str(exc).splitlines()[0]
    return float(program.step_s), ""
