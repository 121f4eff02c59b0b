"""Exceptions for user errors. Each message is one line that names the field
or file:line at fault and says how to fix it.

A library function names its keyword arguments in backticks as they are
(`` `context_lens` ``) and lists them in ``fields``; the CLI rewrites each
listed name into the flag of the command that ran (``--context-lens``) and
prints the line.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

#: A keyword-argument name as a message writes it: `context_lens`.
_FIELD = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


class PerfmodelError(ValueError):
    """Base class of every user-facing error; the CLI turns it into one line.

    ``exit_code`` is 2 for a user error (bad input, a flag, a field, a file: click's own usage errors exit 2
    too); a failure that is not the input's fault (a tool that is missing or crashed) sets 1."""

    exit_code = 2

    def __init__(self, message: str = "", *, fields: tuple[str, ...] = ()):
        super().__init__(message)
        #: Keyword-argument names the message mentions, for the CLI to rewrite into flags (by default every
        #: backticked identifier in the message).
        self.fields = tuple(fields) or tuple(dict.fromkeys(_FIELD.findall(str(message))))


class SpecError(PerfmodelError):
    """A hardware spec file is malformed or inconsistent."""


class UnknownChipError(PerfmodelError):
    """A chip name matches no spec; the message lists close and known names."""


class InputError(PerfmodelError):
    """A shape, dtype or option given to the model is invalid."""


class ToolFailure(PerfmodelError):
    """Not the input's fault: a tool perfmodel runs is missing, crashed or timed out (exit status 1)."""

    exit_code = 1


@contextlib.contextmanager
def naming(*fields: str) -> Iterator[None]:
    """Add ``fields`` to the fields of a PerfmodelError raised inside (for helpers that name a field they were
    handed, e.g. ``parse_dtype(text, "`weight_dtype`")``), so that the CLI rewrites them into flags too."""
    try:
        yield
    except PerfmodelError as exc:
        exc.fields = tuple(dict.fromkeys(exc.fields + fields))
        raise
