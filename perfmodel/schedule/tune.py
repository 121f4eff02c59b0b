"""Block-size advisor: enumerate legal block sizes, rank them by the schedule model's expected time.

Candidates per block field (see :class:`perfmodel.schedule.catalog.BlockAxis`):
multiples of the field's tiling alignment, doubling from its minimum up to
the dimension it tiles (rounded up to the alignment), plus the whole
dimension; fields marked ``divides`` keep only divisors of the dimension.
The cross product is evaluated cheapest-first by a lower bound (grid steps x
per-step overhead) and pruned once the bound exceeds the best time found.
A candidate is *legal* when the kernel's wrapper accepts it (its block-size
dataclass checks tiling and its own VMEM budget) and the schedule model says
its buffers fit the VMEM limit that applies ("fits").

:func:`write_tuned_defaults` regenerates the per-chip default block sizes
of the bundled matmul as data (``perfmodel/data/tuned/matmul.json``).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError
from perfmodel.hw.spec import ChipSpec
from perfmodel.schedule.catalog import BlockAxis, KernelEntry, get_entry
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
    steps: int
    limiter: str
    reason: str

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
    #: Rejection reason -> count.
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
    """Block sizes to try along one axis (see the module docstring)."""
    cap = -(-dim // ax.align) * ax.align
    start = ax.align if dim < ax.minimum else -(-ax.minimum // ax.align) * ax.align
    values = set()
    v = start
    while v <= min(cap, MAX_BLOCK):
        values.add(v)
        v *= 2
    if dim <= MAX_BLOCK:
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
    return Candidate(
        blocks=dict(blocks),
        expected_s=a.expected_s,
        hbm_bytes=sum(k.hbm_bytes for k in a.kernels),
        ideal_hbm_bytes=sum(k.ideal_hbm_bytes for k in a.kernels),
        vmem_bytes=worst_vmem.vmem.total_bytes,
        vmem_status=status,
        steps=sum(k.steps for k in a.kernels),
        limiter=main.time.limiter,
        reason=explain(a),
    )


def _evaluate(entry: KernelEntry, specs: Mapping, args: Sequence[Any], blocks: Mapping[str, int] | None,
              chip: ChipSpec, extra: Mapping[str, Any] | None) -> Candidate:
    from perfmodel.schedule.analyze import analyze

    fn = entry.make_function(specs, blocks, chip, extra=extra)
    a = analyze(fn, *args, chip=chip)
    if not a.kernels:
        raise InputError(f"{entry.name} ran no pallas_call for these shapes")
    return _candidate(blocks or {}, a)


def tune(kernel: str | KernelEntry, shapes: Sequence[str] = (), chip: str | ChipSpec = "tpu-v5e", *,
         extra: Mapping[str, Any] | None = None, max_evaluated: int = MAX_EVALUATED) -> TuneResult:
    """Rank the legal block sizes of a catalog kernel for these shapes on chip."""
    from perfmodel.schedule.analyze import resolve_chip

    entry = kernel if isinstance(kernel, KernelEntry) else get_entry(kernel)
    if not entry.tunable:
        tunable = ", ".join(e.name for e in _entries() if e.tunable)
        raise InputError(f"KERNEL '{entry.name}' has no block sizes the advisor enumerates; tunable kernels: {tunable}")
    spec = resolve_chip(chip)
    specs = entry.specs(shapes)
    args = entry.arguments(specs)
    dims = entry.dims(specs)
    overhead = spec.overheads.pallas_grid_step_overhead_s or 0.0
    cands = sorted(enumerate_candidates(entry, dims), key=lambda b: (steps_lower_bound(entry, dims, b), sorted(b.items())))
    ranked: list[Candidate] = []
    rejected: dict[str, int] = {}
    pruned = evaluated = 0
    best = math.inf
    for blocks in cands:
        if steps_lower_bound(entry, dims, blocks) * overhead >= best or evaluated >= max_evaluated:
            pruned += 1
            continue
        evaluated += 1
        try:
            c = _evaluate(entry, specs, args, blocks, spec, extra)
        except (InputError, ValueError) as exc:
            reason = _short(str(exc))
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        if c.vmem_status != "fits":
            key = f"VMEM {c.vmem_status} on {spec.name}"
            rejected[key] = rejected.get(key, 0) + 1
            continue
        ranked.append(c)
        best = min(best, c.expected_s)
    ranked.sort(key=lambda c: (c.expected_s, c.vmem_bytes))
    baseline, label = _baseline(entry, specs, args, spec, extra)
    return TuneResult(
        kernel=entry.name, chip=spec.name, shapes=tuple(s.text() for s in specs.values()), ranked=tuple(ranked),
        evaluated=evaluated, rejected=rejected, pruned=pruned, baseline=baseline, baseline_label=label,
    )


def _entries() -> tuple[KernelEntry, ...]:
    from perfmodel.schedule.catalog import ENTRIES

    return ENTRIES


def _short(text: str) -> str:
    """A rejection reason with the candidate's own numbers blanked, so like reasons group together."""
    line = text.strip().splitlines()[0] if text.strip() else "rejected"
    line = re.sub(r"^tracing \S+ failed: ", "", line)
    line = re.sub(r"\([^)]*=[^)]*\)", "(...)", line)  # block labels such as (bm=..,bk=..); keep e.g. dtype names
    line = re.sub(r"(?<![\w.-])\d+(\.\d+)?(?![\w.])", "#", line)
    return line if len(line) <= 140 else line[:137] + "..."


def _baseline(entry: KernelEntry, specs: Mapping, args: Sequence[Any], chip: ChipSpec,
              extra: Mapping[str, Any] | None) -> tuple[Candidate | None, str]:
    """The kernel's default blocks (wrapper called without block sizes), or the entry's reference blocks."""
    blocks = dict(entry.reference_blocks) if entry.reference_blocks else None
    label = "reference blocks" if blocks else "kernel default"
    try:
        return _evaluate(entry, specs, args, blocks, chip, extra), label
    except (InputError, ValueError):
        return None, label


# ----------------------------------------------------------------------------- tuned defaults as data

#: Operand dtype pairs of the bundled matmul's defaults table (x dtype, w dtype) and the --shape dtype names.
MATMUL_PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("bf16", "bf16", "bf16", "bf16"),
    ("fp32", "fp32", "f32", "f32"),
    ("bf16", "int8", "bf16", "int8"),
    ("fp32", "int8", "f32", "int8"),
    ("bf16", "fp8", "bf16", "fp8"),
    ("fp32", "fp8", "f32", "fp8"),
)
#: The representative problem the per-chip defaults are tuned on (a large square GEMM).
TUNED_SHAPE_MNK = (8192, 8192, 8192)
TUNED_PATH = Path(__file__).resolve().parent.parent / "data" / "tuned" / "matmul.json"


#: Candidates this close to the best expected time count as ties when picking a stored default.
DEFAULT_TIE_BAND = 0.01


def robust_choice(result: TuneResult) -> Candidate:
    """The default to store: among candidates within DEFAULT_TIE_BAND of the best expected time, prefer
    one that fits the chip's default scoped VMEM limit (no raised vmem_limit_bytes), then the fewest HBM
    bytes moved, then the fewest steps: the choice least exposed to model error and to HBM contention."""
    from perfmodel.schedule.analyze import resolve_chip

    limit = resolve_chip(result.chip).memory.vmem_default_scoped_limit_bytes_per_core or 0
    best = result.best
    close = [c for c in result.ranked if c.expected_s <= best.expected_s * (1 + DEFAULT_TIE_BAND)]
    return min(close, key=lambda c: (c.vmem_bytes > limit, c.hbm_bytes, c.steps, c.vmem_bytes))


def tune_matmul_defaults(chips: Sequence[str] | None = None, mnk: tuple[int, int, int] | None = None
                         ) -> dict[str, Any]:
    """Best blocks of the bundled matmul per TPU chip and operand pair (pairs a chip cannot run are skipped)."""
    from perfmodel.hw.registry import all_chips
    from perfmodel.schedule.analyze import resolve_chip

    names = list(chips) if chips else [c.name for c in all_chips() if c.kind == "tpu"]
    m, n, k = mnk or TUNED_SHAPE_MNK
    out: dict[str, Any] = {}
    for name in names:
        spec = resolve_chip(name)
        per_pair = {}
        for x_name, w_name, x_flag, w_flag in MATMUL_PAIRS:
            # With a bias: the stored defaults must also fit when the epilogue is fused.
            shapes = [f"x={m}x{k}:{x_flag}", f"w={k}x{n}:{w_flag}", f"bias={n}:f32"]
            if w_name in ("int8", "fp8"):
                shapes.append(f"w_scale={n}:f32")
            try:
                best = robust_choice(tune("matmul", shapes, spec))
            except InputError:
                continue  # e.g. fp8 weights on a chip without an fp8 MXU path
            per_pair[f"{x_name} x {w_name}"] = {**best.blocks, "expected_s": best.expected_s,
                                                 "vmem_bytes": best.vmem_bytes, "reason": best.reason}
        out[spec.name] = per_pair
    return out


def write_tuned_defaults(path: str | Path = TUNED_PATH, chips: Sequence[str] | None = None) -> Path:
    """Write the bundled matmul's tuned per-chip default blocks as JSON (see docs in the file)."""
    data = {
        "kernel": "matmul",
        "about": "Per-chip default block sizes of kernels/matmul, chosen by `perfmodel tune matmul` (the "
                 "schedule model) on an M=N=K=%d problem: among candidates within %g%% of the best expected "
                 "time (with a fused bias), one within the default scoped VMEM limit moving the fewest HBM bytes. Regenerate with "
                 "`python -m perfmodel.schedule.tune --write`." % (TUNED_SHAPE_MNK[0], DEFAULT_TIE_BAND * 100),
        "shape_mnk": list(TUNED_SHAPE_MNK),
        "defaults": tune_matmul_defaults(chips),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def load_tuned_defaults(kernel: str = "matmul") -> dict[str, Any]:
    """The stored tuned defaults (no jax import): {chip: {"x x w": {"bm":..,"bk":..,"bn":..}}}."""
    import importlib.resources

    text = importlib.resources.files("perfmodel").joinpath(f"data/tuned/{kernel}.json").read_text()
    return json.loads(text)["defaults"]


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys

    if "--write" in sys.argv:
        print(write_tuned_defaults())
