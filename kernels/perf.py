"""The bundled kernels' one interface to perfmodel: chip specs, the chip a call runs on, the default chip, and
CostEstimates from its op models.

No other ``kernels/`` module imports perfmodel (``tests/kernels/test_standalone.py`` checks it), so a kernel
folder copied into another project needs perfmodel only through the functions here. Each imports perfmodel
inside itself: importing this module (and so a kernel) imports none of perfmodel, and a call imports only the
part it asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from perfmodel.hw.spec import ChipSpec as ChipSpec


def __getattr__(name: str) -> Any:
    """``DEFAULT_CHIP``: perfmodel's default chip name, read from its registry on first use."""
    if name == "DEFAULT_CHIP":
        from perfmodel.hw.registry import DEFAULT_CHIP

        return DEFAULT_CHIP
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")


def resolve_chip(chip: str | None, *, interpret: bool = False) -> str:
    """The chip a kernel call is built for (its tuned blocks and VMEM budget): ``chip`` when given; else the TPU
    the call is traced for, read from its JAX device kind through perfmodel's registry -- the abstract mesh's
    device when one is set (perfmodel's ``analyze`` traces under the chip it models), else ``jax.devices()[0]`` on
    a TPU backend; else, in interpret mode, ``DEFAULT_CHIP``. Lowering for a TPU from a host without one
    (``jax.export``, a deviceless compile) has no device to ask: the chip must be given (ValueError)."""
    if chip is not None:
        return chip
    import jax

    device = jax.sharding.get_abstract_mesh().abstract_device
    if device is not None and getattr(device, "platform", None) == "tpu":
        return chip_spec(device.device_kind).name
    first = jax.devices()[0]
    if first.platform == "tpu":
        return chip_spec(first.device_kind).name
    if interpret:
        from perfmodel.hw.registry import DEFAULT_CHIP

        return DEFAULT_CHIP
    raise ValueError(f"chip: no TPU to ask which chip this call is for (JAX's devices are {first.platform}); "
                     "pass chip= (e.g. chip='tpu-v6e') when lowering for a TPU from another host, or run with "
                     "interpret=True")


def chip_spec(chip: str) -> ChipSpec:
    """perfmodel's ChipSpec of ``chip``: a chip name, alias, JAX device_kind or spec-file path."""
    from perfmodel.hw.registry import get_chip

    return get_chip(chip)


def pallas_chips() -> tuple[str, ...]:
    """The chips the attention, grouped-matmul and sampling kernels keep tuned defaults for, oldest first
    (:func:`perfmodel.schedule.catalog.pallas_chips`). Read when tuning: an ``entry.py`` names this function
    (``TunedKernel(chips=pallas_chips)``)."""
    from perfmodel.schedule.catalog import pallas_chips as chips

    return chips()


def binary(value: float) -> str:
    """A byte count in binary prefixes, e.g. ``"128 MiB"`` (perfmodel's formatting, for error messages)."""
    from perfmodel.units import binary as format_binary

    return format_binary(value)


def _estimate(cost: Any) -> Any:
    """pl.CostEstimate of a perfmodel OpCost."""
    from perfmodel.model.core import to_cost_estimate

    return to_cost_estimate(cost)


def flash_attention_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.attention.flash_attention(**params)``."""
    from perfmodel.model.attention import flash_attention

    return _estimate(flash_attention(**params))


def paged_attention_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.paged_attention.paged_decode_attention(**params)``."""
    from perfmodel.model.paged_attention import paged_decode_attention

    return _estimate(paged_decode_attention(**params))


def ragged_paged_attention_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.paged_attention.ragged_paged_attention(**params)``."""
    from perfmodel.model.paged_attention import ragged_paged_attention

    return _estimate(ragged_paged_attention(**params))


def rms_norm_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.fused.rms_norm(**params)``."""
    from perfmodel.model.fused import rms_norm

    return _estimate(rms_norm(**params))


def gemm_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.gemm.gemm(**params)``."""
    from perfmodel.model.gemm import gemm

    return _estimate(gemm(**params))


def grouped_gemm_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.gemm.grouped_gemm(**params)``."""
    from perfmodel.model.gemm import grouped_gemm

    return _estimate(grouped_gemm(**params))


def kv_cache_update_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.kvcache.kv_cache_update(**params)``."""
    from perfmodel.model.kvcache import kv_cache_update

    return _estimate(kv_cache_update(**params))


def sampling_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.sampling.sampling(**params)``."""
    from perfmodel.model.sampling import sampling

    return _estimate(sampling(**params))


def rejection_sampling_cost(**params: Any) -> Any:
    """pl.CostEstimate of ``perfmodel.model.sampling.rejection_sampling(**params)``."""
    from perfmodel.model.sampling import rejection_sampling

    return _estimate(rejection_sampling(**params))


def uniform_group_sizes(rows: int, groups: int) -> tuple[int, ...]:
    """``rows`` split over ``groups`` as evenly as whole rows allow (``perfmodel.model.gemm.uniform_group_sizes``,
    the split the grouped GEMM model assumes)."""
    from perfmodel.model.gemm import uniform_group_sizes as split

    return split(rows, groups)


def tile_visits(group_sizes: Sequence[int], block_m: int) -> int:
    """Row tiles a grouped matmul over groups of ``group_sizes`` rows computes in ``block_m``-row tiles
    (``perfmodel.model.gemm.tile_visits``)."""
    from perfmodel.model.gemm import tile_visits as visits

    return visits(group_sizes, block_m)
