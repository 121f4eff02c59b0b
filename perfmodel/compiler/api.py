"""Compile reports: run the TPU compiler in a forked compile process, cache the answer on disk.

``compile_report(call, chip)`` returns a :class:`CompileReport` for one call
(a ``MODULE:FUNCTION`` with ``--shape``/``--arg`` texts, or a catalog kernel
with block sizes). The first time, a compile server (:mod:`perfmodel.compiler
.client`, one per concurrent compile, living as long as the caller) forks a
process that compiles it with libtpu, deviceless, and keeps only what it reads
back (the report, each kernel's loop-body bundles, the optimized HLO) with the
record of every local file the compile imported or read. Afterwards the same
request is answered from the cache in milliseconds while each of those files
still hashes the same (:mod:`perfmodel.compiler.cache`): editing a kernel, its
tuned.json, perfmodel's gemm rules or a chip's hwspec recompiles exactly the
calls that read it. The key also covers the chip, the topology, the
jax/jaxlib/libtpu versions and libtpu's, XLA's and JAX's settings from the
environment.

The cache lives in ``$PERFMODEL_CACHE_DIR`` (default
``$XDG_CACHE_HOME/perfmodel`` or ``~/.cache/perfmodel``), under ``compile/``,
one sub-cache per libtpu version, least recently used entries evicted past
``$PERFMODEL_CACHE_MAX_MB``; ``perfmodel cache info|clear``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from perfmodel.compiler import cache
from perfmodel.compiler.bundles import LoopStats
from perfmodel.compiler.toolchain import CompilerUnavailable, Toolchain, check_topology, toolchain, worker_environment
from perfmodel.errors import InputError, PerfmodelError, ToolFailure

#: Bump when the report's JSON layout or the worker's reading of the dumps changes.
SCHEMA_VERSION = 5
#: Seconds one compile may take before it is abandoned.
DEFAULT_TIMEOUT_S = 600.0
#: File of the optimized HLO text in a cache entry.
HLO_FILE = cache.HLO_FILE


class CompileFailed(ToolFailure):
    """The compile child crashed or timed out (not a compiler rejection, which is a report)."""


def encode_arg(value: Any) -> Any:
    """A static argument as JSON for the compile worker: a JAX PRNG key (a tuned kernel's draw) as its key data and
    implementation (:func:`decode_arg` rebuilds it); anything else as it is."""
    if type(value).__name__ == "PRNGKeyArray":
        import jax
        import numpy as np

        return {"prng_key_data": np.asarray(jax.random.key_data(value)).tolist(),
                "prng_impl": str(jax.random.key_impl(value))}
    return value


def decode_arg(value: Any) -> Any:
    """Inverse of :func:`encode_arg` (in the worker)."""
    if isinstance(value, dict) and "prng_key_data" in value:
        import jax
        import numpy as np

        return jax.random.wrap_key_data(np.asarray(value["prng_key_data"], dtype=np.uint32), impl=value["prng_impl"])
    return value


@dataclass(frozen=True, kw_only=True)
class CompileCall:
    """What to compile: ``kind`` "function" (target MODULE:FUNCTION, args as ``--arg`` texts), "catalog"
    (target = kernel name, ``blocks`` its block fields or None for its defaults, ``extra`` static arguments)
    or "model" (target = preset name or config path, ``extra`` the step's parameters; see
    :mod:`perfmodel.xla.reference`). ``topology`` (e.g. "v5e:2x4") compiles for a whole slice: a
    function's arrays are then placed on a 1-D mesh of its chips (``shard``: NAME=SPEC texts, see
    :mod:`perfmodel.xla.build`); None = the chip's default topology, arrays on its first chip."""

    kind: str
    target: str
    shapes: tuple[str, ...]
    args: tuple[str, ...] = ()
    blocks: Mapping[str, int] | None = None
    extra: Mapping[str, Any] | None = None
    topology: str | None = None
    shard: tuple[str, ...] = ()

    def to_request(self) -> dict[str, Any]:
        slice_ = {} if self.topology is None else {"topology": self.topology, "shard": list(self.shard)}
        if self.kind == "function":
            return {"kind": "function", "target": self.target, "shapes": list(self.shapes), "args": list(self.args),
                    **slice_}
        if self.kind == "model":
            return {"kind": "model", "model": self.target, "args": dict(self.extra or {}), **slice_}
        return {"kind": "catalog", "kernel": self.target, "shapes": list(self.shapes),
                "blocks": dict(self.blocks) if self.blocks is not None else None,
                "args": {k: encode_arg(v) for k, v in (self.extra or {}).items()}}

    @property
    def label(self) -> str:
        blocks = "" if self.blocks is None else " " + ",".join(f"{k}={v}" for k, v in self.blocks.items())
        step = "" if self.kind != "model" else " " + ",".join(f"{k}={v}" for k, v in (self.extra or {}).items())
        return f"{self.target}{blocks}{step}"


@dataclass(frozen=True, kw_only=True)
class KernelCompile:
    """One pallas_call (tpu_custom_call) of the compiled program, in program order."""

    hlo_name: str
    #: Mosaic's scoped VMEM allocation (used_scoped_memory_configs), bytes.
    scoped_vmem_bytes: int | None
    #: Bundles of the whole kernel program (prologue, grid loop, epilogue).
    program_bundles: int | None
    #: MXUs the kernel issues to.
    mxus: int | None
    #: Whether the kernel has a grid-step loop (a one-step grid has none: the program is the step).
    has_grid_loop: bool
    #: The grid-step loop body (or the whole program without a loop).
    loop: LoopStats | None
    #: The body's bundles as the compiler printed them (in the cache directory).
    body_bundles_path: str | None


@dataclass(frozen=True, kw_only=True)
class CompileReport:
    call: str
    chip: str
    topology: str
    device_kind: str | None
    jax_version: str
    libtpu_version: str
    compiled: bool
    #: The compiler's message when it rejected the program (one line).
    error: str | None
    compile_s: float
    from_cache: bool
    kernels: tuple[KernelCompile, ...]
    #: Other ops of the program (XLA fusions, copies) and their bundles.
    other_ops: tuple[dict[str, Any], ...]
    cost_analysis: dict[str, float]
    memory: dict[str, int]
    cache_dir: str
    #: The optimized HLO module (``compiled.as_text()``) in the cache directory; None for older entries.
    hlo_path: str | None = None
    #: Chips of the topology compiled for (the program is one chip's; collectives span them).
    chips: int = 1


def cache_root() -> Path:
    """The compile cache's folder (all libtpu versions)."""
    return cache.root()


def _module_path(module: str) -> Path | None:
    """File of a module: found on sys.path without importing it, else through the import system's finders (an
    editable install's finder is not a sys.path entry; this imports the module's parent packages only)."""
    parts = module.split(".")
    for entry in sys.path or ["."]:
        base = Path(entry or ".").joinpath(*parts)
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                return cand
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and Path(origin).is_file() else None


#: Environment variables that change what a compile produces (besides the request): libtpu's and XLA's flags
#: and JAX's configuration (JAX_PLATFORMS excepted: the compile process always runs on the CPU).
def compile_environment() -> dict[str, str]:
    env = worker_environment(None)
    keep = {k: v for k, v in env.items() if k.startswith("JAX_") and k != "JAX_PLATFORMS"}
    keep.update({k: env.get(k, "") for k in ("LIBTPU_INIT_ARGS", "XLA_FLAGS")})
    return dict(sorted(keep.items()))


def cache_key(call: CompileCall, chip: str, tools: Toolchain, topology: str | None = None) -> str:
    """The request's key: the call, chip, topology, tool versions, the environment that matters and, for a
    ``MODULE:FUNCTION``, where the module resolves from here. What the compile read is checked apart, per
    variant (:mod:`perfmodel.compiler.cache`)."""
    from perfmodel import __version__
    from perfmodel.compiler.deps import project_root, relative_name

    target = None
    if call.kind == "function":
        path = _module_path(call.target.split(":", 1)[0])
        target = relative_name(str(path), project_root()) if path is not None else None
    blob = json.dumps({"schema": SCHEMA_VERSION, "call": call.to_request(), "chip": chip, "topology": topology,
                       "jax": tools.jax_version, "jaxlib": tools.jaxlib_version, "libtpu": tools.libtpu_version,
                       "perfmodel": __version__, "python": list(sys.version_info[:2]), "target_file": target,
                       "env": compile_environment()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _from_json(data: dict[str, Any], *, from_cache: bool, cache_dir: Path) -> CompileReport:
    kernels = []
    for i, k in enumerate(data.get("kernels", [])):
        sched = k.get("schedule")
        loop = None
        if sched:
            sched = dict(sched)
            sched["predicated_regions"] = tuple(sched.get("predicated_regions", ()))
            loop = LoopStats(**sched)
        body = cache_dir / f"kernel{i}_{k['hlo_name']}.bundles.txt"
        kernels.append(KernelCompile(
            hlo_name=k["hlo_name"], scoped_vmem_bytes=k.get("scoped_vmem_bytes"),
            program_bundles=k.get("program_bundles"), mxus=k.get("mxus"), has_grid_loop=bool(k.get("has_grid_loop")),
            loop=loop, body_bundles_path=str(body) if body.exists() else None,
        ))
    return CompileReport(
        call=data["call_label"], chip=data["chip"], topology=data["topology"], device_kind=data.get("device_kind"),
        jax_version=data["jax_version"], libtpu_version=data["libtpu_version"], compiled=bool(data["compiled"]),
        error=data.get("error"), compile_s=float(data.get("compile_s", 0.0)), from_cache=from_cache,
        kernels=tuple(kernels), other_ops=tuple(data.get("other_ops", ())),
        cost_analysis=dict(data.get("cost_analysis") or {}), memory=dict(data.get("memory") or {}),
        cache_dir=str(cache_dir),
        hlo_path=str(cache_dir / HLO_FILE) if (cache_dir / HLO_FILE).is_file() else None,
        chips=int(data.get("chips", 1)),
    )


def compile_report(call: CompileCall, chip: Any, *, use_cache: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                   progress: Callable[[str], None] | None = None) -> CompileReport:
    """Compile ``call`` for ``chip`` (a ChipSpec or name) with libtpu in a forked compile process; cached on
    disk while every file the compile read is unchanged."""
    from perfmodel.hw.registry import get_chip

    spec = get_chip(chip) if isinstance(chip, str) else chip
    if spec.kind != "tpu":
        raise InputError(f"--hw: {spec.name} is not a TPU; the TPU compiler compiles for TPUs only")
    topology = check_topology(spec, call.topology)
    tools = toolchain()
    key_dir = cache.sub_cache(tools.libtpu_version) / cache_key(call, spec.name, tools, topology)
    if use_cache:
        hit = cache.lookup(key_dir)
        if hit is not None:
            try:
                return _from_json(hit[1], from_cache=True, cache_dir=hit[0])
            except (KeyError, TypeError, ValueError):
                pass  # a damaged entry is recompiled
    if progress:
        progress(f"compiling {call.label} for {spec.name} ({topology}) with libtpu {tools.libtpu_version} ...")
    data = _run_worker(call, spec.name, topology, timeout_s)
    if data.get("error_kind") == "input":
        raise InputError(data["error"])
    if data.get("error_kind") == "internal":
        raise CompileFailed(f"compiling {call.label} for {spec.name} failed inside perfmodel: {data['error']}")
    record = data.pop("deps")
    data.update(call_label=call.label, chip=spec.name, topology=topology, jax_version=tools.jax_version,
                libtpu_version=tools.libtpu_version)
    cdir = cache.store(key_dir, data, record)
    if progress:
        progress(f"compiled in {data.get('compile_s', 0.0):.1f} s" if data.get("compiled")
                 else "the compiler rejected it")
    return _from_json(data, from_cache=False, cache_dir=cdir)


def _run_worker(call: CompileCall, chip: str, topology: str, timeout_s: float) -> dict[str, Any]:
    """The compile server's answer for one call (a compile process forked for it)."""
    from perfmodel.compiler.client import ServerFailed, ask

    request = {"chip": chip, "topology": topology, "call": call.to_request(),
               "exclude_reads": [str(cache.root().parent)]}
    try:
        data = ask(request, worker_environment(None), timeout_s)
    except ServerFailed as exc:
        raise CompileFailed(f"compiling {call.label} for {chip}: {exc}") from None
    if data.get("server_error") == "timeout":
        raise CompileFailed(f"compiling {call.label} for {chip} took over {timeout_s:.0f} s; gave up "
                            "(use smaller shapes or fewer grid steps)")
    if data.get("server_error"):
        raise CompileFailed(f"the compile process for {call.label} on {chip} exited with code "
                            f"{data.get('returncode')}: {data.get('stderr', 'no output')}")
    return data


def _compile_task(task: tuple[CompileCall, Any, bool]) -> CompileReport | PerfmodelError:
    """One compile of :func:`compile_many` (module level: perfmodel.runner's process and Ray workers call it); a
    compile error is its value, not a failed task."""
    call, chip, use_cache = task
    try:
        return compile_report(call, chip, use_cache=use_cache)
    except PerfmodelError as exc:
        return exc


def compile_many(calls: Sequence[CompileCall], chip: Any, *, jobs: int | None = None, use_cache: bool = True,
                 progress: Callable[[str], None] | None = None, backend: str = "thread",
                 address: str | None = None) -> list[CompileReport | PerfmodelError]:
    """Compile several calls in parallel on perfmodel.runner (``backend`` "thread" by default: ``jobs`` compile
    servers of this process; "ray" with ``address``: on a Ray cluster's workers, each with its own servers and the
    environment perfmodel.runner.ray_runtime_env carries); each item is a report or the error it raised."""
    from perfmodel.runner import run_tasks

    jobs = jobs or max(1, min(len(calls), os.cpu_count() or 1))
    t0 = time.perf_counter()

    def tick(message: str, *, done: int, total: int) -> None:
        if progress:
            progress(f"compiled {done}/{total} ({time.perf_counter() - t0:.0f} s)")

    results = run_tasks(_compile_task, [(c, chip, use_cache) for c in calls], backend=backend, workers=jobs,
                        address=address, progress=tick)
    # a task that raised something else than a PerfmodelError (a worker lost) is a failed compile of that call
    name = getattr(chip, "name", chip)
    return [r.value if r.ok else CompileFailed(f"compiling {calls[r.index].label} for {name}: {r.error}")
            for r in results]


__all__ = ["CompileCall", "CompileFailed", "CompileReport", "CompilerUnavailable", "KernelCompile",
           "cache_root", "compile_many", "compile_report"]
