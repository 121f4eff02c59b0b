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
  trip count is small enough), ``scan``, ``jit`` / custom-derivative calls and
  ``run_scoped`` (recursed into).

Anything else (vector values, reads of VMEM refs) evaluates to
:data:`UNKNOWN`, which propagates. A :class:`Hook` sees every executed
equation with its execution *weight*: how many times it runs at each grid step
(a scalar or an ``(n,)`` array), which is how :mod:`perfmodel.schedule.body`
counts the body's work per step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

#: Largest lanes x iterations a ``while`` loop is simulated for before its trip
#: count is declared unknown (keeps a million-step grid under a second).
MAX_WHILE_LANE_ITERATIONS = 20_000_000
#: Loops up to this many lanes x iterations have their body counted iteration by
#: iteration (exact per-iteration predicates); longer ones count the body once
#: (at the initial carry) times the trip count.
MAX_UNROLLED_LANE_ITERATIONS = 2_000_000
#: Longest scan counted iteration by iteration.
MAX_UNROLLED_SCAN_LENGTH = 4096


class _Unknown:
    """Sentinel for a value the interpreter cannot compute."""

    _instance: "_Unknown | None" = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclasses.dataclass
class RefValue:
    """A ref in the environment: its content (batch axis first) or UNKNOWN."""

    value: Any
    memory_space: str


class Hook:
    """Receives executed equations. The default does nothing."""

    def eqn(self, eqn: Any, weight: Any, interp: "Interpreter") -> None:  # pragma: no cover - interface
        pass

    def child(self) -> "Hook":
        return self

    def absorb_costliest(self, children: Sequence["Hook"], reason: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


_NULL_HOOK = Hook()


def _is_unknown(x: Any) -> bool:
    return x is UNKNOWN


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.div: integers round toward zero; floats divide."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        safe_b = np.where(b == 0, 1, b)
        q = np.abs(a) // np.abs(safe_b)
        return np.where((a < 0) ^ (safe_b < 0), -q, q)
    return a / b


def _int_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """lax.rem: sign follows the dividend (C semantics)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.fmod(a, np.where(b == 0, 1, b))
    return np.fmod(a, b)


def _select_n(which: np.ndarray, *cases: np.ndarray) -> np.ndarray:
    which = np.asarray(which)
    if which.dtype == bool:
        return np.where(which, cases[1], cases[0])
    out = np.asarray(cases[0])
    for k, case in enumerate(cases[1:], start=1):
        out = np.where(which == k, case, out)
    return out


def _shift_right_logical(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    unsigned = a.astype(a.dtype.str.replace("i", "u")) if a.dtype.kind == "i" else a
    return (unsigned >> b).astype(a.dtype)


#: Primitive name -> numpy implementation, for values of any (batched) shape.
ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _int_div,
    "rem": _int_rem,
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "max": np.maximum,
    "min": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": lambda a, b: np.bitwise_and(a, b) if np.asarray(a).dtype != bool else np.logical_and(a, b),
    "or": lambda a, b: np.bitwise_or(a, b) if np.asarray(a).dtype != bool else np.logical_or(a, b),
    "xor": lambda a, b: np.bitwise_xor(a, b) if np.asarray(a).dtype != bool else np.logical_xor(a, b),
    "not": lambda a: np.invert(a) if np.asarray(a).dtype != bool else np.logical_not(a),
    "select_n": _select_n,
    "clamp": lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),
    "shift_left": np.left_shift,
    "shift_right_arithmetic": np.right_shift,
    "shift_right_logical": _shift_right_logical,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
}

#: Shape-only primitives; computed when the result holds a single element.
SHAPE_OPS = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p", "optimization_barrier"})

#: Primitives that run a sub-jaxpr once with the same operands.
CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _aval_size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape)) if shape is not None else 1


class Interpreter:
    """Evaluates jaxprs over ``n`` grid steps at once.

    ``grid_ids`` holds one int array of shape ``(n,)`` per grid dimension (the
    coordinates of every step, in order); ``grid`` the grid sizes.
    """

    def __init__(self, n: int, grid: Sequence[int] = (), grid_ids: Sequence[np.ndarray] = (), hook: Hook | None = None):
        self.n = n
        self.grid = tuple(grid)
        self.grid_ids = tuple(np.asarray(g).reshape(-1) for g in grid_ids)
        self.hook = hook or _NULL_HOOK

    # ----- values -----

    def literal(self, val: Any, aval: Any) -> Any:
        arr = np.asarray(val)
        if arr.dtype == object:
            return UNKNOWN
        return arr.reshape((1,) + tuple(arr.shape))

    def read(self, env: dict, var: Any) -> Any:
        from jax.extend.core import Literal

        if isinstance(var, Literal):
            return self.literal(var.val, var.aval)
        return env.get(var, UNKNOWN)

    # ----- driver -----

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], weight: Any = 1.0) -> list[Any]:
        """Run an open jaxpr; consts/args already in batched form (or RefValue / UNKNOWN)."""
        env: dict = {}
        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        for eqn in jaxpr.eqns:
            invals = [self.read(env, v) for v in eqn.invars]
            outs = self.eqn(eqn, invals, weight)  # always a list, one value per outvar
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return [self.read(env, v) for v in jaxpr.outvars]

    def run_closed(self, closed: Any, args: Sequence[Any], weight: Any = 1.0) -> list[Any]:
        consts = [self.literal(c, None) if not _is_ref_const(c) else UNKNOWN for c in closed.consts]
        return self.run(closed.jaxpr, consts, args, weight)

    # ----- one equation -----

    def eqn(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        name = eqn.primitive.name
        handler = getattr(self, f"_p_{name}", None)
        if handler is not None:
            return handler(eqn, invals, weight)
        if any(p in eqn.params for p in CALL_PARAMS) and name not in ("pallas_call",):
            return self._call(eqn, invals, weight)
        self.hook.eqn(eqn, weight, self)
        return self._compute(eqn, invals)

    def _unknown_outs(self, eqn: Any) -> list[Any]:
        return [UNKNOWN] * len(eqn.outvars)

    def _compute(self, eqn: Any, invals: list[Any]) -> list[Any]:
        name = eqn.primitive.name
        out_avals = [v.aval for v in eqn.outvars]
        if any(_aval_size(a) != 1 for a in out_avals) or any(_is_unknown(x) or isinstance(x, RefValue) for x in invals):
            return self._unknown_outs(eqn)
        if name in ELEMENTWISE:
            with np.errstate(all="ignore"):
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

    def _p_program_id(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        axis = eqn.params["axis"]
        if axis >= len(self.grid_ids):
            return [UNKNOWN]
        return [self.grid_ids[axis].astype(np.int32)]

    def _p_num_programs(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
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

    def _p_get(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        ref = invals[0]
        if not isinstance(ref, RefValue) or _is_unknown(ref.value):
            return [UNKNOWN]
        out_aval = eqn.outvars[0].aval
        if _aval_size(out_aval) != 1:
            return [UNKNOWN]
        parsed = self._indexers(eqn, invals)
        if parsed is None:
            return [UNKNOWN]
        transforms, _ = parsed
        value = ref.value
        for t in transforms:
            value = self._apply_indexer(value, t)
            if _is_unknown(value):
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
            if _is_unknown(idx) or isinstance(idx, RefValue):
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

    def _p_swap(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        ref = invals[0]
        if isinstance(ref, RefValue):
            ref.value = UNKNOWN  # writes are not tracked; later reads are data-dependent
        return self._unknown_outs(eqn)

    _p_addupdate = _p_swap

    # ----- control flow -----

    def _call(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        from jax.extend.core import ClosedJaxpr

        for key in CALL_PARAMS:
            sub = eqn.params.get(key)
            if sub is None:
                continue
            if isinstance(sub, ClosedJaxpr):
                return self.run_closed(sub, invals[: len(sub.jaxpr.invars)], weight)
            if hasattr(sub, "eqns"):
                return self.run(sub, [], invals[: len(sub.invars)], weight)
        self.hook.eqn(eqn, weight, self)
        return self._unknown_outs(eqn)

    def _p_custom_jvp_call(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        return self._call(eqn, invals, weight)

    def _p_run_scoped(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        self.hook.eqn(eqn, weight, self)
        jaxpr = eqn.params["jaxpr"]
        scoped = [RefValue(UNKNOWN, str(getattr(v.aval, "memory_space", ""))) for v in jaxpr.invars]
        return self.run(jaxpr, invals, scoped, weight)

    def _p_cond(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        branches = eqn.params["branches"]
        index, operands = invals[0], invals[1:]
        if _is_unknown(index):
            children = []
            for br in branches:
                child = Interpreter(self.n, self.grid, self.grid_ids, self.hook.child())
                child.run_closed(br, _copy_refs(operands), weight)
                children.append(child.hook)
            self.hook.absorb_costliest(children, "a pl.when / lax.cond whose predicate depends on data")
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
            w = weight * mask if mask.shape[0] > 1 or not mask.all() else weight
            outs_per_branch.append(self.run_closed(br, operands, w))
            masks.append(mask)
        results = []
        for j in range(len(eqn.outvars)):
            taken = [(m, outs[j]) for m, outs in zip(masks, outs_per_branch) if outs is not None]
            if any(_is_unknown(v) or isinstance(v, RefValue) for _, v in taken):
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

    def _p_while(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        p = eqn.params
        cond_j, body_j = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]
        trips, final = self._simulate_while(cond_j, body_j, cconsts, bconsts, init)
        if trips is None:
            self.hook.note("a while loop with a data-dependent trip count is counted as one iteration")
            self.run_closed(body_j, list(bconsts) + list(init), weight)
            return self._unknown_outs(eqn)
        lanes = max(trips.shape[0], 1)
        if int(trips.max(initial=0)) * lanes <= MAX_UNROLLED_LANE_ITERATIONS:
            self._unrolled_while(cond_j, body_j, cconsts, bconsts, init, weight)
        else:
            trips_w = trips if trips.shape[0] > 1 else float(trips[0])
            self.run_closed(body_j, list(bconsts) + list(init), weight * trips_w)
        return final

    def _unrolled_while(self, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list, weight: Any) -> None:
        """Run the body once per iteration with the real carries, each lane weighted while its loop runs."""
        quiet = Interpreter(self.n, self.grid, self.grid_ids, _NULL_HOOK)
        carry = list(init)
        while True:
            pred = quiet.run_closed(cond_j, _copy_refs(cconsts) + carry)[0]
            if _is_unknown(pred):
                return
            pred = np.asarray(pred).reshape(-1)
            if not pred.any():
                return
            w = weight * pred if (pred.shape[0] > 1 or not pred.all()) else weight
            new = self.run_closed(body_j, list(bconsts) + carry, w)
            carry = _merge_carry(pred, new, carry)

    def _simulate_while(self, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list) -> tuple[Any, Any]:
        """Trip count per lane (None when unknown) and the final carries, without counting work."""
        quiet = Interpreter(self.n, self.grid, self.grid_ids, _NULL_HOOK)
        carry = list(init)
        cconsts, bconsts = _copy_refs(cconsts), _copy_refs(bconsts)
        trips = None
        it = 0
        while True:
            pred = quiet.run_closed(cond_j, cconsts + carry)[0]
            if _is_unknown(pred):
                return None, None
            pred = np.asarray(pred).reshape(-1)
            lanes = pred.shape[0]
            trips = np.zeros(lanes, dtype=np.int64) if trips is None else np.broadcast_to(trips, (max(lanes, trips.shape[0]),)).copy()
            if not pred.any():
                return trips, carry
            it += 1
            if lanes * it > MAX_WHILE_LANE_ITERATIONS:
                return None, None
            trips = trips + pred
            new = quiet.run_closed(body_j, bconsts + carry)
            carry = _merge_carry(pred, new, carry)

    def _p_scan(self, eqn: Any, invals: list[Any], weight: Any) -> list[Any]:
        p = eqn.params
        length = int(p["length"])
        nconsts, ncarry = p["num_consts"], p["num_carry"]
        body = p["jaxpr"]
        consts = list(invals[:nconsts])
        carry = list(invals[nconsts : nconsts + ncarry])
        xs = [UNKNOWN] * (len(invals) - nconsts - ncarry)
        lanes = max(self.n, 1) if any(isinstance(c, np.ndarray) and c.shape[0] > 1 for c in carry) else 1
        if length * lanes <= MAX_UNROLLED_LANE_ITERATIONS and length <= MAX_UNROLLED_SCAN_LENGTH:
            for _ in range(length):
                outs = self.run_closed(body, consts + carry + xs, weight)
                carry = outs[:ncarry]
            return list(carry) + [UNKNOWN] * (len(eqn.outvars) - ncarry)
        self.run_closed(body, consts + carry + xs, weight * length)
        return self._unknown_outs(eqn)


def _merge_carry(pred: np.ndarray, new: Sequence[Any], old: Sequence[Any]) -> list[Any]:
    """New carries where the loop ran (pred), old ones elsewhere."""
    merged = []
    for o, nv in zip(old, new):
        if isinstance(nv, RefValue) or isinstance(o, RefValue):
            merged.append(nv)
            continue
        if _is_unknown(nv) or _is_unknown(o):
            merged.append(UNKNOWN)
            continue
        nv, o = np.asarray(nv), np.asarray(o)
        mm = pred.reshape((-1,) + (1,) * (nv.ndim - 1))
        merged.append(np.where(mm, nv, o))
    return merged


def _is_ref_const(c: Any) -> bool:
    return hasattr(c, "aval") and "Ref" in type(getattr(c, "aval", None)).__name__


def _copy_refs(values: Sequence[Any]) -> list[Any]:
    """Branch exploration must not see another branch's writes."""
    return [RefValue(v.value, v.memory_space) if isinstance(v, RefValue) else v for v in values]


def evaluate_index_map(closed: Any, grid: Sequence[int], grid_ids: Sequence[np.ndarray], prefetch: Sequence[Any]) -> list[Any]:
    """Block indices of one index map at every grid step: a list of ``(n,)`` arrays (or UNKNOWN)."""
    n = int(grid_ids[0].shape[0]) if grid_ids else 1
    interp = Interpreter(n, grid, grid_ids)
    args: list[Any] = [np.asarray(g).astype(np.int32) for g in grid_ids]
    for p in prefetch:
        args.append(RefValue(UNKNOWN if p is None else np.asarray(p)[None, ...], "smem"))
    outs = interp.run_closed(closed, args)
    result = []
    for o in outs:
        if _is_unknown(o) or isinstance(o, RefValue):
            result.append(UNKNOWN)
        else:
            result.append(np.broadcast_to(np.asarray(o).reshape(-1), (n,)))
    return result
