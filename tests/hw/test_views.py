"""One JAX device of a chip whose TensorCores are separate devices: ``--hw tpu-7x/core``."""

from __future__ import annotations

import pytest

from perfmodel.errors import UnknownChipError
from perfmodel.hw import get_chip
from perfmodel.hw.registry import chip_argument
from perfmodel.hw.views import one_device, split_device_suffix


@pytest.mark.parametrize("text,out", [("tpu-7x/core", ("tpu-7x", True)), (" 7x/CORE ", ("7x", True)),
                                      ("tpu-7x", ("tpu-7x", False)), ("/core", ("/core", False))])
def test_split_device_suffix(text, out):
    assert split_device_suffix(text) == out


def test_7x_device_is_half_the_chip():
    chip, dev = get_chip("tpu-7x"), get_chip("ironwood/core")
    assert dev is one_device(chip) and dev.name == "tpu-7x/core"
    # per-chip quantities halve: 2307 -> 1153.5 TFLOP/s bf16, 192 -> 96 GiB, 7.37 -> 3.685 TB/s, 6 -> 3 links
    assert dev.matmul_rate("bf16") == pytest.approx(2.307e15 / 2)
    assert dev.memory.hbm_bytes_per_chip == 96 * 2**30
    assert dev.memory.hbm_bw_bytes_per_s_per_chip == pytest.approx(3.685e12)
    assert dev.interconnect.ici_links_per_chip == 3
    assert (dev.cores.cores_per_chip, dev.cores.jax_devices_per_chip) == (1, 1)
    # per-core and per-link numbers stay; a pod holds twice as many devices as chips
    assert dev.memory.vmem_bytes_per_core == chip.memory.vmem_bytes_per_core
    assert dev.interconnect.ici_bw_bytes_per_s_per_link == chip.interconnect.ici_bw_bytes_per_s_per_link
    assert dev.interconnect.max_chips_per_pod == 2 * 9216
    # the ridge point (FLOP/s over bytes/s) is the chip's: both halve
    assert dev.ridge_point("bf16") == pytest.approx(chip.ridge_point("bf16"))
    # every scaled number says how it was derived
    assert dev.derived["memory.hbm_bw_bytes_per_s_per_chip"].startswith("one JAX device of tpu-7x: the chip's figure / 2")


def test_v2_device():
    dev = get_chip("tpu-v2/core")
    # v2: 8 GiB HBM and one MXU per TensorCore (Cloud TPU system architecture page)
    assert dev.memory.hbm_bytes_per_chip == 8 * 2**30
    assert dev.matmul_rate("bf16") == pytest.approx(2.3e13)


def test_device_view_round_trips_through_chip_argument():
    dev = get_chip("tpu-7x/core")
    assert chip_argument(dev) == "tpu-7x/core" and get_chip(chip_argument(dev)) is dev


def test_device_view_of_a_spec_file(tmp_path):
    src = get_chip("tpu-7x")
    from perfmodel.hw.registry import _SOURCE_FILES

    path = _SOURCE_FILES[id(src)]
    dev = get_chip(path + "/core")
    assert dev.memory.hbm_bytes_per_chip == src.memory.hbm_bytes_per_chip // 2


@pytest.mark.parametrize("name,match", [
    ("tpu-v5p/core", r"^chip 'tpu-v5p/core': tpu-v5p is one JAX device per chip \(megacore"),
    ("v6e/core", r"^chip 'v6e/core': tpu-v6e is one JAX device per chip \(1 TensorCore\)"),
    ("b200/core", r"^chip 'b200/core': b200 is one JAX device per chip \(148 SMs\)"),
])
def test_one_device_chips_refuse_the_view(name, match):
    with pytest.raises(UnknownChipError, match=match):
        get_chip(name)
    with pytest.raises(UnknownChipError, match=r"use '"):
        one_device(get_chip(name.split("/")[0]))
