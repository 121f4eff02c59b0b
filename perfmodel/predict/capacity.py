"""KV-cache capacity over chips x sweep points: tokens and sequences of KV that fit next to the weights.

:func:`capacity_sweep` evaluates :func:`perfmodel.model.kvcache.kv_capacity`
for every chip and point; :mod:`perfmodel.predict.render` prints the
:class:`CapacitySweep`. No jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError, naming

#: Parameters a sweep may not vary (dtypes and scale layouts are choices, not sizes).
NOT_SWEEPABLE = ("weight_dtype", "kv_dtype", "kv_scale")


@dataclass(frozen=True, kw_only=True)
class CapacityRow:
    chip: str
    #: The parameters at this point (the sweep point's values over the given ones).
    params: dict[str, Any]
    capacity: Any  # perfmodel.model.kvcache.KVCapacity


@dataclass(frozen=True, kw_only=True)
class CapacitySweep:
    #: The parameters as given, and the names of the swept ones.
    params: dict[str, Any]
    swept: tuple[str, ...]
    rows: tuple[CapacityRow, ...]


def kv_capacity_point(chip: Any, *, layers: Any, kv_heads: Any, head_dim: Any = 128, weight_bytes: Any = None,
                      params_b: Any = None, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                      kv_scale: str | None = None, page_size: Any = 16, context: Any = None, num_chips: Any = 1,
                      hbm_utilization: float = 0.9, reserved_bytes: Any = 0.0) -> Any:
    """KVCapacity of one point: the weights from ``weight_bytes`` or ``params_b`` (billions of parameters of
    ``weight_dtype``), KV bytes per token from the model's shape (scales default as every op model's)."""
    from perfmodel.model.dtypes import itemsize
    from perfmodel.model.kvcache import kv_bytes_per_token, kv_capacity

    if (weight_bytes is None) == (params_b is None):
        raise InputError("give exactly one of `weight_bytes` and `params_b`", fields=("weight_bytes", "params_b"))
    if params_b is not None and not 0 < params_b < float("inf"):
        raise InputError(f"`params_b` must be a positive number of billions of parameters, got {params_b:g}",
                         fields=("params_b",))
    if weight_bytes is None:
        with naming("weight_dtype"):
            weight_bytes = params_b * 1e9 * itemsize(weight_dtype, "`weight_dtype`")
    per_token = kv_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_dtype=kv_dtype,
                                   kv_scale=kv_scale)
    return kv_capacity(chip=chip, weight_bytes=weight_bytes, kv_bytes_per_token=per_token, page_size=page_size,
                       context_len=context, num_chips=num_chips, reserved_bytes=reserved_bytes,
                       hbm_utilization=hbm_utilization)


def capacity_sweep(params: Mapping[str, Any], *, chips: Sequence[Any],
                   points: Sequence[Mapping[str, Any]] = ({},)) -> CapacitySweep:
    """:func:`kv_capacity_point` for every chip and point."""
    fixed = [k for k in (points[0] if points else {}) if k in NOT_SWEEPABLE]
    if fixed:
        raise InputError(f"`{fixed[0]}`: cannot be swept; sweep sizes, not dtypes or scale layouts", fields=(fixed[0],))
    rows = []
    for chip in chips:
        for point in points:
            p = {**params, **point}
            rows.append(CapacityRow(chip=chip.name, params=p, capacity=kv_capacity_point(chip, **p)))
    swept = tuple(points[0]) if points and points[0] else ()
    return CapacitySweep(params=dict(params), swept=swept, rows=tuple(rows))
