"""The built-in hardware database: every spec loads, is internally consistent and resolvable.

These tests do not import jax; tests/hw/test_jax_crosscheck.py compares the TPU specs with
JAX's own table.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
from pathlib import Path

import pytest

from perfmodel.errors import UnknownChipError
from perfmodel.hw import get_chip, load_spec_file
from perfmodel.hw.registry import normalize
from perfmodel.hw.spec import MATMUL_DTYPES, ChipSpec

BUILTIN_DIR = Path(str(importlib.resources.files("hwspecs")))
TPUS = ("tpu-v2", "tpu-v3", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x")
GPUS = ("a100-sxm-80gb", "h100-sxm", "h200-sxm", "h800-sxm", "b200", "mi300x")
ALL = TPUS + GPUS

# Relative tolerance for "a = b x c" consistency checks between numbers of one spec, keyed by
# what is compared (the inputs are rounded vendor figures).
CONSISTENCY_REL_TOL = {"ici_per_chip": 0.01, "ridge": 1e-9}


def _builtin_files() -> list[Path]:
    return sorted(BUILTIN_DIR.glob("*.yaml"))


def _builtin(name: str) -> ChipSpec:
    return load_spec_file(str(BUILTIN_DIR / f"{name}.yaml"))


def _names(spec: ChipSpec) -> list[str]:
    return [spec.name, *spec.aliases, *spec.jax_device_kinds]


# ----------------------------------------------------------------------------- loading


def test_builtin_set_is_exactly_the_thirteen_chips():
    assert sorted(f.stem for f in _builtin_files()) == sorted(ALL)


@pytest.mark.parametrize("name", ALL)
def test_spec_loads_validates_and_matches_its_file_name(name):
    spec = _builtin(name)  # load_spec_file runs the strict loader and validate()
    assert spec.name == name
    assert spec.kind == ("tpu" if name in TPUS else "gpu")
    assert spec.display_name and spec.vendor
    assert 2015 <= spec.year <= 2026


@pytest.mark.parametrize("name", ALL)
def test_every_reference_is_used_and_cited_text_is_nonempty(name):
    spec = _builtin(name)
    used = set(spec.sources.values()) | {d.chosen_source for d in spec.disagreements} | {
        d.other_source for d in spec.disagreements
    }
    assert set(spec.references) <= used, f"unused references: {set(spec.references) - used}"
    assert all(text.strip() for text in spec.references.values())
    for d in spec.disagreements:
        assert d.chosen_source in spec.references and d.other_source in spec.references
        assert d.reason.strip()


@pytest.mark.parametrize("name", ALL)
def test_no_placeholder_derivations_remain(name):
    spec = _builtin(name)
    for path, text in spec.derived.items():
        assert text.strip(), path
        assert "PLACEHOLDER" not in text.upper(), path
        assert path in spec.sources or path.rsplit(".", 1)[0] in spec.sources, f"derived '{path}' is unsourced"


@pytest.mark.parametrize("name", TPUS)
def test_tpu_vpu_and_eup_estimates_carry_their_derivation(name):
    spec = _builtin(name)
    for path in ("compute.vpu_flops_per_s_per_chip", "compute.eup_ops_per_s_per_chip"):
        assert "DERIVED" in spec.derived[path], f"{name}: {path} must say it is derived"


@pytest.mark.parametrize("name", ALL)
def test_disagreements_still_describe_the_chosen_value(name):
    """A disagreement whose 'chosen' no longer matches the field is stale."""
    spec = _builtin(name)
    for d in spec.disagreements:
        obj = spec
        for part in d.field.split("."):
            obj = getattr(obj, part)
        values = list(obj.values()) if isinstance(obj, dict) else [obj]
        assert any(math.isclose(d.chosen, v, rel_tol=1e-9) for v in values), (name, d.field)
        assert not math.isclose(d.chosen, d.other, rel_tol=1e-12), (name, d.field)


# ----------------------------------------------------------------------------- TPU structure

# Hand-known from the Cloud TPU pages and JAX's table: (cores, JAX devices, megacore, MXUs/core, MXU dim)
TPU_LAYOUT = {
    "tpu-v2": (2, 2, False, 1, 128),
    "tpu-v3": (2, 2, False, 2, 128),
    "tpu-v4": (2, 1, True, 4, 128),
    "tpu-v5e": (1, 1, False, 4, 128),
    "tpu-v5p": (2, 1, True, 4, 128),
    "tpu-v6e": (1, 1, False, 2, 256),
    "tpu-7x": (2, 2, False, 2, 256),
}


@pytest.mark.parametrize("name", TPUS)
def test_tpu_has_mxu_dim_and_vreg_tile(name):
    c = _builtin(name).cores
    assert (c.cores_per_chip, c.jax_devices_per_chip, c.megacore, c.mxus_per_core, c.mxu_dim) == TPU_LAYOUT[name]
    assert (c.vreg_sublanes, c.vreg_lanes) == (8, 128)
    assert c.core_kind == "TensorCore"


@pytest.mark.parametrize("name", TPUS)
def test_tpu_memories_and_pallas_overhead(name):
    spec = _builtin(name)
    m = spec.memory
    assert m.vmem_bytes_per_core is not None and m.vmem_bytes_per_core >= 16 * 2**20
    assert m.smem_bytes_per_core is not None
    if m.vmem_default_scoped_limit_bytes_per_core is not None:
        assert m.vmem_default_scoped_limit_bytes_per_core <= m.vmem_bytes_per_core
    assert m.shared_memory_bytes_per_core is None and m.l2_bytes_per_chip is None
    assert (m.cmem_bytes_per_chip is not None) == (name == "tpu-v4")  # CMEM exists on v4 only
    assert spec.overheads.pallas_grid_step_overhead_s == pytest.approx(0.35e-6)


@pytest.mark.parametrize(
    ("name", "scoped_mib"),
    # v4/v5: 16 MiB; v6e and TPU7x: 32 MiB; not documented for v2/v3.
    [("tpu-v2", None), ("tpu-v3", None), ("tpu-v4", 16), ("tpu-v5e", 16), ("tpu-v5p", 16), ("tpu-v6e", 32), ("tpu-7x", 32)],
)
def test_default_scoped_vmem_limit(name, scoped_mib):
    limit = _builtin(name).memory.vmem_default_scoped_limit_bytes_per_core
    assert limit == (None if scoped_mib is None else scoped_mib * 2**20)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_has_no_tpu_only_fields(name):
    spec = _builtin(name)
    c, m = spec.cores, spec.memory
    assert (c.mxus_per_core, c.mxu_dim, c.vreg_sublanes, c.vreg_lanes) == (None, None, None, None)
    assert not c.megacore and c.jax_devices_per_chip == 1
    assert m.vmem_bytes_per_core is None and m.smem_bytes_per_core is None and m.cmem_bytes_per_chip is None
    assert m.shared_memory_bytes_per_core is not None
    assert spec.overheads.pallas_grid_step_overhead_s is None


@pytest.mark.parametrize("name", ALL)
def test_megacore_and_device_count_agree(name):
    c = _builtin(name).cores
    if c.megacore:
        assert c.jax_devices_per_chip == 1 and c.cores_per_chip == 2
    assert c.jax_devices_per_chip in (1, c.cores_per_chip)


# ----------------------------------------------------------------------------- compute


@pytest.mark.parametrize("name", ALL)
def test_every_rate_dtype_has_a_native_pair_and_rates_are_ordered(name):
    spec = _builtin(name)
    rates = spec.compute.matmul_flops_per_s_per_chip
    assert "bf16" in rates
    in_pairs = {d for pair in spec.compute.native_matmul_dtype_pairs for d in pair.split(" x ")}
    for dtype in rates:
        assert dtype in in_pairs, f"{name}: a {dtype} rate but no native {dtype} operand pair"
    assert spec.supports_matmul("bf16", "bf16")
    # Narrower operands are never slower than wider ones on the same chip.
    order = [d for d in MATMUL_DTYPES if d in rates]
    for wide, narrow in zip(order, order[1:]):
        assert rates[narrow] >= rates[wide], (name, wide, narrow)
    # The vector unit is always far below the matrix unit, the EUP below the VPU.
    assert spec.compute.vpu_flops_per_s_per_chip < rates["bf16"]
    assert spec.compute.eup_ops_per_s_per_chip < spec.compute.vpu_flops_per_s_per_chip


@pytest.mark.parametrize(
    ("name", "lhs", "rhs", "native"),
    [
        ("tpu-v4", "bf16", "int8", True),  # v4 takes an int8 right-hand side
        ("tpu-v4", "int8", "int8", False),
        ("tpu-v5e", "int8", "int8", True),
        ("tpu-v5e", "int4", "int4", True),
        ("tpu-v6e", "fp8", "bf16", True),
        ("tpu-7x", "bf16", "fp8", True),  # Ironwood: fp8 rhs with a bf16 lhs ...
        ("tpu-7x", "fp8", "bf16", False),  # ... but not the reverse
        ("tpu-7x", "int8", "int8", False),  # and no int8 path at all
        ("tpu-v3", "int8", "int8", False),
        ("a100-sxm-80gb", "fp8", "fp8", False),
        ("h100-sxm", "int4", "int4", False),
        ("h100-sxm", "fp8", "fp8", True),
    ],
)
def test_native_matmul_pairs(name, lhs, rhs, native):
    assert _builtin(name).supports_matmul(lhs, rhs) is native


def test_fp8_rates_where_sources_publish_them():
    # v5e: Google publishes no fp8 peak; v5p/v6e run fp8 at the bf16 rate; Ironwood doubles it.
    assert get_chip("tpu-v5e").matmul_rate("fp8") is None
    for name in ("tpu-v5p", "tpu-v6e"):
        spec = get_chip(name)
        assert spec.matmul_rate("fp8") == spec.matmul_rate("bf16")
    ironwood = get_chip("tpu-7x")
    assert ironwood.matmul_rate("fp8") == pytest.approx(2 * ironwood.matmul_rate("bf16"))  # 4614 = 2 x 2307
    assert ironwood.matmul_rate("int8") is None


# ----------------------------------------------------------------------------- rooflines


def test_ridge_point_hand_worked_v5e():
    spec = get_chip("tpu-v5e")
    # 1.97e14 FLOP/s / 8.19e11 B/s = 240.537... FLOP per byte (the Pallas matmul guide's ~240.5)
    assert spec.ridge_point("bf16") == pytest.approx(240.537, abs=1e-3)
    # int8: 3.94e14 / 8.19e11 = 481.07 ops per byte
    assert spec.ridge_point("int8") == pytest.approx(481.07, abs=1e-2)
    assert spec.ridge_point("fp8") is None


@pytest.mark.parametrize(
    ("name", "ridge"),
    [
        ("tpu-v5p", 4.59e14 / 2.765e12),  # = 166.0
        ("tpu-v6e", 9.18e14 / 1.638e12),  # = 560.4
        ("tpu-7x", 2.307e15 / 7.37e12),  # = 313.0
        ("h100-sxm", 9.89e14 / 3.35e12),  # = 295.2
        ("mi300x", 1.3074e15 / 5.3e12),  # = 246.7
    ],
)
def test_ridge_points_match_hand_division(name, ridge):
    assert get_chip(name).ridge_point("bf16") == pytest.approx(ridge, rel=CONSISTENCY_REL_TOL["ridge"])


@pytest.mark.parametrize("name", ALL)
def test_ridge_points_are_sane(name):
    spec = get_chip(name)
    bf16 = spec.ridge_point("bf16")
    assert 50 < bf16 < 700, f"{name}: bf16 ridge {bf16:.1f} FLOP/B is implausible"
    for dtype in spec.compute.matmul_flops_per_s_per_chip:
        assert spec.ridge_point(dtype) == pytest.approx(spec.matmul_rate(dtype) / spec.memory.hbm_bw_bytes_per_s_per_chip)


# ----------------------------------------------------------------------------- interconnect


@pytest.mark.parametrize("name", ALL)
def test_ici_per_chip_is_links_times_link_bandwidth(name):
    ic = _builtin(name).interconnect
    assert ic.ici_links_per_chip is not None
    if ic.ici_bw_bytes_per_s_per_link is None:  # not public (TPU v2): then neither is the total
        assert ic.ici_bw_bytes_per_s_per_chip is None
        return
    assert ic.ici_bw_bytes_per_s_per_chip == pytest.approx(
        ic.ici_bw_bytes_per_s_per_link * ic.ici_links_per_chip, rel=CONSISTENCY_REL_TOL["ici_per_chip"]
    )


@pytest.mark.parametrize(
    ("name", "topology", "links", "pod"),
    [
        ("tpu-v2", "2d-torus", 4, 256),
        ("tpu-v3", "2d-torus", 4, 1024),
        ("tpu-v4", "3d-torus", 6, 4096),
        ("tpu-v5e", "2d-torus", 4, 256),
        ("tpu-v5p", "3d-torus", 6, 8960),
        ("tpu-v6e", "2d-torus", 4, 256),
        ("tpu-7x", "3d-torus", 6, 9216),
        ("h100-sxm", "switch", 18, 8),
        ("h800-sxm", "switch", 8, 8),
        ("mi300x", "fully-connected", 7, 8),
    ],
)
def test_topology(name, topology, links, pod):
    ic = _builtin(name).interconnect
    assert (ic.topology, ic.ici_links_per_chip, ic.max_chips_per_pod) == (topology, links, pod)


# ----------------------------------------------------------------------------- names


def test_names_aliases_and_device_kinds_are_unique_across_all_files():
    # Within one spec a name may repeat after normalisation ('tpu-v2' and 'TPU v2'): it resolves
    # to the same chip. Across specs every normalised name must be unique.
    owner: dict[str, str] = {}
    for f in _builtin_files():
        spec = load_spec_file(str(f))
        for key in {normalize(n) for n in _names(spec)}:
            assert key not in owner, f"'{key}' of {spec.name} already names {owner[key]}"
            owner[key] = spec.name
    assert len(set(owner.values())) == len(ALL)


def test_aliases_do_not_repeat_each_other_or_the_name():
    for name in ALL:
        spec = _builtin(name)
        aliases = [normalize(a) for a in spec.aliases]
        assert len(aliases) == len(set(aliases)), name
        assert normalize(spec.name) not in aliases, name


# Every device_kind string JAX's chip_version_from_device_kind knows, with the chip it is.
JAX_DEVICE_KINDS = [
    ("TPU v2", "tpu-v2"),
    ("TPU v3", "tpu-v3"),
    ("TPU v4", "tpu-v4"),
    ("TPU v5 lite", "tpu-v5e"),
    ("TPU v5e", "tpu-v5e"),
    ("TPU v5", "tpu-v5p"),
    ("TPU v5p", "tpu-v5p"),
    ("TPU v6 lite", "tpu-v6e"),
    ("TPU v6e", "tpu-v6e"),
    ("TPU7x", "tpu-7x"),
]
# Known to JAX but not modelled here (v4i, TPU7, TPU8i).
UNMODELLED_DEVICE_KINDS = ["TPU v4 lite", "TPU7", "TPU8i"]


@pytest.mark.parametrize(("kind", "name"), JAX_DEVICE_KINDS)
def test_jax_device_kind_resolves(kind, name):
    spec = get_chip(kind)
    assert spec.name == name
    assert kind in spec.jax_device_kinds


@pytest.mark.parametrize("kind", UNMODELLED_DEVICE_KINDS)
def test_unmodelled_device_kinds_are_unknown(kind):
    with pytest.raises(UnknownChipError, match=rf"unknown chip '{kind}'; .*known chips: "):
        get_chip(kind)


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("v6e", "tpu-v6e"),
        ("Trillium", "tpu-v6e"),
        ("TPU v6 lite", "tpu-v6e"),
        ("ironwood", "tpu-7x"),
        ("7x", "tpu-7x"),
        ("v7x", "tpu-7x"),
        ("TPU7x", "tpu-7x"),
        ("tpu_v5p", "tpu-v5p"),
        ("v4", "tpu-v4"),
        ("H100", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("h200", "h200-sxm"),
        ("NVIDIA B200", "b200"),
        ("MI300X", "mi300x"),
    ],
)
def test_alias_resolution(alias, name):
    assert get_chip(alias).name == name


def test_unknown_alias_suggests_close_names():
    with pytest.raises(UnknownChipError, match=r"unknown chip 'trilium'; did you mean tpu-v6e\?"):
        get_chip("trilium")


def test_spec_is_frozen():
    spec = get_chip("tpu-v6e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.memory.vmem_bytes_per_core = 1  # type: ignore[misc]


# ----------------------------------------------------------------------------- issue 10 part 6: spec gaps


@pytest.mark.parametrize(("name", "wrap"), [("tpu-v2", None), ("tpu-v3", None), ("tpu-v4", 4), ("tpu-v5e", 16),
                                            ("tpu-v5p", 4), ("tpu-v6e", 16), ("tpu-7x", 4)])
def test_torus_wraparound_rule(name, wrap):
    # v4/v5p/7x: axes of a multiple of 4 (a cube edge) wrap; v5e/v6e: only the full 16-chip pod side
    assert _builtin(name).interconnect.torus_wraparound_multiple_chips == wrap


@pytest.mark.parametrize("name", GPUS)
def test_gpus_are_not_tori(name):
    assert _builtin(name).interconnect.torus_wraparound_multiple_chips is None


def test_v2_has_ici_bandwidth():
    ic = _builtin("tpu-v2").interconnect
    # Jouppi et al. 2020: 4 links of 496 Gbit/s = 62e9 B/s each; 4 x 6.2e10 = 2.48e11 B/s per chip
    assert (ic.ici_bw_bytes_per_s_per_link, ic.ici_bw_bytes_per_s_per_chip) == (6.2e10, 2.48e11)


def test_7x_dcn_is_an_estimate_with_its_derivation():
    spec = _builtin("tpu-7x")
    # 100 Gbps per chip = 1.25e10 B/s, marked as an estimate (Google gives no NIC rate)
    assert spec.interconnect.dcn_bw_bytes_per_s_per_chip == 1.25e10
    assert spec.sources["interconnect.dcn_bw_bytes_per_s_per_chip"] == "perfmodel-estimate"
    assert spec.derived["interconnect.dcn_bw_bytes_per_s_per_chip"].startswith("ESTIMATE:")


def test_b200_l2_and_clock():
    spec = _builtin("b200")
    assert spec.memory.l2_bytes_per_chip == 126 * 2**20  # 126 MB (Chips and Cheese) read as MiB, like H100's 50
    assert spec.compute.clock_hz == 1.98e9
    assert {d.field for d in spec.disagreements} >= {"memory.l2_bytes_per_chip", "compute.clock_hz"}


def test_mi300x_l2_is_the_l2_and_infinity_cache_has_its_own_field():
    m = _builtin("mi300x").memory
    assert m.l2_bytes_per_chip == 8 * 4 * 2**20  # 8 XCDs x 4 MB
    assert m.memory_side_cache_bytes_per_chip == 256 * 2**20  # Infinity Cache
    others = [n for n in ALL if n != "mi300x"]
    assert all(_builtin(n).memory.memory_side_cache_bytes_per_chip is None for n in others)


def test_h800_is_an_h100_with_a_narrower_nvlink():
    h100, h800 = _builtin("h100-sxm"), _builtin("h800-sxm")
    assert (h800.compute, h800.memory, h800.cores) == (h100.compute, h100.memory, h100.cores)
    # NVLink 400 GB/s bidirectional = 8 links x 25 GB/s one way (H100: 900 GB/s, 18 links)
    ic = h800.interconnect
    assert (ic.ici_links_per_chip, ic.ici_bw_bytes_per_s_per_chip) == (8, 2.0e11)
    assert h100.interconnect.ici_bw_bytes_per_s_per_chip == 4.5e11
