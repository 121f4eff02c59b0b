"""Shared test set-up. JAX (where a test imports it) runs on the CPU.

Chip fixtures shared by every test directory live here; each directory's
conftest keeps only its own tolerance table (``rtol``).
"""

import os
import sys

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tables fit the terminal (at most 120 columns): the tests read them at 120 whatever runs them (a terminal, a
# pipe, or a pytest-xdist worker, which is given COLUMNS=80).
os.environ["COLUMNS"] = "120"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# The interpret-mode kernel tests spend most of their time in XLA:CPU compiling the interpreted kernels, which
# compile about a third faster without LLVM optimization (a kernel and its reference run under the same compiler).
# For this process only: XLA reads XLA_FLAGS once, at the first compile, and child processes (the libtpu compile
# worker, CLI subprocesses) get the caller's flags back once collection is done (pytest_collection_finish).
_CHILD_XLA_FLAGS = os.environ["XLA_FLAGS"]
if "xla_backend_optimization_level" not in _CHILD_XLA_FLAGS:
    os.environ["XLA_FLAGS"] = f"{_CHILD_XLA_FLAGS} --xla_backend_optimization_level=0"
# XLA:CPU programs (the interpret-mode kernels and their references) are kept between runs in JAX's persistent
# compilation cache, under the same cache folder (its key is the program, the compile options and flags, and the
# jaxlib version, so it never serves a stale program). Every program is kept, however quick its compile: the
# interpret-mode runs compile many small ones (tests/kernels/test_paged_attention.py: 50 -> 34 s warm; with a
# 0.2 s floor nothing was kept). No size cap: JAX's cap locks and scans the folder on every write, which
# stalled two workers for minutes; `perfmodel cache clear` empties it.
from perfmodel.cachedir import cache_dir  # noqa: E402 - stdlib only

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir("jax-cpu")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Compile reports are cached on disk, in the user cache ($PERFMODEL_CACHE_DIR, default ~/.cache/perfmodel) that
# the tool uses too: an entry is served only while every file its compile read is unchanged
# (perfmodel/compiler/cache.py), so a second run compiles only what changed. A cold run:
# PERFMODEL_CACHE_DIR=$(mktemp -d) make test.


def pytest_collection_finish(session):
    if "jax" in sys.modules:  # a collected test uses jax: compile once now, so that XLA has read the flags above
        import jax

        jax.jit(lambda x: x + 1)(0)
    os.environ["XLA_FLAGS"] = _CHILD_XLA_FLAGS


def _chip_fixture(name: str):
    """A session fixture returning the built-in chip spec ``name``."""

    def chip():
        from perfmodel.hw import get_chip

        return get_chip(name)

    return pytest.fixture(scope="session")(chip)


v5e = _chip_fixture("tpu-v5e")
v5p = _chip_fixture("tpu-v5p")
v6e = _chip_fixture("tpu-v6e")
tpu7x = _chip_fixture("tpu-7x")
tpu_v2 = _chip_fixture("tpu-v2")


#: Test files whose tests share work that runs once per process: a module-scoped fixture (a whole `validate` run,
#: a measured results file, a written report) or a per-chip batch of compiles (functools.cache). Under
#: pytest-xdist (`make test`: --dist loadgroup) each of them runs on one worker; every other test goes wherever a
#: worker is free.
SHARE_A_WORKER = (
    "tests/compiler/test_compile_matrix.py",
    "tests/compiler/test_kernel_variants_compile.py",
    "tests/compiler/test_compiled_validation.py",
    "tests/cli/test_validate_cli.py",
    "tests/cli/test_measure_cli.py",
    "tests/test_html_report_browser.py",
    "tests/test_fuzz_inputs.py",
    "tests/kernels/test_matmul.py",
    "tests/schedule/test_sched_artifacts.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path in SHARE_A_WORKER:
            item.add_marker(pytest.mark.xdist_group(path))


@pytest.fixture
def efficiency_table(monkeypatch):
    """``use(table)`` replaces efficiency.yaml's parsed table for one test (the per-chip cache cleared around it)."""
    from perfmodel.model import efficiency

    def use(table):
        monkeypatch.setattr(efficiency, "_table", lambda: table)
        efficiency.chip_efficiency.cache_clear()

    yield use
    efficiency.chip_efficiency.cache_clear()
