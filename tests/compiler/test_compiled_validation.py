"""Compiler-backed timing against published TPU kernel timings: the stored constants are what the fit gives,
and the held-out points stay within the errors recorded in perfmodel/compiler/README.md.

The default run compiles the two fit points and two held-out matmul points (about 20 s); the whole set (25
compiles, about 2 minutes) runs with ``-m slow``, which CI runs after the default suite (``make ci``)."""

import pytest

from perfmodel.harness import kernel_validation as kv
from perfmodel.schedule.compiled import default_constants

pytestmark = pytest.mark.needs_libtpu

#: Held-out points compiled in the default run next to the fit points.
QUICK_HELD_OUT = ("mm-1024-b128", "mm-4096-b512")


@pytest.fixture(scope="module")
def prepared():
    return kv.prepare(kv.load_points())


@pytest.fixture(scope="module")
def prepared_quick():
    points = [p for p in kv.load_points() if p.role.startswith("fit:") or p.id in QUICK_HELD_OUT]
    return kv.prepare(points)


def _assert_fit_is_stored(prepared):
    """Fit the constants on these points; they equal the stored ones. Returns (stored, fitted)."""
    stored = default_constants()
    fitted = kv.fit_constants(prepared)
    assert fitted.dma_latency_s == pytest.approx(stored.dma_latency_s, rel=0.05)
    assert fitted.stall_factor == pytest.approx(stored.stall_factor, rel=0.02)
    assert set(fitted.provenance["fitted_on"]) == {"dma_latency_s", "stall_factor"}
    return stored, fitted


def test_stored_constants_are_the_fit_and_two_held_out_points_stay_within_5_percent(prepared_quick):
    _assert_fit_is_stored(prepared_quick)
    rows = {r.point.id: r for r in kv.evaluate(prepared_quick)}
    assert set(QUICK_HELD_OUT) <= set(rows)
    for pid in QUICK_HELD_OUT:
        assert abs(rows[pid].compiled_error) < 0.05, (pid, rows[pid].compiled_error)


@pytest.mark.slow
def test_stored_constants_are_the_fit(prepared):
    stored, fitted = _assert_fit_is_stored(prepared)
    assert set(fitted.provenance["held_out"]) == set(stored.provenance["held_out"])


@pytest.mark.slow
def test_held_out_errors(prepared):
    rows = kv.evaluate(prepared)
    by_id = {r.point.id: r for r in rows}
    for pid in ("mm-1024-b128", "mm-4096-b128", "mm-1024-b512", "mm-4096-b512"):
        assert abs(by_id[pid].compiled_error) < 0.05, (pid, by_id[pid].compiled_error)
    # The guide's fused-transpose and fused-ReLU variants (never fitted) stay within 10%.
    for r in rows:
        if r.point.source_id == "jax-matmul-guide-variants":
            assert abs(r.compiled_error) < 0.10, (r.point.id, r.compiled_error)
    for r in rows:
        assert r.compiled_s is not None, r.compile_error
        assert abs(r.compiled_error) < 0.45, (r.point.id, r.compiled_error)
    s = kv.summary(rows)
    assert s["held_out_points"] == 23
    assert s["compiled_median_abs_error_held_out"] <= 0.10
    assert s["held_out_by_source"]["axlearn-flash-v4"]["points"] == 7
    assert s["compiled_median_abs_error_fit"] < 0.01
