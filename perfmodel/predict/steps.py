"""One prefill chunk or decode step of a whole model over chips x sweep points (`perfmodel predict model`).

:func:`step_sweep` builds the :class:`~perfmodel.model.step.Step` of
every point (per-sequence contexts from
:func:`perfmodel.predict.ops.context_lengths`) and predicts it on every chip
with :func:`perfmodel.model.transformer.predict_step`;
:mod:`perfmodel.predict.step_render` prints the :class:`StepSweep`. No jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: Parameters a sweep may vary.
SWEEPABLE = ("phase", "batch", "context", "prefill_len", "tp", "page_size", "weight_dtype", "act_dtype", "kv_dtype",
             "weight_scale", "scale_block")


@dataclass(frozen=True, kw_only=True)
class StepPoint:
    #: The swept values of this point ({} without a sweep).
    point: dict[str, Any]
    prediction: Any  # perfmodel.model.transformer.StepPrediction


@dataclass(frozen=True, kw_only=True)
class StepSweep:
    model: Any  # perfmodel.model.schema.ModelConfig
    swept: tuple[str, ...]
    #: Chips x points, in that order.
    points: tuple[StepPoint, ...]

    @property
    def predictions(self) -> list[Any]:
        return [p.prediction for p in self.points]


def step_sweep(model: Any, *, chips: Sequence[Any], points: Sequence[Mapping[str, Any]] = ({},),
               phase: str = "decode", batch: int | None = None, context: int | None = None,
               context_lens: Any = None, context_dist: str | None = None, prefill_len: int | None = None,
               weight_dtype: str = "bf16", act_dtype: str = "bf16", kv_dtype: str | None = None, tp: int = 1,
               page_size: int = 16, hbm_utilization: float = 0.9, weight_scale: str | None = None,
               scale_block: int | None = None, quantize_activations: bool = False,
               progress: Callable[..., None] | None = None) -> StepSweep:
    """Predict the step of ``model`` (a ModelConfig, preset name or config path) at every chip and point.

    ``context_lens`` (one length per sequence) or ``context_dist`` (``batch``
    quantiles) give a decode batch of mixed lengths instead of one ``context``. ``progress(chip name,
    done=i, total=n)`` before each of the n chip x point predictions.
    """
    from perfmodel.errors import InputError
    from perfmodel.model.configs import get_model
    from perfmodel.model.schema import ModelConfig
    from perfmodel.model.step import make_step
    from perfmodel.model.transformer import predict_step
    from perfmodel.predict.ops import context_lengths

    cfg = model if isinstance(model, ModelConfig) else get_model(model)
    unknown = [k for k in (points[0] if points else {}) if k not in SWEEPABLE]
    if unknown:
        raise InputError(f"`{unknown[0]}`: cannot be swept; sweepable: {', '.join(SWEEPABLE)}", fields=(unknown[0],))
    lens = None
    if context_lens is not None or context_dist is not None:
        lens, batch = context_lengths(context, context_lens, context_dist, batch)
        context = None
    params = dict(phase=phase, batch=batch, context=context, prefill_len=prefill_len, weight_dtype=weight_dtype,
                  act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp, page_size=page_size, context_lens=lens,
                  weight_scale=weight_scale, scale_block=scale_block, quantize_activations=quantize_activations)
    out = []
    for chip in chips:
        for point in points:
            if progress is not None:
                progress(chip.name, done=len(out) + 1, total=len(chips) * len(points))
            merged = {**params, **point}
            if "phase" in point and merged["phase"] == "decode":
                merged["prefill_len"] = None  # a phase sweep: prefill_len belongs to its prefill points only
            pred = predict_step(cfg, make_step(**merged), chip, hbm_utilization=hbm_utilization)
            out.append(StepPoint(point=dict(point), prediction=pred))
    swept = tuple(points[0]) if points and points[0] else ()
    return StepSweep(model=cfg, swept=swept, points=tuple(out))
