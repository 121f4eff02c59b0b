"""The project's performance-regression gate: every bundled kernel at its production shapes on every generation,
recompiled and compared with kernels/baseline.json (`perfmodel baseline check kernels/baseline.json`). Runs in
`make compile-checks`, after the compile matrix has compiled the same calls (the cache is warm). A kernel change
that costs bundles, time, spills or VMEM fails here unless the same commit rewrites the baseline with
`perfmodel baseline write kernels/baseline.json`."""

from pathlib import Path

import pytest

from perfmodel.harness import baseline
from perfmodel.harness import baseline_report as rep

pytestmark = [pytest.mark.slow, pytest.mark.needs_libtpu]

BASELINE = Path(__file__).resolve().parents[2] / "kernels" / "baseline.json"


def test_no_kernel_regressed_against_the_baseline():
    stored = baseline.read(BASELINE)
    rows = baseline.compare(stored.records, baseline.record(baseline.default_calls(), workers=2))
    bad = baseline.regressions(rows)
    assert not bad, ("kernels regressed against kernels/baseline.json; if intended, run `perfmodel baseline "
                     "write kernels/baseline.json` in the same commit\n\n" + rep.report_markdown(rows, 0.02))
    # every default call is in the baseline: a new kernel or chip is recorded when it is added
    assert not [r for r in rows if r.verdict in ("new", "missing")], rep.report_text(rows, 0.02)
