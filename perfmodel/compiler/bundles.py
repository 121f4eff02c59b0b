"""Read the TPU compiler's final VLIW schedule of one op (no jax, no libtpu).

libtpu writes, per HLO op, ``*-final_bundles.txt`` (one VLIW bundle per
address, with control markers: ``LB`` loop body start, ``PF`` predicated-region
fallthrough, ...; ``>`` marks bundles inside a loop; comments name the regions
each bundle starts or ends) and ``*-final_hlo-static-per-bundle-utilization.txt``
(slot capacity of each unit, then one row of slot use per bundle, in bundle
order). This module turns them into a :class:`Schedule` and summarizes one
loop body as :class:`LoopStats`:

* loops are backward branches (``sbr.rel ... target = $regionN`` where region
  N starts at or before the branch); the trip count comes from the compare
  the compiler marks ``loop exit test`` when its bound is a literal (the index
  is assumed to start at 0 and step by 1, as the compiler's grid loops do);
* predicated regions are forward branches over a range of bundles inside the
  body (e.g. a ``pl.when`` on the first reduction step, a masked path): their
  bundles run on some steps only, and regions whose branch predicates cannot
  hold together (a masked and an unmasked path) never run in one iteration
  (:mod:`perfmodel.compiler.predicates`);
* an inner loop's bundles count once per trip (``weighted_bundles``);
* DMA issues (``dma.*``), DMA waits (``dma.done.wait``), bounds-check halts
  (``shalt.err``), vector spills/fills (the utilization file's ``VSTORE:SPILL``
  and ``VLOAD:FILL`` columns) and scalar spills/fills (``sst``/``sld`` of a
  ``*_spill`` allocation) are counted over the body.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from perfmodel.compiler.predicates import most_run

_BUNDLE = re.compile(r"^\s*(0x[0-9a-fA-F]+|[0-9]+)\s+(?:([A-Z]{2}):|:)\s*(>*)\s*\{")
_OPCODE = re.compile(r"=\s+([a-z_][\w.]*)")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_TARGET = re.compile(r"sbr\.rel\b\s*(?:\((!?)(%p\w+)\))?[^;]*?target\s*=\s*\$region(\d+)")
_REGION_START = re.compile(r"Start(?:/End empty)? region (\d+)\b")
_EXIT_TEST = re.compile(r"scmp\.\w+\.s32\.\w+\s+%\w+,\s*(-?\d+|%\w+)\s*/\*\s*loop exit test")
_MXU = re.compile(r"\.mxu(\d+)\b")
#: An instruction handed to a cross-lane unit (vxpose / vbcast / vperm / vrot ... ``.xluN``); pops (``vpop``)
#: take results back and are not counted.
_XLU = re.compile(r"\.xlu(\d+)\b")
#: The compiler's note on a software-pipelined loop's iteration counter: "iteration index, stage = N".
_STAGE = re.compile(r"iteration index, stage = (\d+)")

#: A forward branch skipping at least this share of a loop body is the step guard, not a predicated path.
GUARD_SHARE = 0.75


@dataclass(frozen=True)
class Bundle:
    index: int
    address: int
    #: Control marker ("LB", "PF", ...) or "".
    marker: str
    #: Loop nesting depth the compiler marks with '>' (0 outside loops).
    depth: int
    #: Opcodes of the bundle's instructions (comments removed).
    ops: tuple[str, ...]
    text: str
    #: ``text`` without its comments (what the instructions are read from).
    code: str = ""


@dataclass(frozen=True)
class Loop:
    start: int
    #: Index of the backward branch (the body is start..end inclusive).
    end: int
    #: Trip count from the loop-exit test, None when the bound is a register (data-dependent).
    trip_count: int | None
    #: The deepest software-pipeline stage the compiler notes in the body, nested loops aside (0: not
    #: modulo-scheduled). A loop of S + 1 stages runs its work items in trips = items + S iterations: the
    #: first S fill the pipeline, the last S drain it, so a stage's work runs trips - S times.
    stages: int = 0

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1

    def guarded_trips(self) -> int | None:
        """Iterations that run the body's step guard (one stage's work): trips less the fill/drain ones."""
        if not self.trip_count or self.trip_count <= 0:
            return None
        return guarded_trips(self.trip_count, self.stages)


def guarded_trips(trips: int, stages: int) -> int:
    """Of ``trips`` iterations of a loop pipelined ``stages`` deep, those that run its step guard: the other
    ``stages`` only fill or drain the pipeline (a loop with no stage notes, or fewer trips than stages, runs it on
    every trip)."""
    return trips - stages if 0 < stages < trips else trips


@dataclass(frozen=True)
class Region:
    """Bundles a forward branch can skip: first..last inclusive."""

    branch: int
    first: int
    last: int
    #: The branch's predicate (negated, register); None for an unconditional branch.
    predicate: tuple[bool, str] | None = None

    @property
    def bundles(self) -> int:
        return self.last - self.first + 1


@dataclass
class Schedule:
    bundles: list[Bundle]
    loops: list[Loop]
    regions: list[Region]
    #: Unit name -> slots per bundle (from the utilization file; empty if absent).
    capacity: dict[str, int] = field(default_factory=dict)
    #: One row per bundle, in the capacity's unit order.
    utilization: list[tuple[int, ...]] = field(default_factory=list)

    def top_loops(self) -> list[Loop]:
        """Loops not nested in another loop, in program order."""
        return [lp for lp in self.loops
                if not any(o is not lp and o.start <= lp.start and lp.end <= o.end for o in self.loops)]

    def mxus(self) -> int:
        """Distinct MXUs the program issues to (``.mxuN`` suffixes)."""
        found = set()
        for b in self.bundles:
            for op in b.ops:
                m = _MXU.search(op)
                if m:
                    found.add(int(m.group(1)))
        return len(found)


def parse_bundles(text: str) -> list[Bundle]:
    """Bundles of a ``final_bundles.txt`` (instructions may span lines inside comments)."""
    chunks: list[tuple[int, str, int, list[str]]] = []
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m:
            addr = int(m.group(1), 16) if m.group(1).lower().startswith("0x") else int(m.group(1))
            chunks.append((addr, m.group(2) or "", len(m.group(3)), [line[m.end() - 1:]]))
        elif chunks:
            chunks[-1][3].append(line)
    out = []
    for i, (addr, marker, depth, lines) in enumerate(chunks):
        raw = "\n".join(lines)
        code = _COMMENT.sub("", raw)
        out.append(Bundle(index=i, address=addr, marker=marker, depth=depth, ops=tuple(_OPCODE.findall(code)),
                          text=raw, code=code))
    return out


def parse_utilization(text: str) -> tuple[dict[str, int], list[tuple[int, ...]]]:
    """(unit -> capacity, per-bundle rows) of a ``*-per-bundle-utilization.txt``."""
    lines = [ln.strip() for ln in text.splitlines()]
    try:
        i = next(k for k, ln in enumerate(lines) if ln.startswith("== CAPAC"))
    except StopIteration:
        return {}, []
    units = [u.strip() for u in lines[i + 1].split(",")]
    caps = [int(x) for x in lines[i + 2].split()]
    rows = []
    for ln in lines[i + 3:]:
        if not ln or ln.startswith("=="):
            continue
        parts = ln.split()
        if len(parts) == len(units) and all(p.isdigit() for p in parts):
            rows.append(tuple(int(p) for p in parts))
    return dict(zip(units, caps)), rows


def build_schedule(bundles_text: str, utilization_text: str | None = None) -> Schedule:
    bundles = parse_bundles(bundles_text)
    starts: dict[int, int] = {}
    for b in bundles:
        for n in _REGION_START.findall(b.text):
            starts.setdefault(int(n), b.index)
    loops, regions = [], []
    for b in bundles:
        for neg, pred, n in _TARGET.findall(b.code):
            target = starts.get(int(n))
            if target is None:
                continue
            if target <= b.index:
                loops.append(Loop(start=target, end=b.index, trip_count=_trip_count(bundles, target, b.index)))
            elif target > b.index + 1:
                regions.append(Region(branch=b.index, first=b.index + 1, last=target - 1,
                                      predicate=(neg == "!", pred) if pred else None))
    loops = [dataclasses.replace(lp, stages=_stages(bundles, lp, loops)) for lp in loops]
    capacity, rows = parse_utilization(utilization_text) if utilization_text else ({}, [])
    return Schedule(bundles=bundles, loops=loops, regions=regions, capacity=capacity, utilization=rows)


def _stages(bundles: list[Bundle], loop: Loop, loops: list[Loop]) -> int:
    """The deepest pipeline stage noted in ``loop``'s own bundles (those of loops nested in it left out)."""
    nested = [lp for lp in loops if lp is not loop and loop.start <= lp.start and lp.end <= loop.end]
    deepest = 0
    for b in bundles[loop.start:loop.end + 1]:
        if any(lp.start <= b.index <= lp.end for lp in nested):
            continue
        deepest = max([deepest, *(int(n) for n in _STAGE.findall(b.text))])
    return deepest


def step_guards(sched: Schedule, lo: int, hi: int) -> list[Region]:
    """The forward branches over most of the body lo..hi (at least GUARD_SHARE of it): the step guard a
    software-pipelined loop's fill/drain iterations skip (and any nested one as large)."""
    return [r for r in sched.regions if lo <= r.branch and r.last <= hi and r.bundles >= GUARD_SHARE * (hi - lo + 1)]


def largest(regions: list[Region]) -> Region | None:
    """The region of the most bundles (None: no region): of :func:`step_guards`, the loop's step guard."""
    return max(regions, key=lambda r: r.bundles, default=None)


def bundle_weights(sched: Schedule, loop: Loop | None) -> list[int]:
    """How many times each bundle of ``loop``'s body (None: the whole program) runs per pass over it: a loop
    nested in it once per trip (unknown trips once), the bundles under that loop's step guard once per
    iteration that runs it (:meth:`Loop.guarded_trips`: the pipeline's fill/drain iterations skip them)."""
    lo, hi = (loop.start, loop.end) if loop else (0, len(sched.bundles) - 1)
    weight = [1] * (hi - lo + 1)
    for lp in sched.loops:
        if lp is loop or lp.start < lo or hi < lp.end:
            continue
        trips = lp.trip_count if lp.trip_count and lp.trip_count > 0 else 1
        guard = largest(step_guards(sched, lp.start, lp.end)) if lp.stages else None
        for i in range(lp.start, lp.end + 1):
            inside = guard is not None and guard.first <= i <= guard.last
            weight[i - lo] *= (lp.guarded_trips() or 1) if inside else trips
    return weight


def _trip_count(bundles: list[Bundle], start: int, end: int) -> int | None:
    """The literal bound of the last 'loop exit test' compare in the loop, else None."""
    bound = None
    for b in bundles[start:end + 1]:
        m = _EXIT_TEST.search(b.text)
        if m:
            bound = m.group(1)
    if bound is None or bound.startswith("%"):
        return None
    return int(bound)


@dataclass(frozen=True, kw_only=True)
class LoopStats:
    """One loop body of the compiled schedule (the grid-step loop of a pallas_call)."""

    #: Static bundles from the body's first bundle to its backward branch.
    bundles: int
    #: Bundles per iteration with each inner loop counted once per trip (unknown trips count once).
    weighted_bundles: int
    #: Bundles (weighted) outside every predicated region: what every iteration runs.
    always_bundles: int
    #: Bundles (weighted) inside predicated regions: some iterations only.
    predicated_bundles: int
    #: Sizes (static bundles) of the outermost predicated regions, in program order.
    predicated_regions: tuple[int, ...]
    #: The most of ``predicated_bundles`` one iteration can run: the outermost regions whose branch conditions
    #: can hold together (:mod:`perfmodel.compiler.predicates`; a masked and an unmasked path exclude each other).
    predicated_max_bundles: int
    #: Static bundles under a step guard (a branch over most of the body; the pipeline's fill/drain iterations skip it).
    guarded_bundles: int
    #: ``weighted_bundles`` of them under the step guard, when the loop is software-pipelined (else 0).
    guarded_weighted_bundles: int
    trip_count: int | None
    #: The loop's deepest software-pipeline stage (:attr:`Loop.stages`; 0: not pipelined, or no loop).
    stages: int
    inner_loops: int
    #: Inner loops whose trip count the schedule does not fix (data-dependent), counted once.
    inner_loops_unknown_trips: int
    dma_starts: int
    dma_waits: int
    bounds_check_halts: int
    vector_spills: int
    vector_fills: int
    scalar_spills: int
    scalar_fills: int
    #: Unit -> mean slot use over the body's static bundles as a share of capacity (0..1).
    slot_utilization: dict[str, float]

    def run_bundles(self, trips: int) -> int:
        """Bundles ``trips`` iterations of the loop issue: every iteration runs the body but its step guard's
        work, which runs on the iterations past the pipeline's fill and drain only (:func:`guarded_trips`)."""
        skipped = trips - guarded_trips(trips, self.stages)
        return self.weighted_bundles * trips - self.guarded_weighted_bundles * skipped


def loop_stats(sched: Schedule, loop: Loop | None) -> LoopStats:
    """Summarize ``loop`` (None: the whole program, e.g. a single-step kernel without a grid loop)."""
    lo, hi = (loop.start, loop.end) if loop else (0, len(sched.bundles) - 1)
    inner = [lp for lp in sched.loops if lp is not loop and lo <= lp.start and lp.end <= hi]
    weight = bundle_weights(sched, loop)
    predicated = [False] * (hi - lo + 1)
    inside = sorted((r for r in sched.regions if lo <= r.branch and r.last <= hi), key=lambda r: (r.first, -r.last))
    # A region spanning most of the body guards the whole step (the software pipeline skips it on its
    # fill/drain iterations): every real step runs it, so it is not counted as predicated.
    guards = step_guards(sched, lo, hi)
    guard = largest(guards)
    outer: list[Region] = []
    for r in inside:
        if r in guards:
            continue
        if not (outer and r.last <= outer[-1].last):  # else nested in the previous outer region
            outer.append(r)
        for i in range(r.first, r.last + 1):
            predicated[i - lo] = True
    body = sched.bundles[lo:hi + 1]
    always = sum(w for w, p in zip(weight, predicated) if not p)
    pred = sum(w for w, p in zip(weight, predicated) if p)
    pred_max = most_run([(sum(weight[r.first - lo:r.last - lo + 1]), r.predicate) for r in outer],
                        (b.code for b in body))
    counts = {"dma_starts": 0, "dma_waits": 0, "halts": 0, "sst": 0, "sld": 0}
    for b, w in zip(body, weight):
        for op in b.ops:
            if op == "dma.done.wait":
                counts["dma_waits"] += w
            elif op.startswith("dma."):
                counts["dma_starts"] += w
            elif op == "shalt.err":
                counts["halts"] += w
        counts["sst"] += w * len(re.findall(r"=\s+sst\s+\[smem:\[#allocation\d+_spill\]\]", b.text))
        counts["sld"] += w * len(re.findall(r"=\s+sld\s+\[smem:\[#allocation\d+_spill\]\]", b.text))
    util: dict[str, float] = {}
    vspill = vfill = 0
    if sched.capacity and len(sched.utilization) == len(sched.bundles):
        units = list(sched.capacity)
        rows = sched.utilization[lo:hi + 1]
        for j, unit in enumerate(units):
            used = sum(r[j] * w for r, w in zip(rows, weight))
            cap = sched.capacity[unit] * sum(weight)
            util[unit] = used / cap if cap else 0.0
            if unit == "VSTORE:SPILL":
                vspill = used
            elif unit == "VLOAD:FILL":
                vfill = used
    return LoopStats(
        bundles=hi - lo + 1,
        weighted_bundles=sum(weight),
        always_bundles=always,
        predicated_bundles=pred,
        predicated_regions=tuple(r.bundles for r in outer),
        predicated_max_bundles=pred_max,
        guarded_bundles=guard.bundles if guard else 0,
        guarded_weighted_bundles=(sum(weight[guard.first - lo:guard.last - lo + 1])
                                  if guard and loop is not None and loop.stages else 0),
        trip_count=loop.trip_count if loop else 1,
        stages=loop.stages if loop else 0,
        inner_loops=len(inner),
        inner_loops_unknown_trips=sum(1 for lp in inner if not lp.trip_count),
        dma_starts=counts["dma_starts"],
        dma_waits=counts["dma_waits"],
        bounds_check_halts=counts["halts"],
        vector_spills=vspill,
        vector_fills=vfill,
        scalar_spills=counts["sst"],
        scalar_fills=counts["sld"],
        slot_utilization=util,
    )


@dataclass(frozen=True)
class XluIssue:
    """What a schedule hands its cross-lane units (XLUs)."""

    #: XLU index -> vregs pushed to it, an inner loop's pushes once per trip.
    pushes: dict[int, int]
    #: The most common distance, in bundles, between consecutive pushes to one XLU inside loops: the cadence
    #: the compiler issues at where the XLU is what limits the loop; None when no loop pushes twice.
    spacing: int | None


def xlu_issue(sched: Schedule) -> XluIssue:
    """Count the pushes to each XLU over the whole program (weighted as :func:`bundle_weights`) and their
    spacing."""
    weight = bundle_weights(sched, None)
    pushes: dict[int, int] = {}
    gaps: dict[int, int] = {}
    last: dict[int, int] = {}
    for b, w in zip(sched.bundles, weight):
        for op in b.ops:
            m = _XLU.search(op)
            if not m or op.startswith("vpop"):
                continue
            unit = int(m.group(1))
            pushes[unit] = pushes.get(unit, 0) + w
            if b.depth and unit in last and last[unit] < b.index:
                gap = b.index - last[unit]
                gaps[gap] = gaps.get(gap, 0) + 1
            last[unit] = b.index
    spacing = max(gaps, key=lambda g: (gaps[g], -g)) if gaps else None
    return XluIssue(pushes=dict(sorted(pushes.items())), spacing=spacing)


def grid_loop(sched: Schedule, steps: int | None = None) -> Loop | None:
    """The grid-step loop: the outermost loop (the one whose trip count is nearest ``steps`` if several)."""
    top = sched.top_loops()
    if not top:
        return None
    if steps is None or len(top) == 1:
        return max(top, key=lambda lp: (lp.trip_count or 0, lp.bundles)) if len(top) > 1 else top[0]
    return min(top, key=lambda lp: abs((lp.trip_count or 0) - steps))


def loop_body_text(sched: Schedule, loop: Loop | None) -> str:
    """The bundles of ``loop`` as the compiler printed them (what ``--out`` saves)."""
    lo, hi = (loop.start, loop.end) if loop else (0, len(sched.bundles) - 1)
    return "\n".join(f"{b.address:#6x} {b.marker + ':' if b.marker else '   '} {'>' * b.depth} {b.text}"
                     for b in sched.bundles[lo:hi + 1]) + "\n"
