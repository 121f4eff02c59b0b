"""Text of a compile report (pure functions from report to text)."""

from __future__ import annotations

from typing import Any, Sequence

#: Units of the per-bundle utilization file, in the order they are printed.
UNITS = ("MXU", "VALU", "VPOP", "XLU", "EUP", "VLOAD", "VSTORE", "SALU")


def render_report(report: Any, paired: Sequence[Any] = ()) -> str:
    """``report``: a CompileReport; ``paired``: CompiledKernel views (same order) for estimates and timing."""
    from perfmodel.compiler.bundles import guarded_trips
    from perfmodel.units import binary, seconds

    head = (f"compile {report.call} for {report.chip} ({report.topology}, {report.device_kind or '?'}) "
            f"with libtpu {report.libtpu_version}, jax {report.jax_version}: "
            + ("compiled" if report.compiled else "REJECTED")
            + (" (from cache)" if report.from_cache else f" in {report.compile_s:.1f} s"))
    lines = [head]
    if not report.compiled:
        lines.append(f"  compiler: {report.error}")
        return "\n".join(lines)
    views = {i: v for i, v in enumerate(paired)}
    for i, k in enumerate(report.kernels):
        v = views.get(i)
        name = v.name if v is not None else k.hlo_name
        lines += ["", f"pallas_call #{i} {name} (HLO {k.hlo_name}): {k.program_bundles or 0:,} bundles, "
                      f"{k.mxus or 0} MXU(s) used"]
        if k.scoped_vmem_bytes is not None:
            est = ""
            if v is not None:
                err = v.vmem_error
                est = f"; perfmodel estimates {binary(v.vmem_estimate_bytes)}" + (f" ({err:+.0%})" if err is not None else "")
            lines.append(f"  VMEM      Mosaic allocated {binary(k.scoped_vmem_bytes)} of scoped VMEM{est}")
        lp = k.loop
        if lp is None:
            lines.append("  schedule  not available (no final-bundles dump for this op)")
            continue
        where = (f"grid-step loop body, {lp.trip_count:,} iterations" if k.has_grid_loop and lp.trip_count
                 else "grid-step loop body, data-dependent trip count" if k.has_grid_loop
                 else "whole program (no grid loop: one step)")
        lines.append(f"  bundles   {lp.bundles:,} static in the {where}")
        if lp.guarded_weighted_bundles and lp.trip_count:
            runs = guarded_trips(lp.trip_count, lp.stages)
            lines.append(f"            software-pipelined {lp.stages + 1} stages deep: {runs:,} iterations run the step "
                         f"guard's {lp.guarded_weighted_bundles:,} bundles, {lp.trip_count - runs} only fill or drain "
                         "the pipeline")
        regions = ", ".join(f"{r:,}" for r in lp.predicated_regions) or "none"
        most = (f", at most {lp.predicated_max_bundles:,} in one step (paths whose branch conditions exclude each "
                "other)" if lp.predicated_max_bundles < lp.predicated_bundles else "")
        lines.append(f"            every step: {lp.always_bundles:,}; predicated: {lp.predicated_bundles:,} "
                     f"(regions of {regions} bundles: pl.when paths, masked blocks){most}")
        if lp.inner_loops:
            unk = f", {lp.inner_loops_unknown_trips} with a data-dependent trip count counted once" if lp.inner_loops_unknown_trips else ""
            lines.append(f"            {lp.inner_loops} inner loop(s) counted per trip: {lp.weighted_bundles:,} bundles per step{unk}")
        lines.append(f"  per step  DMA starts {lp.dma_starts}, DMA waits {lp.dma_waits}, bounds-check halts "
                     f"{lp.bounds_check_halts}; spills/fills: vector {lp.vector_spills}/{lp.vector_fills}, "
                     f"scalar {lp.scalar_spills}/{lp.scalar_fills}")
        if lp.slot_utilization:
            util = "  ".join(f"{u} {lp.slot_utilization[u]:.0%}" for u in UNITS if u in lp.slot_utilization)
            lines.append(f"  slots     {util}  (share of each unit's issue slots over the body)")
        if v is not None and v.time is not None:
            t = v.time
            lines.append(f"  time      compiler-backed {seconds(t.expected_s)} vs analytic {seconds(v.analytic_expected_s)} "
                         f"({t.expected_s / v.analytic_expected_s:.2f}x); mean step {t.mean_step_bundles:,.0f} bundles at "
                         f"{t.clock_hz / 1e9:.2f} GHz = {seconds(t.mean_step_compute_s)} compute, "
                         f"{seconds(t.mean_step_dma_s)} DMA -> {t.limiter}-limited "
                         f"({t.steps_limited_by['compute']:,}/{v.steps:,} steps compute)")
            if t.floored:
                lines.append("            (raised to the op floor: the schedule alone came out faster than the peak rates allow)")
    if report.other_ops:
        ops = ", ".join(f"{o['hlo_name']} ({o['program_bundles']:,} bundles)" for o in report.other_ops[:6])
        lines += ["", f"other ops in the program: {ops}"]
    return "\n".join(lines)


def render_cache_info(info: Any, *, cleared: bool = False) -> str:
    """Text of :func:`perfmodel.compiler.cache.info` (``cleared``: what :func:`~perfmodel.compiler.cache.clear`
    removed)."""
    from perfmodel.units import binary

    verb = "removed" if cleared else "holds"
    lines = [f"compile cache {info.path}: {verb} {info.variants:,} compiles, {binary(info.size_bytes)}"
             + ("" if cleared else f" of {binary(info.max_bytes)} (PERFMODEL_CACHE_MAX_MB; least recently used "
                                   "evicted past it)")]
    for sub in info.sub_caches:
        lines.append(f"  libtpu {sub.libtpu_version}: {sub.entries:,} requests, {sub.variants:,} compiles, "
                     f"{binary(sub.size_bytes)}")
    lines.append(f"spec cache {info.spec_cache_path}: {binary(info.spec_cache_bytes)}")
    lines.append(f"XLA:CPU program cache {info.jax_cache_path}: {binary(info.jax_cache_bytes)} (the test suite's)")
    return "\n".join(lines)
