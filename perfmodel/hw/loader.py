"""Strict YAML -> dataclass loader with file:line error messages.

The YAML is composed into nodes (so every value keeps its line) and converted
field by field against the dataclass's type hints. Anything unexpected is a
:class:`SpecError` naming ``file:line``, the dotted field and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from perfmodel.errors import InputError, SpecError
from perfmodel.inputcheck import decode, short
from perfmodel.hw.speccache import dataclass_fields

_NUMBER_RE = re.compile(r"^[+-]?(\d[\d_]*\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_UNIT_RE = re.compile(r"^\s*[+-]?[\d.]+(?:[eE][+-]?\d+)?\s*[A-Za-zµ/]+")


#: libyaml's composer when available (much faster than the pure-Python one); it reports plain scalars with
#: style "" not None.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _plain(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.style in (None, "")


class _Ctx:
    def __init__(self, file: str):
        self.file = file

    def fail(self, node: yaml.Node, path: str, msg: str) -> SpecError:
        line = node.start_mark.line + 1
        where = f" field '{path}'" if path else ""
        return SpecError(f"{self.file}:{line}:{where} {msg}")


def _unit_hint(path: str) -> str:
    name = path.rsplit(".", 1)[-1]
    for suffix, unit in (
        ("_bytes_per_s_per_chip", "bytes/s"),
        ("_bytes_per_s_per_link", "bytes/s"),
        ("_bytes_per_s", "bytes/s"),
        ("_flops_per_s_per_chip", "FLOP/s"),
        ("_ops_per_s_per_chip", "ops/s"),
        ("_bytes_per_core", "bytes"),
        ("_bytes_per_chip", "bytes"),
        ("_bytes", "bytes"),
        ("_hz", "Hz"),
        ("_w", "W"),
        ("_s", "seconds"),
    ):
        if name.endswith(suffix):
            return unit
    return "its base unit"


def _scalar_number(node: yaml.Node, path: str, ctx: _Ctx, want_int: bool) -> float | int:
    if not isinstance(node, yaml.ScalarNode) or node.value in ("", "~", "null"):
        raise ctx.fail(node, path, "must be a number")
    text = node.value.strip()
    if _plain(node) and _NUMBER_RE.match(text):
        value: float | int = float(text.replace("_", ""))
    elif _UNIT_RE.match(text):
        raise ctx.fail(
            node,
            path,
            f"takes a plain number in {_unit_hint(path)}, not '{text}'; the unit is in the "
            "field name (write e.g. 8.2e11 for 820 GB/s)",
        )
    else:
        raise ctx.fail(node, path, f"must be a number, got '{short(text, 40)}'")
    if not math.isfinite(value):
        raise ctx.fail(node, path, f"must be a finite number, got {short(text, 40)}")
    if value <= 0:
        raise ctx.fail(node, path, f"must be positive, got {short(text, 40)} (use null if unknown)")
    if want_int:
        if float(value) != int(value):
            raise ctx.fail(node, path, f"must be a whole number, got {text}")
        return int(value)
    return float(value)


def _convert(node: yaml.Node, tp: Any, path: str, ctx: _Ctx) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and type(None) in args):
        inner = [a for a in args if a is not type(None)]
        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return None
        if _plain(node) and node.value in ("", "~", "null"):
            return None
        (tp,) = inner
        return _convert(node, tp, path, ctx)
    if dataclasses.is_dataclass(tp):
        return load_dataclass(node, tp, path, ctx)
    if tp is bool:
        if _plain(node) and node.value in ("true", "false"):
            return node.value == "true"
        raise ctx.fail(node, path, f"must be true or false, got '{getattr(node, 'value', '...')}'")
    if tp is int or tp is float:
        return _scalar_number(node, path, ctx, want_int=tp is int)
    if tp is str:
        if not isinstance(node, yaml.ScalarNode) or node.value == "":
            raise ctx.fail(node, path, "must be a non-empty string")
        return node.value
    if origin is tuple:
        if not isinstance(node, yaml.SequenceNode):
            raise ctx.fail(node, path, "must be a list")
        return tuple(_convert(item, args[0], f"{path}[{i}]", ctx) for i, item in enumerate(node.value))
    if origin is dict:
        if not isinstance(node, yaml.MappingNode):
            raise ctx.fail(node, path, "must be a mapping")
        out = {}
        for key_node, val_node in node.value:
            key = _convert(key_node, args[0], path, ctx)
            if key in out:
                raise ctx.fail(key_node, f"{path}.{key}", "appears twice")
            out[key] = _convert(val_node, args[1], f"{path}.{key}", ctx)
        return out
    raise TypeError(f"loader does not know type {tp!r} at {path}")  # programming error


def load_dataclass(node: yaml.Node, cls: type, path: str, ctx: _Ctx) -> Any:
    """Build ``cls`` from a mapping node, rejecting unknown and missing keys."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, path, f"must be a mapping of {cls.__name__} fields")
    hints, fields = dataclass_fields(cls)
    seen: dict[str, Any] = {}
    for key_node, val_node in node.value:
        key = key_node.value
        sub = f"{path}.{key}" if path else key
        if key not in hints:
            import difflib

            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
            hint = f"did you mean '{close[0]}'?" if close else f"known fields: {', '.join(fields)}"
            raise ctx.fail(key_node, sub, f"unknown key in {cls.__name__}; {hint}")
        if key in seen:
            raise ctx.fail(key_node, sub, "appears twice")
        seen[key] = _convert(val_node, hints[key], sub, ctx)
    missing = [f for f in fields if f not in seen]
    if missing:
        where = f"'{path}'" if path else "the top level"
        raise ctx.fail(node, path, f"missing key(s) {', '.join(missing)} in {where} (use null if unknown)")
    return cls(**seen)


def load_yaml_file(file: Path, cls: type, text: str | None = None) -> Any:
    """Parse ``file`` (or ``text``, read from it already) and build ``cls`` from it, strictly."""
    ctx = _Ctx(str(file))
    if text is None:
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise SpecError(f"{file}: cannot read ({exc.strerror})") from None
        try:
            text = decode(raw, str(file))
        except InputError as exc:
            raise SpecError(str(exc)) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{file}{line}: malformed YAML: {problem}") from None
    if node is None:
        raise SpecError(f"{file}: empty file; expected a {cls.__name__} mapping")
    return load_dataclass(node, cls, "", ctx)

