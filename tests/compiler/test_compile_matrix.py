"""Every bundled kernel compiles with the real TPU compiler at production shapes and its tuned defaults (one compile
per kernel and chip).

The default run compiles every kernel for tpu-v5e; the other generations (tpu-v4, tpu-v5p, tpu-v6e, tpu-7x) run
with ``-m slow``, which CI runs after the default suite (``make ci``: every kernel on every generation)."""

import functools

import pytest

from perfmodel.harness.compile_matrix import CASES, chips, run_matrix

pytestmark = pytest.mark.needs_libtpu

#: Compiled in the default run: the generation the model is calibrated on.
DEFAULT_CHIPS = ("tpu-v5e",)


@functools.cache
def _matrix(chip: str) -> dict[str, dict]:
    """One chip's rows by case: every case compiled once, two at a time."""
    return {r["case"]: r for r in run_matrix(chip_names=[chip], jobs=2)}


def _chips() -> list:
    return [c if c in DEFAULT_CHIPS else pytest.param(c, marks=pytest.mark.slow) for c in chips()]


def test_the_default_chips_are_compiler_targets():
    assert set(DEFAULT_CHIPS) <= set(chips())


@pytest.mark.parametrize("chip", _chips())
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_compiles(case, chip):
    row = _matrix(chip)[case]
    assert row["compiled"], f"{case} on {chip}: {row['error']}"
    assert row["vmem_allocated_bytes"] and row["body_bundles"] > 0
