"""An op over chips x sweep points: evaluate the op model at every point on every chip.

A *builder* (see :mod:`perfmodel.predict.ops`) takes ``chip=`` and the op's
flat keyword parameters and returns one :class:`~perfmodel.model.core.OpCost`
or a dict ``{variant: OpCost}`` (e.g. fused / unfused).
:func:`predict_sweep` calls it for every chip and point and evaluates each
variant's roofline; the :class:`OpSweep` it returns is what
:mod:`perfmodel.predict.render` prints. No jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from perfmodel.hw.registry import DEFAULT_CHIP
from perfmodel.model.core import OpCost, Roofline, evaluate

Builder = Callable[..., "OpCost | Mapping[str, OpCost]"]


def resolve_chips(names: Iterable[str] = ()) -> list:
    """ChipSpecs for chip names or spec files (comma lists allowed), in order, without duplicates;
    :data:`~perfmodel.hw.registry.DEFAULT_CHIP` when none is given."""
    from perfmodel.hw import get_chip

    flat = [n.strip() for value in (names or (DEFAULT_CHIP,)) for n in str(value).split(",") if n.strip()]
    chips, seen = [], set()
    for name in flat or [DEFAULT_CHIP]:
        chip = get_chip(name)
        if chip.name not in seen:
            seen.add(chip.name)
            chips.append(chip)
    return chips


@dataclass(frozen=True, kw_only=True)
class OpPrediction:
    """One evaluated row: a chip, a sweep point, a variant ("" when the op has one)."""

    op: str
    chip: Any
    point: dict[str, Any]
    variant: str
    roofline: Roofline

    @property
    def cost(self) -> OpCost:
        return self.roofline.cost


@dataclass(frozen=True, kw_only=True)
class OpSweep:
    """Every prediction of one op: chips x points x variants, in that order."""

    op: str
    #: The op's parameters as given (a swept parameter keeps its given value; each point overrides it).
    params: dict[str, Any]
    #: Names of the swept parameters (empty: one point).
    swept: tuple[str, ...]
    predictions: tuple[OpPrediction, ...]

    @property
    def chips(self) -> list[str]:
        return list(dict.fromkeys(p.chip.name for p in self.predictions))


def predict_sweep(op: str, build: Builder, params: Mapping[str, Any], *, chips: Sequence[Any],
                  points: Sequence[Mapping[str, Any]] = ({},),
                  progress: Callable[..., None] | None = None) -> OpSweep:
    """Call ``build(chip=..., **params, **point)`` for every chip and point and evaluate every variant.
    ``progress(chip name, done=i, total=n)`` before each of the n chip x point predictions."""
    out = []
    total, done = len(chips) * len(points), 0
    for chip in chips:
        for point in points:
            done += 1
            if progress is not None:
                progress(chip.name, done=done, total=total)
            result = build(chip=chip, **{**params, **point})
            variants = result.items() if isinstance(result, Mapping) else [("", result)]
            for label, cost in variants:
                out.append(OpPrediction(op=op, chip=chip, point=dict(point), variant=label,
                                        roofline=evaluate(cost, chip)))
    swept = tuple(points[0]) if points and points[0] else ()
    return OpSweep(op=op, params=dict(params), swept=swept, predictions=tuple(out))
