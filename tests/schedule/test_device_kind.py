"""Tracing as if on a chosen TPU: pltpu.get_tpu_info() sees the chip's device kind and cores per device."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.device_kind import as_device, cores_per_device, tpu_device_kind


@pytest.mark.parametrize("chip_name, version, cores", [
    # megacore chips drive both TensorCores from one device; 7x shows each core as its own device
    ("tpu-v4", "v4", 2), ("tpu-v5e", "v5e", 1), ("tpu-v5p", "v5p", 2), ("tpu-v6e", "v6e", 1), ("tpu-7x", "7x", 1),
])
def test_get_tpu_info_sees_the_chosen_chip(chip_name, version, cores):
    seen = {}

    def f(x):
        info = pltpu.get_tpu_info()
        seen.update(version=str(info.chip_version), cores=info.num_cores)
        return x * info.num_lanes

    chip = get_chip(chip_name)
    with as_device(chip):
        jaxpr = jax.make_jaxpr(f)(jnp.ones(4))
    assert seen == {"version": version, "cores": cores} and cores_per_device(chip) == cores
    assert "128" in str(jaxpr)  # the kernel's own use of the info is traced
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        jax.make_jaxpr(f)(jnp.ones(4))  # outside the context the CPU answers


def test_a_gpu_has_no_tpu_device_kind():
    with pytest.raises(InputError, match="--hw: .* is not a TPU with a JAX device kind"):
        tpu_device_kind(get_chip("h100"))
