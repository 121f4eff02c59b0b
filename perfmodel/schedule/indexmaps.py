"""Evaluate a pallas_call's index maps at every grid step, vectorized.

The numpy interpreter (:mod:`perfmodel.schedule.interp`) handles the integer
arithmetic, ``select_n``, scalar-prefetch reads and control flow index maps
are made of. An index map it cannot evaluate falls back to ``jax.vmap`` of the
same jaxpr, run on the CPU. An index map that reads a scalar-prefetch operand
whose value is unknown (the function was traced with ShapeDtypeStructs) is a
user error: pass concrete values.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from perfmodel.errors import InputError
from perfmodel.schedule.extract import BlockMapping, PallasCall
from perfmodel.schedule.interp import UNKNOWN, evaluate_index_map


def grid_points(grid: Sequence[int]) -> np.ndarray:
    """All grid coordinates in Pallas' iteration order (last dimension fastest): ``(n, ndim)`` int32."""
    grid = tuple(int(g) for g in grid)
    n = int(np.prod(grid)) if grid else 1
    if not grid:
        return np.zeros((1, 0), dtype=np.int32)
    out = np.empty((n, len(grid)), dtype=np.int32)
    if n == 0:
        return out
    inner = n
    for d, g in enumerate(grid):
        inner //= g
        out[:, d] = np.broadcast_to(np.arange(g, dtype=np.int32)[None, :, None], (n // (inner * g), g, inner)).reshape(-1)
    return out


def block_indices(call: PallasCall, block: BlockMapping, points: np.ndarray) -> list[np.ndarray]:
    """Block indices the index map of ``block`` returns at each of ``points``: one ``(n,)`` column per
    array dimension (a literal index stays a zero-stride broadcast)."""
    ids = [points[:, d] for d in range(points.shape[1])]
    prefetch = list(call.prefetch_values)
    outs = evaluate_index_map(block.index_map, call.grid, ids, prefetch)
    if any(o is UNKNOWN for o in outs):
        missing = _reads_unknown_prefetch(block, call)
        if missing:
            raise InputError(
                f"index map of operand '{block.name}' of {call.name} reads scalar-prefetch operand(s) "
                f"{', '.join(str(m) for m in missing)} whose values are unknown; pass concrete arrays for them "
                "(CLI: --shape NAME=DIMS:int32=arange or =VALUE)"
            )
        outs = _evaluate_with_jax(block, call, points)
    n = points.shape[0]
    return [np.broadcast_to(np.asarray(o).reshape(-1), (n,)) for o in outs]


def _reads_unknown_prefetch(block: BlockMapping, call: PallasCall) -> list[int]:
    jaxpr = block.index_map.jaxpr
    ngrid = len(call.grid)
    used = _used_invars(jaxpr)
    return [i for i, v in enumerate(jaxpr.invars[ngrid:]) if v in used and call.prefetch_values[i] is None]


def _used_invars(jaxpr: Any) -> set:
    from jax.extend.core import Var

    used = set()
    for eqn in jaxpr.eqns:
        used.update(v for v in eqn.invars if isinstance(v, Var))
    used.update(v for v in jaxpr.outvars if isinstance(v, Var))
    return used


def _evaluate_with_jax(block: BlockMapping, call: PallasCall, points: np.ndarray) -> list[np.ndarray]:
    """Fallback: vmap the (state-discharged) index map over the grid points on the CPU."""
    import jax
    import jax.numpy as jnp
    from jax._src.state.discharge import discharge_state
    from jax.extend.core import jaxpr_as_fun

    closed = block.index_map
    try:
        discharged = discharge_state(closed)  # jax >= 0.10: ClosedJaxpr in and out
    except TypeError:  # older jax: (jaxpr, consts)
        jaxpr, consts = discharge_state(closed.jaxpr, closed.consts)
        discharged = jax.extend.core.ClosedJaxpr(jaxpr, consts)
    fn = jaxpr_as_fun(discharged)
    ngrid = len(call.grid)
    nouts = len(closed.jaxpr.outvars)

    def one(ids: Any, *prefetch: Any) -> Any:
        return tuple(fn(*[ids[d] for d in range(ngrid)], *prefetch)[:nouts])

    prefetch = [jnp.asarray(v) for v in call.prefetch_values]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        outs = jax.jit(jax.vmap(one, in_axes=(0,) + (None,) * len(prefetch)))(jnp.asarray(points), *prefetch)
    return [np.asarray(o) for o in outs]
