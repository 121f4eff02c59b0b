"""What a compile depended on, recorded where it ran and checked where it is looked up.

A compile runs in a process forked for it from a server that has imported jax
and nothing of the project (:mod:`perfmodel.compiler.server`), so after the
compile that process's ``sys.modules`` holds exactly the local modules the
compile imported, and an audit hook on ``open`` saw exactly the local files it
read (a kernel's tuned.json, the chip's hwspec YAML, a model preset). Local
means outside the Python installation (stdlib and site-packages, which the
jax/jaxlib/libtpu versions in the cache key cover). Each file is recorded with
its SHA-256, as a path relative to the project root (the folder holding the
``perfmodel`` package) when it is under it, so two clones of the same tree
share entries; an entry is valid only while every recorded file still hashes
the same (:func:`still_valid`).

This module imports only the standard library: the compile process imports it
before anything of the project.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, Iterable, Mapping

#: Bump when the layout of a record changes (older records are then never valid).
RECORD_VERSION = 1
#: Source and bytecode files are recorded as modules (from sys.modules), not as data reads.
_CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".so", ".pyd")
#: Kernel and device files: what a library reads there (/proc/cpuinfo, ...) is the machine, not an input, and
#: changes between reads.
_PSEUDO_FILESYSTEMS = ("/proc/", "/sys/", "/dev/", "/run/")


def project_root() -> Path:
    """The folder that holds the ``perfmodel`` package (a checkout's root, or site-packages when installed)."""
    return Path(__file__).resolve().parents[2]


def _installation_dirs() -> tuple[str, ...]:
    """Folders of the Python installation: what is under them is not project code."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


def is_local(path: str, installed: tuple[str, ...]) -> bool:
    """A file of the project or the user's own code: not under the Python installation. A project installed
    into site-packages (not editable) counts as installed: its version is perfmodel's, not hashed."""
    real = os.path.realpath(path)
    if real.startswith(installed) or "site-packages" in real or "dist-packages" in real:
        return False
    return not any(part.endswith((".egg-info", ".dist-info")) for part in Path(real).parts)  # package metadata


def relative_name(path: str, root: Path) -> str:
    """The path as recorded: relative to the project root when under it (``kernels/matmul/kernel.py``), else
    absolute."""
    real = Path(os.path.realpath(path))
    try:
        return real.relative_to(root).as_posix()
    except ValueError:
        return str(real)


def resolve(name: str, root: Path) -> Path:
    """Inverse of :func:`relative_name` in the process that looks the record up."""
    path = Path(name)
    return path if path.is_absolute() else root / path


_HASHES: dict[tuple[str, int, int, int], str] = {}


def file_sha256(path: Path) -> str | None:
    """SHA-256 of a file's bytes, or None when it cannot be read; memoized per process by (path, inode, size,
    mtime in ns), so checking many entries reads each file once."""
    try:
        st = path.stat()
    except OSError:
        return None
    memo = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _HASHES.get(memo)
    if digest is None:
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None
        _HASHES[memo] = digest
    return digest


class ReadRecorder:
    """An audit hook (``sys.addaudithook(recorder.audit)``) keeping the local files opened for reading, except
    code and files under ``exclude`` (the compiler's dump folder, the cache)."""

    def __init__(self, exclude: Iterable[str] = ()):
        self.installed = _installation_dirs()
        self.exclude = tuple(os.path.realpath(e) + os.sep for e in exclude if e)
        self.paths: set[str] = set()

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event != "open" or not args:
            return
        path, mode = args[0], args[1] if len(args) > 1 else "r"
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str) or path.endswith(_CODE_SUFFIXES) or path.startswith(_PSEUDO_FILESYSTEMS):
            return
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return
        if isinstance(mode, int) and mode & (os.O_WRONLY | os.O_RDWR):  # os.open's flags
            return
        self.paths.add(os.path.abspath(path))

    def data_files(self) -> list[str]:
        return sorted(p for p in self.paths
                      if os.path.isfile(p) and is_local(p, self.installed)
                      and not os.path.realpath(p).startswith(self.exclude))


def module_files(modules: Mapping[str, Any]) -> list[str]:
    """Local source files of the modules in ``modules`` (a process's sys.modules)."""
    installed = _installation_dirs()
    out = set()
    for mod in list(modules.values()):
        path = getattr(mod, "__file__", None)
        if isinstance(path, str) and os.path.isfile(path) and is_local(path, installed):
            out.add(os.path.abspath(path))
    return sorted(out)


def make_record(modules: Mapping[str, Any], reads: ReadRecorder) -> dict[str, Any]:
    """The record of one compile: {"version", "files": {recorded path: sha256}} over the local modules it
    imported and the local data files it read."""
    root = project_root()
    files: dict[str, str] = {}
    for path in [*module_files(modules), *reads.data_files()]:
        digest = file_sha256(Path(path))
        if digest is not None:
            files[relative_name(path, root)] = digest
    return {"version": RECORD_VERSION, "files": dict(sorted(files.items()))}


def still_valid(record: Any, root: Path | None = None) -> bool:
    """Whether every file a record lists still hashes what it did; False for a damaged or foreign record."""
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        return False
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return False
    root = root or project_root()
    return all(isinstance(d, str) and file_sha256(resolve(n, root)) == d for n, d in files.items())
