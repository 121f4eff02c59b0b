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
from typing import TYPE_CHECKING

from perfmodel.errors import ToolFailure

if TYPE_CHECKING:
    from perfmodel.hw.spec import ChipSpec

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


def compile_targets() -> dict[str, str]:
    """Canonical chip name -> the deviceless topology libtpu compiles for, for every chip of the registry (hwspecs/
    and $PERFMODEL_HW_PATH) whose spec sets ``compiler.deviceless_topology``, oldest first. The first device of the
    topology is the compile target. These are libtpu's topology names, not hardware facts."""
    from perfmodel.hw.registry import all_chips

    chips = sorted((c for c in all_chips() if c.compiler.deviceless_topology), key=lambda c: (c.year, c.name))
    return {c.name: c.compiler.deviceless_topology for c in chips}


def _spec(chip: "ChipSpec | str") -> "ChipSpec":
    if isinstance(chip, str):
        from perfmodel.hw.registry import get_chip

        return get_chip(chip)
    return chip


def deviceless_topology(chip: "ChipSpec | str") -> str | None:
    """The libtpu topology ``chip`` (a ChipSpec, or a name, alias or spec file) compiles for by default: its spec's
    ``compiler.deviceless_topology``; None where it has none (GPUs, v2, v3) and for one JAX device of a chip
    (``tpu-7x/core``, perfmodel.hw.views), which is not a compile target."""
    from perfmodel.hw.views import DEVICE_SUFFIX

    spec = _spec(chip)
    return None if spec.name.endswith(DEVICE_SUFFIX) else spec.compiler.deviceless_topology


def topology_for(chip: "ChipSpec | str") -> str:
    """libtpu topology string of a TPU chip (a ChipSpec, or a name, alias or spec file); a one-line error for the
    rest."""
    topology = deviceless_topology(chip)
    if topology is None:
        name = chip if isinstance(chip, str) else chip.name
        raise CompilerUnavailable(
            f"--hw {name}: the installed TPU compiler has no deviceless target for it; "
            f"compile for one of {', '.join(compile_targets())}"
        )
    return topology


def check_topology(chip: "ChipSpec | str", topology: str | None) -> str:
    """The topology to compile for: ``topology`` (e.g. "v5e:2x4", a slice of ``chip``'s generation) or the
    chip's default; a one-line error naming `topology` when it is another generation or malformed."""
    default = topology_for(chip)
    if topology is None:
        return default
    chip_name = chip if isinstance(chip, str) else chip.name
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
