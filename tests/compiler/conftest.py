import pytest

from perfmodel.compiler.toolchain import available


def pytest_collection_modifyitems(config, items):
    """Compile tests need libtpu (`make test` installs it); without it they are skipped, saying so."""
    if available():
        return
    skip = pytest.mark.skip(reason="libtpu not installed: pip install -e '.[tpu-compiler]'")
    for item in items:
        if "needs_libtpu" in item.keywords:
            item.add_marker(skip)
