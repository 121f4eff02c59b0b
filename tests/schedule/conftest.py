"""Tolerances of the schedule-model tests (chip fixtures come from tests/conftest.py)."""

from __future__ import annotations

import pytest

#: Relative tolerances keyed by what is compared: closed-form counts are exact
#: integers; times carry float rounding only; published measurements use the
#: issue's 15% calibration band.
RTOL = {"count": 0.0, "time": 1e-9, "published": 0.15}


@pytest.fixture(scope="session")
def rtol():
    return RTOL
