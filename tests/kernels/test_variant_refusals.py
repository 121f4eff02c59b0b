"""A variant a chip has no MXU path for is refused by the kernel's wrapper, with its one-line error, before
anything is lowered: int8 x int8 (w8a8, w4a8) on v4 and 7x, fp8 weights where the spec has no fp8 rate.

The same calls as the compile checks (tests/compiler/kernel_variants.py), bound the way the compile worker binds
them (perfmodel.schedule.binding.bind_catalog) and traced abstractly: no compiler is started for a refusal
(these cases used to start libtpu only to read the wrapper's ValueError back)."""

from __future__ import annotations

import jax
import pytest

from perfmodel.compiler.toolchain import compile_targets
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.binding import bind_catalog
from tests.compiler.kernel_variants import BUILD, CALLS, refusal

TARGETS = compile_targets()
REFUSED = [(call, chip, refusal(call[1], chip)) for chip in sorted(TARGETS) for call in CALLS
           if refusal(call[1], chip) is not None]


def _trace(call, chip):
    compile_call = BUILD[call[0]](call[1], call[2])
    fn, specs, _ = bind_catalog(compile_call.target, compile_call.shapes, None, dict(compile_call.extra or {}),
                                get_chip(chip))
    return jax.eval_shape(fn, *(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in specs))


def test_every_generation_refuses_something_or_runs_everything():
    # v4 (no int8 x int8, no fp8: 4 + 2 variants x 2 cases), 7x (no int8 MXU: 4 x 2) and v5e (no fp8: 2 x 2)
    # refuse; v5p and v6e run every variant.
    by_chip = {chip: sum(1 for _, c, _ in REFUSED if c == chip) for chip in TARGETS}
    assert by_chip == {"tpu-v4": 12, "tpu-7x": 8, "tpu-v5e": 4, "tpu-v5p": 0, "tpu-v6e": 0}


@pytest.mark.parametrize("call, chip, message", REFUSED,
                         ids=["-".join((*c, chip)).replace(" ", "_") for c, chip, _ in REFUSED])
def test_a_variant_without_an_mxu_path_is_refused_before_lowering(call, chip, message):
    with pytest.raises(ValueError, match=message):
        _trace(call, chip)


@pytest.mark.parametrize("call", [c for c in CALLS if c[0] != "sampling"][:4], ids=lambda c: "-".join(c))
def test_the_same_binding_traces_where_the_chip_has_the_path(call):
    # The refusals above are not a binding that fails everywhere: on v5e the same calls trace.
    out = _trace(call, "tpu-v5e")
    assert jax.tree.leaves(out)[0].shape[0] == {"decode": 64, "prefill": 2048}[call[2]]
