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


def test_analyze_traces_a_kernel_that_asks_for_the_chip():
    # The kernel sizes its block from the chip's lane count and VMEM: traced on a CPU without the chip's device
    # kind, get_tpu_info() would fail.
    from jax.experimental import pallas as pl

    from perfmodel.schedule.analyze import analyze

    def fn(x):
        info = pltpu.get_tpu_info()
        rows = 8 if info.vmem_capacity_bytes < 64 * 2**20 else 16  # v4: 16 MiB per core -> 8 rows; v5e: 128 MiB
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...] * 2),
                              grid=(x.shape[0] // rows,),
                              in_specs=[pl.BlockSpec((rows, info.num_lanes), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((rows, info.num_lanes), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    assert analyze(fn, x, chip="tpu-v4").kernels[0].steps == 64 // 8
    assert analyze(fn, x, chip="tpu-v5e").kernels[0].steps == 64 // 16
