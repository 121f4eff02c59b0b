"""Evaluate a pallas_call's index maps at every grid step, vectorized.

The numpy interpreter (:mod:`perfmodel.schedule.interpreter`) handles the integer
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
from perfmodel.schedule.interpreter import evaluate_index_map
from perfmodel.schedule.loops import LoopOptions
from perfmodel.schedule.values import UNKNOWN


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


def block_indices(call: PallasCall, block: BlockMapping, points: np.ndarray, *,
                  loop_options: LoopOptions = LoopOptions()) -> list[np.ndarray]:
    """Block indices the index map of ``block`` returns at each of ``points``: one ``(n,)`` column per
    array dimension (a literal index stays a zero-stride broadcast). ``loop_options``: the interpreter's fast
    paths."""
    ids = [points[:, d] for d in range(points.shape[1])]
    prefetch = list(call.prefetch_values)
    outs = evaluate_index_map(block.index_map, call.grid, ids, prefetch, loop_options=loop_options)
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


def program_id_axes(jaxpr: Any) -> set[int]:
    """Grid axes whose ``program_id`` a kernel body reads, anywhere in it."""
    from jax.extend.core import jaxprs_in_params

    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    axes: set[int] = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "program_id":
            axes.add(int(eqn.params["axis"]))
        for sub in jaxprs_in_params(eqn.params):
            axes |= program_id_axes(sub)
    return axes


def _grid_index_roles(index_map: Any, ndim: int) -> list[Any]:
    """For each grid index of an index map: ("identity", c) when it is output component c and used for nothing
    else, "unused" when the map ignores it, "used" otherwise."""
    from jax.extend.core import Var

    jaxpr = index_map.jaxpr
    used = {v for eqn in jaxpr.eqns for v in eqn.invars if isinstance(v, Var)}
    roles: list[Any] = []
    for d in range(ndim):
        v = jaxpr.invars[d]
        at = [c for c, o in enumerate(jaxpr.outvars) if o is v]
        if v in used or len(at) > 1:
            roles.append("used")
        elif at:
            roles.append(("identity", at[0]))
        else:
            roles.append("unused")
    return roles


def _full_windows(block: BlockMapping, roles: Sequence[Any], grid: Sequence[int]) -> bool:
    """Whether every window along the components that follow grid indices lies inside the array."""
    for d, role in enumerate(roles):
        c = role[1]
        kind, size, dim, g = block.block_kinds[c], int(block.block_shape[c]), int(block.array_shape[c]), int(grid[d])
        if kind == "blocked":
            if g * size > dim:
                return False
        elif kind in ("squeezed", "element"):
            if g - 1 + size > dim:
                return False
        else:
            return False
    return True


def periodic_leading_dims(call: PallasCall) -> tuple[int, list[bool | None]]:
    """The most leading grid dimensions over which the traversal is periodic (see
    :class:`perfmodel.schedule.pipeline.Traversal`), and per block whether its windows follow them (True:
    each of those grid indices is one of its block-index components, every window inside the array) or
    ignore them (False); None for blocks left in HBM. (0, []) when not even the first dimension is.

    The body must not read their program ids, and each pipelined block's index map must use each of them
    only as an output component (identity) or not at all, the same for all of them.
    """
    ndim = len(call.grid)
    axes = [call.body_axes[a] for a in program_id_axes(call.body) if a < len(call.body_axes)]
    limit = min([ndim] + axes)
    roles = [_grid_index_roles(b.index_map, ndim) if b.pipelined else None for b in call.blocks]
    for m in range(limit, 0, -1):
        flags: list[bool | None] = []
        for b, r in zip(call.blocks, roles):
            if r is None:
                flags.append(None)
            elif all(x == "unused" for x in r[:m]):
                flags.append(False)
            elif all(isinstance(x, tuple) for x in r[:m]) and _full_windows(b, r[:m], call.grid):
                flags.append(True)
            else:
                break
        else:
            return m, flags
    return 0, []
