"""Checking a kernel's TPU lowering without a TPU: export for the "tpu" platform
(runs the Pallas -> Mosaic lowering on the host) and read back what the module
carries (the Mosaic custom call, its pl.CostEstimate, named scopes)."""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.extend  # jax.extend.core is not loaded by `import jax` alone

#: Name of the custom call a Mosaic kernel lowers to.
MOSAIC_CUSTOM_CALL = "tpu_custom_call"

_COST_RE = re.compile(r"cost_estimate\\22: \{(.*?)\}")
_FIELD_RE = re.compile(r"\\22(\w+)\\22:(-?\d+)")


def export_for_tpu(fn: Callable[..., Any], *args: jax.ShapeDtypeStruct) -> str:
    """Text of the StableHLO module of ``jax.jit(fn)`` exported for TPU at the given shapes."""
    return jax.export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()


def cost_estimates(module_text: str) -> list[dict[str, int]]:
    """The pl.CostEstimate fields (flops, transcendentals, bytes_accessed, ...) of each Mosaic call in the module."""
    return [dict((k, int(v)) for k, v in _FIELD_RE.findall(body)) for body in _COST_RE.findall(module_text)]


def traced_cost_estimate(fn: Callable[..., Any], *args: Any) -> Any:
    """The pl.CostEstimate that ``fn`` hands to its one pallas_call, read from the traced jaxpr."""
    found = []

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                found.append(eqn.params["cost_estimate"])
            for param in eqn.params.values():
                if isinstance(param, jax.extend.core.ClosedJaxpr):
                    walk(param.jaxpr)
                elif isinstance(param, jax.extend.core.Jaxpr):
                    walk(param)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    if len(found) != 1:
        raise ValueError(f"expected one pallas_call in the traced function, found {len(found)}")
    return found[0]


_BODY_RE = re.compile(r"body\\22: \\22([A-Za-z0-9+/=]+)")


def mosaic_bodies(module_text: str) -> list[str]:
    """The Mosaic kernels a module carries, as MLIR text without source locations: what two traces of one call
    compare equal on when only the Python lines they were traced from differ."""
    import base64

    from jax._src.interpreters import mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir

    bodies = []
    for payload in _BODY_RE.findall(module_text):
        ctx = mlir.make_ir_context()
        tpu.register_dialect(ctx)
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(base64.b64decode(payload))
            bodies.append(module.operation.get_asm(enable_debug_info=False))
    return bodies
