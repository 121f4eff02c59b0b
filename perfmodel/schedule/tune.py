"""Block-size advisor: enumerate legal block sizes, rank them by the schedule model's expected time.

Candidates per block field (see :class:`kernels.spec.BlockAxis`):
multiples of the field's tiling alignment, doubling from its minimum up to
the dimension it tiles (rounded up to the alignment), plus the whole
dimension; fields marked ``divides`` keep only divisors of the dimension.
The cross product is evaluated cheapest-first by a lower bound (grid steps x
per-step overhead, divided by the TensorCores of a megacore chip) and pruned
once the bound exceeds the best time found.
A candidate is *legal* when the kernel's wrapper accepts it (its block-size
dataclass checks tiling and its own VMEM budget) and the schedule model says
its buffers fit the VMEM limit that applies ("fits").

The stored per-chip defaults of the bundled kernels are written from this
ranking by :mod:`perfmodel.schedule.tuned` (``perfmodel tune --write``).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kernels import spec as kernel_spec
from kernels.spec import BlockAxis
from perfmodel.errors import InputError
from perfmodel.hw.registry import DEFAULT_CHIP
from perfmodel.hw.spec import ChipSpec
from perfmodel.schedule.catalog import KernelEntry, as_entry, entries, get_entry
from perfmodel.schedule.results import Analysis
from perfmodel.units import binary

#: Largest block the advisor proposes along any dimension.
MAX_BLOCK = 8192
#: Candidates evaluated at most (after ordering by the lower bound).
MAX_EVALUATED = 400


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One legal block-size choice and what the model expects of it."""

    blocks: dict[str, int]
    expected_s: float
    hbm_bytes: int
    ideal_hbm_bytes: int
    vmem_bytes: int
    vmem_status: str
    #: The vmem_limit_bytes the kernel compiles with (None: Mosaic's default scoped limit).
    vmem_limit_bytes: int | None = None
    steps: int
    limiter: str
    reason: str
    #: Vector-unit ops of the body over the whole grid (the model overlaps them with the MXU; the compiler hides
    #: only part of them under a large dot, so among candidates the model ties, fewer is safer).
    vpu_ops: float = 0.0

    @property
    def label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.blocks.items())

    @property
    def reread_factor(self) -> float:
        return self.hbm_bytes / self.ideal_hbm_bytes if self.ideal_hbm_bytes else float("nan")


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    kernel: str
    chip: str
    shapes: tuple[str, ...]
    #: Legal candidates, fastest first (all evaluated ones; print the first few).
    ranked: tuple[Candidate, ...]
    evaluated: int
    #: Rejection reason (the first real message of each group of like reasons) -> count.
    rejected: dict[str, int]
    #: Candidates never evaluated because their lower bound exceeded the best time.
    pruned: int
    #: The kernel's own default (or the entry's reference blocks), evaluated the same way.
    baseline: Candidate | None
    baseline_label: str
    notes: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Candidate:
        if not self.ranked:
            raise InputError(f"tune {self.kernel}: no legal block sizes for these shapes on {self.chip}")
        return self.ranked[0]


def candidate_values(ax: BlockAxis, dim: int) -> list[int]:
    """Block sizes to try along one axis (see the module docstring), none above the axis' maximum."""
    cap = -(-dim // ax.align) * ax.align
    start = ax.align if dim < ax.minimum else -(-ax.minimum // ax.align) * ax.align
    largest = min(MAX_BLOCK, ax.maximum or MAX_BLOCK)
    values = set()
    v = start
    while v <= min(cap, largest):
        values.add(v)
        v *= 2
    if dim <= largest:
        # The whole dimension: legal as is when aligned or when blocks must divide (a block equal to the
        # array dimension is always legal); otherwise rounded up to the alignment (a partial last block).
        values.add(dim if ax.divides or dim % ax.align == 0 else cap)
    if ax.divides:
        values = {v for v in values if dim % v == 0}
    return sorted(values)


def enumerate_candidates(entry: KernelEntry, dims: Mapping[str, int]) -> list[dict[str, int]]:
    axes = entry.block_axes
    per_axis = [candidate_values(ax, dims[ax.field]) for ax in axes]
    return [dict(zip((ax.field for ax in axes), combo)) for combo in itertools.product(*per_axis)]


def steps_lower_bound(entry: KernelEntry, dims: Mapping[str, int], blocks: Mapping[str, int]) -> int:
    """Grid steps are at least the product of the tiled dimensions' block counts."""
    return int(math.prod(-(-dims[ax.field] // blocks[ax.field]) for ax in entry.block_axes))


def explain(analysis: Analysis) -> str:
    """One-line reason: what limits the steps, how often each input is read, VMEM."""
    parts = []
    for k in analysis.kernels:
        phrase = {"compute": "compute-limited", "dma": "DMA-limited",
                  "overhead": f"per-step-overhead-limited ({k.steps:,} steps)"}[k.time.limiter]
        reads = []
        for o in k.operands:
            if o.role != "input" or not o.pipelined or not o.ideal_hbm_bytes:
                continue
            r = o.reread_factor
            reads.append(f"{o.name} read once" if r <= 1.0005 else f"{o.name} read {r:.1f}x")
        vmem = f"{binary(k.vmem.total_bytes)} VMEM" + ("" if k.vmem.status == "fits" else f" ({k.vmem.status})")
        parts.append("; ".join([phrase] + ([", ".join(reads)] if reads else []) + [vmem]))
    return " | ".join(parts)


def _candidate(blocks: Mapping[str, int], a: Analysis) -> Candidate:
    worst_vmem = max(a.kernels, key=lambda k: k.vmem.total_bytes)
    statuses = {k.vmem.status for k in a.kernels}
    status = "does not fit" if "does not fit" in statuses else (
        "needs vmem_limit_bytes" if "needs vmem_limit_bytes" in statuses else "fits")
    main = max(a.kernels, key=lambda k: k.time.expected_s)
    requested = [k.vmem.requested_limit_bytes for k in a.kernels if k.vmem.requested_limit_bytes is not None]
    return Candidate(
        blocks=dict(blocks),
        expected_s=a.expected_s,
        hbm_bytes=sum(k.hbm_bytes for k in a.kernels),
        ideal_hbm_bytes=sum(k.ideal_hbm_bytes for k in a.kernels),
        vmem_bytes=worst_vmem.vmem.total_bytes,
        vmem_status=status,
        vmem_limit_bytes=max(requested) if requested else None,
        steps=sum(k.steps for k in a.kernels),
        limiter=main.time.limiter,
        reason=explain(a),
        vpu_ops=sum(k.work.vpu_ops for k in a.kernels),
    )


def _evaluate(entry: KernelEntry, specs: Mapping, args: Sequence[Any], blocks: Mapping[str, int] | None,
              chip: ChipSpec, extra: Mapping[str, Any] | None) -> Candidate:
    from perfmodel.schedule.analyze import analyze

    fn = entry.make_function(specs, blocks, chip, extra=extra)
    a = analyze(fn, *args, chip=chip)
    if not a.kernels:
        raise InputError(f"{entry.name} ran no pallas_call for these shapes")
    return _candidate(blocks or {}, a)


def tune(kernel: str | kernel_spec.KernelEntry, shapes: Sequence[str] = (), chip: str | ChipSpec = DEFAULT_CHIP, *,
         extra: Mapping[str, Any] | None = None, max_evaluated: int = MAX_EVALUATED,
         prune_slack: float = 0.0, progress: Callable[..., None] | None = None) -> TuneResult:
    """Rank the legal block sizes of a catalog kernel for these shapes on chip.

    ``prune_slack``: candidates are pruned only once their lower bound exceeds the best time found by
    this fraction (the tuned-defaults writer keeps everything within SCOPED_VMEM_BAND of the best).
    ``progress(label, done=i, total=n)`` is called after each of the n candidates (pruned ones included).
    """
    from perfmodel.schedule.analyze import resolve_chip

    entry = as_entry(kernel) if isinstance(kernel, kernel_spec.KernelEntry) else get_entry(kernel)
    if not entry.tunable:
        tunable = ", ".join(e.name for e in entries() if e.tunable)
        raise InputError(f"KERNEL '{entry.name}' has no block sizes the advisor enumerates; tunable kernels: {tunable}")
    spec = resolve_chip(chip)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    dims = entry.dims(specs)
    # A megacore chip may split the grid over its TensorCores, so the bound divides the steps among them.
    cores = spec.cores.cores_per_chip if spec.cores.megacore else 1
    overhead = (spec.overheads.pallas_grid_step_overhead_s or 0.0) / cores
    cands = sorted(enumerate_candidates(entry, dims), key=lambda b: (steps_lower_bound(entry, dims, b), sorted(b.items())))
    ranked: list[Candidate] = []
    groups: dict[str, list] = {}  # grouping key -> [first message, count]
    errors: set[str] = set()  # the distinct messages of the candidates that raised
    pruned = evaluated = 0
    best = math.inf
    for done, blocks in enumerate(cands, start=1):
        if progress is not None:
            progress(",".join(f"{k}={v}" for k, v in blocks.items()), done=done, total=len(cands))
        if steps_lower_bound(entry, dims, blocks) * overhead >= best * (1 + prune_slack) or evaluated >= max_evaluated:
            pruned += 1
            continue
        evaluated += 1
        try:
            c = _evaluate(entry, specs, args, blocks, spec, extra)
        except (InputError, ValueError) as exc:
            _count(groups, str(exc))
            errors.add(_message(str(exc)))
            continue
        if c.vmem_status != "fits":
            _count(groups, f"VMEM {c.vmem_status} on {spec.name}")
            continue
        ranked.append(c)
        best = min(best, c.expected_s)
    ranked = rank(ranked)
    baseline, label = _baseline(entry, specs, args, spec, extra)
    if not ranked and baseline is None and len(errors) == 1 and sum(n for _, n in groups.values()) == evaluated:
        # Every candidate and the kernel's own blocks failed with one and the same message: the shapes (or
        # arguments) are wrong whatever the blocks, so that is the error, not "no legal block sizes".
        raise InputError(f"tune {entry.name}: {errors.pop()}")
    return TuneResult(
        kernel=entry.name, chip=spec.name, shapes=tuple(s.text() for s in specs.values()), ranked=tuple(ranked),
        evaluated=evaluated, rejected={msg: n for msg, n in groups.values()}, pruned=pruned, baseline=baseline,
        baseline_label=label,
    )


#: Expected times this close (relative) are a tie: they differ by float rounding only (a periodic grid's
#: totals are summed in another order than step by step).
TIE_RTOL = 1e-9


def rank(cands: Sequence[Candidate]) -> list[Candidate]:
    """Fastest first; candidates whose expected times tie (within TIE_RTOL of the first of their run) by
    less VMEM, then in the order given."""
    order = {id(c): i for i, c in enumerate(cands)}
    by_time = sorted(cands, key=lambda c: c.expected_s)
    out: list[Candidate] = []
    i = 0
    while i < len(by_time):
        j = i + 1
        while j < len(by_time) and by_time[j].expected_s <= by_time[i].expected_s * (1 + TIE_RTOL):
            j += 1
        out += sorted(by_time[i:j], key=lambda c: (c.vmem_bytes, order[id(c)]))
        i = j
    return out


MAX_REASON_CHARS = 200


def _message(text: str) -> str:
    """A rejection as the user reads it: the first line, without the tracing and --block prefixes (tune has no
    --block flag), cut only beyond MAX_REASON_CHARS."""
    line = text.strip().splitlines()[0] if text.strip() else "rejected"
    line = re.sub(r"^tracing \S+ failed: ", "", line)
    line = re.sub(r"^--block: ", "", line)
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 3] + "..."


def _group_key(message: str) -> str:
    """A rejection with the candidate's own numbers blanked, so like reasons group together."""
    key = re.sub(r"\([^)]*=[^)]*\)", "(...)", message)  # block labels such as (bm=..,bk=..); keep e.g. dtype names
    key = re.sub(r"\{[^}]*\}", "{...}", key)  # block dicts such as {'bm': 128}
    return re.sub(r"(?<![\w.-])\d+(\.\d+)?(?![\w.])", "#", key)


def _count(groups: dict[str, list], text: str) -> None:
    """Count one rejection in its group; the group keeps its first message as the example shown."""
    message = _message(text)
    group = groups.setdefault(_group_key(message), [message, 0])
    group[1] += 1


def _baseline(entry: KernelEntry, specs: Mapping, args: Sequence[Any], chip: ChipSpec,
              extra: Mapping[str, Any] | None) -> tuple[Candidate | None, str]:
    """The kernel's default blocks (wrapper called without block sizes), or the entry's reference blocks."""
    blocks = dict(entry.reference_blocks) if entry.reference_blocks else None
    label = "reference blocks" if blocks else "kernel default"
    try:
        return _evaluate(entry, specs, args, blocks, chip, extra), label
    except (InputError, ValueError):
        return None, label
