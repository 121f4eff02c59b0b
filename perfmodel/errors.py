"""Exceptions for user errors. Each message is one line that names the flag,
field or file:line at fault and says how to fix it; the CLI prints it as is."""

from __future__ import annotations


class PerfmodelError(ValueError):
    """Base class of every user-facing error; the CLI turns it into one line."""

    exit_code = 1


class SpecError(PerfmodelError):
    """A hardware spec file is malformed or inconsistent."""


class UnknownChipError(PerfmodelError):
    """A chip name matches no spec; the message lists close and known names."""

    exit_code = 2


class InputError(PerfmodelError):
    """A shape, dtype or option given to the model is invalid."""
