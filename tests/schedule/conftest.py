"""Chips and tolerances shared by the schedule-model tests."""

from __future__ import annotations

import pytest

from perfmodel.hw.registry import get_chip

#: Relative tolerances keyed by what is compared: closed-form counts are exact
#: integers; times carry float rounding only; published measurements use the
#: issue's 15% calibration band.
RTOL = {"count": 0.0, "time": 1e-9, "published": 0.15}

#: Interpret-mode numerics are not under test here, only traffic; inputs are
#: random so no kernel can short-circuit on zeros.


@pytest.fixture(scope="session")
def v5e():
    return get_chip("tpu-v5e")


@pytest.fixture(scope="session")
def v5p():
    return get_chip("tpu-v5p")


@pytest.fixture(scope="session")
def v6e():
    return get_chip("tpu-v6e")


@pytest.fixture(scope="session")
def rtol():
    return RTOL
