"""Shared CLI plumbing: --json, error translation, chip resolution."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Callable

import click

from perfmodel.errors import PerfmodelError


class UserError(click.ClickException):
    """A one-line error with the exit code of the library error behind it."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def user_errors(fn: Callable) -> Callable:
    """Turn library errors (PerfmodelError) into one-line click errors."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PerfmodelError as exc:
            raise UserError(str(exc), exc.exit_code) from None

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, numpy scalars/arrays, tuples and dicts to plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):  # numpy scalar or array
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    return obj


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(to_jsonable(obj), indent=2))
