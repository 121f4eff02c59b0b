"""Reading bundled spec files fast: a scan of a file's head, and a JSON cache of checked loads.

Neither imports yaml. :func:`scan_header` reads the names at the top of a spec file
without a parser, so a registry can pick the one file a name refers to.
:func:`load_cached` keeps the result of a strict load (:mod:`perfmodel.hw.loader` plus
the caller's checks) as JSON under ``$PERFMODEL_CACHE_DIR/specs`` (default
``$XDG_CACHE_HOME/perfmodel/specs`` or ``~/.cache/perfmodel/specs``). An entry is used
only when the YAML text is the same, character for character, as the text it was made
from, and the modules that read and check it (their files' mtime and size, as for
``.pyc`` files) are unchanged; otherwise the file is loaded in full and the entry
rewritten. A cache that cannot be read or written is skipped, never an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Sequence

#: Bump when the entry layout or the JSON <-> dataclass mapping changes.
FORMAT = 1


@functools.lru_cache(maxsize=None)
def _annotation(text: str, module: str) -> Any:
    return eval(text, vars(sys.modules[module]))  # noqa: S307 - a field annotation of our own module


@functools.lru_cache(maxsize=None)
def dataclass_fields(cls: type) -> tuple[dict[str, Any], list[str]]:
    """Type hints (as typing.get_type_hints gives them) and field names of a dataclass, computed once.

    The string annotations (``from __future__ import annotations``) are evaluated once per distinct
    text and module, which is several times faster than typing.get_type_hints; any annotation that
    does not evaluate that way (e.g. a field inherited from another module) falls back to it.
    """
    fields = dataclasses.fields(cls)
    try:
        hints = {f.name: _annotation(f.type, cls.__module__) if isinstance(f.type, str) else f.type
                 for f in fields}
    except Exception:  # noqa: BLE001 - anything unusual: the slow, general path
        hints = typing.get_type_hints(cls)
    return hints, [f.name for f in fields]


# --------------------------------------------------------------------------- header scan (no YAML parse)

#: Scalars simple enough to read without a YAML parser: plain words, or quotes with no escapes. Anything
#: else (anchors, tags, escapes, multi-line values, flow mappings...) makes the scan give up, never guess.
_WORD = r"[A-Za-z0-9(][A-Za-z0-9._+/()-]*"
_QUOTED = r'"[^"\\#:\n]*"|\'[^\'#:\n]*\''
_SCALAR = rf"{_QUOTED}|{_WORD}(?:[ ,]+{_WORD})*"
_FLOW_ITEM = rf"{_QUOTED}|{_WORD}(?: +{_WORD})*"
_COMMENT = r"(?:[ \t]+#.*)?"
_KEY_LINE = re.compile(r"(?P<k>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)")
_SCALAR_REST = re.compile(rf"[ \t]+(?P<v>{_SCALAR})[ \t]*{_COMMENT}")
_FLOW_REST = re.compile(rf"[ \t]*\[[ \t]*(?P<v>(?:{_FLOW_ITEM})(?:[ \t]*,[ \t]*(?:{_FLOW_ITEM}))*)?[ \t]*\][ \t]*{_COMMENT}")
_EMPTY_REST = re.compile(rf"[ \t]*{_COMMENT}")
_BLOCK_ITEM = re.compile(rf"[ \t]*-[ \t]+(?P<v>{_FLOW_ITEM})[ \t]*{_COMMENT}")
_FLOW_ITEMS = re.compile(_FLOW_ITEM)


def _unquote(token: str) -> str:
    token = token.strip()
    return token[1:-1] if token[:1] in "\"'" else token


def scan_header(text: str, keys: dict[str, type]) -> dict[str, Any] | None:
    """Read a few top-level keys of a YAML mapping cheaply, without a YAML parser; None when unsure.

    ``keys`` maps each key to ``str`` (one scalar) or ``tuple`` (a list of scalars). Only the file's
    head is read: top-level ``key: value`` lines with one-line values (``name: tpu-v5e``,
    ``aliases: [a, "b c"]``, or a block list of ``- item`` lines for a list key), up to the first
    line that is anything else (a nested mapping, a multi-line value, a document marker...).
    Every key must be found there, once, in one of those forms; otherwise the answer is None and
    the caller parses the file in full. Where the answer is not None it is what the strict loader
    reads for those keys (a valid spec has each top-level key once).
    """
    found: dict[str, Any] = {}
    lines = text.splitlines()
    n, i = len(lines), 0
    while i < n and len(found) < len(keys):
        line = lines[i]
        i += 1
        if not line.strip() or line.startswith("#"):
            continue
        m = _KEY_LINE.fullmatch(line)
        if m is None:
            break  # indented, a marker, a quoted key...: past the simple head
        key, rest = m["k"], m["rest"]
        want = keys.get(key)
        value: Any = None
        if want is tuple and (f := _FLOW_REST.fullmatch(rest)) is not None:
            value = tuple(_unquote(t) for t in _FLOW_ITEMS.findall(f["v"] or ""))
        elif want is tuple and _EMPTY_REST.fullmatch(rest):
            items = []
            while i < n and (b := _BLOCK_ITEM.fullmatch(lines[i])) is not None:
                items.append(_unquote(b["v"]))
                i += 1
            value = tuple(items) if items else None
        elif want is not tuple and (s := _SCALAR_REST.fullmatch(rest)) is not None:
            value = _unquote(s["v"])
        if value is None:
            if want is not None:
                return None
            break  # a key whose value is not one simple line (e.g. a nested mapping): the head ends
        j = i
        while j < n and not lines[j].strip():
            j += 1
        if j < n and lines[j][:1] in (" ", "\t"):  # the value goes on (or nests) on the next line
            if want is not None:
                return None
            break
        if want is not None:
            if key in found:
                return None
            found[key] = value
    return found if len(found) == len(keys) else None


# --------------------------------------------------------------------------- JSON cache of checked loads



def scan_names(path: str, keys: dict[str, type], names: Any, normalize: Any
               ) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """(names, their normalized forms) from the head of the YAML file at ``path`` (``names(head)`` picks them
    from the scanned keys), or None when the file cannot be read or the scan is unsure."""
    try:
        head = scan_header(Path(path).read_text(encoding="utf-8"), keys)
    except (OSError, UnicodeDecodeError):
        return None
    if head is None:
        return None
    found = tuple(names(head))
    return found, frozenset(normalize(n) for n in found)

def cache_dir() -> Path:
    """Where spec cache entries live: ``$PERFMODEL_CACHE_DIR/specs`` or the user cache directory."""
    from perfmodel.cachedir import cache_dir as perfmodel_cache_dir

    return perfmodel_cache_dir("specs")


def scan_heads(files: Any, scan: Any) -> list[tuple[Path, tuple[str, ...], frozenset[str]]] | None:
    """(file, names, normalized names) of each file's scanned head, in order, from ``scan(path, mtime_ns,
    size)``; None when any file cannot be read or scanned (the caller then loads every file)."""
    out = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            return None
        scanned = scan(str(f), st.st_mtime_ns, st.st_size)
        if scanned is None:
            return None
        out.append((Path(f), *scanned))
    return out


@functools.lru_cache(maxsize=None)
def _dataclass_modules(cls: type) -> frozenset[str]:
    """Files of the modules defining cls and every dataclass nested in it."""
    out = {sys.modules[cls.__module__].__file__ or ""}
    for tp in dataclass_fields(cls)[0].values():
        for t in (tp, *typing.get_args(tp)):
            if dataclasses.is_dataclass(t) and t is not cls:
                out |= _dataclass_modules(t)
    return frozenset(out)


def _code_stamp(cls: type, code: Sequence[str | Path]) -> list[list[Any]]:
    """(file, mtime_ns, size) of every module that decides what a load returns."""
    here = Path(__file__)
    files = {str(here), str(here.with_name("loader.py")), *_dataclass_modules(cls), *map(str, code)}
    out = []
    for f in sorted(files):
        st = os.stat(f)
        out.append([f, st.st_mtime_ns, st.st_size])
    return out


def _entry_path(file: Path) -> Path:
    """One entry per source file; the path's FNV-1a hash keeps checkouts apart (zlib/hashlib would cost an
    extension-module import on every run)."""
    h = 0xCBF29CE484222325
    for byte in str(file).encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return cache_dir() / f"{file.stem}-{h:016x}.json"


def to_plain(obj: Any) -> Any:
    """A dataclass tree as JSON data (tuples become lists; from_plain restores them from the type hints)."""
    if dataclasses.is_dataclass(obj):
        return {f: to_plain(getattr(obj, f)) for f in dataclass_fields(type(obj))[1]}
    if isinstance(obj, (tuple, list)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


@functools.lru_cache(maxsize=None)
def _shape(tp: Any) -> tuple[str, Any]:
    """How from_plain rebuilds a value of type ``tp``: (kind, inner type(s))."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and type(None) in args):
        (inner,) = [a for a in args if a is not type(None)]
        return "optional", inner
    if dataclasses.is_dataclass(tp):
        return "dataclass", dataclass_fields(tp)
    if tp is bool or tp is int or tp is float or tp is str:
        return "scalar", tp
    if origin is tuple:
        return "tuple", args[0]
    if origin is dict:
        return "dict", args
    raise ValueError(f"cannot rebuild {tp!r}")


def from_plain(tp: Any, data: Any) -> Any:
    """Rebuild a value of type ``tp`` from to_plain() data; ValueError if the data does not fit the type."""
    kind, inner = _shape(tp)
    if kind == "optional":
        return None if data is None else from_plain(inner, data)
    if kind == "scalar":
        if type(data) is not inner:
            raise ValueError(f"expected {inner.__name__}, got {type(data).__name__}")
        return data
    if kind == "dataclass":
        hints, fields = inner
        if not isinstance(data, dict) or list(data) != fields:
            raise ValueError(f"{tp.__name__}: fields differ")
        return tp(**{k: from_plain(hints[k], data[k]) for k in fields})
    if kind == "tuple" and isinstance(data, list):
        return tuple(from_plain(inner, x) for x in data)
    if kind == "dict" and isinstance(data, dict):
        return {from_plain(inner[0], k): from_plain(inner[1], v) for k, v in data.items()}
    raise ValueError(f"cannot rebuild {tp!r} from {type(data).__name__}")


def load_cached(file: Path, cls: type, load: Callable[[str | None], Any], code: Sequence[str | Path] = ()) -> Any:
    """``load(text)`` (the strict load and checks of ``file``'s text, returning a ``cls``) through the cache.

    ``load`` gets the text the entry is keyed by (None where the file could not be read: the loader
    reports that its own way). ``code`` names the files of the modules that check the load besides
    the loader and the modules of ``cls`` (those are always part of the key).
    """
    try:
        text = file.read_text(encoding="utf-8")
        stamp = _code_stamp(cls, code)
    except (OSError, UnicodeDecodeError):
        return load(None)
    return _through_cache(file, text, stamp, lambda: load(text), to_plain, lambda v: from_plain(cls, v))


def load_data_cached(file: Path, load: Callable[[str], Any]) -> Any:
    """``load(text)`` of a data file (plain dicts, lists and scalars, e.g. a calibration table parsed by
    yaml.safe_load) through the same cache, keyed by the file's text; data JSON would not give back as it
    was (non-string keys) is returned uncached. A file that cannot be read raises as reading it would."""
    text = file.read_text(encoding="utf-8")
    return _through_cache(file, text, [], lambda: load(text), _json_exact, lambda v: v)


def _json_exact(value: Any) -> Any:
    if json.loads(json.dumps(value)) != value:
        raise ValueError("not JSON data")
    return value


def _through_cache(file: Path, text: str, stamp: list[list[Any]], load: Callable[[], Any],
                   encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> Any:
    """The entry for ``file`` when it was made from this text and code stamp, else ``load()``, written back."""
    entry_path = _entry_path(file)
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
        if (entry["format"] == FORMAT and entry["source"] == str(file) and entry["code"] == stamp
                and entry["text"] == text):
            return decode(entry["value"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no entry, or one made from another text or version: load and rewrite it
    value = load()
    try:
        plain = encode(value)
    except (ValueError, TypeError):
        return value
    entry = {"format": FORMAT, "source": str(file), "code": stamp, "text": text, "value": plain}
    tmp = entry_path.with_name(f"{entry_path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        entry_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(tmp, entry_path)  # atomic: a reader sees the old entry or the new one, never half of one
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return value
