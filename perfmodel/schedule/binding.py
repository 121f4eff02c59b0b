"""Binding a function's arguments from ``--shape``/``--arg`` texts (library code the CLI and the
compile worker share).

``bind_function`` resolves MODULE:FUNCTION and builds the call ``perfmodel
analyze`` models; ``bind_arrays`` and ``bind_catalog`` build the same call for
the TPU compiler, with arrays given a FILL baked in as constants and the rest
left free (abstract).
"""

from __future__ import annotations

import ast
import inspect as pyinspect
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from perfmodel.errors import InputError

if TYPE_CHECKING:
    from perfmodel.hw.spec import ChipSpec


def parse_arg(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` with VALUE a Python literal (strings may be unquoted)."""
    if "=" not in text:
        raise InputError(f"--arg '{text}': expected NAME=VALUE, e.g. --arg block_k=1024 or --arg causal=True")
    name, value = text.split("=", 1)
    name = name.strip()
    if not name.isidentifier():
        raise InputError(f"--arg '{text}': '{name}' is not a valid argument name")
    try:
        return name, ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return name, value.strip()


def _parameters(fn: Callable) -> tuple[list[str], bool]:
    """Parameter names of fn and whether it takes **kwargs (unknown signature: accept anything)."""
    try:
        sig = pyinspect.signature(fn)
    except (TypeError, ValueError):
        return [], True
    names = [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return names, any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _dataclass_arguments(fn: Callable, static: dict[str, Any]) -> None:
    """Build dataclass parameters (e.g. ``block_sizes: MatmulBlockSizes | None``) given as a dict literal:
    ``--arg 'block_sizes={"bm": 512, "bk": 1024, "bn": 1024}'``. Other values are left as parsed."""
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: nothing to build
        return
    for name, value in static.items():
        if not isinstance(value, dict) or name not in hints:
            continue
        hint = hints[name]
        classes = [t for t in (typing.get_args(hint) or (hint,)) if dataclasses.is_dataclass(t) and isinstance(t, type)]
        if not classes:
            continue
        cls = classes[0]
        try:
            static[name] = cls(**value)
        except (TypeError, ValueError) as exc:
            fields = ", ".join(f.name for f in dataclasses.fields(cls))
            raise InputError(f"--arg {name}: {exc} ({cls.__name__} fields: {fields})") from None


def bind_function(target: str, shapes: Sequence[str], args: Sequence[str], chip: ChipSpec
                  ) -> tuple[Callable, tuple[Any, ...]]:
    """Resolve MODULE:FUNCTION and build (wrapper of the arrays, arrays) from --shape and --arg."""
    from perfmodel.schedule.catalog import load
    from perfmodel.schedule.shapes import materialize, parse_shape

    fn = load(target, "MODULE:FUNCTION")
    if not callable(fn):
        raise InputError(f"MODULE:FUNCTION '{target}' is not callable")
    specs = [parse_shape(s) for s in shapes]
    if not specs:
        raise InputError("--shape: give at least one array argument, e.g. --shape x=4096x4096:bf16")
    static = dict(parse_arg(a) for a in args)
    params, open_kwargs = _parameters(fn)
    for name in [s.name for s in specs] + list(static):
        if not open_kwargs and name not in params:
            flag = "--shape" if name in {s.name for s in specs} else "--arg"
            raise InputError(f"{flag}: '{name}' is not a parameter of {target}; its parameters: {', '.join(params)}")
    _dataclass_arguments(fn, static)
    dup = {s.name for s in specs} & set(static)
    if dup:
        raise InputError(f"--arg: {', '.join(sorted(dup))} also given as --shape; give each argument once")
    if "chip" in params and "chip" not in static:
        from perfmodel.hw.registry import chip_argument

        static["chip"] = chip_argument(chip)
    elif "chip" in params and isinstance(static["chip"], str):
        from perfmodel.hw.registry import get_chip

        if get_chip(static["chip"]).name != chip.name:  # the kernel would be built for one chip, modelled on another
            raise InputError(f"--arg chip={static['chip']} differs from --hw {chip.name}; "
                             "give the chip once, with --hw")
    names = [s.name for s in specs]

    def call(*arrays: Any) -> Any:
        return fn(**dict(zip(names, arrays)), **static)

    call.__name__ = target.split(":", 1)[1]
    return call, tuple(materialize(s) for s in specs)


def free_function(fn: Callable, values: Sequence[Any], specs: Sequence[Any]) -> tuple[Callable, list[Any], list[Any]]:
    """(fn of the arrays without a FILL, their specs, their values); filled ones are baked in as constants
    (wrappers and references may read them, e.g. a page table or a sequence count)."""
    free = [i for i, s in enumerate(specs) if s.fill is None]

    def call(*arrays: Any) -> Any:
        args = list(values)
        for i, a in zip(free, arrays):
            args[i] = a
        return fn(*args)

    call.__name__ = getattr(fn, "__name__", "kernel")
    return call, [specs[i] for i in free], [values[i] for i in free]


def bind_arrays(target: str, shapes: Sequence[str], args: Sequence[str], chip: ChipSpec
                ) -> tuple[Callable, list[Any], list[Any]]:
    """(function of the free arrays, their ShapeSpecs, their values) for MODULE:FUNCTION."""
    from perfmodel.schedule.shapes import parse_shape

    fn, values = bind_function(target, shapes, args, chip)
    return free_function(fn, values, [parse_shape(s) for s in shapes])


def bind_catalog(kernel: str, shapes: Sequence[str], blocks: Mapping[str, int] | None, extra: Mapping[str, Any],
                 chip: ChipSpec) -> tuple[Callable, list[Any], list[Any]]:
    """The same for a catalog kernel (``perfmodel tune --list``) with explicit or default blocks."""
    from perfmodel.schedule.catalog import get_entry

    entry = get_entry(kernel)
    specs = entry.specs(shapes)
    fn = entry.make_function(specs, blocks, chip, extra=extra)
    names = entry.names(specs)
    return free_function(fn, list(entry.arguments(specs)), [specs[n] for n in names])
