"""Every bundled kernel compiles with the real TPU compiler on every generation at production shapes and its
tuned defaults (one compile per kernel and chip for the whole module)."""

import pytest

from perfmodel.compiler.matrix import CASES, chips, run_matrix

pytestmark = pytest.mark.needs_libtpu


@pytest.fixture(scope="module")
def matrix():
    rows = run_matrix(jobs=2)
    return {(r["case"], r["chip"]): r for r in rows}


@pytest.mark.parametrize("chip", chips())
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_compiles(matrix, case, chip):
    row = matrix[(case, chip)]
    assert row["compiled"], f"{case} on {chip}: {row['error']}"
    assert row["vmem_allocated_bytes"] and row["body_bundles"] > 0
