"""Cross-check every TPU spec against JAX's own hardware table, field by field.

JAX's ``pltpu.get_tpu_info_for_chip(version, n)`` is per TensorCore: chip totals are the
per-core value times the physical TensorCores per chip. A field listed in the spec's
``jax_table_differences`` must actually differ (so a stale exception fails) and carry a reason;
every other field must agree within the tolerance for its kind.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import jax.numpy as jnp
import pytest
from jax._src.pallas.mosaic import tpu_info as _tpu_info_module
from jax.experimental.pallas import tpu as pltpu

from perfmodel.errors import UnknownChipError
from perfmodel.hw import get_chip
from perfmodel.hw.spec import MATMUL_DTYPES, ChipSpec

CV = pltpu.ChipVersion
CHIP_VERSION = {
    "tpu-v2": CV.TPU_V2,
    "tpu-v3": CV.TPU_V3,
    "tpu-v4": CV.TPU_V4,
    "tpu-v5e": CV.TPU_V5E,
    "tpu-v5p": CV.TPU_V5P,
    "tpu-v6e": CV.TPU_V6E,
    "tpu-7x": CV.TPU_7X,
}

# Relative tolerance per kind of field: vendor pages and JAX round differently (819 vs 820 GB/s,
# 16 GiB vs 17.2e9 B), so ~2% for rates and capacities; structural counts must match exactly.
REL_TOL = {"capacity": 0.02, "rate": 0.02, "count": 0.0}

# Our operand dtypes -> the jnp dtypes JAX's is_matmul_supported is asked about (any variant counts).
JNP_VARIANTS = {
    "fp32": (jnp.float32,),
    "bf16": (jnp.bfloat16,),
    "fp8": (jnp.float8_e5m2, jnp.float8_e4m3fn, jnp.float8_e4m3b11fnuz),
    "int8": (jnp.int8,),
    "int4": (jnp.int4,),
}


def _rate(dtype: str):
    return lambda s: s.matmul_rate(dtype) or 0


# TpuInfo field -> (kind, our per-chip value, scale JAX's per-core value to ours: "chip" or "core")
FIELDS = {
    "hbm_capacity_bytes": ("capacity", lambda s: s.memory.hbm_bytes_per_chip, "chip"),
    "mem_bw_bytes_per_second": ("rate", lambda s: s.memory.hbm_bw_bytes_per_s_per_chip, "chip"),
    "bf16_ops_per_second": ("rate", _rate("bf16"), "chip"),
    "int8_ops_per_second": ("rate", _rate("int8"), "chip"),
    "fp8_ops_per_second": ("rate", _rate("fp8"), "chip"),
    "int4_ops_per_second": ("rate", _rate("int4"), "chip"),
    "vmem_capacity_bytes": ("capacity", lambda s: s.memory.vmem_bytes_per_core, "core"),
    "smem_capacity_bytes": ("capacity", lambda s: s.memory.smem_bytes_per_core, "core"),
    "cmem_capacity_bytes": ("capacity", lambda s: s.memory.cmem_bytes_per_chip or 0, "chip"),
    "mxu_column_size": ("count", lambda s: s.cores.mxu_dim, "core"),
    "num_mxus": ("count", lambda s: s.cores.mxus_per_core, "core"),
    "num_lanes": ("count", lambda s: s.cores.vreg_lanes, "core"),
    "num_sublanes": ("count", lambda s: s.cores.vreg_sublanes, "core"),
    # TensorCores per JAX device: 2 with megacore (v4, v5p), else 1.
    "num_cores": ("count", lambda s: s.cores.cores_per_chip // s.cores.jax_devices_per_chip, "core"),
}


def _info(spec: ChipSpec) -> pltpu.TpuInfo:
    cores_per_device = spec.cores.cores_per_chip // spec.cores.jax_devices_per_chip
    return pltpu.get_tpu_info_for_chip(CHIP_VERSION[spec.name], cores_per_device)


def _jax_value(spec: ChipSpec, field: str) -> float:
    info = _info(spec)
    value = getattr(info, field)
    if FIELDS[field][2] == "chip":
        value *= CHIP_VERSION[spec.name].num_physical_tensor_cores_per_chip
    return value


def _agree(ours: float, theirs: float, kind: str) -> bool:
    if ours == 0 or theirs == 0:
        return ours == theirs
    return abs(ours - theirs) <= REL_TOL[kind] * max(abs(ours), abs(theirs))


def _jax_pairs(info: pltpu.TpuInfo) -> set[str]:
    return {
        f"{lhs} x {rhs}"
        for lhs in MATMUL_DTYPES
        for rhs in MATMUL_DTYPES
        if any(info.is_matmul_supported(a, b) for a in JNP_VARIANTS[lhs] for b in JNP_VARIANTS[rhs])
    }


CASES = [(name, field) for name in CHIP_VERSION for field in FIELDS]


@pytest.mark.parametrize(("name", "field"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_field_matches_jax_or_is_a_listed_difference(name, field):
    spec = get_chip(name)
    kind, ours_of, _ = FIELDS[field]
    ours, theirs = ours_of(spec), _jax_value(spec, field)
    assert ours is not None, f"{name}: our value for {field} is null"
    if field in spec.jax_table_differences:
        assert spec.jax_table_differences[field].strip(), f"{name}: empty reason for {field}"
        assert not _agree(ours, theirs, kind), (
            f"{name}: {field} is listed in jax_table_differences but now agrees "
            f"(ours {ours:.4g}, JAX {theirs:.4g}); remove the stale exception"
        )
    else:
        assert _agree(ours, theirs, kind), (
            f"{name}: {field} ours {ours:.4g} vs JAX {theirs:.4g} (tolerance {REL_TOL[kind]:.0%}); "
            "fix the spec or list the field in jax_table_differences with a reason"
        )


@pytest.mark.parametrize("name", CHIP_VERSION)
def test_native_pairs_match_is_matmul_supported(name):
    spec = get_chip(name)
    ours = set(spec.compute.native_matmul_dtype_pairs)
    theirs = _jax_pairs(_info(spec))
    if "is_matmul_supported" in spec.jax_table_differences:
        assert spec.jax_table_differences["is_matmul_supported"].strip()
        assert ours != theirs, f"{name}: pairs now match JAX; remove the stale exception"
    else:
        assert ours == theirs, f"{name}: only ours {sorted(ours - theirs)}, only JAX {sorted(theirs - ours)}"


@pytest.mark.parametrize("name", CHIP_VERSION)
def test_core_layout_matches_chip_version(name):
    spec, version = get_chip(name), CHIP_VERSION[name]
    assert spec.cores.cores_per_chip == version.num_physical_tensor_cores_per_chip
    assert spec.cores.megacore is version.supports_megacore
    # Lite chips have one core; the rest are 2 devices per chip unless megacore fuses them.
    expected_devices = 1 if (version.is_lite or version.supports_megacore) else 2
    assert spec.cores.jax_devices_per_chip == expected_devices


@pytest.mark.parametrize("name", ["tpu-v4", "tpu-v5p"])
def test_megacore_split_mode_has_the_same_per_core_numbers(name):
    """JAX's per-core numbers do not depend on megacore vs split mode, so our per-chip ones hold."""
    version = CHIP_VERSION[name]
    fused, split = pltpu.get_tpu_info_for_chip(version, 2), pltpu.get_tpu_info_for_chip(version, 1)
    assert (fused.num_cores, split.num_cores) == (2, 1)
    assert fused.mem_bw_bytes_per_second == split.mem_bw_bytes_per_second
    assert fused.bf16_ops_per_second == split.bf16_ops_per_second


@pytest.mark.parametrize("name", CHIP_VERSION)
def test_listed_differences_name_real_tpuinfo_fields(name):
    known = {f.name for f in dataclasses.fields(pltpu.TpuInfo)} | {"is_matmul_supported"}
    for field, reason in get_chip(name).jax_table_differences.items():
        assert field in known, f"{name}: '{field}' is not a TpuInfo field"
        assert reason.strip()


def _device_kinds_known_to_jax() -> list[str]:
    source = inspect.getsource(_tpu_info_module.chip_version_from_device_kind)
    return [kind for case in re.findall(r"case (.+):", source) for kind in re.findall(r'"([^"]+)"', case)]


def test_device_kind_list_parsed_from_jax():
    kinds = _device_kinds_known_to_jax()
    # Hand-checked against jax 0.10.2's chip_version_from_device_kind.
    assert {"TPU v2", "TPU v5 lite", "TPU v5", "TPU v6 lite", "TPU7x"} <= set(kinds)
    assert len(kinds) == len(set(kinds)) >= 13


@pytest.mark.parametrize("kind", _device_kinds_known_to_jax())
def test_every_jax_device_kind_resolves_to_its_chip(kind):
    cv = _tpu_info_module.chip_version_from_device_kind(kind)
    ours = {v: n for n, v in CHIP_VERSION.items()}
    if cv in ours:
        spec = get_chip(kind)
        assert spec.name == ours[cv]
        assert kind in spec.jax_device_kinds
    else:  # v4i, TPU7, TPU8i: known to JAX, not modelled here
        with pytest.raises(UnknownChipError, match=rf"unknown chip '{re.escape(kind)}'"):
            get_chip(kind)


@pytest.mark.parametrize("name", CHIP_VERSION)
def test_our_device_kinds_are_ones_jax_maps_to_the_same_chip(name):
    spec = get_chip(name)
    assert spec.jax_device_kinds
    for kind in spec.jax_device_kinds:
        assert _tpu_info_module.chip_version_from_device_kind(kind) == CHIP_VERSION[name]
