"""The compiler facts of every chip spec (its ``compiler:`` section) and the code that reads them.

These facts used to be lists of chip names in the code, in copies that disagreed: ``BF16_VPU_CHIPS``
(perfmodel/model/gemm.py, and kernels/matmul/kernel.py's ``BF16_SCALING_CHIPS``), ``F32_ONLY_VPU_CHIPS``
(kernels/tiling.py), ``TOPOLOGIES`` (perfmodel/compiler/toolchain.py) and ``PALLAS_CHIPS``
(perfmodel/schedule/catalog.py). EXPECTED below is what those lists said, written out as data: the specs must
say the same, and the functions that replaced the lists must give the same answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.matmul.rules import has_bf16_vpu, quantizes_in_bf16
from perfmodel.harness.compile_matrix import chips as matrix_chips
from perfmodel.compiler.toolchain import CompilerUnavailable, compile_targets, deviceless_topology, topology_for
from perfmodel.errors import SpecError
from perfmodel.hw import get_chip, load_spec_file
from perfmodel.hw.spec import Compiler
from perfmodel.schedule.catalog import pallas_chips

#: chip -> (deviceless_topology, vpu_bf16_arithmetic, mosaic_narrow_vmem_temporaries, bundled_pallas_kernels):
#: TOPOLOGIES, BF16_VPU_CHIPS (true on v6e and 7x), not F32_ONLY_VPU_CHIPS (false on v2, v3, v4), PALLAS_CHIPS.
EXPECTED = {
    "tpu-v2": (None, False, False, False),
    "tpu-v3": (None, False, False, False),
    "tpu-v4": ("v4:2x2x1", False, False, True),
    "tpu-v5e": ("v5e:2x2", False, True, True),
    "tpu-v5p": ("v5p:2x2x1", False, True, True),
    "tpu-v6e": ("v6e:2x2", True, True, True),
    "tpu-7x": ("tpu7x:2x2x1", True, True, True),
}
GPUS = ("a100-sxm-80gb", "h100-sxm", "h200-sxm", "h800-sxm", "b200", "mi300x")
BUILTIN_DIR = Path(__file__).resolve().parents[2] / "hwspecs"
FIELDS = ("deviceless_topology", "vpu_bf16_arithmetic", "mosaic_narrow_vmem_temporaries", "bundled_pallas_kernels")


@pytest.mark.parametrize("name", EXPECTED)
def test_every_tpu_spec_has_the_compiler_facts_the_code_used(name):
    spec = get_chip(name)
    assert spec.compiler == Compiler(**dict(zip(FIELDS, EXPECTED[name])))


@pytest.mark.parametrize("name", EXPECTED)
def test_every_known_compiler_fact_of_a_tpu_is_sourced(name):
    spec = get_chip(name)
    for field in FIELDS:
        if getattr(spec.compiler, field) is not None:
            ref = spec.sources.get(f"compiler.{field}")
            assert ref in spec.references, f"{name}: compiler.{field} has no source"


@pytest.mark.parametrize("name", GPUS)
def test_gpus_have_no_tpu_compiler_facts(name):
    assert get_chip(name).compiler == Compiler(deviceless_topology=None, vpu_bf16_arithmetic=None,
                                               mosaic_narrow_vmem_temporaries=None, bundled_pallas_kernels=False)


def test_v5e_and_v5p_keep_two_different_facts():
    # Both widen bf16 arithmetic to f32 (no bf16 VPU math before v6e), yet Mosaic keeps their bf16/int8 temporaries
    # narrow (from v5 on): the two old lists disagreed about them because they are two facts.
    for name in ("tpu-v5e", "tpu-v5p"):
        c = get_chip(name).compiler
        assert c.vpu_bf16_arithmetic is False and c.mosaic_narrow_vmem_temporaries is True


def test_the_functions_that_replaced_the_lists_answer_as_the_lists_did():
    from kernels.matmul.plan import scales_in_bf16
    from kernels.tiling import narrow_vmem_temporaries

    specs = [get_chip(n) for n in EXPECTED]
    assert [s.name for s in specs if has_bf16_vpu(s)] == ["tpu-v6e", "tpu-7x"]  # BF16_VPU_CHIPS
    assert [s.name for s in specs if quantizes_in_bf16(s, "bf16")] == ["tpu-v6e", "tpu-7x"]
    assert [s.name for s in specs if scales_in_bf16(s)] == ["tpu-v6e", "tpu-7x"]  # BF16_SCALING_CHIPS
    assert [s.name for s in specs if not narrow_vmem_temporaries(s)] == ["tpu-v2", "tpu-v3", "tpu-v4"]  # F32_ONLY
    topologies = {"tpu-v4": "v4:2x2x1", "tpu-v5e": "v5e:2x2", "tpu-v5p": "v5p:2x2x1", "tpu-v6e": "v6e:2x2",
                  "tpu-7x": "tpu7x:2x2x1"}
    assert compile_targets() == topologies and list(compile_targets()) == list(topologies)  # TOPOLOGIES, in order
    assert matrix_chips() == tuple(topologies)
    assert pallas_chips() == ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x")  # PALLAS_CHIPS, in order
    assert not any(has_bf16_vpu(get_chip(n)) for n in GPUS) and not has_bf16_vpu(None)


def test_topology_for_reads_the_spec_and_refuses_chips_without_one():
    assert topology_for("tpu-v5e") == topology_for("v5e") == topology_for(get_chip("v5e")) == "v5e:2x2"
    assert topology_for(get_chip("ironwood")) == "tpu7x:2x2x1"
    for name in ("tpu-v3", "h100-sxm"):
        with pytest.raises(CompilerUnavailable, match=rf"--hw {name}: .* compile for one of tpu-v4, tpu-v5e, "
                                                      r"tpu-v5p, tpu-v6e, tpu-7x$"):
            topology_for(name)


def test_one_device_of_a_chip_keeps_its_facts_but_is_no_compile_target():
    chip, dev = get_chip("tpu-7x"), get_chip("tpu-7x/core")
    assert dev.compiler == chip.compiler  # one TensorCore of the same silicon, compiled by the same compiler
    assert has_bf16_vpu(dev) and quantizes_in_bf16(dev, "bf16")
    assert deviceless_topology(chip) == "tpu7x:2x2x1" and deviceless_topology(dev) is None
    with pytest.raises(CompilerUnavailable, match=r"--hw tpu-7x/core: the installed TPU compiler has no deviceless"):
        topology_for(dev)


def test_the_compiler_section_is_required_and_strict(tmp_path):
    base = (BUILTIN_DIR / "tpu-v5e.yaml").read_text()
    missing = tmp_path / "missing.yaml"
    missing.write_text(base.replace("  bundled_pallas_kernels: true\n", "", 1))
    with pytest.raises(SpecError, match=r"field 'compiler' missing key\(s\) bundled_pallas_kernels in 'compiler'"):
        load_spec_file(str(missing))
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(base.replace("  vpu_bf16_arithmetic: false", "  vpu_bf16_arithmetic: yes", 1))
    with pytest.raises(SpecError, match=r"field 'compiler.vpu_bf16_arithmetic' must be true or false, got 'yes'"):
        load_spec_file(str(wrong))
