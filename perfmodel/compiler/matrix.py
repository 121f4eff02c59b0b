"""The compile matrix: every bundled kernel at production shapes and its tuned defaults, on every TPU
generation the installed libtpu compiles for (the README's table; tests/compiler/test_compile_matrix.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perfmodel.compiler.api import CompileCall
from perfmodel.compiler.toolchain import TOPOLOGIES


@dataclass(frozen=True, kw_only=True)
class MatrixCase:
    name: str
    call: CompileCall


def _case(name: str, kernel: str, *shapes: str, **extra: Any) -> MatrixCase:
    return MatrixCase(name=name, call=CompileCall(kind="catalog", target=kernel, shapes=shapes, extra=extra or None))


#: Production shapes: Llama-3-8B layers (hidden 4096, 32 q / 8 kv heads of 128, MLP 14336), 8k prefill,
#: decode of 64 sequences at 2k context over 16-token pages, a 128k vocabulary.
CASES: tuple[MatrixCase, ...] = (
    _case("matmul 8192x4096 @ 4096x14336 bf16", "matmul", "x=8192x4096:bf16", "w=4096x14336:bf16"),
    _case("rms_norm 8192x4096 bf16", "rms_norm", "x=8192x4096:bf16", "residual=8192x4096:bf16", "weight=4096:f32"),
    _case("flash_attention causal prefill 8k, GQA 4", "flash_attention", "q=1x32x8192x128:bf16",
          "k=1x8x8192x128:bf16", "v=1x8x8192x128:bf16"),
    _case("paged_attention decode 64 seqs x 2k", "paged_attention", "q=64x32x128:bf16",
          "k_pages=8x8192x16x128:bf16", "v_pages=8x8192x16x128:bf16", "page_table=64x128:int32=arange",
          "lengths=64:int32=2048"),
    _case("ragged_paged_attention 64 seqs x 16 tokens, 2k context", "ragged_paged_attention", "q=1024x32x128:bf16",
          "k_pages=8x8192x16x128:bf16", "v_pages=8x8192x16x128:bf16", "kv_lens=64:int32=2048",
          "page_table=64x128:int32=arange", "cu_q_lens=65:int32=arange*16", "num_seqs=1:int32=64"),
    _case("kv_cache_update 64 tokens", "kv_cache_update", "new_k=64x8x128:bf16", "new_v=64x8x128:bf16",
          "k_cache=8x8192x16x128:bf16", "v_cache=8x8192x16x128:bf16", "slot_mapping=64:int32=arange"),
    _case("sampling 64 x 128256 f32", "sampling", "logits=64x128256:f32"),
)


def chips() -> tuple[str, ...]:
    """TPU generations the compiler targets."""
    return tuple(TOPOLOGIES)


def run_matrix(cases: Sequence[MatrixCase] = CASES, chip_names: Sequence[str] | None = None, *,
               jobs: int | None = None, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Compile every case on every chip; one row per (case, chip) with pass/fail, Mosaic's VMEM and perfmodel's."""
    from perfmodel.compiler.api import compile_many
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.analyze import analyze
    from perfmodel.schedule.catalog import get_entry

    rows = []
    for chip_name in chip_names or chips():
        chip = get_chip(chip_name)
        reports = compile_many([c.call for c in cases], chip, jobs=jobs, progress=progress)
        for case, rep in zip(cases, reports):
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


def render_matrix(rows: Sequence[dict[str, Any]]) -> str:
    from perfmodel.units import binary, table

    cases = list(dict.fromkeys(r["case"] for r in rows))
    chip_names = list(dict.fromkeys(r["chip"] for r in rows))
    by = {(r["case"], r["chip"]): r for r in rows}
    body = []
    for case in cases:
        cells = [case]
        for ch in chip_names:
            r = by.get((case, ch))
            if r is None:
                cells.append("-")
            elif not r["compiled"]:
                cells.append("FAIL")
            else:
                est, alloc = r.get("vmem_estimate_bytes"), r.get("vmem_allocated_bytes")
                cells.append(f"ok {binary(est) if est else '?'} / {binary(alloc) if alloc else '?'}")
        body.append(cells)
    return table(["kernel (VMEM estimated / allocated by Mosaic)", *chip_names], body, align="l" + "l" * len(chip_names))
