"""Compiler artifacts of a kernel, and three cost counts side by side.

* :func:`lower_for_tpu` exports a function for TPU with ``jax.export``
  (Mosaic lowering runs on the CPU; no TPU needed) and returns the StableHLO
  module and, decoded from each ``tpu_custom_call``'s backend config, the
  Mosaic MLIR of every kernel.
* :func:`xla_cost` compiles a function (the kernel's pure-jnp reference) for
  the CPU and returns XLA's cost analysis (FLOPs, transcendentals, bytes).
* :func:`compare_costs` puts XLA's counts next to perfmodel's op model (the
  kernel's ``pl.CostEstimate``, which the bundled kernels take from
  perfmodel.model) and the schedule model (useful work and ideal / moved
  bytes), flagging any count more than :data:`DISAGREEMENT` away from XLA's.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: Relative difference from XLA's count above which a row is flagged.
DISAGREEMENT = 0.05

#: The base64 Mosaic body inside a backend_config, as it appears in StableHLO text.
_BODY_RE = re.compile(r'(\\22body\\22: \\22)([A-Za-z0-9+/=]{64,})(\\22)')


@dataclass(frozen=True, kw_only=True)
class MosaicKernel:
    """One Mosaic kernel found in the lowered module."""

    name: str
    mlir: str
    body_bytes: int


@dataclass(frozen=True, kw_only=True)
class Lowered:
    stablehlo: str
    kernels: tuple[MosaicKernel, ...]

    def stablehlo_elided(self) -> str:
        """The StableHLO text with each base64 Mosaic body replaced by a placeholder."""
        return _BODY_RE.sub(lambda m: f"{m.group(1)}<Mosaic body: {len(m.group(2))} base64 chars, printed separately>"
                            f"{m.group(3)}", self.stablehlo)


def lower_for_tpu(fn: Callable, *args: Any) -> Lowered:
    """Export ``jax.jit(fn)`` for TPU and decode its Mosaic kernels."""
    import jax

    from perfmodel.errors import InputError

    try:
        exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
    except (TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"lowering {getattr(fn, '__name__', 'the kernel')} for TPU failed: {first}") from exc
    text = exported.mlir_module()
    return Lowered(stablehlo=text, kernels=tuple(_mosaic_kernels(text)))


def _mosaic_kernels(stablehlo: str) -> list[MosaicKernel]:
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = mlir.make_ir_context()
    tpu.register_dialect(ctx)
    configs: list[str] = []
    out = []
    with ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(stablehlo)

        def visit(op: Any) -> Any:
            if op.name == "stablehlo.custom_call":
                target = ir.StringAttr(op.attributes["call_target_name"]).value
                if target == "tpu_custom_call":
                    configs.append(ir.StringAttr(op.attributes["backend_config"]).value)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for cfg in configs:
            body = base64.b64decode(json.loads(cfg)["custom_call_config"]["body"])
            kernel = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(kernel.operation)
            text = str(kernel)
            match = re.search(r"func\.func @([\w$.-]+)", text)
            out.append(MosaicKernel(name=match.group(1) if match else "kernel", mlir=text, body_bytes=len(body)))
    return out


@dataclass(frozen=True, kw_only=True)
class CostCount:
    """FLOPs / transcendentals / bytes from one source (None: the source does not say)."""

    source: str
    flops: float | None
    transcendentals: float | None
    hbm_bytes: float | None
    note: str = ""


def xla_cost(fn: Callable, *args: Any) -> tuple[CostCount, CostCount]:
    """XLA's cost analysis of ``jax.jit(fn)``: compiled for the CPU, and of the HLO before optimization."""
    import jax

    from perfmodel.errors import InputError

    cpu = jax.devices("cpu")[0]
    try:
        with jax.default_device(cpu):
            lowered = jax.jit(fn).lower(*args)
            compiled = lowered.compile()
    except (TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"compiling the reference {getattr(fn, '__name__', '')} for CPU failed: {first}") from exc
    return (
        _count(compiled.cost_analysis(), "XLA cost analysis, jnp reference compiled for CPU"),
        _count(lowered.cost_analysis(), "XLA cost analysis, jnp reference before optimization"),
    )


def _count(ca: Any, source: str) -> CostCount:
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = dict(ca or {})
    # XLA leaves out zero counts; an analysis that has FLOPs but no transcendentals had none.
    return CostCount(source=source, flops=_get(ca, "flops"),
                     transcendentals=_get(ca, "transcendentals") if ca else None,
                     hbm_bytes=_get(ca, "bytes accessed"))


def _get(d: dict, key: str) -> float | None:
    v = d.get(key, 0.0 if d else None)
    return None if v is None else float(v)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    rows: tuple[CostCount, ...]
    #: (row source, field, relative difference from XLA) for every count more than DISAGREEMENT away.
    disagreements: tuple[tuple[str, str, float], ...]


def compare_costs(xla: CostCount, others: Sequence[CostCount], context: Sequence[CostCount] = ()) -> Comparison:
    """Flag counts of ``others`` more than DISAGREEMENT from ``xla``'s; ``context`` rows are shown, not flagged."""
    flagged = []
    for row in others:
        for f in ("flops", "transcendentals", "hbm_bytes"):
            ours, ref = getattr(row, f), getattr(xla, f)
            if ours is None or ref is None:
                continue
            if ref == 0 and ours == 0:
                continue
            rel = (ours - ref) / ref if ref else float("inf")
            if abs(rel) > DISAGREEMENT:
                flagged.append((row.source, f, rel))
    return Comparison(rows=(xla, *context, *others), disagreements=tuple(flagged))
