"""Views of a chip spec: one JAX device of a chip whose TensorCores are separate devices.

On TPU v2, v3 and 7x each TensorCore is its own JAX device (``cores.jax_devices_per_chip`` = 2);
a user who times one device measures half a chip. ``--hw tpu-7x/core`` (any chip name, alias or spec
file followed by :data:`DEVICE_SUFFIX`) asks for that device: :func:`one_device` derives it from the chip
spec, so nothing is written twice in hwspecs/. Megacore chips (v4, v5p: JAX drives both TensorCores as
one device) and one-core chips are one JAX device already; asking for ``/core`` of them is an error.

The rule, by the naming convention of :mod:`perfmodel.hw.spec`: every number whose field name ends in
``_per_chip`` is a whole-package quantity and is divided by the devices per chip (peak FLOP/s, VPU and
EUP rates, HBM bytes and bandwidth, ICI links and bandwidth, DCN bandwidth, caches, cores); per-core,
per-link and per-op numbers stay as they are; a pod holds that many times more devices than chips. A
device on 7x so owns half the chip's HBM and its bandwidth and half the chip's ICI links (the two dies'
share of the package's links; the die-to-die path between a chip's two devices is not modelled).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from perfmodel.errors import UnknownChipError
from perfmodel.hw.spec import ChipSpec

#: What follows a chip name to ask for one JAX device of it: ``tpu-7x/core``.
DEVICE_SUFFIX = "/core"

#: Per-chip counts that grow rather than shrink: a pod of C chips is C x devices-per-chip devices.
_MULTIPLIED = ("interconnect.max_chips_per_pod",)

#: id(chip) -> its device view (chip specs are cached by the registry, so ids stay valid and a view is
#: the same object every time: chip_argument() relies on it).
_VIEWS: dict[int, ChipSpec] = {}


def split_device_suffix(text: str) -> tuple[str, bool]:
    """``("tpu-7x", True)`` for ``"tpu-7x/core"`` (any case, spaces around the name ignored); else (text, False)."""
    stripped = text.strip()
    if stripped.lower().endswith(DEVICE_SUFFIX) and len(stripped) > len(DEVICE_SUFFIX):
        return stripped[: -len(DEVICE_SUFFIX)].strip(), True
    return text, False


def one_device_error(chip: ChipSpec, asked: str) -> UnknownChipError | None:
    """Why ``asked`` (``<chip>/core``) has no device view, or None when it has one."""
    cores, devices = chip.cores.cores_per_chip, chip.cores.jax_devices_per_chip
    if devices > 1:
        return None
    if chip.cores.megacore:
        why = (f"{chip.name} is one JAX device per chip (megacore: JAX drives its {cores} TensorCores as one "
               f"device)")
    else:
        why = f"{chip.name} is one JAX device per chip ({cores} {chip.cores.core_kind}{'s' if cores > 1 else ''})"
    from perfmodel.hw.registry import all_chips

    split = ", ".join(c.name for c in all_chips() if c.cores.jax_devices_per_chip > 1)
    return UnknownChipError(f"chip '{asked}': {why}; '{DEVICE_SUFFIX}' is only for chips whose TensorCores are "
                            f"separate JAX devices ({split}); use '{chip.name}'")


def _scale(value: Any, factor: float, path: str) -> Any:
    if isinstance(value, dict):
        return {k: _scale(v, factor, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, bool) or value is None or not isinstance(value, (int, float)):
        return value
    out = value * factor
    if isinstance(value, int):
        if out != int(out):
            raise UnknownChipError(f"field '{path}' ({value}) does not split into whole per-device parts")
        return int(out)
    return out


def _factor(path: str, devices: int) -> float | None:
    if path in _MULTIPLIED:
        return float(devices)
    return 1.0 / devices if path.endswith("_per_chip") else None


def one_device(chip: ChipSpec) -> ChipSpec:
    """One JAX device of ``chip`` (see the module docstring): the chip's per-chip numbers / devices per chip.

    Raises UnknownChipError when the chip is one JAX device already (megacore or one core).
    """
    cached = _VIEWS.get(id(chip))
    if cached is not None:
        return cached
    err = one_device_error(chip, chip.name + DEVICE_SUFFIX)
    if err is not None:
        raise err
    n = chip.cores.jax_devices_per_chip
    derived = dict(chip.derived)
    sections: dict[str, Any] = {}
    for section in ("cores", "compute", "memory", "interconnect", "overheads"):
        obj = getattr(chip, section)
        changes = {}
        for f in dataclasses.fields(obj):
            path = f"{section}.{f.name}"
            factor = _factor(path, n)
            value = getattr(obj, f.name)
            if factor is None or value is None or isinstance(value, (bool, str)):
                continue
            changes[f.name] = _scale(value, factor, path)
            op = f"x {n}" if factor > 1 else f"/ {n}"
            how = f"one JAX device of {chip.name}: the chip's figure {op} ({n} JAX devices per chip)"
            derived[path] = f"{how}; chip: {chip.derived[path]}" if path in chip.derived else how
        sections[section] = dataclasses.replace(obj, **changes)
    disagreements = tuple(
        dataclasses.replace(d, chosen=d.chosen * f, other=d.other * f) if (f := _factor(d.field, n)) else d
        for d in chip.disagreements
    )
    view = dataclasses.replace(
        chip,
        name=chip.name + DEVICE_SUFFIX,
        display_name=f"{chip.display_name}, one TensorCore (1 of {n} JAX devices per chip)",
        aliases=tuple(a + DEVICE_SUFFIX for a in chip.aliases),
        notes=(f"Device view of {chip.name}: one of the chip's {n} JAX devices (one TensorCore); every per-chip "
               f"number here is the chip's / {n} (see `derived`).",) + chip.notes,
        derived=derived,
        disagreements=disagreements,
        **sections,
    )
    _VIEWS[id(chip)] = view
    return view


def devices_text(chip: ChipSpec) -> str:
    """How many JAX devices the chip is, in words (for `perfmodel hw show`)."""
    devices, cores = chip.cores.jax_devices_per_chip, chip.cores.cores_per_chip
    if chip.name.endswith(DEVICE_SUFFIX):
        return "1 (this is the device view: one TensorCore of the chip)"
    if devices > 1:
        return (f"{devices} (each {chip.cores.core_kind} is its own JAX device; one of them: "
                f"--hw {chip.name}{DEVICE_SUFFIX})")
    if chip.cores.megacore:
        return f"1 (megacore: JAX drives the {cores} TensorCores as one device)"
    return "1"

