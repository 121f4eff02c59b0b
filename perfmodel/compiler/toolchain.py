"""The TPU compiler (libtpu) as an optional part of perfmodel: is it here, which version, which topology.

Nothing here imports jax or libtpu: availability is read from package
metadata, so ``perfmodel hw`` and ``predict`` never pay for it. Compiles run
in a child process (:mod:`perfmodel.compiler.worker`) whose environment is
built by :func:`worker_environment`; the caller's own environment and process
are never touched.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass

from perfmodel.errors import ToolFailure

#: Deviceless topology libtpu compiles for, per canonical chip name. The first device of the topology is
#: the compile target; its ``device_kind`` must be one of the chip spec's ``jax_device_kinds`` (checked by
#: the worker and by tests/compiler). These are libtpu's topology names, not hardware facts.
TOPOLOGIES: dict[str, str] = {
    "tpu-v4": "v4:2x2x1",
    "tpu-v5e": "v5e:2x2",
    "tpu-v5p": "v5p:2x2x1",
    "tpu-v6e": "v6e:2x2",
    "tpu-7x": "tpu7x:2x2x1",
}

INSTALL_HINT = "install it with `pip install -e '.[tpu-compiler]'` (or `make test`, which does)"


class CompilerUnavailable(ToolFailure):
    """libtpu is not installed, or cannot compile for the chip asked for."""


@dataclass(frozen=True, kw_only=True)
class Toolchain:
    jax_version: str
    jaxlib_version: str
    libtpu_version: str


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def toolchain() -> Toolchain:
    """Versions of jax, jaxlib and libtpu; CompilerUnavailable (one line) when libtpu is missing."""
    libtpu = _version("libtpu") or _version("libtpu-nightly")
    if libtpu is None or importlib.util.find_spec("libtpu") is None:
        raise CompilerUnavailable(f"the TPU compiler (libtpu) is not installed; {INSTALL_HINT}")
    return Toolchain(jax_version=_version("jax") or "?", jaxlib_version=_version("jaxlib") or "?",
                     libtpu_version=libtpu)


def available() -> bool:
    try:
        toolchain()
    except CompilerUnavailable:
        return False
    return True


def topology_for(chip_name: str) -> str:
    """libtpu topology string for a canonical TPU chip name; a one-line error for the rest."""
    try:
        return TOPOLOGIES[chip_name]
    except KeyError:
        raise CompilerUnavailable(
            f"--hw {chip_name}: the installed TPU compiler has no deviceless target for it; "
            f"compile for one of {', '.join(TOPOLOGIES)}"
        ) from None


def check_topology(chip_name: str, topology: str | None) -> str:
    """The topology to compile for: ``topology`` (e.g. "v5e:2x4", a slice of ``chip_name``'s generation) or the
    chip's default; a one-line error naming `topology` when it is another generation or malformed."""
    default = topology_for(chip_name)
    if topology is None:
        return default
    family, _, dims = topology.partition(":")
    want = default.split(":", 1)[0]
    parts = dims.split("x")
    if family != want or not dims or not all(p.isdigit() and int(p) > 0 for p in parts) \
            or len(parts) != len(default.split(":", 1)[1].split("x")):
        from perfmodel.errors import InputError

        raise InputError(f"`topology` '{topology}': {chip_name} slices are written like '{default}' "
                                  f"({want}:AxB{'xC' if default.count('x') == 2 else ''}, chips per axis)")
    return topology


def topology_chips(topology: str) -> int:
    """Chips of a topology string ("v5e:2x4" -> 8)."""
    n = 1
    for p in topology.partition(":")[2].split("x"):
        n *= int(p)
    return n


#: JAX's persistent compilation cache settings (the test suite caches XLA:CPU programs with them): never passed to a
#: compile process, whose compiles must run for their dumps, nor part of a compile's cache key.
JAX_CACHE_VARIABLES = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "JAX_ENABLE_COMPILATION_CACHE")


def worker_environment(dump_dir: str | None) -> dict[str, str]:
    """Environment of a compile child: the caller's, plus what libtpu needs on a host without a TPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(JAX_CACHE_VARIABLES)}
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # every compile runs, so that libtpu dumps its schedules
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server on a CPU host
    env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # compiles may run side by side
    env["JAX_PLATFORMS"] = "cpu"  # the child's own arrays stay on the CPU; TPU targets are compile-only
    env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "3")
    flags = [f for f in env.get("LIBTPU_INIT_ARGS", "").split() if not f.startswith("--xla_jf_dump_to")]
    if dump_dir:
        flags.append(f"--xla_jf_dump_to={dump_dir}")
    env["LIBTPU_INIT_ARGS"] = " ".join(flags)
    return env
