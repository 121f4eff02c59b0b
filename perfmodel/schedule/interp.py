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

Loops are counted without a Python pass per iteration where possible:

* only single-element values can ever be known (a vector op evaluates to
  UNKNOWN), so a loop's trip counts and carries are simulated on the *slice*
  of its body that computes them (:func:`slice_jaxpr`: the equations its
  condition and its scalar carries depend on, plus writes to refs), usually a
  handful of equations instead of hundreds;
* the body's work is then counted in one pass over *expanded lanes*, one per
  (grid step, iteration) pair that runs, each holding that iteration's carries
  (:meth:`Interpreter._expanded_body`), and folded back per grid step
  (:meth:`Hook.fold`). This equals the per-iteration pass (kept as the
  reference, ``expand=False``, and used for hooks that cannot fold or past
  :data:`MAX_EXPANDED_LANES`) up to float summation order.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any, Callable, Sequence

import numpy as np

#: Largest lanes x iterations a ``while`` loop is simulated for before its trip
#: count is declared unknown (keeps a million-step grid under a second).
MAX_WHILE_LANE_ITERATIONS = 20_000_000
#: Loops up to this many lanes x iterations have their body counted iteration by
#: iteration (exact per-iteration predicates); longer ones count the body once
#: (at the initial carry) times the trip count. A while loop whose (step,
#: iteration) pairs number at most :data:`MAX_EXPANDED_LANES` is always counted
#: exactly (it runs as expanded lanes).
MAX_UNROLLED_LANE_ITERATIONS = 2_000_000
#: Longest scan counted iteration by iteration.
MAX_UNROLLED_SCAN_LENGTH = 4096
#: Most (grid step, iteration) lanes a loop body is counted over in one pass.
MAX_EXPANDED_LANES = 1 << 20
#: Loops run by an interpreter with more lanes than this are counted one pass per iteration: each pass
#: already works on arrays long enough that Python's per-equation cost does not matter, and expanding
#: would only copy them.
MAX_LANES_TO_EXPAND = 16384
#: Default of ``Interpreter(expand=...)``: count loop bodies over expanded lanes
#: (False: one pass per iteration, the reference implementation).
EXPAND_LOOPS = True
#: Quiet runs (trip counts, carries, index maps) compute only the slice of a jaxpr their outputs need.
SLICE_QUIET_RUNS = True
#: Counting loops (``fori_loop`` with traced bounds) are simulated in closed form.
CLOSED_FORM_LOOPS = True


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
    """A ref in the environment: its content (batch axis first) or UNKNOWN. ``track``: scalar writes to it
    update the content (SMEM state a kernel carries from step to step, e.g. a first-step flag); writes to an
    untracked ref forget its content."""

    value: Any
    memory_space: str
    track: bool = False


class Hook:
    """Receives executed equations. The default does nothing.

    A hook that sets ``foldable`` implements :meth:`fold` and
    :meth:`absorb_costliest_grouped`, which lets the interpreter count a loop's
    iterations in one pass over expanded lanes instead of one pass each.
    """

    #: Whether fold() and absorb_costliest_grouped() are implemented.
    foldable = False
    #: Iterations assumed for a while loop whose trip count the interpreter cannot evaluate (None: count one
    #: iteration and say so); the user's explicit ``loop_trips`` / ``--loop-trips``.
    assumed_trips: int | None = None

    def eqn(self, eqn: Any, weight: Any, interp: "Interpreter") -> None:  # pragma: no cover - interface
        pass

    def child(self) -> "Hook":
        return self

    def absorb_costliest(self, children: Sequence["Hook"], reason: str) -> None:
        pass

    def absorb_costliest_grouped(self, children: Sequence["Hook"], reason: str, groups: np.ndarray,
                                 ngroups: int) -> None:
        """absorb_costliest chosen separately within each group of lanes (``groups``: a group id per lane):
        the lanes of one group are the steps one per-iteration pass would have seen together."""
        raise NotImplementedError  # pragma: no cover - only called on foldable hooks

    def fold(self, child: "Hook", lanes: np.ndarray, n: int) -> None:
        """Add what ``child`` counted over expanded lanes to this hook's ``n`` lanes (``lanes``: the lane of
        this hook each expanded lane belongs to)."""
        raise NotImplementedError  # pragma: no cover - only called on foldable hooks

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
    # An alignment hint for the compiler (pl.multiple_of): the value itself.
    "multiple_of": np.asarray,
}

#: Shape-only primitives; computed when the result holds a single element.
SHAPE_OPS = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p", "optimization_barrier"})

#: Primitives that run a sub-jaxpr once with the same operands.
CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _aval_size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape)) if shape is not None else 1


# ----- slicing: which equations compute the values a caller needs -----

#: Primitives that change a ref's content (the interpreter then forgets it).
_WRITES = frozenset({"swap", "addupdate"})

_Literal: Any = None
_Var: Any = None


def _jax_types() -> tuple[Any, Any]:
    global _Literal, _Var
    if _Literal is None:
        from jax.extend.core import Literal, Var

        _Literal, _Var = Literal, Var
    return _Literal, _Var


def _kind(eqn: Any) -> str:
    """How the interpreter runs an equation (mirrors :meth:`Interpreter.eqn`'s dispatch)."""
    name = eqn.primitive.name
    if name in _WRITES:
        return "write"
    if name in ("cond", "while", "scan", "run_scoped"):
        return name
    if name == "custom_jvp_call" or (name != "pallas_call" and any(p in eqn.params for p in CALL_PARAMS)):
        return "call"
    return "other"


def _call_jaxpr(eqn: Any) -> tuple[Any, bool] | None:
    """(sub-jaxpr, closed?) that :meth:`Interpreter._call` runs for a call-like equation."""
    from jax.extend.core import ClosedJaxpr

    for key in CALL_PARAMS:
        sub = eqn.params.get(key)
        if sub is None:
            continue
        if isinstance(sub, ClosedJaxpr):
            return sub.jaxpr, True
        if hasattr(sub, "eqns"):
            return sub, False
    return None


def _open(j: Any) -> Any:
    return getattr(j, "jaxpr", j)


def _may_be_known(var: Any) -> bool:
    """Only single-element values (and refs) can be known: every operation with a vector result evaluates
    to UNKNOWN, and no operation the interpreter computes derives a single element from a vector."""
    aval = getattr(var, "aval", None)
    if aval is None or hasattr(aval, "inner_aval") or not hasattr(aval, "dtype"):
        return True  # refs, tokens, unfamiliar types: keep
    return _aval_size(aval) == 1


class _Cache:
    """Per-jaxpr memo (jaxprs are weak-referenceable and hash by identity)."""

    def __init__(self) -> None:
        self._data: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()

    def get(self, jaxpr: Any) -> dict:
        try:
            d = self._data.get(jaxpr)
        except TypeError:  # pragma: no cover - not weak-referenceable
            return {}
        if d is None:
            d = {}
            try:
                self._data[jaxpr] = d
            except TypeError:  # pragma: no cover
                pass
        return d


_CACHE = _Cache()


def jaxpr_writes(jaxpr: Any) -> bool:
    """Whether running ``jaxpr`` can change a ref's content (a swap / addupdate anywhere inside)."""
    jaxpr = _open(jaxpr)
    memo = _CACHE.get(jaxpr)
    if "writes" not in memo:
        memo["writes"] = any(_eqn_writes(e) for e in jaxpr.eqns)
    return memo["writes"]


def _eqn_writes(eqn: Any) -> bool:
    if eqn.primitive.name in _WRITES:
        return True
    return any(jaxpr_writes(sub) for sub in _subs(eqn))


def _subs(eqn: Any) -> list[Any]:
    from jax.extend.core import jaxprs_in_params

    return list(jaxprs_in_params(eqn.params))


def jaxpr_has(jaxpr: Any, primitive: str) -> bool:
    """Whether ``primitive`` runs anywhere inside ``jaxpr``."""
    jaxpr = _open(jaxpr)
    memo = _CACHE.get(jaxpr)
    key = ("has", primitive)
    if key not in memo:
        memo[key] = any(e.primitive.name == primitive or any(jaxpr_has(s, primitive) for s in _subs(e))
                        for e in jaxpr.eqns)
    return memo[key]


def written_inputs(jaxpr: Any) -> frozenset:
    """Positions of ``jaxpr``'s (constvars + invars) that it writes to (refs passed in)."""
    jaxpr = _open(jaxpr)
    memo = _CACHE.get(jaxpr)
    if "written" not in memo:
        written: set = set()
        for eqn in jaxpr.eqns:
            written |= _written_operands(eqn)
        params = list(jaxpr.constvars) + list(jaxpr.invars)
        memo["written"] = frozenset(i for i, v in enumerate(params) if v in written)
    return memo["written"]


def _written_operands(eqn: Any) -> set:
    """The operand Vars of one equation that it (or its sub-jaxprs) writes to."""
    kind = _kind(eqn)
    if kind == "write":
        return {eqn.invars[0]}
    if not _eqn_writes(eqn):
        return set()
    ins = eqn.invars
    out: set = set()

    def mark(sub: Any, operands: Sequence[Any], consts_are_operands: bool = False) -> None:
        sub = _open(sub)
        params = (list(sub.constvars) if consts_are_operands else []) + list(sub.invars)
        for i in written_inputs(sub):
            j = i if consts_are_operands else i - len(sub.constvars)
            if 0 <= j < len(operands):
                out.add(operands[j])

    if kind == "cond":
        for br in eqn.params["branches"]:
            mark(br, ins[1:])
    elif kind == "while":
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        mark(p["cond_jaxpr"], list(ins[:cn]) + list(ins[cn + bn:]))
        mark(p["body_jaxpr"], list(ins[cn:cn + bn]) + list(ins[cn + bn:]))
    elif kind == "scan":
        mark(eqn.params["jaxpr"], ins)
    elif kind == "run_scoped":
        mark(eqn.params["jaxpr"], ins, consts_are_operands=True)
    elif kind == "call" and _call_jaxpr(eqn) is not None:
        mark(_call_jaxpr(eqn)[0], ins)
    else:
        out |= set(ins)  # an unfamiliar primitive with sub-jaxprs that write: assume it writes everything
    _, Var = _jax_types()
    return {v for v in out if isinstance(v, Var)}


@dataclasses.dataclass(frozen=True)
class Slice:
    """The equations of a jaxpr that compute the needed outputs (and, when asked, every ref write), each
    with the outputs needed of it, and which constvars / invars they read."""

    eqns: tuple[tuple[Any, tuple[bool, ...]], ...]
    constvars: tuple[bool, ...]
    invars: tuple[bool, ...]


def slice_jaxpr(jaxpr: Any, needed: Sequence[bool], writes: bool = True) -> Slice:
    """Backward slice of an open jaxpr for the outputs marked in ``needed``.

    Kept: equations with a needed output that can be known (:func:`_may_be_known`) and, with ``writes``,
    every equation that writes to a ref (a later read must see the ref as changed; a write needs only its
    ref). Without ``writes`` (no ref whose content is known is written) writes are dropped: writing a ref
    the interpreter does not know changes nothing. Sub-jaxprs (cond branches, loop bodies, calls) are
    sliced in turn when run.
    """
    jaxpr = _open(jaxpr)
    key = ("slice", tuple(bool(x) for x in needed), writes)
    memo = _CACHE.get(jaxpr)
    hit = memo.get(key)
    if hit is not None:
        return hit
    _, Var = _jax_types()
    live: set = {v for v, nd in zip(jaxpr.outvars, needed) if nd and isinstance(v, Var) and _may_be_known(v)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        outs = tuple(isinstance(v, Var) and v in live for v in eqn.outvars)
        if not any(outs) and not (writes and _eqn_writes(eqn)):
            continue
        kept.append((eqn, outs))
        for v in _inputs_needed(eqn, outs, writes):
            if isinstance(v, Var) and _may_be_known(v):
                live.add(v)
    kept.reverse()
    result = Slice(eqns=tuple(kept), constvars=tuple(v in live for v in jaxpr.constvars),
                   invars=tuple(v in live for v in jaxpr.invars))
    memo[key] = result
    return result


def _or(a: Sequence[bool], b: Sequence[bool]) -> list[bool]:
    return [x or y for x, y in zip(a, b)]


def loop_carries_needed(eqn: Any, outs: Sequence[bool], writes: bool = True) -> tuple[bool, ...]:
    """Carries of a while / scan equation that must be simulated for the outputs ``outs`` (and, for a
    while loop, its condition): the closure of ``outs`` under the body's dependencies."""
    p = eqn.params
    memo = _CACHE.get(_open(p["body_jaxpr"] if eqn.primitive.name == "while" else p["jaxpr"]))
    key = ("carries", eqn.primitive.name, tuple(bool(x) for x in outs), writes)
    if key in memo:
        return memo[key]
    if eqn.primitive.name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        body = _open(p["body_jaxpr"])
        ncarry = len(body.outvars)
        cond = slice_jaxpr(p["cond_jaxpr"], (True,), writes)
        need = _or(list(outs)[:ncarry], cond.invars[cn:])
        skip = bn
    else:
        body = _open(p["jaxpr"])
        ncarry = p["num_carry"]
        need = list(outs)[:ncarry]
        skip = p["num_consts"]
    while True:
        s = slice_jaxpr(body, tuple(need) + (False,) * (len(body.outvars) - ncarry), writes)
        new = _or(need, s.invars[skip:skip + ncarry])
        if new == need:
            break
        need = new
    memo[key] = tuple(need)
    return memo[key]


def _inputs_needed(eqn: Any, outs: tuple[bool, ...], writes: bool) -> list[Any]:
    """The operands of a kept equation that its needed outputs (and its writes) read."""
    kind = _kind(eqn)
    ins = list(eqn.invars)
    if kind == "write":
        return ins if any(outs) else ins[:1]
    if kind == "cond":
        need = [False] * (len(ins) - 1)
        for br in eqn.params["branches"]:
            need = _or(need, slice_jaxpr(br.jaxpr, outs, writes).invars)
        return ins[:1] + [v for v, nd in zip(ins[1:], need) if nd]
    if kind == "while":
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        carries = loop_carries_needed(eqn, outs, writes)
        cond = slice_jaxpr(p["cond_jaxpr"], (True,), writes)
        body = slice_jaxpr(p["body_jaxpr"], carries, writes)
        return ([v for v, nd in zip(ins[:cn], cond.invars[:cn]) if nd]
                + [v for v, nd in zip(ins[cn:cn + bn], body.invars[:bn]) if nd]
                + [v for v, nd in zip(ins[cn + bn:], carries) if nd])
    if kind == "scan":
        p = eqn.params
        nc, nk = p["num_consts"], p["num_carry"]
        carries = loop_carries_needed(eqn, outs, writes)
        body = _open(p["jaxpr"])
        s = slice_jaxpr(body, tuple(carries) + (False,) * (len(body.outvars) - nk), writes)
        return ([v for v, nd in zip(ins[:nc], s.invars[:nc]) if nd]
                + [v for v, nd in zip(ins[nc:nc + nk], carries) if nd])  # xs are never known
    if kind == "run_scoped":
        s = slice_jaxpr(eqn.params["jaxpr"], outs, writes)
        return [v for v, nd in zip(ins, s.constvars) if nd]
    if kind == "call":
        found = _call_jaxpr(eqn)
        if found is None:
            return ins
        sub, _ = found
        s = slice_jaxpr(sub, outs, writes)
        return [v for v, nd in zip(ins, s.invars) if nd]
    return ins


def writes_known(jaxpr: Any, values: Sequence[Any]) -> bool:
    """Whether running ``jaxpr`` (open) on ``values`` (its constvars then invars) writes to a ref whose
    content is known."""
    written = written_inputs(jaxpr)
    return bool(written) and any(i < len(values) and isinstance(values[i], RefValue)
                                 and not _is_unknown(values[i].value) for i in written)


def _consts_of(closed: Any) -> list[Any]:
    """A closed jaxpr's consts in batched form (memoized: every run of a loop body reuses them)."""
    memo = _CACHE.get(closed)
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


def _gather(x: Any, lanes: np.ndarray, n: int) -> Any:
    """A value of ``n`` lanes at the expanded lanes (an unbatched value stays as it is)."""
    if n <= 1:
        return x
    if isinstance(x, np.ndarray) and x.ndim and x.shape[0] == n:
        return x[lanes]
    if isinstance(x, RefValue) and isinstance(x.value, np.ndarray) and x.value.ndim and x.value.shape[0] == n:
        return RefValue(x.value[lanes], x.memory_space)
    return x


_ERRSTATE_DEPTH = 0


class Interpreter:
    """Evaluates jaxprs over ``n`` grid steps at once.

    ``grid_ids`` holds one int array of shape ``(n,)`` per grid dimension (the
    coordinates of every step, in order); ``grid`` the grid sizes.
    ``groups`` (expanded lanes only): for each lane, which per-iteration pass
    of the reference implementation it belongs to. ``expand``: count loop bodies
    over expanded lanes (default :data:`EXPAND_LOOPS`).
    """

    def __init__(self, n: int, grid: Sequence[int] = (), grid_ids: Sequence[np.ndarray] = (), hook: Hook | None = None,
                 *, groups: np.ndarray | None = None, ngroups: int | None = None, expand: bool | None = None):
        self.n = n
        self.grid = tuple(grid)
        self.grid_ids = tuple(np.asarray(g).reshape(-1) for g in grid_ids)
        self.hook = hook or _NULL_HOOK
        self.groups = groups
        if ngroups is None:
            ngroups = int(groups.max()) + 1 if groups is not None and groups.shape[0] else 0
        #: An upper bound of the group ids (ids need not all occur).
        self.ngroups = ngroups
        self.expand = EXPAND_LOOPS if expand is None else expand

    @property
    def quiet(self) -> bool:
        """No hook: only values are computed (jaxprs run sliced to the outputs asked for)."""
        return self.hook is _NULL_HOOK

    def _quiet(self) -> "Interpreter":
        return Interpreter(self.n, self.grid, self.grid_ids, _NULL_HOOK, expand=self.expand)

    # ----- values -----

    def literal(self, val: Any, aval: Any) -> Any:
        arr = np.asarray(val)
        if arr.dtype == object:
            return UNKNOWN
        return arr.reshape((1,) + tuple(arr.shape))

    def read(self, env: dict, var: Any) -> Any:
        Literal, _ = _jax_types()
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
        if needed is not None and self.quiet and SLICE_QUIET_RUNS:
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
        if any(_aval_size(a) != 1 for a in out_avals) or any(_is_unknown(x) or isinstance(x, RefValue) for x in invals):
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
        if (_is_unknown(content) or _is_unknown(value) or isinstance(value, RefValue) or self.groups is not None
                or _aval_size(eqn.outvars[0].aval) != 1 or not np.all((w == 0) | (w == 1))):
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
            elif _is_unknown(idx) or isinstance(idx, RefValue) or np.ndim(idx) != 1:
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
        if _is_unknown(index):
            children = []
            for br in branches:
                child = Interpreter(self.n, self.grid, self.grid_ids, self.hook.child(), groups=self.groups,
                                    ngroups=self.ngroups, expand=self.expand)
                copies = _copy_refs(operands)
                child.run_closed(br, copies, weight, needed)
                _forget_changed(operands, copies)
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

    # ----- loops -----

    def _loop_writes(self, body: Any, values: Sequence[Any]) -> bool:
        """Whether a loop body (closed) writes a ref whose content is known (``values``: its operands)."""
        return writes_known(body, [UNKNOWN] * len(_open(body).constvars) + list(values))

    def _carries_needed(self, eqn: Any, needed: Sequence[bool] | None, writes: bool) -> tuple[bool, ...]:
        """Carries to simulate: those the caller needs (quiet), or every one that can be known (counting)."""
        if needed is None or not self.quiet:
            needed = [_may_be_known(v) for v in eqn.outvars]
        return loop_carries_needed(eqn, needed, writes)

    def _p_while(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        p = eqn.params
        cond_j, body_j = p["cond_jaxpr"], p["body_jaxpr"]
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]
        writes = self._loop_writes(body_j, list(bconsts) + list(init))
        if self.quiet and writes:
            carries = (True,) * len(init)  # the reference path below runs the whole body
        else:
            carries = self._carries_needed(eqn, needed, writes)
        record = (not self.quiet and self.expand and self.hook.foldable and not writes
                  and self.n <= MAX_LANES_TO_EXPAND and not jaxpr_has(body_j, "run_scoped"))
        trips, final, expansion = self._simulate_while(cond_j, body_j, cconsts, bconsts, init, carries, record)
        if trips is None:
            assumed = self.hook.assumed_trips
            what = "a while loop whose trip count is read from data the model does not know (an array given only " \
                   "as a shape, or a value the kernel computes from its blocks)"
            if assumed is None:
                self.hook.note(f"{what} is counted as one iteration; give the arrays it reads values "
                               "(--shape NAME=DIMS:DTYPE=FILL) or assume a trip count with --loop-trips N")
            else:
                self.hook.note(f"{what} is counted as {assumed} iterations (--loop-trips)")
            operands = list(bconsts) + list(init)
            copies = _copy_refs(operands)
            self.run_closed(body_j, copies, weight if assumed is None else weight * assumed,
                            (False,) * len(init) if self.quiet else None)
            _forget_changed(operands, copies)
            return self._unknown_outs(eqn)
        if self.quiet and not writes:
            return final  # nothing to count, and running the body again changes no known value
        lanes = max(trips.shape[0], 1)
        if expansion is not None:
            self._expanded_body(body_j, bconsts, expansion, weight)
        elif int(trips.max(initial=0)) * lanes <= MAX_UNROLLED_LANE_ITERATIONS:
            self._unrolled_while(cond_j, body_j, cconsts, bconsts, init, weight)
        else:
            trips_w = trips if trips.shape[0] > 1 else float(trips[0])
            self.run_closed(body_j, list(bconsts) + list(init), weight * trips_w)
        return final

    def _unrolled_while(self, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list, weight: Any) -> None:
        """Run the body once per iteration with the real carries, each lane weighted while its loop runs."""
        quiet = self._quiet()
        carry = list(init)
        while True:
            pred = quiet.run_closed(cond_j, _copy_refs(cconsts) + carry, needed=(True,))[0]
            if _is_unknown(pred):
                return
            pred = np.asarray(pred).reshape(-1)
            if not pred.any():
                return
            w = weight * pred if (pred.shape[0] > 1 or not pred.all()) else weight
            new = self.run_closed(body_j, list(bconsts) + carry, w)
            carry = _merge_carry(pred, new, carry)

    def _simulate_while(self, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list,
                        carries: Sequence[bool] | None = None, record: bool = False) -> tuple[Any, Any, Any]:
        """Trip count per lane (None when unknown), the final carries and, when ``record``, the
        :class:`_Expansion` of the iterations that run (None when more than MAX_EXPANDED_LANES lanes
        would run, or a carry is known at some iterations only), without counting work. Only the
        ``carries`` marked (default: all) are computed."""
        if carries is None or not SLICE_QUIET_RUNS:
            carries = (True,) * len(init)
        carries = tuple(carries)
        carry = [c if nd else UNKNOWN for c, nd in zip(init, carries)]
        counted = self._counter_loop(cond_j, body_j, cconsts, bconsts, carry, carries, record) \
            if CLOSED_FORM_LOOPS else None
        if counted is not None:
            return counted
        quiet = self._quiet()
        cconsts, bconsts = _copy_refs(cconsts), _copy_refs(bconsts)
        history: list | None = [] if record else None
        active = 0
        trips = None
        it = 0
        while True:
            pred = quiet.run_closed(cond_j, cconsts + carry, needed=(True,))[0]
            if _is_unknown(pred):
                return None, None, None
            pred = np.asarray(pred).reshape(-1)
            lanes = pred.shape[0]
            trips = np.zeros(lanes, dtype=np.int64) if trips is None else np.broadcast_to(trips, (max(lanes, trips.shape[0]),)).copy()
            if not pred.any():
                return trips, carry, self._from_history(history)
            it += 1
            if lanes * it > MAX_WHILE_LANE_ITERATIONS:
                return None, None, None
            if history is not None:
                active += int(np.count_nonzero(pred)) * (self.n if lanes == 1 else 1)
                if active <= MAX_EXPANDED_LANES:
                    history.append((pred, carry))
                else:
                    history = None
            trips = trips + pred
            new = quiet.run_closed(body_j, bconsts + carry, needed=carries)
            carry = _merge_carry(pred, new, carry)

    def _counter_loop(self, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, carry: list,
                      carries: Sequence[bool], record: bool) -> tuple[Any, Any, Any] | None:
        """:meth:`_simulate_while` in closed form for a counting loop (``fori_loop`` with traced bounds):
        the condition is ``i < u``, the body adds 1 to ``i`` and maps every other simulated carry ``x`` to
        itself or to ``+-x + b`` (e.g. a double buffer's ``slot = 1 - slot``). None when the loop is not of
        that form (or a bound is unknown)."""
        form = _counter_form(cond_j, body_j, carries)
        if form is None:
            return None
        k_i, bound, updates = form
        if any(_is_unknown(carry[j]) or isinstance(carry[j], RefValue) or not _int_like(np.asarray(carry[j]).dtype)
               for j in updates):
            return None
        i0 = carry[k_i]
        kind, where = bound
        u0 = carry[where] if kind == "carry" else cconsts[where] if kind == "const" else where
        if _is_unknown(i0) or _is_unknown(u0) or isinstance(i0, RefValue) or isinstance(u0, RefValue):
            return None
        i0, u0 = np.asarray(i0).reshape(-1), np.asarray(u0).reshape(-1)
        if not (_int_like(i0.dtype) and _int_like(u0.dtype)):
            return None
        lanes = max(i0.shape[0], u0.shape[0])
        trips = np.broadcast_to(np.maximum(u0.astype(np.int64) - i0.astype(np.int64), 0), (lanes,)).copy()
        t_max = int(trips.max(initial=0))
        if lanes * t_max > MAX_WHILE_LANE_ITERATIONS:
            return None, None, None
        if t_max == 0:
            return trips, carry, None
        final = []
        for j, c in enumerate(carry):
            if j in updates:
                x0 = np.broadcast_to(np.asarray(c).reshape(-1), (lanes,))
                final.append(_affine_at(x0, trips, *updates[j]))
            elif isinstance(c, np.ndarray):
                final.append(np.broadcast_to(c, (lanes,) + c.shape[1:]).copy())  # as merged per iteration
            else:
                final.append(c)
        expansion = None
        total = int(trips.sum()) * (self.n if lanes == 1 else 1)
        if record and total <= MAX_EXPANDED_LANES:
            n = self.n
            per = np.broadcast_to(trips, (n,)) if lanes == 1 else trips
            # (iteration, lane) pairs that run, iteration-major and lanes ascending, as the history is.
            it, lane = np.nonzero(np.arange(t_max, dtype=np.int64)[:, None] < per[None, :])
            values = []
            for j, c in enumerate(carry):
                if j in updates:
                    x0 = np.broadcast_to(np.asarray(c).reshape(-1), (n,))[lane]
                    values.append(_affine_at(x0, it, *updates[j]))
                elif isinstance(c, np.ndarray):
                    values.append(np.broadcast_to(c, (n,) + c.shape[1:])[lane])
                else:
                    values.append(c)
            expansion = _Expansion(lanes=lane, iters=it, niter=t_max, carries=values)
        return trips, final, expansion

    def _from_history(self, history: list | None) -> "_Expansion | None":
        """The expansion of a recorded per-iteration history, when every carry is known at every iteration
        or at none (then a single pass sees what each per-iteration pass would) and none is a ref."""
        if not history:
            return None
        ncarry = len(history[0][1])
        for j in range(ncarry):
            known = {not _is_unknown(carry[j]) for _, carry in history}
            if len(known) > 1 or any(isinstance(carry[j], RefValue) for _, carry in history):
                return None
        n = self.n
        lane_parts, iter_parts = [], []
        for k, (pred, _) in enumerate(history):
            idx = np.flatnonzero(np.broadcast_to(pred, (n,)))
            lane_parts.append(idx)
            iter_parts.append(np.full(idx.shape[0], k, dtype=np.int64))
        values = []
        for j in range(ncarry):
            if _is_unknown(history[0][1][j]):
                values.append(UNKNOWN)
                continue
            parts = []
            for (_, c), idx in zip(history, lane_parts):
                v = np.asarray(c[j])
                parts.append(np.broadcast_to(v, (n,) + v.shape[1:])[idx])
            values.append(np.concatenate(parts))
        return _Expansion(lanes=np.concatenate(lane_parts), iters=np.concatenate(iter_parts), niter=len(history),
                          carries=values)

    def _expanded_body(self, body: Any, consts: Sequence[Any], expansion: "_Expansion", weight: Any,
                       extra: Sequence[Any] = ()) -> None:
        """Count the body once over every (lane, iteration) pair that runs, with that iteration's carries
        (``extra``: operands after the carries, e.g. a scan's xs), folded back per lane."""
        n = self.n
        lanes = expansion.lanes
        ids = [np.broadcast_to(g, (n,))[lanes] for g in self.grid_ids]
        parent = self.groups[lanes] if self.groups is not None else np.zeros(lanes.shape[0], dtype=np.int64)
        # Group = (parent group, iteration): the lanes one per-iteration pass would have seen together.
        ngroups = max(self.ngroups, 1) * expansion.niter
        groups = parent * expansion.niter + expansion.iters
        if ngroups > MAX_EXPANDED_LANES:  # keep the per-group sums small: renumber the groups that occur
            groups = np.unique(groups, return_inverse=True)[1].reshape(-1)
            ngroups = int(groups.max()) + 1
        child = Interpreter(int(lanes.shape[0]), self.grid, ids, self.hook.child(), groups=groups, ngroups=ngroups,
                            expand=self.expand)
        w = _gather(np.broadcast_to(np.asarray(weight, dtype=float), (n,)), lanes, n) if n > 1 else weight
        child.run_closed(body, [_gather(c, lanes, n) for c in consts] + list(expansion.carries) + list(extra), w)
        self.hook.fold(child.hook, lanes, n)

    def _p_scan(self, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
        p = eqn.params
        length = int(p["length"])
        nconsts, ncarry = p["num_consts"], p["num_carry"]
        body = p["jaxpr"]
        consts = list(invals[:nconsts])
        carry = list(invals[nconsts : nconsts + ncarry])
        xs = [UNKNOWN] * (len(invals) - nconsts - ncarry)
        nys = len(eqn.outvars) - ncarry
        lanes = max(self.n, 1) if any(isinstance(c, np.ndarray) and c.shape[0] > 1 for c in carry) else 1
        if length * lanes <= MAX_UNROLLED_LANE_ITERATIONS and length <= MAX_UNROLLED_SCAN_LENGTH:
            writes = self._loop_writes(body, consts + carry + xs)
            if not writes:
                carries = self._carries_needed(eqn, needed, writes)
                if self.quiet:
                    return self._simulate_scan(body, consts, carry, xs, length, carries)[0] + [UNKNOWN] * nys
                if (self.expand and self.hook.foldable and not jaxpr_has(body, "run_scoped")
                        and 1 < length and self.n <= MAX_LANES_TO_EXPAND and length * self.n <= MAX_EXPANDED_LANES):
                    final, expansion = self._simulate_scan(body, consts, carry, xs, length, carries, record=True)
                    if expansion is not None:
                        self._expanded_body(body, consts, expansion, weight, xs)
                        return final + [UNKNOWN] * nys
            for _ in range(length):
                outs = self.run_closed(body, consts + carry + xs, weight)
                carry = outs[:ncarry]
            return list(carry) + [UNKNOWN] * nys
        self.run_closed(body, consts + carry + xs, weight * length, (False,) * len(eqn.outvars) if self.quiet else None)
        return self._unknown_outs(eqn)

    def _simulate_scan(self, body: Any, consts: list, carry: list, xs: list, length: int, carries: Sequence[bool],
                       record: bool = False) -> tuple[list, "_Expansion | None"]:
        """The final carries of a scan (only those marked are computed) and, when ``record``, the
        expansion of its iterations over every lane."""
        quiet = self._quiet()
        ncarry = len(carry)
        nout = len(_open(body).outvars)
        if not SLICE_QUIET_RUNS:
            carries = (True,) * ncarry
        needed = tuple(carries) + (False,) * (nout - ncarry)
        carry = [c if nd else UNKNOWN for c, nd in zip(carry, carries)]
        consts = _copy_refs(consts)
        history: list = []
        for _ in range(length):
            if record:
                history.append(carry)
            carry = quiet.run_closed(body, consts + carry + xs, needed=needed)[:ncarry]
        if not record:
            return list(carry), None
        n = self.n
        for j in range(ncarry):
            known = {not _is_unknown(c[j]) for c in history}
            if len(known) > 1 or any(isinstance(c[j], RefValue) for c in history):
                return list(carry), None
        values = []
        for j in range(ncarry):
            if _is_unknown(history[0][j]):
                values.append(UNKNOWN)
                continue
            values.append(np.concatenate([np.broadcast_to(np.asarray(c[j]), (n,) + np.asarray(c[j]).shape[1:])
                                          for c in history]))
        expansion = _Expansion(lanes=np.tile(np.arange(n, dtype=np.int64), length),
                               iters=np.repeat(np.arange(length, dtype=np.int64), n), niter=length, carries=values)
        return list(carry), expansion


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Expansion:
    """The (lane, iteration) pairs of a loop that run, in iteration-major order, and the carries of each."""

    #: Lane (of the interpreter running the loop) of each pair.
    lanes: np.ndarray
    #: Iteration of each pair.
    iters: np.ndarray
    niter: int
    #: Per carry: its value at each pair (batched over the pairs), or UNKNOWN.
    carries: list


def _int_like(dtype: Any) -> bool:
    return np.dtype(dtype).kind in "biu"


def _counter_form(cond_j: Any, body_j: Any, carries: Sequence[bool]) -> tuple[int, tuple[str, Any], dict] | None:
    """(counter carry, bound, updates) when a while loop is ``while i < u: i += 1`` with every other
    simulated carry unchanged or stepped by ``x -> a * x + b`` (a = +-1; ``updates``: carry -> (a, b), the
    counter's (1, 1) included); the bound is ("carry", index), ("const", index into the cond consts) or
    ("literal", value). None otherwise."""
    cond, body = _open(cond_j), _open(body_j)
    memo = _CACHE.get(body)
    key = ("counter", id(cond), tuple(carries))
    hit = memo.get(key)
    if hit is not None and hit[0]() is cond:
        return hit[1]
    result = _find_counter_form(cond, body, tuple(carries))
    memo[key] = (weakref.ref(cond), result)
    return result


def _find_counter_form(cond: Any, body: Any, carries: tuple[bool, ...]) -> tuple[int, tuple[str, Any], dict] | None:
    Literal, Var = _jax_types()
    ncarry = len(body.outvars)
    cn = len(cond.invars) - ncarry
    bn = len(body.invars) - ncarry
    if cn < 0 or bn < 0 or len(carries) != ncarry or jaxpr_writes(cond) or cond.constvars:
        return None
    cs = slice_jaxpr(cond, (True,), False)
    if len(cs.eqns) != 1 or cs.eqns[0][0].primitive.name != "lt" or cond.outvars[0] is not cs.eqns[0][0].outvars[0]:
        return None
    a, b = cs.eqns[0][0].invars
    cvars = list(cond.invars)
    if not isinstance(a, Var) or a not in cvars[cn:]:
        return None
    k_i = cvars.index(a) - cn
    if isinstance(b, Literal):
        bound: tuple[str, Any] = ("literal", np.asarray(b.val).reshape(1))
    elif b in cvars[cn:]:
        bound = ("carry", cvars.index(b) - cn)
    elif b in cvars[:cn]:
        bound = ("const", cvars.index(b))
    else:
        return None
    if bound[0] == "carry" and (bound[1] == k_i or not carries[bound[1]]):
        return None
    bs = slice_jaxpr(body, carries, False)
    bin_ = list(body.invars[bn:])
    # Each simulated carry comes out unchanged or as a * itself + b (a = +-1, b an integer literal), each
    # from one equation of the slice; the counter as itself + 1.
    defined = {e.outvars[0]: e for e, _ in bs.eqns if len(e.outvars) == 1}
    if len(defined) != len(bs.eqns):
        return None
    updates: dict[int, tuple[int, int]] = {}
    used = set()
    for j, nd in enumerate(carries):
        if not nd:
            continue
        out = body.outvars[j]
        if out is bin_[j]:
            if j == k_i:
                return None
            continue
        eqn = defined.get(out)
        step = _affine_step(eqn, bin_[j], Literal) if eqn is not None else None
        if step is None:
            return None
        updates[j] = step
        used.add(out)
    if len(used) != len(bs.eqns) or updates.get(k_i) != (1, 1):
        return None
    if bound[0] == "carry" and bound[1] in updates:
        return None  # the bound moves
    return k_i, bound, updates


def _affine_step(eqn: Any, x: Any, Literal: Any) -> tuple[int, int] | None:
    """(a, b) when ``eqn`` computes a * x + b with a = +-1 and b an integer literal (add / sub)."""
    name = eqn.primitive.name
    if name not in ("add", "sub") or len(eqn.invars) != 2:
        return None
    p, q = eqn.invars
    try:
        dtype = np.dtype(eqn.outvars[0].aval.dtype)
    except TypeError:
        return None
    if dtype.kind not in "iu" or np.dtype(getattr(x.aval, "dtype", dtype)) != dtype or tuple(x.aval.shape) != ():
        return None

    def lit(v: Any) -> int | None:
        if not isinstance(v, Literal):
            return None
        arr = np.asarray(v.val)
        return int(arr) if arr.shape == () and arr.dtype.kind in "iub" else None

    if name == "add":
        if p is x and lit(q) is not None:
            return 1, lit(q)
        if q is x and lit(p) is not None:
            return 1, lit(p)
        return None
    if p is x and lit(q) is not None:
        return 1, -lit(q)
    if q is x and lit(p) is not None:
        return -1, lit(p)
    return None


def _affine_at(x0: np.ndarray, k: np.ndarray, a: int, b: int) -> np.ndarray:
    """a * x + b applied k times to x0 (a = +-1), in x0's integer dtype (wrapping like the loop would)."""
    x = x0.astype(np.int64)
    if a == 1:
        out = x + k * b
    else:
        out = np.where(k % 2 == 0, x, b - x)
    return out.astype(x0.dtype)


_HANDLERS: dict[str, Callable[..., list[Any]]] = {
    name[3:]: fn for name, fn in vars(Interpreter).items() if name.startswith("_p_") and callable(fn)
}


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
    return [RefValue(v.value, v.memory_space, v.track) if isinstance(v, RefValue) else v for v in values]


def _forget_changed(originals: Sequence[Any], copies: Sequence[Any]) -> None:
    """A tracked ref that a branch of unknown choice wrote holds data-dependent content afterwards."""
    for orig, copy in zip(originals, copies):
        if isinstance(orig, RefValue) and orig.track and isinstance(copy, RefValue) and copy.value is not orig.value:
            orig.value = UNKNOWN


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
