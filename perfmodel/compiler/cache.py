"""The compile cache on disk: entries kept between runs, valid while what they read is unchanged.

Layout: ``<cache_dir("compile")>/libtpu-<version>/<key>/<variant>/`` where
``key`` hashes the request, chip, topology, tool versions and the environment
that changes a compile (:func:`perfmodel.compiler.api.cache_key`) and each
``variant`` is one compile of that request with its dependency record
(``deps.json``, :mod:`perfmodel.compiler.deps`): the report, the loop bodies'
bundles and the optimized HLO. A lookup serves the first variant whose record
still holds (every file it lists hashes the same), so two checkouts that differ
in one kernel share every entry the edit did not touch, and a forged or stale
entry is never served. Each sub-cache is one libtpu version.

Least recently used variants are evicted once the cache passes its cap
(``$PERFMODEL_CACHE_MAX_MB``, default :data:`DEFAULT_MAX_MB`); a hit or a store
marks a variant used (its folder's mtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.compiler import deps as deps_mod
from perfmodel.errors import InputError

DEFAULT_MAX_MB = 2048
REPORT = "report.json"
DEPS = "deps.json"
HLO_FILE = "program.hlo.txt"


def root() -> Path:
    from perfmodel.cachedir import cache_dir

    return cache_dir("compile")


def max_bytes() -> int:
    text = os.environ.get("PERFMODEL_CACHE_MAX_MB", "")
    if not text:
        return DEFAULT_MAX_MB * 2**20
    try:
        mb = float(text)
    except ValueError:
        mb = -1.0
    if not mb > 0 or mb == float("inf"):
        raise InputError(f"PERFMODEL_CACHE_MAX_MB '{text[:40]}': not a positive number of MiB; e.g. "
                         f"PERFMODEL_CACHE_MAX_MB={DEFAULT_MAX_MB}")
    return int(mb * 2**20)


def sub_cache(libtpu_version: str) -> Path:
    return root() / f"libtpu-{libtpu_version}"


def lookup(key_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """(variant folder, report JSON) of the first variant of a key whose dependency record still holds."""
    try:
        variants = sorted(key_dir.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for var in variants:
        try:
            record = json.loads((var / DEPS).read_text())
            if not deps_mod.still_valid(record):
                continue
            report = json.loads((var / REPORT).read_text())
        except (OSError, ValueError):
            continue  # a damaged or half-evicted variant is skipped (and recompiled)
        _touch(var)
        return var, report
    return None


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def store(key_dir: Path, data: dict[str, Any], record: dict[str, Any]) -> Path:
    """Write one variant atomically (a reader sees a whole variant or none) and evict down to the cap."""
    variant = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    target = key_dir / variant
    key_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{variant}.", dir=key_dir))
    for i, k in enumerate(data.get("kernels", [])):
        body = k.pop("body_text", None)
        if body:
            (tmp / f"kernel{i}_{k['hlo_name']}.bundles.txt").write_text(body)
    hlo = data.pop("hlo_text", None)
    if hlo:
        (tmp / HLO_FILE).write_text(hlo)
    (tmp / REPORT).write_text(json.dumps(data, indent=1))
    (tmp / DEPS).write_text(json.dumps(record, indent=1))
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process stored the same variant first
        shutil.rmtree(tmp, ignore_errors=True)
    evict(max_bytes(), keep=target)
    return target


@dataclass(frozen=True, kw_only=True)
class Variant:
    path: Path
    size_bytes: int
    last_used_s: float


def _folders(path: Path) -> list[Path]:
    """Sub-folders of ``path``; none when it is gone (another process may evict while this one reads)."""
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _variants(base: Path) -> list[Variant]:
    """Every stored variant (libtpu sub-cache / key / variant), with its size and last use."""
    out = []
    for var in (v for sub in _folders(base) for key_dir in _folders(sub) for v in _folders(key_dir)):
        try:
            size = sum(f.stat().st_size for f in var.iterdir())
            out.append(Variant(path=var, size_bytes=size, last_used_s=var.stat().st_mtime))
        except OSError:
            continue
    return out


def evict(limit_bytes: int, *, keep: Path | None = None) -> int:
    """Remove least recently used variants until the cache is at most ``limit_bytes``; the number removed."""
    variants = _variants(root())
    total = sum(v.size_bytes for v in variants)
    removed = 0
    for v in sorted(variants, key=lambda v: v.last_used_s):
        if total <= limit_bytes:
            break
        if keep is not None and v.path == keep:
            continue
        shutil.rmtree(v.path, ignore_errors=True)
        try:
            v.path.parent.rmdir()  # the key's folder, once its last variant is gone
        except OSError:
            pass
        total -= v.size_bytes
        removed += 1
    return removed


@dataclass(frozen=True, kw_only=True)
class SubCacheInfo:
    libtpu_version: str
    entries: int
    variants: int
    size_bytes: int


@dataclass(frozen=True, kw_only=True)
class CacheInfo:
    path: str
    max_bytes: int
    size_bytes: int
    variants: int
    sub_caches: tuple[SubCacheInfo, ...]
    spec_cache_path: str
    spec_cache_bytes: int
    #: JAX's persistent cache of XLA:CPU programs (the test suite's interpret-mode kernels).
    jax_cache_path: str
    jax_cache_bytes: int


def info() -> CacheInfo:
    from perfmodel.cachedir import cache_dir

    base = root()
    subs = []
    variants = _variants(base)
    for sub in sorted(_folders(base)):
        mine = [v for v in variants if v.path.parent.parent == sub]
        subs.append(SubCacheInfo(libtpu_version=sub.name.removeprefix("libtpu-"),
                                 entries=len({v.path.parent for v in mine}), variants=len(mine),
                                 size_bytes=sum(v.size_bytes for v in mine)))
    specs, jax_cpu = cache_dir("specs"), cache_dir("jax-cpu")
    return CacheInfo(path=str(base), max_bytes=max_bytes(), size_bytes=sum(v.size_bytes for v in variants),
                     variants=len(variants), sub_caches=tuple(subs), spec_cache_path=str(specs),
                     spec_cache_bytes=_folder_bytes(specs), jax_cache_path=str(jax_cpu),
                     jax_cache_bytes=_folder_bytes(jax_cpu))


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def clear() -> CacheInfo:
    """Remove the compile cache, the spec cache and the XLA:CPU program cache; what was there before."""
    from perfmodel.cachedir import cache_dir

    before = info()
    for path in (root(), cache_dir("specs"), cache_dir("jax-cpu")):
        shutil.rmtree(path, ignore_errors=True)
    return before
