"""The compile matrix: every bundled kernel at production shapes and its tuned defaults, on every TPU
generation the installed libtpu compiles for, with the schedule model's VMEM estimate beside Mosaic's allocation
(the table in perfmodel/compiler/README.md; tests/compiler/test_compile_matrix.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perfmodel.compiler.api import CompileCall
from perfmodel.compiler.toolchain import compile_targets


@dataclass(frozen=True, kw_only=True)
class MatrixCase:
    name: str
    call: CompileCall


def cases() -> tuple[MatrixCase, ...]:
    """One case per bundled kernel with a production call (its ``kernels/<name>/entry.py`` says which: e.g.
    Llama-3-8B layers, an 8k prefill, decode of 64 sequences at 2k context over 16-token pages, a 128k
    vocabulary), compiled at the kernel's tuned defaults."""
    from perfmodel.schedule.catalog import bundled

    return tuple(MatrixCase(name=e.production.label, call=CompileCall(kind="catalog", target=e.name,
                                                                      shapes=e.production.shapes))
                 for e in bundled() if e.production is not None)


def __getattr__(name: str) -> Any:
    # CASES reads the kernel folders on first use, not at import.
    if name == "CASES":
        return cases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def chips() -> tuple[str, ...]:
    """TPU generations the compiler targets: the registry's chips whose spec has a
    ``compiler.deviceless_topology``, oldest first."""
    return tuple(compile_targets())


def run_matrix(matrix: Sequence[MatrixCase] | None = None, chip_names: Sequence[str] | None = None, *,
               jobs: int | None = None, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Compile every case on every chip; one row per (case, chip) with pass/fail, Mosaic's VMEM and perfmodel's."""
    from perfmodel.compiler.api import compile_many
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.catalog import get_entry

    matrix = cases() if matrix is None else matrix
    rows = []
    for chip_name in chip_names or chips():
        chip = get_chip(chip_name)
        reports = compile_many([c.call for c in matrix], chip, jobs=jobs, progress=progress)
        for case, rep in zip(matrix, reports):
            row: dict[str, Any] = {"case": case.name, "kernel": case.call.target, "chip": chip.name}
            if isinstance(rep, Exception):
                row.update(compiled=False, error=str(rep))
                rows.append(row)
                continue
            row.update(compiled=rep.compiled, error=rep.error, compile_s=rep.compile_s)
            entry = get_entry(case.call.target)
            specs = entry.specs(case.call.shapes)
            try:
                a = analyze(entry.make_function(specs, None, chip, extra=case.call.extra), *entry.arguments(specs),
                            chip=chip)
                row["vmem_estimate_bytes"] = max((k.vmem.total_bytes for k in a.kernels), default=0)
            except Exception as exc:  # the matrix reports what it can
                row["vmem_estimate_bytes"] = None
                row["analysis_error"] = str(exc)
            if rep.compiled:
                row["vmem_allocated_bytes"] = max((k.scoped_vmem_bytes or 0 for k in rep.kernels), default=0)
                row["body_bundles"] = sum(k.loop.bundles for k in rep.kernels if k.loop)
            rows.append(row)
    return rows

