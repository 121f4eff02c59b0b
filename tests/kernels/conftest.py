"""Fixtures of the kernel tests."""

import pytest

from perfmodel.hw.registry import get_chip
from perfmodel.schedule.device_kind import as_device


@pytest.fixture
def traced_on_v5e():
    """Trace the test's kernel calls as on a TPU v5e: a wrapper called without ``chip`` (and not in interpret
    mode) resolves it from the device kind (kernels.perf.resolve_chip), as it would on that TPU."""
    with as_device(get_chip("tpu-v5e")):
        yield
