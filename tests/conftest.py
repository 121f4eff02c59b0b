"""Shared test set-up. JAX (where a test imports it) runs on the CPU.

Chip fixtures shared by every test directory live here; each directory's
conftest keeps only its own tolerance table (``rtol``).
"""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# Compile reports are cached on disk; the tests use a cache of their own so that every run compiles for real
# (PERFMODEL_TEST_CACHE_DIR reuses one between runs while developing).
if "PERFMODEL_TEST_CACHE_DIR" in os.environ:
    os.environ["PERFMODEL_CACHE_DIR"] = os.environ["PERFMODEL_TEST_CACHE_DIR"]
else:
    import tempfile

    os.environ["PERFMODEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="perfmodel-test-cache-")


@pytest.fixture(scope="session")
def v5e():
    from perfmodel.hw import get_chip

    return get_chip("tpu-v5e")


@pytest.fixture(scope="session")
def v5p():
    from perfmodel.hw import get_chip

    return get_chip("tpu-v5p")


@pytest.fixture(scope="session")
def v6e():
    from perfmodel.hw import get_chip

    return get_chip("tpu-v6e")
