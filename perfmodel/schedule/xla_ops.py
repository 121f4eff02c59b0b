"""The XLA ops a traced function runs around its pallas_calls (pads, transposes, casts, reductions, dots),
put on the roofline so that an analysis adds up to what a user times.

Each equation of the traced jaxpr that is not a pallas_call (those are the
schedule model's) and not a layout-only op XLA turns into a bitcast becomes an
op-model cost: a ``dot_general`` as a matmul (MXU passes by its precision and
the chip's dtype rules), anything else as one pass that reads its operands
from HBM and writes its results (one vector op per output element). A value
that one such pass makes for exactly one other (an elementwise chain, a cast
under a reduction or a transpose) stays inside their fusion, as XLA's
producer-consumer fusion keeps it: neither written nor read. Every other value
round-trips HBM: XLA also fuses a value read twice (duplicating cheap
producers) and siblings that share an operand, so the sum is an upper bound
there, and exact for ops that stand alone (a pad or transpose of a kernel's
operand). No per-op launch cost is
added, and scalar-only ops (index arithmetic: scalars in, scalars out) are skipped. Control flow: ``scan`` multiplies its body by its length, ``cond`` takes
its costliest branch, and a ``while`` loop's body is counted once (its trip
count is data) with a note; calls (``pjit``, custom derivatives, remat) are
entered. A transpose that undoes the transpose its operand came from (across a
call boundary too: a wrapper that transposes an argument for a jitted function
that transposes it back) costs nothing, and neither does the first one when
nothing else reads it: XLA's simplifier removes the pair (tokamax's tgmm
wrapper does this to a [131072, 7168] operand; the compiled program has no
transpose).

The compiler's own report of the whole program (``perfmodel inspect
--compile``) is the exact answer where libtpu is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.hw.spec import ChipSpec

#: Layout-only primitives: XLA makes them bitcasts or folds them into their consumer (no HBM pass of their own).
FREE = frozenset({
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "bitcast_convert_type", "iota", "copy_p",
    "stop_gradient", "optimization_barrier", "sharding_constraint", "device_put", "pvary", "name", "random_wrap",
    "random_unwrap", "random_seed", "random_bits", "threefry2x32",
})
#: Primitives modeled elsewhere (the schedule model prices pallas_calls).
MODELED = frozenset({"pallas_call"})


@dataclass(frozen=True, kw_only=True)
class XlaOp:
    """The equations of one primitive outside the pallas_calls, summed."""

    primitive: str
    #: Equations counted (a scan body's count once per iteration).
    count: int
    flops: float
    hbm_bytes: float
    #: Expected time on the roofline (the slowest unit at its achievable rate), summed over the equations.
    expected_s: float
    limiter: str


@dataclass(frozen=True, kw_only=True)
class XlaOps:
    """Every XLA op of a traced function outside its pallas_calls (see the module docstring)."""

    ops: tuple[XlaOp, ...]
    notes: tuple[str, ...] = ()

    @property
    def expected_s(self) -> float:
        return sum(o.expected_s for o in self.ops)


def _nbytes(aval: Any) -> float:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0.0
    try:
        item = np.dtype(dtype).itemsize
    except TypeError:  # PRNG key arrays and other extended dtypes
        item = 4
    return float(math.prod(shape)) * item


def _elements(aval: Any) -> float:
    shape = getattr(aval, "shape", None)
    return float(math.prod(shape)) if shape is not None else 0.0


def _dot_cost(eqn: Any, chip: ChipSpec) -> Any:
    from perfmodel.model.core import OpCost
    from perfmodel.model.dtypes import matmul_path
    from perfmodel.schedule.body import _model_dtype, dot_precision

    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    (lc, _rc), (lb, _rb) = eqn.params["dimension_numbers"]
    k = math.prod(lhs.shape[d] for d in lc)
    out = eqn.outvars[0].aval
    useful = 2.0 * _elements(out) * k
    path = matmul_path(chip, _model_dtype(lhs.dtype), _model_dtype(rhs.dtype), dot_precision(eqn.params))
    return OpCost(name="dot_general", mxu_flops=useful * path.passes, useful_flops=useful, mxu_dtype=path.compute_dtype,
                  hbm_read_bytes=_nbytes(lhs) + _nbytes(rhs), hbm_write_bytes=_nbytes(out), notes=path.notes)


def _pass_cost(eqn: Any, fused: frozenset = frozenset()) -> Any:
    """One HBM pass: read the operands, write the results, one vector op per output element; ``fused``: values
    that stay inside an XLA fusion (neither written by their producer nor read by their consumer)."""
    from perfmodel.model.core import OpCost

    read = sum(_nbytes(v.aval) for v in eqn.invars if hasattr(v, "aval") and not _is_literal(v) and v not in fused)
    write = sum(_nbytes(v.aval) for v in eqn.outvars if v not in fused)
    return OpCost(name=eqn.primitive.name, vpu_ops=sum(_elements(v.aval) for v in eqn.outvars),
                  hbm_read_bytes=read, hbm_write_bytes=write)


def _pass_op(eqn: Any) -> bool:
    """Whether XLA runs ``eqn`` as a loop over its elements it can fuse with its producers and consumers
    (elementwise ops, casts, reductions, transposes): not a dot, a pallas_call, a layout-only op or a call."""
    from jax.extend.core import jaxprs_in_params

    name = eqn.primitive.name
    return (name not in MODELED and name not in FREE and name not in ("dot_general", "scan", "while", "cond")
            and not list(jaxprs_in_params(eqn.params)))


def _fused_values(jaxpr: Any) -> frozenset:
    """Values XLA keeps inside one fusion: the result of a pass op (:func:`_pass_op`) that exactly one other
    pass op of the same jaxpr reads (through layout-only ops: reshapes, broadcasts) and that is not an output:
    XLA's producer-consumer fusion computes it in the consumer's loop, so it never round-trips HBM
    (tokamax's flash attention backward: the f32 casts and product under ``sum(o * do)`` are one pass over o
    and do, not five)."""
    through: dict[Any, Any] = {}  # a layout-only op's result -> the value it is a view of
    views: dict[Any, list] = {}  # the inverse: a value -> the layout-only results that view it
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in FREE and len(eqn.invars) == 1 and len(eqn.outvars) == 1 \
                and not _is_literal(eqn.invars[0]):
            src = through[eqn.outvars[0]] = through.get(eqn.invars[0], eqn.invars[0])
            views.setdefault(src, []).append(eqn.outvars[0])
    readers: dict[Any, list] = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in FREE and eqn.outvars and eqn.outvars[0] in through:
            continue
        for v in eqn.invars:
            if not _is_literal(v):
                readers.setdefault(through.get(v, v), []).append(eqn)
    outputs = {through.get(v, v) for v in jaxpr.outvars if not _is_literal(v)}
    fused: set = set()
    for eqn in jaxpr.eqns:
        if not _pass_op(eqn):
            continue
        for v in eqn.outvars:
            r = readers.get(v, [])
            if v not in outputs and len(r) == 1 and _pass_op(r[0]):
                fused.add(v)
                fused.update(views.get(v, ()))
    return frozenset(fused)


def _is_literal(var: Any) -> bool:
    return type(var).__name__ == "Literal"


@dataclass(frozen=True)
class _Transposed:
    """A transpose equation's output: what it read, its permutation, and what it was charged."""

    source: Any
    permutation: tuple[int, ...]
    cost: Any
    weight: float
    #: Nothing but the call or transpose that undoes it reads the output (so XLA drops it with the pair).
    single_use: bool


def _uses(jaxpr: Any) -> dict[Any, int]:
    """How many times each variable is read in ``jaxpr`` (its equations' operands and its outputs)."""
    counts: dict[Any, int] = {}
    for v in [v for e in jaxpr.eqns for v in e.invars] + list(jaxpr.outvars):
        if not _is_literal(v):
            counts[v] = counts.get(v, 0) + 1
    return counts


class _Counter:
    def __init__(self, chip: ChipSpec) -> None:
        from perfmodel.model.core import evaluate

        self.chip = chip
        self.evaluate = evaluate
        self.by_primitive: dict[str, list[float]] = {}  # name -> [count, flops, bytes, seconds, limiter seconds...]
        self.limiters: dict[str, dict[str, float]] = {}
        self.notes: list[str] = []
        #: A call body's parameter -> the caller's variable it is bound to (to follow a value across calls).
        self.alias: dict[Any, Any] = {}
        self.transposed: dict[Any, _Transposed] = {}

    def add(self, name: str, cost: Any, weight: float) -> None:
        roof = self.evaluate(cost, self.chip)
        row = self.by_primitive.setdefault(name, [0.0, 0.0, 0.0, 0.0])
        row[0] += weight
        row[1] += weight * float(cost.useful_flops)
        row[2] += weight * float(cost.hbm_bytes)
        row[3] += weight * float(roof.expected_s)
        lim = self.limiters.setdefault(name, {})
        lim[str(roof.limiter)] = lim.get(str(roof.limiter), 0.0) + weight * float(roof.expected_s)

    def _resolve(self, var: Any) -> Any:
        while var in self.alias:
            var = self.alias[var]
        return var

    def _transpose(self, eqn: Any, weight: float, uses: dict[Any, int], fused: frozenset) -> None:
        """Charge a transpose unless it undoes the transpose its operand came from (then refund that one too
        when nothing else read it)."""
        perm = tuple(int(p) for p in eqn.params["permutation"])
        src = self._resolve(eqn.invars[0])
        prior = self.transposed.get(src)
        if prior is not None and prior.weight == weight and tuple(prior.permutation[p] for p in perm) == tuple(
                range(len(perm))):
            if prior.single_use and uses.get(eqn.invars[0], 0) == 1:
                self.add("transpose", prior.cost, -prior.weight)  # the first of the pair is not run either
            self.alias[eqn.outvars[0]] = prior.source
            return
        cost = _pass_cost(eqn, fused)
        self.add("transpose", cost, weight)
        self.transposed[eqn.outvars[0]] = _Transposed(source=src, permutation=perm, cost=cost, weight=weight,
                                                      single_use=uses.get(eqn.outvars[0], 0) == 1)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def walk(self, jaxpr: Any, weight: float) -> None:
        from jax.extend.core import jaxprs_in_params

        uses = _uses(jaxpr)
        fused = _fused_values(jaxpr)
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in MODELED or name in FREE:
                continue
            if eqn.outvars and all(not getattr(v.aval, "shape", ()) for v in eqn.outvars + eqn.invars) and not any(
                    (jaxprs_in_params(eqn.params))):
                continue  # scalar work (index arithmetic on the scalar core): no HBM pass
            if name == "scan":
                self.walk(eqn.params["jaxpr"].jaxpr, weight * int(eqn.params["length"]))
                continue
            if name == "while":
                self.note("a while loop's body is counted once (its trip count is data)")
                self.walk(eqn.params["cond_jaxpr"].jaxpr, weight)
                self.walk(eqn.params["body_jaxpr"].jaxpr, weight)
                continue
            if name == "cond":
                self._costliest_branch(eqn.params["branches"], weight)
                continue
            subs = list(jaxprs_in_params(eqn.params))
            if subs:  # pjit, closed_call, custom_jvp/vjp, remat, shard_map...: their bodies run
                for sub in subs:
                    body = getattr(sub, "jaxpr", sub)
                    if len(body.invars) == len(eqn.invars):  # a call: its parameters are the caller's operands
                        self.alias.update((p, a) for p, a in zip(body.invars, eqn.invars) if not _is_literal(a))
                    self.walk(body, weight)
                continue
            if name == "transpose":
                self._transpose(eqn, weight, uses, fused)
                continue
            if name == "dot_general":
                cost = _dot_cost(eqn, self.chip)
                self.add(name, cost, weight)
                for n in cost.notes:
                    self.note(n)
            else:
                self.add(name, _pass_cost(eqn, fused), weight)

    def _costliest_branch(self, branches: Any, weight: float) -> None:
        best: _Counter | None = None
        for branch in branches:
            c = _Counter(self.chip)
            c.walk(branch.jaxpr, weight)
            if best is None or c.total() > best.total():
                best = c
        if best is not None:
            for name, row in best.by_primitive.items():
                mine = self.by_primitive.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                for i, v in enumerate(row):
                    mine[i] += v
                lim = self.limiters.setdefault(name, {})
                for k, v in best.limiters[name].items():
                    lim[k] = lim.get(k, 0.0) + v
            for n in best.notes:
                self.note(n)

    def total(self) -> float:
        return sum(row[3] for row in self.by_primitive.values())

    def result(self) -> XlaOps:
        ops = tuple(
            XlaOp(primitive=name, count=int(round(row[0])), flops=row[1], hbm_bytes=row[2], expected_s=row[3],
                  limiter=max(self.limiters[name].items(), key=lambda kv: kv[1])[0])
            for name, row in sorted(self.by_primitive.items(), key=lambda kv: -kv[1][3])
            if round(row[0]) > 0  # a cancelled transpose pair leaves nothing
        )
        notes = list(self.notes)
        if ops:
            notes.append("XLA ops are counted with producer-consumer fusion only (a value one elementwise op, "
                         "reduction or transpose makes for exactly one other stays on chip; every other value "
                         "round-trips HBM) and without launch costs")
        return XlaOps(ops=ops, notes=tuple(notes))


def xla_ops(closed: Any, chip: ChipSpec) -> XlaOps:
    """The XLA ops of a traced function (a ClosedJaxpr) outside its pallas_calls, on the roofline of the one JAX
    device the function runs on: ``chip`` where the chip is one device, else one of its devices
    (:func:`perfmodel.hw.views.one_device`; a TPU7x JAX device is one TensorCore, half the chip's HBM bandwidth
    and FLOPs). The pallas_calls run on TensorCores either way."""
    from perfmodel.hw.views import one_device

    if chip.cores.jax_devices_per_chip > 1:
        chip = one_device(chip)
    counter = _Counter(chip)
    counter.walk(closed.jaxpr, 1.0)
    return counter.result()
