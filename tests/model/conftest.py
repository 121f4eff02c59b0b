"""Tolerances of the model tests (chip fixtures come from tests/conftest.py)."""

import pytest

#: Relative tolerance of float comparisons, keyed by what is compared (closed-form counts are exact up to
#: float rounding; times divide by rates).
RTOL = {"count": 1e-12, "time": 1e-9}


@pytest.fixture(scope="session")
def rtol():
    return RTOL
