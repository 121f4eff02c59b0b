"""Which predicated regions of a compiled loop body can run in the same iteration (no jax, no libtpu).

A predicated region runs when the forward branch in front of it is not taken. The compiler builds a branch's
predicate in scalar code: ``scmp.<cond>.<s32|u32>`` of a scalar register against an immediate or another register,
combined with ``pnand``, ``por``, ``pneg`` and ``pmov``. A kernel with a masked and an unmasked path (splash / flash
attention: one path for the diagonal blocks, one for the full blocks) branches on the same scalar (the block's mask
kind) compared with different immediates, so no iteration runs both paths.

:func:`most_run` reads those predicates: a compare of one scalar (through ``smov`` copies) against immediates is
decided by the scalar's value, tried at every immediate and its neighbours; anything else (two registers compared,
a predicate or scalar defined outside the text or more than once, an address operand) is a free boolean. The most
bundles an iteration can run is the maximum, over those assignments, of the regions that run. When the assignments
are too many it gives up and every region counts, as if none excluded another.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

_DEF = re.compile(r"^(%[ps]\w+)\s*=\s*([a-z_][\w.]*)\s*(.*)$")
_CMP = re.compile(r"^scmp\.(eq|ne|lt|le|gt|ge)\.(s32|u32)\b")
_IMM = re.compile(r"^-?\d+$")
#: Give up past this many assignments of the scalars and free booleans.
MAX_ASSIGNMENTS = 1 << 14
#: Give up on a predicate whose expression nests deeper than this.
MAX_DEPTH = 48

_U32 = 1 << 32
#: The scalar compares' conditions (looked up once per evaluation, not rebuilt).
_CONDS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
          "ge": operator.ge}


@dataclass(frozen=True)
class Cmp:
    cond: str
    unsigned: bool
    var: str
    imm: int


@dataclass(frozen=True)
class Free:
    name: str


@dataclass(frozen=True)
class Op:
    """``not`` (one arg), ``and`` / ``or`` (two)."""

    kind: str
    args: tuple


Expr = Cmp | Free | Op | bool


def definitions(codes: Iterable[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Register -> (opcode, operands) of every predicate and scalar defined exactly once in ``codes`` (bundle
    texts without their comments, ``Bundle.code``); one defined twice maps to ("", ())."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for code in codes:
        body = code.strip()
        body = body[1:] if body.startswith("{") else body
        body = body[:-1] if body.endswith("}") else body
        for ins in body.split(";;"):
            m = _DEF.match(ins.strip())
            if not m:
                continue
            reg, opcode, rest = m.groups()
            if reg in out:
                out[reg] = ("", ())
                continue
            out[reg] = (opcode, tuple(a.strip() for a in rest.split(",") if a.strip()))
    return out


class _Reader:
    def __init__(self, defs: dict[str, tuple[str, tuple[str, ...]]]):
        self.defs = defs
        self.memo: dict[str, Expr] = {}

    def scalar(self, reg: str) -> str | int:
        """The canonical scalar behind ``reg``'s ``smov`` copies, or its immediate."""
        for _ in range(MAX_DEPTH):
            opcode, args = self.defs.get(reg, ("", ()))
            if opcode != "smov" or len(args) != 1:
                return reg
            if _IMM.match(args[0]):
                return int(args[0])
            reg = args[0]
        return reg

    def predicate(self, reg: str, depth: int = 0) -> Expr:
        if reg in self.memo:
            return self.memo[reg]
        e = self._read(reg, depth)
        self.memo[reg] = e
        return e

    def _read(self, reg: str, depth: int) -> Expr:
        opcode, args = self.defs.get(reg, ("", ()))
        if depth > MAX_DEPTH or not opcode:
            return Free(reg)
        if opcode in ("pnand", "por") and len(args) == 2 and all(a.startswith("%p") for a in args):
            a, b = (self.predicate(x, depth + 1) for x in args)
            return Op("not", (Op("and", (a, b)),)) if opcode == "pnand" else Op("or", (a, b))
        if opcode in ("pneg", "pmov") and len(args) == 1 and args[0].startswith("%p"):
            a = self.predicate(args[0], depth + 1)
            return Op("not", (a,)) if opcode == "pneg" else a
        m = _CMP.match(opcode)
        if m and len(args) == 2:
            lhs = self.scalar(args[0]) if args[0].startswith("%s") else None
            rhs = int(args[1]) if _IMM.match(args[1]) else (self.scalar(args[1]) if args[1].startswith("%s") else None)
            if isinstance(lhs, str) and isinstance(rhs, int):
                return Cmp(m.group(1), m.group(2) == "u32", lhs, rhs)
            if isinstance(lhs, int) and isinstance(rhs, int):
                return _compare(m.group(1), m.group(2) == "u32", lhs, rhs)
        return Free(reg)


def _compare(cond: str, unsigned: bool, a: int, b: int) -> bool:
    if unsigned:
        a, b = a % _U32, b % _U32
    return _CONDS[cond](a, b)


def _atoms(e: Expr, cmps: set[Cmp], frees: set[str]) -> None:
    if isinstance(e, Cmp):
        cmps.add(e)
    elif isinstance(e, Free):
        frees.add(e.name)
    elif isinstance(e, Op):
        for a in e.args:
            _atoms(a, cmps, frees)


def _eval(e: Expr, values: dict[str, int], free: dict[str, bool]) -> bool:
    if isinstance(e, bool):
        return e
    if isinstance(e, Cmp):
        return _compare(e.cond, e.unsigned, values[e.var], e.imm)
    if isinstance(e, Free):
        return free[e.name]
    if e.kind == "not":
        return not _eval(e.args[0], values, free)
    if e.kind == "and":
        return _eval(e.args[0], values, free) and _eval(e.args[1], values, free)
    return _eval(e.args[0], values, free) or _eval(e.args[1], values, free)


def run_condition(branch: tuple[bool, str] | None, reader: _Reader, name: str) -> Expr:
    """When a region runs: its branch ``(negated, predicate)`` not taken; an unconditional branch (None) jumps over
    a region reached from elsewhere (an if/else), which is a free boolean ``name``."""
    if branch is None:
        return Free(name)
    negated, pred = branch
    p = reader.predicate(pred)
    return p if negated else Op("not", (p,))


def most_run(regions: Sequence[tuple[int, tuple[bool, str] | None]], codes: Iterable[str]) -> int:
    """The most of ``regions`` (bundles, branch) one iteration can run, given the predicate definitions in
    ``codes`` (see :func:`definitions`); their sum when the conditions cannot be decided in
    :data:`MAX_ASSIGNMENTS` assignments."""
    total = sum(b for b, _ in regions)
    if len(regions) < 2:
        return total
    reader = _Reader(definitions(codes))
    conds = [run_condition(br, reader, f"region{i}") for i, (_, br) in enumerate(regions)]
    cmps: set[Cmp] = set()
    frees: set[str] = set()
    for c in conds:
        _atoms(c, cmps, frees)
    candidates: dict[str, set[int]] = {}
    for c in cmps:
        candidates.setdefault(c.var, set()).update((c.imm - 1, c.imm, c.imm + 1))
    names = sorted(candidates)
    free_names = sorted(frees)
    count = 1
    for n in names:
        count *= len(candidates[n])
    count <<= len(free_names)
    if count > MAX_ASSIGNMENTS:
        return total
    best = 0
    for vals in itertools.product(*(sorted(candidates[n]) for n in names)):
        values = dict(zip(names, vals))
        for bits in itertools.product((False, True), repeat=len(free_names)):
            free = dict(zip(free_names, bits))
            best = max(best, sum(b for (b, _), c in zip(regions, conds) if _eval(c, values, free)))
            if best == total:
                return total
    return best


__all__ = ["MAX_ASSIGNMENTS", "definitions", "most_run", "run_condition"]
