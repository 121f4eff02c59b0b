"""A kernel call picks the chip it runs on (kernels.perf.resolve_chip): given, from the abstract mesh perfmodel
traces under, from a TPU device's device_kind (faked devices of every generation), the stated default in
interpret mode, and a clear error when lowering for a TPU from a host without one."""

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest

from kernels.perf import DEFAULT_CHIP, resolve_chip
from kernels.rms_norm import rms_norm
from perfmodel.hw.registry import all_chips, get_chip
from perfmodel.schedule.device_kind import as_device
from tests.kernels.lowering import export_for_tpu, mosaic_bodies

#: Every TPU generation's JAX device kinds, from the hwspecs (e.g. "TPU v5 lite" -> tpu-v5e).
DEVICE_KINDS = [(kind, spec.name) for spec in all_chips() if spec.kind == "tpu" for kind in spec.jax_device_kinds]
S = jax.ShapeDtypeStruct


@dataclass(frozen=True)
class FakeDevice:
    platform: str
    device_kind: str


def test_every_generation_has_a_device_kind():
    assert {name for _, name in DEVICE_KINDS} >= {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x"}


def test_a_given_chip_is_used_as_given():
    assert resolve_chip("tpu-v6e") == "tpu-v6e"
    assert resolve_chip("v5e", interpret=True) == "v5e"


@pytest.mark.parametrize("kind, name", DEVICE_KINDS)
def test_chip_from_a_tpu_device(monkeypatch, kind, name):
    monkeypatch.setattr(jax, "devices", lambda *a: [FakeDevice(platform="tpu", device_kind=kind)])
    assert resolve_chip(None) == name
    assert resolve_chip(None, interpret=True) == name  # interpret mode on a TPU host still asks the device


def test_an_unknown_tpu_device_kind_is_named(monkeypatch):
    monkeypatch.setattr(jax, "devices", lambda *a: [FakeDevice(platform="tpu", device_kind="TPU v99")])
    with pytest.raises(ValueError, match="TPU v99"):
        resolve_chip(None)


def test_chip_from_the_abstract_mesh_perfmodel_traces_under():
    with as_device(get_chip("tpu-v6e")):
        assert resolve_chip(None) == "tpu-v6e"


def test_interpret_mode_off_a_tpu_uses_the_stated_default():
    assert jax.devices()[0].platform != "tpu"
    assert resolve_chip(None, interpret=True) == DEFAULT_CHIP == "tpu-v5e"


def test_lowering_for_a_tpu_from_a_cpu_host_needs_the_chip():
    with pytest.raises(ValueError, match=r"chip: no TPU to ask .* pass chip="):
        resolve_chip(None)
    args = (S((64, 4096), jnp.bfloat16), S((64, 4096), jnp.bfloat16), S((4096,), jnp.bfloat16))
    with pytest.raises(ValueError, match="pass chip="):
        export_for_tpu(lambda x, r, w: rms_norm(x, r, w), *args)
    # The chip given, or the device kind of the mesh it is traced under: the same blocks (the Mosaic kernel's
    # block signature; tracing under a mesh adds no-op shape casts to the body, so the bodies are not compared).
    given = export_for_tpu(lambda x, r, w: rms_norm(x, r, w, chip="tpu-v6e"), *args)
    with as_device(get_chip("tpu-v6e")):
        asked = export_for_tpu(lambda x, r, w: rms_norm(x, r, w), *args)
    assert _block_signature(given) == _block_signature(asked)


def _block_signature(module_text):
    (body,) = mosaic_bodies(module_text)
    return next(line for line in body.splitlines() if "^bb0" in line)
