"""How the schedule interpreter (:mod:`perfmodel.schedule.interpreter`) runs ``while`` and ``scan`` loops.

Loops are counted without a Python pass per iteration where possible:

* only single-element values can ever be known (a vector op evaluates to
  UNKNOWN), so a loop's trip counts and carries are simulated on the *slice*
  of its body that computes them (:func:`perfmodel.schedule.slicing.slice_jaxpr`:
  the equations its condition and its scalar carries depend on, plus writes to
  refs), usually a handful of equations instead of hundreds;
* a counting loop (``fori_loop`` with traced bounds) is simulated in closed
  form (:func:`counter_form`);
* the body's work is then counted in one pass over *expanded lanes*, one per
  (grid step, iteration) pair that runs, each holding that iteration's carries
  (:func:`_expanded_body`), and folded back per grid step
  (:meth:`perfmodel.schedule.values.Hook.fold`). This equals the per-iteration
  pass (kept as the reference, ``LoopOptions(expand_loops=False)``, and used
  for hooks that cannot fold or past ``LoopOptions.max_expanded_lanes``) up to
  float summation order.

:class:`LoopOptions` turns each of these off, which gives the reference the fast paths must match.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from perfmodel.schedule.slicing import (
    jax_types,
    jaxpr_has,
    jaxpr_memo,
    jaxpr_writes,
    loop_carries_needed,
    may_be_known,
    open_jaxpr,
    slice_jaxpr,
    waits_on_own_dmas,
    writes_known,
)
from perfmodel.schedule.values import UNKNOWN, RefValue, copy_refs, forget_changed, is_unknown

if TYPE_CHECKING:  # annotations only: the interpreter imports this module to run loops
    from perfmodel.schedule.interpreter import Interpreter

#: Largest lanes x iterations a ``while`` loop is simulated for before its trip
#: count is declared unknown (keeps a million-step grid under a second).
MAX_WHILE_LANE_ITERATIONS = 20_000_000
#: Loops up to this many lanes x iterations have their body counted iteration by
#: iteration (exact per-iteration predicates); longer ones count the body once
#: (at the initial carry) times the trip count. A while loop whose (step,
#: iteration) pairs number at most ``LoopOptions.max_expanded_lanes`` is always
#: counted exactly (it runs as expanded lanes).
MAX_UNROLLED_LANE_ITERATIONS = 2_000_000
#: Longest scan counted iteration by iteration.
MAX_UNROLLED_SCAN_LENGTH = 4096
#: Loops run by an interpreter with more lanes than this are counted one pass per iteration: each pass
#: already works on arrays long enough that Python's per-equation cost does not matter, and expanding
#: would only copy them.
MAX_LANES_TO_EXPAND = 16384


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopOptions:
    """The interpreter's fast paths (the defaults); each turned off gives the reference implementation they
    must match: one pass over the whole body per loop iteration."""

    #: Count loop bodies over expanded lanes (False: one pass per iteration, the reference implementation).
    expand_loops: bool = True
    #: Quiet runs (trip counts, carries, index maps) compute only the slice of a jaxpr their outputs need.
    slice_quiet_runs: bool = True
    #: Counting loops (``fori_loop`` with traced bounds) are simulated in closed form.
    closed_form_loops: bool = True
    #: Most (grid step, iteration) lanes a loop body is counted over in one pass.
    max_expanded_lanes: int = 1 << 20


def _loop_writes(body: Any, values: Sequence[Any]) -> bool:
    """Whether a loop body (closed) writes a ref whose content is known (``values``: its operands)."""
    return writes_known(body, [UNKNOWN] * len(open_jaxpr(body).constvars) + list(values))


def _carries_needed(interp: Interpreter, eqn: Any, needed: Sequence[bool] | None,
                    writes: bool) -> tuple[bool, ...]:
    """Carries to simulate: those the caller needs (quiet), or every one that can be known (counting)."""
    if needed is None or not interp.quiet:
        needed = [may_be_known(v) for v in eqn.outvars]
    return loop_carries_needed(eqn, needed, writes)


def run_while(interp: Interpreter, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
    """Run a ``while`` equation: its trip count per lane simulated (in closed form for a counting loop), its
    body counted over expanded lanes, once per iteration, or once times the trip count (see the module
    docstring); a trip count that cannot be evaluated counts one iteration (or the hook's ``assumed_trips``)."""
    p = eqn.params
    cond_j, body_j = p["cond_jaxpr"], p["body_jaxpr"]
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]
    writes = _loop_writes(body_j, list(bconsts) + list(init))
    if interp.quiet and writes:
        carries = (True,) * len(init)  # the reference path below runs the whole body
    else:
        carries = _carries_needed(interp, eqn, needed, writes)
    record = (not interp.quiet and interp.loop_options.expand_loops and interp.hook.foldable and not writes
              and interp.n <= MAX_LANES_TO_EXPAND and not jaxpr_has(body_j, "run_scoped"))
    trips, final, expansion = simulate_while(interp, cond_j, body_j, cconsts, bconsts, init, carries, record)
    if trips is None:
        assumed = interp.hook.assumed_trips
        what = "a while loop whose trip count is read from data the model does not know (an array given only " \
               "as a shape, or a value the kernel computes from its blocks)"
        if assumed is None:
            interp.hook.note(f"{what} is counted as one iteration; give the arrays it reads values "
                             "(--shape NAME=DIMS:DTYPE=FILL) or assume a trip count with --loop-trips N")
        else:
            interp.hook.note(f"{what} is counted as {assumed} iterations (--loop-trips)")
        if not interp.quiet and waits_on_own_dmas(body_j):
            interp.hook.dma_waves(weight * (1 if assumed is None else assumed))
        operands = list(bconsts) + list(init)
        copies = copy_refs(operands)
        interp.run_closed(body_j, copies, weight if assumed is None else weight * assumed,
                          (False,) * len(init) if interp.quiet else None)
        forget_changed(operands, copies)
        return [UNKNOWN] * len(eqn.outvars)
    if interp.quiet and not writes:
        return final  # nothing to count, and running the body again changes no known value
    lanes = max(trips.shape[0], 1)
    if not interp.quiet and waits_on_own_dmas(body_j):
        interp.hook.dma_waves(weight * (trips if trips.shape[0] > 1 else float(trips.sum())))
    if expansion is not None:
        _expanded_body(interp, body_j, bconsts, expansion, weight)
    elif int(trips.max(initial=0)) * lanes <= MAX_UNROLLED_LANE_ITERATIONS:
        _unrolled_while(interp, cond_j, body_j, cconsts, bconsts, init, weight)
    else:
        trips_w = trips if trips.shape[0] > 1 else float(trips[0])
        interp.run_closed(body_j, list(bconsts) + list(init), weight * trips_w)
    return final


def _unrolled_while(interp: Interpreter, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list,
                    weight: Any) -> None:
    """Run the body once per iteration with the real carries, each lane weighted while its loop runs."""
    quiet = interp.without_hook()
    carry = list(init)
    while True:
        pred = quiet.run_closed(cond_j, copy_refs(cconsts) + carry, needed=(True,))[0]
        if is_unknown(pred):
            return
        pred = np.asarray(pred).reshape(-1)
        if not pred.any():
            return
        w = weight * pred if (pred.shape[0] > 1 or not pred.all()) else weight
        new = interp.run_closed(body_j, list(bconsts) + carry, w)
        carry = _merge_carry(pred, new, carry)


def simulate_while(interp: Interpreter, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, init: list,
                   carries: Sequence[bool] | None = None, record: bool = False) -> tuple[Any, Any, Any]:
    """Trip count per lane (None when unknown), the final carries and, when ``record``, the
    :class:`_Expansion` of the iterations that run (None when more than ``max_expanded_lanes`` of the
    interpreter's :class:`LoopOptions` would run, or a carry is known at some iterations only), without counting
    work. Only the ``carries`` marked (default: all) are computed."""
    if carries is None or not interp.loop_options.slice_quiet_runs:
        carries = (True,) * len(init)
    carries = tuple(carries)
    carry = [c if nd else UNKNOWN for c, nd in zip(init, carries)]
    counted = _counter_loop(interp, cond_j, body_j, cconsts, bconsts, carry, carries, record) \
        if interp.loop_options.closed_form_loops else None
    if counted is not None:
        return counted
    quiet = interp.without_hook()
    cconsts, bconsts = copy_refs(cconsts), copy_refs(bconsts)
    history: list | None = [] if record else None
    active = 0
    trips = None
    it = 0
    while True:
        pred = quiet.run_closed(cond_j, cconsts + carry, needed=(True,))[0]
        if is_unknown(pred):
            return None, None, None
        pred = np.asarray(pred).reshape(-1)
        lanes = pred.shape[0]
        trips = (np.zeros(lanes, dtype=np.int64) if trips is None
                 else np.broadcast_to(trips, (max(lanes, trips.shape[0]),)).copy())
        if not pred.any():
            return trips, carry, _from_history(interp, history)
        it += 1
        if lanes * it > MAX_WHILE_LANE_ITERATIONS:
            return None, None, None
        if history is not None:
            active += int(np.count_nonzero(pred)) * (interp.n if lanes == 1 else 1)
            if active <= interp.loop_options.max_expanded_lanes:
                history.append((pred, carry))
            else:
                history = None
        trips = trips + pred
        new = quiet.run_closed(body_j, bconsts + carry, needed=carries)
        carry = _merge_carry(pred, new, carry)


def _counter_loop(interp: Interpreter, cond_j: Any, body_j: Any, cconsts: list, bconsts: list, carry: list,
                  carries: Sequence[bool], record: bool) -> tuple[Any, Any, Any] | None:
    """:func:`simulate_while` in closed form for a counting loop (``fori_loop`` with traced bounds):
    the condition is ``i < u``, the body adds 1 to ``i`` and maps every other simulated carry ``x`` to
    itself or to ``+-x + b`` (e.g. a double buffer's ``slot = 1 - slot``). None when the loop is not of
    that form (or a bound is unknown)."""
    form = counter_form(cond_j, body_j, carries)
    if form is None:
        return None
    k_i, bound, updates = form
    if any(is_unknown(carry[j]) or isinstance(carry[j], RefValue) or not _int_like(np.asarray(carry[j]).dtype)
           for j in updates):
        return None
    i0 = carry[k_i]
    kind, where = bound
    u0 = carry[where] if kind == "carry" else cconsts[where] if kind == "const" else where
    if is_unknown(i0) or is_unknown(u0) or isinstance(i0, RefValue) or isinstance(u0, RefValue):
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
    total = int(trips.sum()) * (interp.n if lanes == 1 else 1)
    if record and total <= interp.loop_options.max_expanded_lanes:
        n = interp.n
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


def _from_history(interp: Interpreter, history: list | None) -> "_Expansion | None":
    """The expansion of a recorded per-iteration history, when every carry is known at every iteration
    or at none (then a single pass sees what each per-iteration pass would) and none is a ref."""
    if not history:
        return None
    ncarry = len(history[0][1])
    for j in range(ncarry):
        known = {not is_unknown(carry[j]) for _, carry in history}
        if len(known) > 1 or any(isinstance(carry[j], RefValue) for _, carry in history):
            return None
    n = interp.n
    lane_parts, iter_parts = [], []
    for k, (pred, _) in enumerate(history):
        idx = np.flatnonzero(np.broadcast_to(pred, (n,)))
        lane_parts.append(idx)
        iter_parts.append(np.full(idx.shape[0], k, dtype=np.int64))
    values = []
    for j in range(ncarry):
        if is_unknown(history[0][1][j]):
            values.append(UNKNOWN)
            continue
        parts = []
        for (_, c), idx in zip(history, lane_parts):
            v = np.asarray(c[j])
            parts.append(np.broadcast_to(v, (n,) + v.shape[1:])[idx])
        values.append(np.concatenate(parts))
    return _Expansion(lanes=np.concatenate(lane_parts), iters=np.concatenate(iter_parts), niter=len(history),
                      carries=values)


def _expanded_body(interp: Interpreter, body: Any, consts: Sequence[Any], expansion: "_Expansion", weight: Any,
                   extra: Sequence[Any] = ()) -> None:
    """Count the body once over every (lane, iteration) pair that runs, with that iteration's carries
    (``extra``: operands after the carries, e.g. a scan's xs), folded back per lane."""
    n = interp.n
    lanes = expansion.lanes
    ids = [np.broadcast_to(g, (n,))[lanes] for g in interp.grid_ids]
    parent = interp.groups[lanes] if interp.groups is not None else np.zeros(lanes.shape[0], dtype=np.int64)
    # Group = (parent group, iteration): the lanes one per-iteration pass would have seen together.
    ngroups = max(interp.ngroups, 1) * expansion.niter
    groups = parent * expansion.niter + expansion.iters
    if ngroups > interp.loop_options.max_expanded_lanes:  # keep the per-group sums small: renumber those that occur
        groups = np.unique(groups, return_inverse=True)[1].reshape(-1)
        ngroups = int(groups.max()) + 1
    child = interp.spawn(int(lanes.shape[0]), ids, interp.hook.child(), groups=groups, ngroups=ngroups)
    w = _gather(np.broadcast_to(np.asarray(weight, dtype=float), (n,)), lanes, n) if n > 1 else weight
    child.run_closed(body, [_gather(c, lanes, n) for c in consts] + list(expansion.carries) + list(extra), w)
    interp.hook.fold(child.hook, lanes, n)


def run_scan(interp: Interpreter, eqn: Any, invals: list[Any], weight: Any, needed: Any = None) -> list[Any]:
    """Run a ``scan`` equation (a static loop): its body counted over expanded lanes or once per iteration
    when the scan is short enough, else once times its length with its carries unknown afterwards."""
    p = eqn.params
    length = int(p["length"])
    nconsts, ncarry = p["num_consts"], p["num_carry"]
    body = p["jaxpr"]
    consts = list(invals[:nconsts])
    carry = list(invals[nconsts : nconsts + ncarry])
    xs = [UNKNOWN] * (len(invals) - nconsts - ncarry)
    nys = len(eqn.outvars) - ncarry
    lanes = max(interp.n, 1) if any(isinstance(c, np.ndarray) and c.shape[0] > 1 for c in carry) else 1
    if not interp.quiet and waits_on_own_dmas(body):
        interp.hook.dma_waves(weight * length)
    if length * lanes <= MAX_UNROLLED_LANE_ITERATIONS and length <= MAX_UNROLLED_SCAN_LENGTH:
        writes = _loop_writes(body, consts + carry + xs)
        if not writes:
            carries = _carries_needed(interp, eqn, needed, writes)
            if interp.quiet:
                return _simulate_scan(interp, body, consts, carry, xs, length, carries)[0] + [UNKNOWN] * nys
            if (interp.loop_options.expand_loops and interp.hook.foldable and not jaxpr_has(body, "run_scoped")
                    and 1 < length and interp.n <= MAX_LANES_TO_EXPAND
                    and length * interp.n <= interp.loop_options.max_expanded_lanes):
                final, expansion = _simulate_scan(interp, body, consts, carry, xs, length, carries, record=True)
                if expansion is not None:
                    _expanded_body(interp, body, consts, expansion, weight, xs)
                    return final + [UNKNOWN] * nys
        for _ in range(length):
            outs = interp.run_closed(body, consts + carry + xs, weight)
            carry = outs[:ncarry]
        return list(carry) + [UNKNOWN] * nys
    interp.run_closed(body, consts + carry + xs, weight * length,
                      (False,) * len(eqn.outvars) if interp.quiet else None)
    return [UNKNOWN] * len(eqn.outvars)


def _simulate_scan(interp: Interpreter, body: Any, consts: list, carry: list, xs: list, length: int,
                   carries: Sequence[bool], record: bool = False) -> tuple[list, "_Expansion | None"]:
    """The final carries of a scan (only those marked are computed) and, when ``record``, the
    expansion of its iterations over every lane."""
    quiet = interp.without_hook()
    ncarry = len(carry)
    nout = len(open_jaxpr(body).outvars)
    if not interp.loop_options.slice_quiet_runs:
        carries = (True,) * ncarry
    needed = tuple(carries) + (False,) * (nout - ncarry)
    carry = [c if nd else UNKNOWN for c, nd in zip(carry, carries)]
    consts = copy_refs(consts)
    history: list = []
    for _ in range(length):
        if record:
            history.append(carry)
        carry = quiet.run_closed(body, consts + carry + xs, needed=needed)[:ncarry]
    if not record:
        return list(carry), None
    n = interp.n
    for j in range(ncarry):
        known = {not is_unknown(c[j]) for c in history}
        if len(known) > 1 or any(isinstance(c[j], RefValue) for c in history):
            return list(carry), None
    values = []
    for j in range(ncarry):
        if is_unknown(history[0][j]):
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


def counter_form(cond_j: Any, body_j: Any, carries: Sequence[bool]) -> tuple[int, tuple[str, Any], dict] | None:
    """(counter carry, bound, updates) when a while loop is ``while i < u: i += 1`` with every other
    simulated carry unchanged or stepped by ``x -> a * x + b`` (a = +-1; ``updates``: carry -> (a, b), the
    counter's (1, 1) included); the bound is ("carry", index), ("const", index into the cond consts) or
    ("literal", value). None otherwise."""
    cond, body = open_jaxpr(cond_j), open_jaxpr(body_j)
    memo = jaxpr_memo(body)
    key = ("counter", id(cond), tuple(carries))
    hit = memo.get(key)
    if hit is not None and hit[0]() is cond:
        return hit[1]
    result = _find_counter_form(cond, body, tuple(carries))
    memo[key] = (weakref.ref(cond), result)
    return result


def _find_counter_form(cond: Any, body: Any,
                       carries: tuple[bool, ...]) -> tuple[int, tuple[str, Any], dict] | None:
    Literal, Var = jax_types()
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


def _merge_carry(pred: np.ndarray, new: Sequence[Any], old: Sequence[Any]) -> list[Any]:
    """New carries where the loop ran (pred), old ones elsewhere."""
    merged = []
    for o, nv in zip(old, new):
        if isinstance(nv, RefValue) or isinstance(o, RefValue):
            merged.append(nv)
            continue
        if is_unknown(nv) or is_unknown(o):
            merged.append(UNKNOWN)
            continue
        nv, o = np.asarray(nv), np.asarray(o)
        mm = pred.reshape((-1,) + (1,) * (nv.ndim - 1))
        merged.append(np.where(mm, nv, o))
    return merged


def _gather(x: Any, lanes: np.ndarray, n: int) -> Any:
    """A value of ``n`` lanes at the expanded lanes (an unbatched value stays as it is)."""
    if n <= 1:
        return x
    if isinstance(x, np.ndarray) and x.ndim and x.shape[0] == n:
        return x[lanes]
    if isinstance(x, RefValue) and isinstance(x.value, np.ndarray) and x.value.ndim and x.value.shape[0] == n:
        return RefValue(x.value[lanes], x.memory_space)
    return x
