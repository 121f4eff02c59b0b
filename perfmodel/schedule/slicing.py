"""Inspection and slicing of the jaxprs the schedule interpreter runs.

Which refs a jaxpr writes (:func:`jaxpr_writes`, :func:`written_inputs`, :func:`writes_known`), whether a
primitive runs inside it (:func:`jaxpr_has`), and the backward slice of the equations that compute the outputs
a caller needs (:func:`slice_jaxpr`, :func:`loop_carries_needed`). Only single-element values can ever be known
to the interpreter (a vector op evaluates to UNKNOWN), so a quiet run (trip counts, carries, index maps) runs
just its slice, usually a handful of equations instead of hundreds. Results are memoized per jaxpr
(:func:`jaxpr_memo`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Sequence

from perfmodel.schedule.values import RefValue, aval_size, is_unknown

#: Primitives that run a sub-jaxpr once with the same operands.
CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")

#: Primitives that change a ref's content (the interpreter then forgets it).
_WRITES = frozenset({"swap", "addupdate"})

_Literal: Any = None
_Var: Any = None


def jax_types() -> tuple[Any, Any]:
    """jax's (Literal, Var) classes, imported on first use."""
    global _Literal, _Var
    if _Literal is None:
        from jax.extend.core import Literal, Var

        _Literal, _Var = Literal, Var
    return _Literal, _Var


def _kind(eqn: Any) -> str:
    """How the interpreter runs an equation (mirrors the dispatch of ``Interpreter.eqn``)."""
    name = eqn.primitive.name
    if name in _WRITES:
        return "write"
    if name in ("cond", "while", "scan", "run_scoped"):
        return name
    if name == "custom_jvp_call" or (name != "pallas_call" and any(p in eqn.params for p in CALL_PARAMS)):
        return "call"
    return "other"


def _call_jaxpr(eqn: Any) -> tuple[Any, bool] | None:
    """(sub-jaxpr, closed?) that the interpreter runs for a call-like equation."""
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


def open_jaxpr(j: Any) -> Any:
    """The open jaxpr of a closed one (an open jaxpr as it is)."""
    return getattr(j, "jaxpr", j)


def may_be_known(var: Any) -> bool:
    """Only single-element values (and refs) can be known: every operation with a vector result evaluates
    to UNKNOWN, and no operation the interpreter computes derives a single element from a vector."""
    aval = getattr(var, "aval", None)
    if aval is None or hasattr(aval, "inner_aval") or not hasattr(aval, "dtype"):
        return True  # refs, tokens, unfamiliar types: keep
    return aval_size(aval) == 1


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


def jaxpr_memo(jaxpr: Any) -> dict:
    """The memo dict of ``jaxpr`` (kept while the jaxpr lives)."""
    return _CACHE.get(jaxpr)


def jaxpr_writes(jaxpr: Any) -> bool:
    """Whether running ``jaxpr`` can change a ref's content (a swap / addupdate anywhere inside)."""
    jaxpr = open_jaxpr(jaxpr)
    memo = jaxpr_memo(jaxpr)
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
    jaxpr = open_jaxpr(jaxpr)
    memo = jaxpr_memo(jaxpr)
    key = ("has", primitive)
    if key not in memo:
        memo[key] = any(e.primitive.name == primitive or any(jaxpr_has(s, primitive) for s in _subs(e))
                        for e in jaxpr.eqns)
    return memo[key]


def waits_on_own_dmas(jaxpr: Any) -> bool:
    """Whether one pass of a loop body ``jaxpr`` both starts and waits on DMAs, outside any loop of its own
    (a nested loop's iterations are its own): one iteration of a software pipeline."""
    jaxpr = open_jaxpr(jaxpr)
    memo = jaxpr_memo(jaxpr)
    if "pipelined" not in memo:
        seen: set[str] = set()

        def walk(j: Any) -> None:
            for e in open_jaxpr(j).eqns:
                name = e.primitive.name
                if name in ("dma_start", "dma_wait"):
                    seen.add(name)
                elif name not in ("while", "scan"):
                    for sub in _subs(e):
                        walk(sub)

        walk(jaxpr)
        memo["pipelined"] = seen == {"dma_start", "dma_wait"}
    return memo["pipelined"]


def written_inputs(jaxpr: Any) -> frozenset:
    """Positions of ``jaxpr``'s (constvars + invars) that it writes to (refs passed in)."""
    jaxpr = open_jaxpr(jaxpr)
    memo = jaxpr_memo(jaxpr)
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
        sub = open_jaxpr(sub)
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
    _, Var = jax_types()
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

    Kept: equations with a needed output that can be known (:func:`may_be_known`) and, with ``writes``,
    every equation that writes to a ref (a later read must see the ref as changed; a write needs only its
    ref). Without ``writes`` (no ref whose content is known is written) writes are dropped: writing a ref
    the interpreter does not know changes nothing. Sub-jaxprs (cond branches, loop bodies, calls) are
    sliced in turn when run.
    """
    jaxpr = open_jaxpr(jaxpr)
    key = ("slice", tuple(bool(x) for x in needed), writes)
    memo = jaxpr_memo(jaxpr)
    hit = memo.get(key)
    if hit is not None:
        return hit
    _, Var = jax_types()
    live: set = {v for v, nd in zip(jaxpr.outvars, needed) if nd and isinstance(v, Var) and may_be_known(v)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        outs = tuple(isinstance(v, Var) and v in live for v in eqn.outvars)
        if not any(outs) and not (writes and _eqn_writes(eqn)):
            continue
        kept.append((eqn, outs))
        for v in _inputs_needed(eqn, outs, writes):
            if isinstance(v, Var) and may_be_known(v):
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
    memo = jaxpr_memo(open_jaxpr(p["body_jaxpr"] if eqn.primitive.name == "while" else p["jaxpr"]))
    key = ("carries", eqn.primitive.name, tuple(bool(x) for x in outs), writes)
    if key in memo:
        return memo[key]
    if eqn.primitive.name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        body = open_jaxpr(p["body_jaxpr"])
        ncarry = len(body.outvars)
        cond = slice_jaxpr(p["cond_jaxpr"], (True,), writes)
        need = _or(list(outs)[:ncarry], cond.invars[cn:])
        skip = bn
    else:
        body = open_jaxpr(p["jaxpr"])
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
        body = open_jaxpr(p["jaxpr"])
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
                                 and not is_unknown(values[i].value) for i in written)
