"""Chips and tolerances shared by the model tests."""

import pytest

from perfmodel.hw import get_chip

#: Relative tolerance of float comparisons, keyed by what is compared (closed-form counts are exact up to
#: float rounding; times divide by rates).
RTOL = {"count": 1e-12, "time": 1e-9}


@pytest.fixture(scope="session")
def v5e():
    return get_chip("tpu-v5e")


@pytest.fixture(scope="session")
def v6e():
    return get_chip("tpu-v6e")


@pytest.fixture(scope="session")
def rtol():
    return RTOL
