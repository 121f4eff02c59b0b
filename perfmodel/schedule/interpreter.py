"""A vectorized numpy interpreter for the scalar part of Pallas jaxprs.

Index maps and the scalar control flow of kernel bodies (``pl.when`` on
``program_id``, loop bounds read from scalar prefetch) are small integer
programs. This module runs such a jaxpr for *all* grid points at once: every
value carries a leading batch axis of size ``n`` (one entry per grid step) or
1 (the same for every step), so a million-step grid costs a few numpy array
operations per equation instead of a million Python calls.

What is computed:

* integer / boolean element-wise ops, comparisons, ``select_n``, casts, and
  shape ops on single-element values;
* ``program_id`` / ``num_programs`` (from the grid coordinates given);
* reads of concrete refs (scalar-prefetch operands) with integer indices;
* ``cond`` (per-step branch selection), ``while`` (simulated per lane when its
  trip count is small enough), ``scan`` (both run by
  :mod:`perfmodel.schedule.loops`), ``jit`` / custom-derivative calls and
  ``run_scoped`` (recursed into).

Anything else (vector values, reads of VMEM refs) evaluates to
:data:`~perfmodel.schedule.values.UNKNOWN`, which propagates. A
:class:`~perfmodel.schedule.values.Hook` sees every executed
equation with its execution *weight*: how many times it runs at each grid step
(a scalar or an ``(n,)`` array), which is how :mod:`perfmodel.schedule.body`
counts the body's work per step.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from perfmodel.schedule.loops import LoopOptions, run_scan, run_while
from perfmodel.schedule.slicing import CALL_PARAMS, jax_types, jaxpr_memo, slice_jaxpr, writes_known
from perfmodel.schedule.values import (
    ELEMENTWISE,
    UNKNOWN,
    Hook,
    RefValue,
    aval_size,
    copy_refs,
    forget_changed,
    is_unknown,
)

#: Shape-only primitives; computed when the result holds a single element.
SHAPE_OPS = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p",
                       "optimization_barrier"})

_NULL_HOOK = Hook()


def _consts_of(closed: Any) -> list[Any]:
    """A closed jaxpr's consts in batched form (memoized: every run of a loop body reuses them)."""
    memo = jaxpr_memo(closed)
    hit = memo.get("consts")
    if hit is not None:
        return hit
    out = []
    for c in closed.consts:
        if _is_ref_const(c):
            out.append(UNKNOWN)
            continue
        arr = np.asarray(c)
        out.append(UNKNOWN if arr.dtype == object else arr.reshape((1,) + tuple(arr.shape)))
    memo["consts"] = out
    return out


def _is_ref_const(c: Any) -> bool:
    return hasattr(c, "aval") and "Ref" in type(getattr(c, "aval", None)).__name__


_ERRSTATE_DEPTH = 0


class Interpreter:
    """Evaluates jaxprs over ``n`` grid steps at once.

    ``grid_ids`` holds one int array of shape ``(n,)`` per grid dimension (the
    coordinates of every step, in order); ``grid`` the grid sizes.
    ``groups`` (expanded lanes only): for each lane, which per-iteration pass
    of the reference implementation it belongs to. ``loop_options``: which
    fast paths loops and quiet runs take (default: all of them).
    """

    def __init__(self, n: int, grid: Sequence[int] = (), grid_ids: Sequence[np.ndarray] = (), hook: Hook | None = None,
                 *, groups: np.ndarray | None = None, ngroups: int | None = None,
                 loop_options: LoopOptions = LoopOptions()):
        self.n = n
        self.grid = tuple(grid)
        self.grid_ids = tuple(np.asarray(g).reshape(-1) for g in grid_ids)
        self.hook = hook or _NULL_HOOK
        self.groups = groups
        if ngroups is None:
            ngroups = int(groups.max()) + 1 if groups is not None and groups.shape[0] else 0
        #: An upper bound of the group ids (ids need not all occur).
        self.ngroups = ngroups
        self.loop_options = loop_options

    @property
    def quiet(self) -> bool:
        """No hook: only values are computed (jaxprs run sliced to the outputs asked for)."""
        return self.hook is _NULL_HOOK

    def spawn(self, n: int, grid_ids: Sequence[np.ndarray], hook: Hook, *, groups: np.ndarray | None = None,
              ngroups: int | None = None) -> "Interpreter":
        """An interpreter over ``n`` lanes (``grid_ids``: their coordinates) of the same grid, with the same
        loop options, reporting to ``hook``."""
        return Interpreter(n, self.grid, grid_ids, hook, groups=groups, ngroups=ngroups, loop_options=self.loop_options)

    def without_hook(self) -> "Interpreter":
        """A quiet interpreter over the same lanes: computes values only."""
        return self.spawn(self.n, self.grid_ids, _NULL_HOOK)

    # ----- values -----

    def literal(self, val: Any, aval: Any) -> Any:
        arr = np.asarray(val)
        if arr.dtype == object:
            return UNKNOWN
        return arr.reshape((1,) + tuple(arr.shape))

    def read(self, env: dict, var: Any) -> Any:
        Literal, _ = jax_types()
        if isinstance(var, Literal):
            return self.literal(var.val, var.aval)
        return env.get(var, UNKNOWN)

    # ----- driver -----

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], weight: Any = 1.0,
            needed: Sequence[bool] | None = None) -> list[Any]:
        """Run an open jaxpr; consts/args already in batched form (or RefValue / UNKNOWN).

        ``needed`` (quiet interpreters only): compute just these outputs (the rest may come back UNKNOWN)
        and the jaxpr's ref writes.
        """
        global _ERRSTATE_DEPTH
        env: dict = {}
        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        if needed is not None and self.quiet and self.loop_options.slice_quiet_runs:
            eqns: Any = slice_jaxpr(jaxpr, needed, writes_known(jaxpr, list(consts) + list(args))).eqns
        else:
            eqns = [(e, None) for e in jaxpr.eqns]
        read = self.read
        state = None
        if _ERRSTATE_DEPTH == 0:
            state = np.errstate(all="ignore")
            state.__enter__()
        _ERRSTATE_DEPTH += 1
        try:
            for eqn, outs_needed in eqns:
                invals = [read(env, v) for v in eqn.invars]
                outs = self.eqn(eqn, invals, weight, outs_needed)  # always a list, one value per outvar
                for v, x in zip(eqn.outvars, outs):
                    env[v] = x
        finally:
            _ERRSTATE_DEPTH -= 1
            if state is not None:
                state.__exit__(None, None, None)
        return [read(env, v) for v in jaxpr.outvars]

    def run_closed(self, closed: Any, args: Sequence[Any], weight: Any = 1.0,
                   needed: Sequence[bool] | None = None) -> list[Any]:
        return self.run(closed.jaxpr, _consts_of(closed), args, weight, needed)

    # ----- one equation -----

    def eqn(self, eqn: Any, invals: list[Any], weight: Any, needed: Sequence[bool] | None = None) -> list[Any]:
        name = eqn.primitive.name
        handler = _HANDLERS.get(name)
        if handler is not None:
            return handler(self, eqn, invals, weight, needed)
        if any(p in eqn.params for p in CALL_PARAMS) and name not in ("pallas_call",):
            return self._call(eqn, invals, weight, needed)
        #: The values of the equation the hook is shown (e.g. a DMA's run-time slice sizes).
        self.invals = invals
        self.hook.eqn(eqn, weight, self)
        return self._compute(eqn, invals)

    def _unknown_outs(self, eqn: Any) -> list[Any]:
        return [UNKNOWN] * len(eqn.outvars)

    def _compute(self, eqn: Any, invals: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        out_avals = [v.aval for v in eqn.outvars]
        if any(aval_size(a) != 1 for a in out_avals) or any(is_unknown(x) or isinstance(x, RefValue) for x in invals):
            return self._unknown_outs(eqn)
        if name in ELEMENTWISE:
            out = ELEMENTWISE[name](*invals)
            return [self._cast(out, out_avals[0])]
        if name == "convert_element_type":
            return [self._cast(invals[0], out_avals[0])]
        if name == "integer_pow":
            return [np.power(invals[0], eqn.params["y"])]
        if name in SHAPE_OPS or name == "iota":
            if name == "iota":
                return [np.zeros((1,) + tuple(out_avals[0].shape), dtype=np.dtype(out_avals[0].dtype))]
            x = invals[0]
            return [x.reshape((x.shape[0],) + tuple(out_avals[0].shape))]
        return self._unknown_outs(eqn)

    @staticmethod
    def _cast(x: Any, aval: Any) -> Any:
        try:
            dtype = np.dtype(aval.dtype)
        except TypeError:
            return UNKNOWN
        arr = np.asarray(x)
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        return arr

    # ----- grid queries -----

    def _p_program_id(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        axis = eqn.params["axis"]
        if axis >= len(self.grid_ids):
            return [UNKNOWN]
        return [self.grid_ids[axis].astype(np.int32)]

    def _p_num_programs(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        axis = eqn.params["axis"]
        if axis >= len(self.grid):
            return [UNKNOWN]
        return [np.full((1,), self.grid[axis], dtype=np.int32)]

    # ----- refs -----

    def _indexers(self, eqn: Any, invals: list[Any]) -> tuple[Any, list[Any]] | None:
        import jax

        tree = eqn.params["tree"]
        try:
            transforms = jax.tree_util.tree_unflatten(tree, invals[1:])
        except Exception:  # noqa: BLE001 - an unfamiliar transform tree
            return None
        return transforms, invals[1:]

    def _p_get(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        ref = invals[0]
        if not isinstance(ref, RefValue) or is_unknown(ref.value):
            return [UNKNOWN]
        out_aval = eqn.outvars[0].aval
        if aval_size(out_aval) != 1:
            return [UNKNOWN]
        parsed = self._indexers(eqn, invals)
        if parsed is None:
            return [UNKNOWN]
        transforms, _ = parsed
        value = ref.value
        for t in transforms:
            value = self._apply_indexer(value, t)
            if is_unknown(value):
                return [UNKNOWN]
        return [value.reshape((value.shape[0],) + tuple(out_aval.shape))]

    def _apply_indexer(self, value: np.ndarray, indexer: Any) -> Any:
        from jax._src.state.indexing import NDIndexer, Slice

        if not isinstance(indexer, NDIndexer):
            return UNKNOWN
        batch = value.shape[0]
        index: list[Any] = []
        lanes = batch
        for idx in indexer.indices:
            if isinstance(idx, Slice):
                start, size, stride = idx.start, idx.size, idx.stride
                if not isinstance(start, (int, np.integer)) or not isinstance(size, (int, np.integer)):
                    return UNKNOWN
                index.append(slice(int(start), int(start) + int(size) * int(stride), int(stride)))
                continue
            if is_unknown(idx) or isinstance(idx, RefValue):
                return UNKNOWN
            arr = np.asarray(idx)
            if arr.ndim != 1:  # a vector of indices: not a scalar read
                return UNKNOWN
            lanes = max(lanes, arr.shape[0])
            index.append(arr.astype(np.int64))
        if lanes != batch and batch != 1:
            return UNKNOWN
        lane_ids = np.arange(lanes) if batch != 1 else np.zeros(lanes, dtype=np.int64)
        full = [lane_ids] + [np.broadcast_to(i, (lanes,)) if isinstance(i, np.ndarray) else i for i in index]
        try:
            clipped = [full[0]]
            for i, (ix, dim) in enumerate(zip(full[1:], value.shape[1:])):
                clipped.append(np.clip(ix, 0, dim - 1) if isinstance(ix, np.ndarray) else ix)
            return value[tuple(clipped)]
        except IndexError:
            return UNKNOWN

    def _p_swap(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        ref = invals[0]
        if isinstance(ref, RefValue):
            # Untracked refs forget their content (later reads are data-dependent); a tracked ref takes a scalar
            # write at the steps that run it.
            ref.value = self._stored(eqn, invals, weight, ref.value) if ref.track else UNKNOWN
        return self._unknown_outs(eqn)

    def _p_addupdate(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        if isinstance(invals[0], RefValue):
            invals[0].value = UNKNOWN
        return self._unknown_outs(eqn)

    def _stored(self, eqn: Any, invals: list[Any], weight: Any, content: Any) -> Any:
        """The content of a tracked ref after ``ref[idx] = value`` (one element) at the lanes whose weight is
        1; UNKNOWN where any part is unknown, or the write runs a multiplied (loop-counted) number of times."""
        from jax._src.state.indexing import NDIndexer, Slice

        value = invals[1]
        w = np.asarray(weight, dtype=float)
        if (is_unknown(content) or is_unknown(value) or isinstance(value, RefValue) or self.groups is not None
                or aval_size(eqn.outvars[0].aval) != 1 or not np.all((w == 0) | (w == 1))):
            return UNKNOWN
        parsed = self._indexers(eqn, [invals[0]] + list(invals[2:]))
        if parsed is None or len(parsed[0]) != 1 or not isinstance(parsed[0][0], NDIndexer):
            return UNKNOWN
        index = []
        for idx in parsed[0][0].indices:
            if isinstance(idx, Slice):
                if not isinstance(idx.start, (int, np.integer)) or int(idx.size) != 1:
                    return UNKNOWN
                index.append(np.asarray([int(idx.start)]))
            elif is_unknown(idx) or isinstance(idx, RefValue) or np.ndim(idx) != 1:
                return UNKNOWN
            else:
                index.append(np.asarray(idx).astype(np.int64))
        content = np.asarray(content)
        value = np.asarray(value).reshape(-1)
        lanes = max([content.shape[0], value.shape[0], w.size] + [i.shape[0] for i in index])
        if lanes not in (1, self.n) or len(index) != content.ndim - 1:
            return UNKNOWN
        out = np.broadcast_to(content, (lanes,) + content.shape[1:]).copy()
        active = np.nonzero(np.broadcast_to(w.reshape(-1) if w.ndim else w, (lanes,)) == 1)[0]
        where = tuple([active] + [np.clip(np.broadcast_to(i, (lanes,))[active], 0, d - 1)
                                  for i, d in zip(index, content.shape[1:])])
        out[where] = np.broadcast_to(value, (lanes,))[active].astype(out.dtype)
        return out

    # ----- control flow -----

    def _call(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        from jax.extend.core import ClosedJaxpr

        for key in CALL_PARAMS:
            sub = eqn.params.get(key)
            if sub is None:
                continue
            if isinstance(sub, ClosedJaxpr):
                return self.run_closed(sub, invals[: len(sub.jaxpr.invars)], weight, needed)
            if hasattr(sub, "eqns"):
                return self.run(sub, [], invals[: len(sub.invars)], weight, needed)
        self.hook.eqn(eqn, weight, self)
        return self._unknown_outs(eqn)

    def _p_custom_jvp_call(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        return self._call(eqn, invals, weight, needed)

    def _p_run_scoped(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        jaxpr = eqn.params["jaxpr"]
        scoped = [RefValue(UNKNOWN, str(getattr(v.aval, "memory_space", ""))) for v in jaxpr.invars]
        return self.run(jaxpr, invals, scoped, weight, needed)

    def _p_cond(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        branches = eqn.params["branches"]
        index, operands = invals[0], invals[1:]
        quiet = self.quiet
        if is_unknown(index):
            children = []
            for br in branches:
                child = self.spawn(self.n, self.grid_ids, self.hook.child(), groups=self.groups, ngroups=self.ngroups)
                copies = copy_refs(operands)
                child.run_closed(br, copies, weight, needed)
                forget_changed(operands, copies)
                children.append(child.hook)
            if not quiet:
                reason = "a pl.when / lax.cond whose predicate depends on data"
                if self.groups is not None and len(children) > 1:
                    self.hook.absorb_costliest_grouped(children, reason, self.groups, self.ngroups)
                else:
                    self.hook.absorb_costliest(children, reason)
            return self._unknown_outs(eqn)
        index = np.clip(np.asarray(index).reshape(-1), 0, len(branches) - 1)
        outs_per_branch = []
        masks = []
        for k, br in enumerate(branches):
            mask = index == k
            if not mask.any():
                outs_per_branch.append(None)
                masks.append(mask)
                continue
            w = weight if quiet or not (mask.shape[0] > 1 or not mask.all()) else weight * mask
            outs_per_branch.append(self.run_closed(br, operands, w, needed))
            masks.append(mask)
        results = []
        for j in range(len(eqn.outvars)):
            if needed is not None and quiet and not needed[j]:
                results.append(UNKNOWN)
                continue
            taken = [(m, outs[j]) for m, outs in zip(masks, outs_per_branch) if outs is not None]
            if any(is_unknown(v) or isinstance(v, RefValue) for _, v in taken):
                results.append(UNKNOWN)
                continue
            out = None
            for m, v in taken:
                v = np.asarray(v)
                if out is None:
                    out = np.broadcast_to(v, (max(m.shape[0], v.shape[0]),) + v.shape[1:]).copy()
                    continue
                mm = m.reshape((-1,) + (1,) * (v.ndim - 1))
                out = np.where(mm, v, out)
            results.append(out)
        return results


#: Primitive name -> handler(interpreter, eqn, invals, weight, needed): the ``_p_`` methods and the loops.
_HANDLERS: dict[str, Callable[..., list[Any]]] = {
    name[3:]: fn for name, fn in vars(Interpreter).items() if name.startswith("_p_") and callable(fn)
}
_HANDLERS.update({"while": run_while, "scan": run_scan})


def evaluate_index_map(closed: Any, grid: Sequence[int], grid_ids: Sequence[np.ndarray], prefetch: Sequence[Any],
                       *, loop_options: LoopOptions = LoopOptions()) -> list[Any]:
    """Block indices of one index map at every grid step: a list of ``(n,)`` arrays (or UNKNOWN)."""
    n = int(grid_ids[0].shape[0]) if grid_ids else 1
    interp = Interpreter(n, grid, grid_ids, loop_options=loop_options)
    args: list[Any] = [np.asarray(g).astype(np.int32) for g in grid_ids]
    for p in prefetch:
        args.append(RefValue(UNKNOWN if p is None else np.asarray(p)[None, ...], "smem"))
    outs = interp.run_closed(closed, args)
    result = []
    for o in outs:
        if is_unknown(o) or isinstance(o, RefValue):
            result.append(UNKNOWN)
        else:
            result.append(np.broadcast_to(np.asarray(o).reshape(-1), (n,)))
    return result
