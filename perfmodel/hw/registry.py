"""Finding chips: built-in specs, user spec directories and spec files.

Built-in specs live in the ``hwspecs`` package (installed as package data).
Extra directories of ``*.yaml`` specs can be listed in the environment
variable ``PERFMODEL_HW_PATH`` (``os.pathsep``-separated, like ``PATH``); a
user spec there may shadow a built-in one of the same name. Anywhere a chip
name is accepted, a path to a spec file works too.

Resolving one chip reads only that chip's spec in full: the names of the others
come from a scan of each file's first lines (:func:`perfmodel.hw.speccache.scan_header`,
no YAML parse). Where a file's head is not in the simple form the scan reads, or the
name is unknown, every file is loaded. Built-in specs are loaded through a JSON cache
that is used only for the same YAML text and the same loading code
(:func:`perfmodel.hw.speccache.load_cached`); yaml is imported only on a miss.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from perfmodel.errors import SpecError, UnknownChipError
from perfmodel.inputcheck import short
from perfmodel.hw.spec import MATMUL_DTYPES, ChipSpec, numeric_field_paths
from perfmodel.hw.speccache import load_cached, scan_heads, scan_names

ENV_VAR = "PERFMODEL_HW_PATH"

#: The chip every command and function uses when none is given.
DEFAULT_CHIP = "tpu-v5e"


def normalize(name: str) -> str:
    """Case-, space- and underscore-insensitive key for a chip name."""
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _get_path(spec: object, dotted: str) -> object:
    obj = spec
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@functools.lru_cache(maxsize=None)
def _numeric_paths() -> tuple[str, ...]:
    return tuple(numeric_field_paths())


def validate(spec: ChipSpec, file: Path) -> ChipSpec:
    """Cross-field checks the type-driven loader cannot do."""

    def bad(msg: str) -> SpecError:
        return SpecError(f"{file}: {msg}")

    if spec.name != normalize(spec.name):
        raise bad(f"field 'name' must be lower-case with dashes, e.g. '{normalize(spec.name)}'")
    if spec.kind not in ("tpu", "gpu"):
        raise bad(f"field 'kind' must be 'tpu' or 'gpu', got '{spec.kind}'")
    for dtype in spec.compute.matmul_flops_per_s_per_chip:
        if dtype not in MATMUL_DTYPES:
            raise bad(
                f"field 'compute.matmul_flops_per_s_per_chip.{dtype}': unknown dtype; "
                f"use one of {', '.join(MATMUL_DTYPES)}"
            )
    for pair in spec.compute.native_matmul_dtype_pairs:
        parts = pair.split(" x ")
        if len(parts) != 2 or any(p not in MATMUL_DTYPES for p in parts):
            raise bad(
                f"field 'compute.native_matmul_dtype_pairs': '{pair}' must read 'LHS x RHS' "
                f"with dtypes from {', '.join(MATMUL_DTYPES)}"
            )
    for ref in set(spec.sources.values()):
        if ref not in spec.references:
            raise bad(f"field 'sources' names reference '{ref}' that is not in 'references'")
    for path in _numeric_paths():
        value = _get_path(spec, path)
        if value is None:
            continue
        if isinstance(value, dict):
            for key in value:
                sub = f"{path}.{key}"
                if sub not in spec.sources and path not in spec.sources:
                    raise bad(f"field '{sub}' has no entry in 'sources'; every number needs one")
        elif path not in spec.sources:
            raise bad(f"field '{path}' has no entry in 'sources'; every number needs one")
    for path in list(spec.sources) + list(spec.derived):
        root = path.split("[")[0]
        try:
            parts = root.split(".")
            _get_path(spec, ".".join(parts[:2]) if len(parts) > 2 else root)
        except AttributeError:
            raise bad(f"'sources'/'derived' names '{path}', which is not a field") from None
    for d in spec.disagreements:
        try:
            _get_path(spec, d.field)
        except AttributeError:
            raise bad(f"disagreement names field '{d.field}', which is not a field") from None
    return spec


#: id(spec) -> the file it was loaded from (specs are cached, so ids stay valid).
_SOURCE_FILES: dict[int, str] = {}


def _load_checked(file: Path, text: str | None = None) -> ChipSpec:
    from perfmodel.hw.loader import load_yaml_file

    return validate(load_yaml_file(file, ChipSpec, text), file)


@functools.lru_cache(maxsize=None)
def load_spec_file(path: str) -> ChipSpec:
    """Load and validate one spec file (cached by path; a built-in one also on disk, see speccache)."""
    file = Path(path)
    if file.parent == _builtin_dir():
        spec = load_cached(file, ChipSpec, lambda text: _load_checked(file, text), code=(__file__,))
    else:
        spec = _load_checked(file)
    _SOURCE_FILES[id(spec)] = path
    return spec


def chip_argument(spec: ChipSpec) -> str:
    """A string that get_chip() resolves back to ``spec``: its name, or its file when the name finds
    another spec (a spec file given by path, e.g. ``--hw ./my-chip.yaml``, is not in the registry)."""
    try:
        if get_chip(spec.name) is spec:
            return spec.name
    except UnknownChipError:
        pass
    return _SOURCE_FILES.get(id(spec), spec.name)


@functools.lru_cache(maxsize=None)
def _builtin_dir() -> Path:
    import hwspecs  # a regular package of data files: its directory is what importlib.resources.files() gives

    return Path(hwspecs.__file__).parent


def _spec_dirs() -> list[Path]:
    dirs = [_builtin_dir()]
    extra = os.environ.get(ENV_VAR, "")
    for entry in extra.split(os.pathsep):
        if entry:
            d = Path(entry)
            if not d.is_dir():
                raise SpecError(f"${ENV_VAR}: '{entry}' is not a directory; fix or unset the variable")
            dirs.append(d)
    return dirs


def spec_files() -> list[Path]:
    """All spec files, built-in first, then ${PERFMODEL_HW_PATH} in order."""
    return [f for d in _spec_dirs() for f in sorted(d.glob("*.yaml"))]


def all_chips() -> list[ChipSpec]:
    """Every known chip; a later directory's spec replaces an earlier one of the same name. SpecError when two
    chips of different names share a name or alias (a user spec's alias 'v6e' would silently take the built-in
    v6e's place)."""
    by_name: dict[str, tuple[Path, ChipSpec]] = {}
    for f in spec_files():
        spec = load_spec_file(str(f))
        by_name[spec.name] = (f, spec)
    _check_clashes([(f, spec.name, {normalize(n) for n in _names(spec)}) for f, spec in by_name.values()])
    return [spec for _, spec in by_name.values()]


def _check_clashes(entries: list[tuple[Path, str, set[str] | frozenset[str]]]) -> None:
    """SpecError naming both files when a name or alias of one chip is also one of another chip's."""
    owner: dict[str, tuple[Path, str]] = {}
    for f, name, keys in entries:
        for key in sorted(keys):
            if key in owner and owner[key][1] != name:
                other_file, other = owner[key]
                raise SpecError(f"{f}: chip '{name}' and chip '{other}' ({other_file}) both answer to '{key}'; "
                                "rename or drop the alias in one of them (a spec of the same name replaces a "
                                "built-in one)")
            owner.setdefault(key, (f, name))


def _names(spec: ChipSpec) -> list[str]:
    return [spec.name, *spec.aliases, *spec.jax_device_kinds]


#: Top-level keys holding a chip's names, as scan_header reads them.
_NAME_KEYS: dict[str, type] = {"name": str, "aliases": tuple, "jax_device_kinds": tuple}


@functools.lru_cache(maxsize=256)
def _scan_file(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """((name, *aliases, *jax_device_kinds), their normalized forms) of one spec file from its head, or None
    when the scan is unsure. Keyed by the file's mtime and size too, so an edited file is scanned again."""
    return scan_names(path, _NAME_KEYS, lambda h: (h["name"], *h["aliases"], *h["jax_device_kinds"]), normalize)


def _find_by_scan(key: str) -> ChipSpec | None:
    """The chip whose name, alias or device kind normalizes to ``key``, loading only its file.

    Same answer as a search of all_chips() (a later directory's spec of the same name replaces an
    earlier one; the first match in that order wins). None when any file's head cannot be scanned,
    when nothing matches, or when the loaded spec's names are not what the scan read: the caller
    then loads every file.
    """
    heads = scan_heads(spec_files(), _scan_file)
    if heads is None:
        return None
    by_name = {names[0]: (f, names, keys) for f, names, keys in heads}
    _check_clashes([(f, names[0], keys) for f, names, keys in by_name.values()])
    for f, names, keys in by_name.values():
        if key in keys:
            spec = load_spec_file(str(f))
            return spec if tuple(_names(spec)) == names else None
    return None


def get_chip(name_or_path: str) -> ChipSpec:
    """Resolve a chip name, alias, JAX device_kind or spec-file path.

    ``<any of those>/core`` is one JAX device of a chip whose TensorCores are separate devices
    (:func:`perfmodel.hw.views.one_device`). Raises UnknownChipError listing close matches and every
    known name.
    """
    from perfmodel.hw.views import split_device_suffix

    text, device_view = split_device_suffix(str(name_or_path))
    if device_view:
        from perfmodel.hw.views import DEVICE_SUFFIX, one_device, one_device_error

        chip = get_chip(text)
        err = one_device_error(chip, str(name_or_path).strip())
        if err is not None:
            raise err
        view = one_device(chip)
        if id(chip) in _SOURCE_FILES:
            _SOURCE_FILES[id(view)] = _SOURCE_FILES[id(chip)] + DEVICE_SUFFIX
        return view
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        if Path(text).is_dir():
            raise SpecError(f"'{text}' is a directory; give one chip spec YAML file (or put the directory in "
                            f"${ENV_VAR} to add all its chips)")
        if Path(text).exists() and not Path(text).is_file():
            raise SpecError(f"'{short(text)}' is not a regular file; give a chip spec YAML file")
        if not Path(text).is_file():
            raise SpecError(f"spec file '{short(text)}' does not exist; give a chip name (see `perfmodel hw list`) "
                            "or the path of a chip spec YAML")
        return load_spec_file(str(Path(text).resolve()))
    key = normalize(text)
    found = _find_by_scan(key)
    if found is not None:
        return found
    chips = all_chips()
    for spec in chips:
        if key in {normalize(n) for n in _names(spec)}:
            return spec
    import difflib

    known = sorted(spec.name for spec in chips)
    every = {normalize(n): spec.name for spec in chips for n in _names(spec)}
    close = sorted({every[m] for m in difflib.get_close_matches(key, list(every), n=3, cutoff=0.6)})
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownChipError(
        f"unknown chip '{short(text, 40)}'; {hint}known chips: {', '.join(known)} (or pass a spec file path)"
    )
