"""VMEM tile padding and the fits / needs-limit / does-not-fit verdict."""

from __future__ import annotations

import dataclasses

import pytest

from perfmodel.hw.registry import get_chip
from perfmodel.schedule.vmem import buffer_bytes, padded_vmem_bytes, smem_bytes, vmem_status


@pytest.mark.parametrize(
    "shape,itemsize,expected",
    [
        # Mosaic's measured rule (kernels.tiling.padded_rows): rows pad to a multiple of 8 sublanes for every
        # dtype, up to 8 rows to a power of two of at least one 32-bit word; lanes to 128.
        # (512, 1024) bf16: no padding, 1 MiB.
        ((512, 1024), 2, 512 * 1024 * 2),
        # (24, 128) bf16: 24 rows stay 24 (a 16-row bf16 tile would make 32): 24*128*2.
        ((24, 128), 2, 24 * 128 * 2),
        # (8, 100) f32: lanes pad 100 -> 128: 8*128*4 = 4096.
        ((8, 100), 4, 8 * 128 * 4),
        # (1, 128) bf16: one row pads to one 32-bit word = 2 bf16 rows: 2*128*2 = 512.
        ((1, 128), 2, 2 * 128 * 2),
        # (3, 40) int8: rows 3 -> 4 (a power of two, and 4 int8 rows to a word), lanes to 128: 4*128 = 512.
        ((3, 40), 1, 4 * 128),
        # (2, 5, 130) f32: leading dim kept, (5,130) -> (8,256): 2*8*256*4.
        ((2, 5, 130), 4, 2 * 8 * 256 * 4),
        # 1-D f32 of 3 elements is one row of 128 lanes: 128*4.
        ((3,), 4, 128 * 4),
    ],
)
def test_padded_vmem_bytes(v5e, shape, itemsize, expected):
    assert padded_vmem_bytes(shape, itemsize, v5e) == expected


def test_no_padding_on_a_chip_without_vreg_tiles():
    gpu = get_chip("h100-sxm")
    assert padded_vmem_bytes((3, 40), 2, gpu) == 3 * 40 * 2


def test_smem_holds_32_bit_words():
    assert smem_bytes((10,), 1) == 40
    assert smem_bytes((10,), 4) == 40


def test_hbm_buffers_take_no_vmem(v5e):
    assert buffer_bytes((1024, 1024), 2, "any", v5e) == 0


def test_status_against_the_default_scoped_limit_and_capacity(v5e):
    mib = 1 << 20
    # v5e: 16 MiB default scoped limit, 128 MiB of VMEM.
    assert vmem_status(16 * mib, v5e, None) == "fits"
    assert vmem_status(16 * mib + 1, v5e, None) == "needs vmem_limit_bytes"
    assert vmem_status(128 * mib + 1, v5e, None) == "does not fit"
    # A kernel that raises its own limit to 32 MiB fits up to it.
    assert vmem_status(30 * mib, v5e, 32 * mib) == "fits"
    assert vmem_status(33 * mib, v5e, 32 * mib) == "needs vmem_limit_bytes"


def test_status_not_applicable_without_vmem_data(v5e):
    memory = dataclasses.replace(v5e.memory, vmem_bytes_per_core=None, vmem_default_scoped_limit_bytes_per_core=None)
    chip = dataclasses.replace(v5e, memory=memory)
    assert vmem_status(1, chip, None) == "n/a"
