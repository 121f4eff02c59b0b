"""The bundled kernels stand alone: no kernels/ module imports perfmodel except kernels/perf.py, the one interface.

Every ``kernels/**/*.py`` is parsed with ``ast`` and every import statement in it (module level, inside
functions, under ``TYPE_CHECKING``) is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"

#: The one kernels/ module that imports perfmodel.
INTERFACE = "kernels/perf.py"


def _modules() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in KERNELS.rglob("*.py"))


def _imported_by_call(node: ast.Call) -> list[str]:
    """The module of ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return []
    first = node.args[0]
    return [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []


def perfmodel_imports(source: str) -> list[str]:
    """'line N: <module>' for each import of perfmodel (or a submodule of it) in ``source``, at any level."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call):
            names = _imported_by_call(node)
        else:
            continue
        found += [f"line {node.lineno}: {name}" for name in names if name.split(".")[0] == "perfmodel"]
    return found


def test_the_scan_sees_imports_at_every_level():
    source = ("import perfmodel.hw\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from perfmodel.hw.spec import ChipSpec\n"
              "def f():\n    from perfmodel import units\n    import perfmodelx, os\n"
              "    return importlib.import_module('perfmodel.units')\n")
    assert perfmodel_imports(source) == ["line 1: perfmodel.hw", "line 4: perfmodel.hw.spec", "line 6: perfmodel",
                                         "line 8: perfmodel.units"]


def test_the_interface_exists():
    assert INTERFACE in _modules()


def test_only_the_interface_imports_perfmodel():
    checked = [m for m in _modules() if m != INTERFACE]
    found = {m: hits for m in checked if (hits := perfmodel_imports((ROOT / m).read_text()))}
    assert not found, "import perfmodel only through kernels/perf.py; found: " + "; ".join(
        f"{m} {', '.join(hits)}" for m, hits in found.items())
