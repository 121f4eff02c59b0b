"""Compile one function for a TPU with libtpu (deviceless) and read back the result.

Runs in a process forked for the compile by :mod:`perfmodel.compiler.server`
(see :func:`perfmodel.compiler.api.compile_report`), the only place perfmodel
starts libtpu, so libtpu's flags, lockfile and environment stay there.

Request: ``{"chip", "topology", "call": {...}, "dump_dir"}`` where ``call`` is
``{"kind": "function", "target": "MODULE:FUNCTION", "shapes": [...], "args": [...]}``
(the ``--shape``/``--arg`` texts of ``perfmodel analyze``) or
``{"kind": "catalog", "kernel": NAME, "shapes": [...], "blocks": {...} | null, "args": {...}}``.
Arrays given a FILL are baked into the program as constants (wrappers may read
their values, e.g. a page table); the others are abstract, on the topology's
first device.
"""

from __future__ import annotations

import glob
import os
import re
import time
from typing import Any

_CUSTOM_CALL = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=.*custom_call_target=\"tpu_custom_call\"")
_SCOPED = re.compile(r'"used_scoped_memory_configs":\[(.*?)\]')
_SCOPED_ITEM = re.compile(r'\{"memory_space":"(\d+)","offset":"\d+","size":"(\d+)"\}')



def _build(call: dict[str, Any], chip: Any) -> tuple[Any, list[Any], list[str]]:
    """(python function of the free arrays, their specs, their values) for the request's call."""
    from perfmodel.schedule.binding import bind_arrays, bind_catalog

    if call["kind"] == "function":
        return bind_arrays(call["target"], call["shapes"], call["args"], chip)
    from perfmodel.compiler.api import decode_arg

    args = {k: decode_arg(v) for k, v in (call.get("args") or {}).items()}
    return bind_catalog(call["kernel"], call["shapes"], call.get("blocks"), args, chip)


def _first_line(exc: BaseException) -> str:
    """The compiler's own message, on one line (Mosaic errors carry the reason after the location)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("The above exception", "Traceback", "---", "For simplicity"))]
    msg = " ".join(keep[:3]) if keep else text
    return re.sub(r"\s+", " ", msg)[:600]


def read_schedule(files: dict[str, str]) -> Any:
    """The compiler's schedule of one op from its dump files (``files``: an entry of :func:`_op_files`, with
    its bundles file and, where dumped, its utilization file)."""
    from perfmodel.compiler.bundles import build_schedule

    def text(key: str) -> str | None:
        if key not in files:
            return None
        with open(files[key], encoding="utf-8", errors="replace") as fh:
            return fh.read()

    return build_schedule(text("bundles"), text("utilization"))


def _op_files(dump_dir: str) -> dict[str, dict[str, str]]:
    """HLO op name -> {'bundles': path, 'utilization': path} of the final schedule the compiler dumped."""
    out: dict[str, dict[str, str]] = {}
    for path in glob.glob(os.path.join(dump_dir, "*-final_bundles.txt")):
        base = os.path.basename(path)
        if "schedule-analysis" in base:
            continue
        m = re.match(r"^\d+-(.+)-\d+-final_bundles\.txt$", base)
        if not m:
            continue
        name = m.group(1)
        entry = out.setdefault(name, {})
        entry["bundles"] = path
        util = glob.glob(os.path.join(dump_dir, f"*-{glob.escape(name)}-*-final_hlo-static-per-bundle-utilization.txt"))
        if util:
            entry["utilization"] = util[0]
    return out


def run(request: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import jax
    from jax.experimental import topologies

    from perfmodel.compiler.bundles import build_schedule, grid_loop, loop_body_text, loop_stats, xlu_issue
    from perfmodel.hw.registry import get_chip

    chip = get_chip(request["chip"])
    result: dict[str, Any] = {"compiled": False, "error": None, "kernels": [], "other_ops": []}
    topo = topologies.get_topology_desc(request["topology"], "tpu")
    device = topo.devices[0]
    result["device_kind"] = device.device_kind
    call = request["call"]
    donate: tuple[int, ...] = ()
    if call["kind"] == "model" or call.get("topology"):  # a slice: arrays on a mesh of its chips
        from perfmodel.xla.build import slice_program

        fn, args, donate = slice_program(call, chip, list(topo.devices))
        result["chips"] = len(topo.devices)
    else:
        sharding = jax.sharding.SingleDeviceSharding(device)
        fn, specs, _values = _build(call, chip)
        args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in specs]
    try:
        compiled = jax.jit(fn, donate_argnums=donate).trace(*args).lower(lowering_platforms=("tpu",)).compile()
    except Exception as exc:  # the compiler's rejection is the answer, not a crash
        result["error"] = _first_line(exc)
        result["compile_s"] = time.perf_counter() - t0
        return result
    result["compiled"] = True
    result["compile_s"] = time.perf_counter() - t0
    text = compiled.as_text()
    result["hlo_text"] = text  # kept in the cache entry (perfmodel.xla reads it op by op)
    calls = []
    for line in text.splitlines():
        m = _CUSTOM_CALL.match(line)
        if not m:
            continue
        vmem = smem = None
        sm = _SCOPED.search(line)
        if sm:
            items = [(int(a), int(b)) for a, b in _SCOPED_ITEM.findall(sm.group(1))]
            vmem = sum(size for space, size in items if space == 1)
            smem = sum(size for space, size in items if space != 1) or None
        calls.append({"hlo_name": m.group(1), "scoped_vmem_bytes": vmem, "scoped_other_bytes": smem})
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list):
            cost = cost[0] if cost else {}
        result["cost_analysis"] = {k: float(v) for k, v in (cost or {}).items()
                                   if k in ("flops", "transcendentals", "bytes accessed", "optimal_seconds")}
    except Exception:  # not every backend reports it
        result["cost_analysis"] = {}
    try:
        mem = compiled.memory_analysis()
        result["memory"] = {k: int(getattr(mem, k)) for k in
                            ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                             "generated_code_size_in_bytes", "alias_size_in_bytes")}
    except Exception:
        result["memory"] = {}
    dump = request.get("dump_dir")
    files = _op_files(dump) if dump else {}
    for c in calls:
        f = files.get(c["hlo_name"])
        if not f or "bundles" not in f:
            c["schedule"] = None
            continue
        sched = read_schedule(f)
        loop = grid_loop(sched)
        stats = loop_stats(sched, loop)
        c["program_bundles"] = len(sched.bundles)
        c["mxus"] = sched.mxus()
        c["has_grid_loop"] = loop is not None
        c["schedule"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(stats).items()}
        c["body_text"] = loop_body_text(sched, loop)
    result["kernels"] = calls
    custom = {c["hlo_name"] for c in calls}
    for name, f in sorted(files.items()):
        if name in custom or name.startswith("<") or name == "TLP" or "bundles" not in f:
            continue
        with open(f["bundles"], encoding="utf-8", errors="replace") as fh:
            sched = build_schedule(fh.read())
        whole = loop_stats(sched, None)
        xlu = xlu_issue(sched)
        result["other_ops"].append({"hlo_name": name, "program_bundles": len(sched.bundles),
                                    "weighted_bundles": whole.weighted_bundles,
                                    "unknown_trip_loops": whole.inner_loops_unknown_trips,
                                    "xlu_pushes": {str(k): v for k, v in xlu.pushes.items()},
                                    "xlu_spacing": xlu.spacing})
    return result


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """:func:`run` with its failures as answers: a user error in binding (``error_kind`` "input") or an
    unexpected failure ("internal"), each one line."""
    try:
        return run(request)
    except Exception as exc:  # reported to the caller, which raises InputError or CompileFailed
        from perfmodel.errors import PerfmodelError

        kind = "input" if isinstance(exc, PerfmodelError) else "internal"
        return {"compiled": False, "error": _first_line(exc), "error_kind": kind, "kernels": [], "other_ops": []}
