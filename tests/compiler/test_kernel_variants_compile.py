"""Every variant of the quantized matmul family and every sampling feature compiles with the real TPU compiler
(deviceless) on every TPU generation at its tuned defaults: matmul and grouped_matmul at a decode-sized and a
prefill-sized call, sampling at 64 x 128256 logits. A variant a chip has no MXU path for (int8 x int8 on v4 and
7x, fp8 where the spec has no fp8 rate) is refused by the wrapper before lowering: that needs no compiler and is
checked in tests/kernels/test_variant_refusals.py.

One compile per (kernel, variant, case, chip), cached by the compile cache; marked slow (CI's compile-checks,
``make compile-checks``)."""

from __future__ import annotations

import functools

import pytest

from perfmodel.compiler.api import compile_many
from perfmodel.compiler.toolchain import compile_targets
from perfmodel.hw.registry import get_chip
from tests.compiler.kernel_variants import BUILD, CALLS, refusal

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]

#: (call, chip) pairs that compile; the refused ones are checked without the compiler (test_variant_refusals.py).
COMPILED = [(call, chip) for chip in sorted(compile_targets()) for call in CALLS if refusal(call[1], chip) is None]


@functools.cache
def _reports(chip: str) -> dict[tuple[str, str, str], object]:
    """Every call the chip has a path for, compiled two at a time."""
    calls = [call for call, c in COMPILED if c == chip]
    return dict(zip(calls, compile_many([BUILD[kernel](v, case) for kernel, v, case in calls], chip, jobs=2)))


@pytest.mark.parametrize("call, chip", COMPILED, ids=["-".join((*c, chip)).replace(" ", "_") for c, chip in COMPILED])
def test_variant_compiles_at_its_defaults(call, chip):
    rep = _reports(chip)[call]
    assert not isinstance(rep, Exception), f"{call} on {chip}: {rep}"
    assert rep.compiled, f"{call} on {chip}: {rep.error}"
    assert rep.kernels  # Pallas kernels, each with its grid loop in the schedule and within VMEM
    for kernel in rep.kernels:
        assert kernel.loop is not None and kernel.loop.bundles > 0
        assert kernel.scoped_vmem_bytes and kernel.scoped_vmem_bytes <= get_chip(chip).memory.vmem_bytes_per_core
