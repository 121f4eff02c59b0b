"""Trace a kernel as if on a chosen TPU: kernels that ask the chip at trace time (``pltpu.get_tpu_info()``, the
abstract mesh's device kind) see that chip's JAX device kind instead of the CPU they are traced on.

JAX reads the device kind of the current abstract mesh when one is set
(``jax.sharding.use_abstract_mesh`` with an ``AbstractDevice``), so a one-device
abstract mesh whose device is the chip's is all it takes; nothing is patched.
A kernel that reads ``jax.devices()[0].device_kind`` directly still sees the
CPU: pass ``chip=`` to it, or trace it with the TPU compiler (``--compile``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from perfmodel.errors import InputError
from perfmodel.hw.spec import ChipSpec

#: The axis name of the one-device abstract mesh (not visible to the kernel unless it asks for mesh axes).
AXIS = "perfmodel_device"


def tpu_device_kind(chip: ChipSpec) -> str:
    """The device kind JAX reports for one JAX device of ``chip`` (its spec's first ``jax_device_kinds``)."""
    if chip.kind != "tpu" or not chip.jax_device_kinds:
        raise InputError(f"--hw: {chip.name} is not a TPU with a JAX device kind; pick a TPU (e.g. v5e, v6e, 7x)")
    return chip.jax_device_kinds[0]


def cores_per_device(chip: ChipSpec) -> int:
    """TensorCores one JAX device drives: both of a megacore chip's, one where each core is its own device."""
    return max(1, chip.cores.cores_per_chip // max(1, chip.cores.jax_devices_per_chip))


@contextlib.contextmanager
def as_device(chip: ChipSpec) -> Iterator[Any]:
    """Trace under ``chip``'s device kind (see the module docstring); yields the abstract mesh."""
    import jax
    from jax.sharding import AbstractDevice, AbstractMesh

    device = AbstractDevice(device_kind=tpu_device_kind(chip), num_cores=cores_per_device(chip), platform="tpu")
    mesh = AbstractMesh((1,), (AXIS,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        yield mesh
