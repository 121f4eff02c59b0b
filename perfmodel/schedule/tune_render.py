"""Text and JSON of `perfmodel tune` results: the ranked candidates, the compiler's re-ranking and the
catalog list. Pure functions of :class:`~perfmodel.schedule.tune.TuneResult` and friends; no jax."""

from __future__ import annotations

from typing import Any, Sequence

from perfmodel.errors import InputError
from perfmodel.jsonable import to_jsonable
from perfmodel.units import binary, nbytes, seconds, table


def tune_record(result: Any, top: int) -> dict[str, Any]:
    """JSON-ready TuneResult with its ``top`` best candidates."""
    out = to_jsonable(result)
    out["ranked"] = out["ranked"][:top]
    return out


def compiled_tune_record(result: Any, reranked: Sequence[Any]) -> dict[str, Any]:
    """JSON-ready re-ranking by the compiler (`tune --compile`)."""
    return {"kernel": result.kernel, "chip": result.chip, "shapes": list(result.shapes),
            "compiled": to_jsonable(list(reranked))}


def render_compiled_tune(result: Any, reranked: Sequence[Any]) -> str:
    """The candidates the compiler accepted, ranked by compiler-backed time, then those it rejected."""
    rows, rejected = [], []
    for c in reranked:
        if c.compiled_s is None:
            rejected.append(f"  {c.candidate.label}: {c.error}")
            continue
        rows.append([str(len(rows) + 1), c.candidate.label, seconds(c.compiled_s), seconds(c.candidate.expected_s),
                     binary(c.vmem_allocated_bytes) if c.vmem_allocated_bytes else "-",
                     binary(c.candidate.vmem_bytes), f"{c.candidate.steps:,}"])
    lines = [f"tune {result.kernel} on {result.chip} --compile: {' '.join(result.shapes)}", ""]
    if rows:
        lines.append(table(["#", "blocks", "compiler-backed", "analytic", "VMEM (Mosaic)", "VMEM (estimate)", "steps"],
                           rows, align="llrrrrr"))
    else:
        lines.append("the compiler rejected every candidate compiled")
    lines.append("")
    lines.append(f"{len(reranked)} compiled, {len(rows)} accepted, {len(rejected)} rejected by the compiler"
                 + (":" if rejected else ""))
    lines += rejected
    return "\n".join(lines)


def catalog_table(entries: Sequence[Any]) -> str:
    """One line per catalog kernel (name, tuned block fields, what it is), then its example --shape flags."""
    rows = [[e.name, ", ".join(ax.field for ax in e.block_axes) or "-", e.summary] for e in entries]
    lines = [table(["kernel", "tuned blocks", "what"], rows, align="lll"), "", "example shapes:"]
    lines += [f"  {e.name}: " + " ".join(f"--shape {t}" for t in e.example) for e in entries]
    return "\n".join(lines)


def render_tune(result: Any, top: int) -> str:
    """The ``top`` best candidates with traffic, VMEM and the reason, the baseline and the rejections."""
    if not result.ranked:
        reasons = "; ".join(f"{k} ({v}x)" for k, v in result.rejected.items()) or "no candidates"
        raise InputError(f"tune {result.kernel}: no legal block sizes on {result.chip}: {reasons}")
    best = result.ranked[0]
    base = result.baseline
    rows = []
    for i, c in enumerate(result.ranked[:top], start=1):
        vs = f"{c.expected_s / base.expected_s:.3f}x" if base else "-"
        rows.append([str(i), c.label, seconds(c.expected_s), vs, nbytes(c.hbm_bytes), f"{c.reread_factor:.2f}x",
                     binary(c.vmem_bytes), f"{c.steps:,}", c.reason])
    head = ["#", "blocks", "expected", f"vs {result.baseline_label}", "HBM moved", "re-read", "VMEM", "steps", "reason"]
    lines = [f"tune {result.kernel} on {result.chip}: {' '.join(result.shapes)}", "",
             table(head, rows, align="llrrrrrrl"), ""]
    if base:
        which = f"{result.baseline_label} ({base.label})" if base.label else result.baseline_label
        verdict = (f"best is {base.expected_s / best.expected_s:.3f}x faster" if best.expected_s < base.expected_s
                   else "no candidate is predicted faster")
        lines.append(f"{which}: {seconds(base.expected_s)}; {verdict}")
    else:
        lines.append(f"{result.baseline_label}: not applicable to these shapes, so no comparison")
    lines.append(f"{result.evaluated} candidates evaluated, {len(result.ranked)} legal, "
                 f"{sum(result.rejected.values())} rejected, {result.pruned} pruned by the steps x overhead bound")
    for example, count in result.rejected.items():  # one real message per group of like reasons
        lines.append(f"  rejected {count}x, e.g.: {example}" if count > 1 else f"  rejected 1x: {example}")
    return "\n".join(lines)
