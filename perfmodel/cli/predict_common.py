"""Options shared by every ``perfmodel predict`` command, and the parsing of ``--sweep``.

* ``--hw`` (repeatable or a comma list): several chips side by side;
* ``--sweep name=v1,v2,...`` (repeatable): the cross product of values, each
  converted by the option's own click type (one dict per point);
* ``--json`` / ``--csv``.

A command parses its options, calls :func:`run_op` (or a library function of
:mod:`perfmodel.predict`) and prints the result with a renderer of
:mod:`perfmodel.predict.render`. No numpy, yaml, jax or model import at
import time.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterable

import click

from perfmodel.cli.common import Progress, chip_list, emit, output_format, wide_option
from perfmodel.errors import InputError
from perfmodel.inputcheck import option_values, short
from perfmodel.hw.registry import DEFAULT_CHIP


#: Most points one --sweep cross product may have (each point is a full prediction per chip).
MAX_SWEEP_POINTS = 100_000
#: A sweep of at least this many chip x point predictions shows a progress bar (on a terminal).
SWEEP_BAR_POINTS = 200


def predict_options(fn: Callable) -> Callable:
    """--hw, --sweep, --json, --csv, --wide (in that order in --help)."""
    fn = wide_option(fn)
    fn = click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one row per chip x point x variant).")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(fn)
    fn = click.option(
        "--sweep", "sweep", multiple=True, metavar="NAME=V1,V2,...",
        help="Sweep an option over values (repeatable: cross product); one row per point.")(fn)
    fn = click.option(
        "--hw", "hw", multiple=True, metavar="CHIP", callback=chip_list,
        help=f"Chip name or spec file; repeat or comma-separate to compare chips (default {DEFAULT_CHIP}).")(fn)
    return fn


def context_options(fn: Callable) -> Callable:
    """--context / --context-lens / --context-dist / --batch: per-sequence context lengths."""
    fn = click.option("--batch", type=int, default=None,
                      help="Sequences (with --context or --context-dist; default 1).")(fn)
    fn = click.option("--context-dist", default=None, metavar="DIST",
                      help="Context lengths as --batch quantiles of uniform:LO:HI, normal:MEAN:STD or "
                           "lognormal:MEDIAN:SIGMA.")(fn)
    fn = click.option("--context-lens", default=None, metavar="LIST",
                      help="One context length per sequence, e.g. 4096,100,17 or 2048x31,8192 (VALUExCOUNT).")(fn)
    fn = click.option("--context", type=int, default=None, help="Context length shared by all --batch sequences.")(fn)
    return fn


def _option_for(ctx: click.Context | None, name: str) -> click.Parameter | None:
    if ctx is None:
        return None
    for p in ctx.command.params:
        if p.name == name:
            return p
    return None


def _flag_name(param: click.Parameter | None, name: str) -> str:
    """What a user types for an option in --sweep: its longest flag without dashes (--bytes -> bytes)."""
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return max(opts, key=len).lstrip("-") if opts else name.replace("_", "-")


def _sweep_names(ctx: click.Context | None, allowed: Iterable[str]) -> dict[str, str]:
    """--sweep spellings (an option's flag, e.g. ``bytes`` for ``--bytes``) -> the option's parameter name."""
    return {_flag_name(_option_for(ctx, a), a).replace("-", "_"): a for a in allowed}


def sweep_points(sweep: Iterable[str], allowed: Iterable[str]) -> list[dict[str, Any]]:
    """Cross product of ``--sweep name=v1,v2`` values, converted with the option's click type.

    ``allowed``: option names that may be swept. Returns [{}] without sweeps.
    """
    allowed = list(allowed)
    ctx = click.get_current_context(silent=True)
    flags = _sweep_names(ctx, allowed)
    axes: list[tuple[str, list[Any]]] = []
    for item in sweep:
        name, sep, values = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        key = flags.get(key, key)
        if not sep or not key or not values.strip():
            raise InputError(f"--sweep '{short(item)}': write NAME=V1,V2,... (e.g. --sweep m=1,8,64)")
        if key not in allowed:
            shown = ", ".join(_flag_name(_option_for(ctx, a), a) for a in allowed)
            raise InputError(f"--sweep: '{short(name)}' cannot be swept here; sweepable: {shown}")
        if any(key == k for k, _ in axes):
            raise InputError(f"--sweep: '{name}' given twice; list all its values in one --sweep")
        param = _option_for(ctx, key)
        if param is not None and ctx.get_parameter_source(key) == click.core.ParameterSource.COMMANDLINE:
            flag = max(param.opts, key=len)
            raise InputError(f"--sweep {name}: {flag} is also given and would be ignored; drop {flag} or the sweep")
        raw = [v.strip() for v in values.split(",")]
        if not all(raw):
            raise InputError(f"--sweep '{short(item)}': an empty value; write NAME=V1,V2,... (e.g. --sweep m=1,8,64)")
        converted = []
        for v in raw:
            if param is not None and not getattr(param, "multiple", False):
                try:
                    v = param.type.convert(v, param, ctx)
                except click.BadParameter as exc:
                    raise InputError(f"--sweep {name}: {exc.message}") from None
            converted.append(v)
        axes.append((key, converted))
    if not axes:
        return [{}]
    count = math.prod(len(v) for _, v in axes)
    if count > MAX_SWEEP_POINTS:
        raise InputError(f"--sweep: {count:,} points; at most {MAX_SWEEP_POINTS:,} (split the sweep)")
    return [dict(zip([k for k, _ in axes], combo)) for combo in itertools.product(*(v for _, v in axes))]


def check_required(params: dict[str, Any], swept: Iterable[str], required: Iterable[str]) -> None:
    """InputError for a required option that is neither given nor swept (options stay optional in click so
    that ``--sweep`` can supply them)."""
    swept = set(swept)
    for name in required:
        if params.get(name) is None and name not in swept:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"missing option {flag}: give {flag} VALUE or --sweep {name.replace('_', '-')}=V1,V2")


def run_op(op: str, params: dict[str, Any], *, hw: Iterable[str], sweep: Iterable[str], as_json: bool,
           as_csv: bool, required: Iterable[str] = ()) -> None:
    """Parse --hw / --sweep, predict op (:func:`perfmodel.predict.ops.predict_op`) and print it."""
    from perfmodel.predict import render
    from perfmodel.predict.ops import SIZE_PRODUCTS, predict_op
    from perfmodel.predict.sweep import resolve_chips

    fmt = output_format(as_json, as_csv)
    points = sweep_points(sweep, params)
    check_required(params, points[0], required)
    for point in points:
        option_values({**params, **point}, SIZE_PRODUCTS.get(op, ()))
    with Progress(f"predict {op}", min_total=SWEEP_BAR_POINTS) as bar:
        result = predict_op(op, params, chips=resolve_chips(hw), points=points, progress=bar)
    emit(fmt, text=lambda: render.op_text(result), json=lambda: render.op_records(result),
         csv=lambda: render.op_csv(result))
