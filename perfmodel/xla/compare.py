"""The compiler's view of a model step beside the analytic one (`perfmodel predict model --compile`).

:func:`compare_step` compiles the reference step (:mod:`perfmodel.xla.reference`)
for the chip's slice, reads it op by op (:mod:`perfmodel.xla.program`) and
pairs each compiled op with the analytic op
(:func:`perfmodel.model.transformer.predict_step`) whose name its JAX name
stack carries (``.../qkv_proj/dot_general``). Collectives map by the block
their name stack is in (attention -> ``all_reduce(attn)``, MLP/MoE ->
``all_reduce(mlp)``, head -> ``all_gather(logits)``); ops without a known
scope (layout copies and prefetch DMAs around the layer loop) are rows of
their own. A row whose times differ by more than :data:`FLAG_SHARE` is
flagged with the reasons the two views show: ops fused across analytic ops,
HBM bytes or collective sizes that differ, an op the compiler made
compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from perfmodel.xla.program import Program, ProgramOp, scope_of

#: Relative difference of times that flags a row.
FLAG_SHARE = 0.15
COLLECTIVE_ROWS = {"attention": "all_reduce(attn)", "mlp": "all_reduce(mlp)", "moe": "all_reduce(mlp)",
                   "head": "all_gather(logits)", "embed": "all_reduce(embed)"}


@dataclass(frozen=True, kw_only=True)
class CompareRow:
    name: str
    #: Analytic op's count x expected time; None for compiled-only rows.
    analytic_s: float | None
    compiled_s: float
    analytic_hbm_bytes: float | None
    compiled_hbm_bytes: float
    analytic_bound: str | None
    compiled_bound: str | None
    #: Compiled ops folded into this row (HLO names).
    hlo_ops: tuple[str, ...]
    flagged: bool
    reasons: tuple[str, ...]

    @property
    def ratio(self) -> float | None:
        return self.compiled_s / self.analytic_s if self.analytic_s else None


@dataclass(frozen=True, kw_only=True)
class StepComparison:
    prediction: Any  # StepPrediction
    program: Program
    rows: tuple[CompareRow, ...]
    kv_layout: str
    kernels: str

    @property
    def analytic_s(self) -> float:
        return self.prediction.expected_s

    @property
    def compiled_s(self) -> float:
        return self.program.step_s

    @property
    def analytic_hbm_need_bytes(self) -> float:
        m = self.prediction.memory
        return m.weight_bytes + m.kv_bytes


def _mapped_name(op: ProgramOp, known: Mapping[str, Any]) -> str:
    scope = scope_of(op.op_name, known)
    if op.kind == "collective":
        block = known[scope].block if scope else None
        row = COLLECTIVE_ROWS.get(block or "", "collectives (other)")
        return row
    if scope:
        return scope
    return {"copy": "(layout copies)", "dma": "(prefetch DMAs)"}.get(op.kind, "(other ops)")


def compare(prediction: Any, program: Program, *, kv_layout: str = "paged", kernels: str = "jnp") -> StepComparison:
    """Pair the analytic prediction with the compiled program row by row (see the module docstring)."""
    from perfmodel.units import nbytes

    known = {op.name: op for op in prediction.ops}
    groups: dict[str, list[ProgramOp]] = {}
    for op in program.ops:
        groups.setdefault(_mapped_name(op, known), []).append(op)
    rows = []
    for a in prediction.ops:
        ops = groups.pop(a.name, [])
        rows.append(_row(a.name, a, ops, known, nbytes))
    for name, ops in groups.items():
        rows.append(_row(name, None, ops, known, nbytes))
    return StepComparison(prediction=prediction, program=program, rows=tuple(rows), kv_layout=kv_layout,
                          kernels=kernels)


def _row(name: str, a: Any, ops: list[ProgramOp], known: Mapping[str, Any], nbytes: Callable) -> CompareRow:
    compiled = sum(o.total_s for o in ops)
    hbm = sum(o.total_hbm_bytes for o in ops)
    bound = None
    if ops:
        by: dict[str, float] = {}
        for o in ops:
            by[o.bound] = by.get(o.bound, 0.0) + o.total_s
        bound = max(by, key=by.get)
    reasons: list[str] = []
    analytic = a.expected_s if a is not None else None
    flagged = analytic is None and compiled > 0 or (
        analytic is not None and (abs(compiled - analytic) > FLAG_SHARE * max(analytic, 1e-30)))
    if flagged:
        if a is None:
            reasons.append("no analytic op: " + ("layout copies of arrays around the layer loop"
                                                 if name == "(layout copies)" else
                                                 "weights/arrays the compiler prefetches into VMEM"
                                                 if name == "(prefetch DMAs)" else "ops outside the analytic list"))
        elif not ops:
            reasons.append("no compiled op of its own (fused into a neighbour, or folded away)")
        else:
            others = sorted({s for o in ops for n in o.fused_op_names
                             for s in [scope_of(n, known)] if s and s != name})
            if others:
                reasons.append("fused with " + ", ".join(others))
            if a.block == "tp" or name.startswith("all_"):
                size = sum(o.total_hbm_bytes for o in ops)
                reasons.append(f"collective: {len(ops)} compiled op(s) moving {nbytes(sum(o.ici_bytes * o.count for o in ops))} "
                               f"over ICI vs analytic {nbytes(a.ici_bytes)}" + ("" if size else ""))
            elif a.hbm_bytes and abs(hbm - a.hbm_bytes) > FLAG_SHARE * a.hbm_bytes:
                reasons.append(f"HBM bytes compiled {nbytes(hbm)} vs analytic {nbytes(a.hbm_bytes)}")
            if bound == "compute" and a.bound.startswith("HBM"):
                b = sum((o.bundles or 0) * o.count for o in ops)
                reasons.append(f"the compiled ops are bundle-bound ({b:,.0f} bundles) where the analytic op is HBM-bound")
    return CompareRow(name=name, analytic_s=analytic, compiled_s=compiled,
                      analytic_hbm_bytes=a.hbm_bytes if a is not None else None, compiled_hbm_bytes=hbm,
                      analytic_bound=a.bound if a is not None else None, compiled_bound=bound,
                      hlo_ops=tuple(o.hlo_name for o in ops), flagged=bool(flagged), reasons=tuple(reasons))


def step_params(step: Any) -> dict[str, Any]:
    """make_step's keyword arguments that rebuild ``step``, in one canonical form (defaults resolved, dtype names
    canonical), so that the same step gives the same compile-cache key however it was asked for."""
    out: dict[str, Any] = dict(phase=step.phase, batch=step.batch, context=step.context_tokens,
                               weight_dtype=step.weight_dtype, act_dtype=step.act_dtype, kv_dtype=step.kv_dtype,
                               tp=step.tp, page_size=step.page_size)
    if step.phase == "prefill":
        out["prefill_len"] = step.chunk_tokens
    return out


def compile_step_call(cfg_name: str, step: Any, *, topology: str | None, kv_layout: str, kernels: str) -> Any:
    """The CompileCall of the reference step (preset name or config path, a make_step Step)."""
    from perfmodel.compiler.api import CompileCall

    return CompileCall(kind="model", target=str(cfg_name), shapes=(),
                       extra={**step_params(step), "kv_layout": kv_layout, "kernels": kernels}, topology=topology)


def default_topology(chip: Any, tp: int) -> str | None:
    """The chip's default topology when it has enough chips for ``tp``; else the smallest 2-D / 3-D slice that
    does (v5e:2x4 for 8 chips), None when the default fits."""
    from perfmodel.compiler.toolchain import topology_chips, topology_for

    base = topology_for(chip)
    if topology_chips(base) >= tp:
        return None
    family, dims = base.split(":")
    n = len(dims.split("x"))
    shape = [int(x) for x in dims.split("x")]
    i = 0
    while shape[0] * shape[1] * (shape[2] if n == 3 else 1) < tp:
        shape[i % (n if n == 2 else 2)] *= 2
        i += 1
    return f"{family}:{'x'.join(str(x) for x in shape)}"


def compare_step(model: Any, *, chip: Any, topology: str | None = None, kv_layout: str = "paged",
                 kernels: str = "jnp", hbm_utilization: float = 0.9,
                 progress: Callable[[str], None] | None = None, **params: Any) -> StepComparison:
    """Compile the reference step of ``model`` (preset name or config path) and compare it with the analytic
    prediction of the same step (``params``: make_step's keyword arguments)."""
    from perfmodel.compiler.api import compile_report
    from perfmodel.model import configs
    from perfmodel.model.step import make_step
    from perfmodel.model.transformer import predict_step
    from perfmodel.xla.program import build_program

    cfg = configs.get_model(model)
    step = make_step(**params)
    pred = predict_step(cfg, step, chip, hbm_utilization=hbm_utilization)
    topo = topology or default_topology(chip, step.tp)
    report = compile_report(compile_step_call(model, step, topology=topo, kv_layout=kv_layout, kernels=kernels),
                            chip, progress=progress)
    program = build_program(report, chip)
    return compare(pred, program, kv_layout=kv_layout, kernels=kernels)


def compare_sweep(model: Any, *, chips: Sequence[Any], points: Sequence[Mapping[str, Any]], base: Mapping[str, Any],
                  **kw: Any) -> list[tuple[dict[str, Any], StepComparison]]:
    """compare_step at every chip x sweep point (the point's values override ``base``)."""
    out = []
    for chip in chips:
        for point in points:
            params = {**base, **point}
            if "phase" in point and params.get("phase") == "decode":
                params["prefill_len"] = None
            out.append((dict(point), compare_step(model, chip=chip, **kw, **params)))
    return out
