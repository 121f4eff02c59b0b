"""The values the schedule interpreter (:mod:`perfmodel.schedule.interpreter`) computes with.

A value is a numpy array whose leading axis is the batch axis (one entry per grid step, or 1 when it is the same
at every step), a :class:`RefValue` (a ref and its content) or :data:`UNKNOWN`. :data:`ELEMENTWISE` holds the
numpy implementation of each integer / boolean primitive the interpreter computes (lax's semantics, e.g.
division rounding toward zero); :class:`Hook` is the interface that sees every executed equation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # annotations only: the interpreter imports this module
    from perfmodel.schedule.interpreter import Interpreter


class _Unknown:
    """Sentinel for a value the interpreter cannot compute."""

    _instance: "_Unknown | None" = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclasses.dataclass
class RefValue:
    """A ref in the environment: its content (batch axis first) or UNKNOWN. ``track``: scalar writes to it
    update the content (SMEM state a kernel carries from step to step, e.g. a first-step flag); writes to an
    untracked ref forget its content."""

    value: Any
    memory_space: str
    track: bool = False


class Hook:
    """Receives executed equations. The default does nothing.

    A hook that sets ``foldable`` implements :meth:`fold` and
    :meth:`absorb_costliest_grouped`, which lets the interpreter count a loop's
    iterations in one pass over expanded lanes instead of one pass each.
    """

    #: Whether fold() and absorb_costliest_grouped() are implemented.
    foldable = False
    #: Iterations assumed for a while loop whose trip count the interpreter cannot evaluate (None: count one
    #: iteration and say so); the user's explicit ``loop_trips`` / ``--loop-trips``.
    assumed_trips: int | None = None

    def eqn(self, eqn: Any, weight: Any, interp: "Interpreter") -> None:  # pragma: no cover - interface
        pass

    def child(self) -> "Hook":
        return self

    def absorb_costliest(self, children: Sequence["Hook"], reason: str) -> None:
        pass

    def absorb_costliest_grouped(self, children: Sequence["Hook"], reason: str, groups: np.ndarray,
                                 ngroups: int) -> None:
        """absorb_costliest chosen separately within each group of lanes (``groups``: a group id per lane):
        the lanes of one group are the steps one per-iteration pass would have seen together."""
        raise NotImplementedError  # pragma: no cover - only called on foldable hooks

    def fold(self, child: "Hook", lanes: np.ndarray, n: int) -> None:
        """Add what ``child`` counted over expanded lanes to this hook's ``n`` lanes (``lanes``: the lane of
        this hook each expanded lane belongs to)."""
        raise NotImplementedError  # pragma: no cover - only called on foldable hooks

    def note(self, text: str) -> None:
        pass

    def dma_waves(self, weight: Any) -> None:
        """``weight`` (per lane) iterations ran of a loop whose body both starts and waits on DMAs (a
        pipeline written with ``emit_pipeline`` or by hand): each such iteration waits for copies it or an
        earlier one issued, a wave of copies."""


def is_unknown(x: Any) -> bool:
    """Whether ``x`` is :data:`UNKNOWN`."""
    return x is UNKNOWN


def aval_size(aval: Any) -> int:
    """Number of elements of an abstract value (1 for one without a shape)."""
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape)) if shape is not None else 1


def copy_refs(values: Sequence[Any]) -> list[Any]:
    """The values with every ref copied: branch exploration must not see another branch's writes."""
    return [RefValue(v.value, v.memory_space, v.track) if isinstance(v, RefValue) else v for v in values]


def forget_changed(originals: Sequence[Any], copies: Sequence[Any]) -> None:
    """Forget the content of each tracked ref whose copy a branch of unknown choice wrote: it holds
    data-dependent content afterwards."""
    for orig, copy in zip(originals, copies):
        if isinstance(orig, RefValue) and orig.track and isinstance(copy, RefValue) and copy.value is not orig.value:
            orig.value = UNKNOWN


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.div: integers round toward zero; floats divide."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        safe_b = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe_b)
        return np.where((a < 0) ^ (safe_b < 0), -q, q)
    return a / b


def _int_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.rem: sign follows the dividend (C semantics)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.fmod(a, np.where(b == 0, 1, b))
    return np.fmod(a, b)


def _select_n(which: np.ndarray, *cases: np.ndarray) -> np.ndarray:
    which = np.asarray(which)
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0])
    out = np.asarray(cases[0])
    for k, case in enumerate(cases[1:], start=1):
        out = np.where(which == k, case, out)
    return out


def _shift_right_logical(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    unsigned = a.astype(a.dtype.str.replace("i", "u")) if a.dtype.kind == "i" else a
    return (unsigned >> b).astype(a.dtype)


#: Primitive name -> numpy implementation, for values of any (batched) shape.
ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _int_div,
    "rem": _int_rem,
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "max": np.maximum,
    "min": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": lambda a, b: np.bitwise_and(a, b) if np.asarray(a).dtype != bool else np.logical_and(a, b),
    "or": lambda a, b: np.bitwise_or(a, b) if np.asarray(a).dtype != bool else np.logical_or(a, b),
    "xor": lambda a, b: np.bitwise_xor(a, b) if np.asarray(a).dtype != bool else np.logical_xor(a, b),
    "not": lambda a: np.invert(a) if np.asarray(a).dtype != bool else np.logical_not(a),
    "select_n": _select_n,
    "clamp": lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
    "shift_left": np.left_shift,
    "shift_right_arithmetic": np.right_shift,
    "shift_right_logical": _shift_right_logical,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    # An alignment hint for the compiler (pl.multiple_of): the value itself.
    "multiple_of": np.asarray,
}
