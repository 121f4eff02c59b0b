"""Block-size advisor: enumerate legal block sizes, rank them by the schedule model's expected time.

Candidates per block field (see :class:`perfmodel.schedule.catalog.BlockAxis`):
multiples of the field's tiling alignment, doubling from its minimum up to
the dimension it tiles (rounded up to the alignment), plus the whole
dimension; fields marked ``divides`` keep only divisors of the dimension.
The cross product is evaluated cheapest-first by a lower bound (grid steps x
per-step overhead, divided by the TensorCores of a megacore chip) and pruned
once the bound exceeds the best time found.
A candidate is *legal* when the kernel's wrapper accepts it (its block-size
dataclass checks tiling and its own VMEM budget) and the schedule model says
its buffers fit the VMEM limit that applies ("fits").

:func:`write_tuned_defaults` regenerates the per-chip default block sizes of
a bundled kernel as data (``perfmodel/data/tuned/<kernel>.json``, read by the
kernel's ``blocks.py``); ``python -m perfmodel.schedule.tune --write [KERNEL ...]``
rewrites them all (a maintenance command: about two minutes on two cores).
:func:`robust_choice` says which candidate is stored.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

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
    #: The vmem_limit_bytes the kernel compiles with (None: Mosaic's default scoped limit).
    vmem_limit_bytes: int | None = None
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
         extra: Mapping[str, Any] | None = None, max_evaluated: int = MAX_EVALUATED,
         prune_slack: float = 0.0) -> TuneResult:
    """Rank the legal block sizes of a catalog kernel for these shapes on chip.

    ``prune_slack``: candidates are pruned only once their lower bound exceeds the best time found by
    this fraction (the tuned-defaults writer keeps everything within SCOPED_VMEM_BAND of the best).
    """
    from perfmodel.schedule.analyze import resolve_chip

    entry = kernel if isinstance(kernel, KernelEntry) else get_entry(kernel)
    if not entry.tunable:
        tunable = ", ".join(e.name for e in _entries() if e.tunable)
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
    pruned = evaluated = 0
    best = math.inf
    for blocks in cands:
        if steps_lower_bound(entry, dims, blocks) * overhead >= best * (1 + prune_slack) or evaluated >= max_evaluated:
            pruned += 1
            continue
        evaluated += 1
        try:
            c = _evaluate(entry, specs, args, blocks, spec, extra)
        except (InputError, ValueError) as exc:
            _count(groups, str(exc))
            continue
        if c.vmem_status != "fits":
            _count(groups, f"VMEM {c.vmem_status} on {spec.name}")
            continue
        ranked.append(c)
        best = min(best, c.expected_s)
    ranked.sort(key=lambda c: (c.expected_s, c.vmem_bytes))
    baseline, label = _baseline(entry, specs, args, spec, extra)
    return TuneResult(
        kernel=entry.name, chip=spec.name, shapes=tuple(s.text() for s in specs.values()), ranked=tuple(ranked),
        evaluated=evaluated, rejected={msg: n for msg, n in groups.values()}, pruned=pruned, baseline=baseline,
        baseline_label=label,
    )


def _entries() -> tuple[KernelEntry, ...]:
    from perfmodel.schedule.catalog import ENTRIES

    return ENTRIES


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


# ----------------------------------------------------------------------------- tuned defaults as data

#: Candidates this close to the best expected time count as ties when picking a stored default.
DEFAULT_TIE_BAND = 0.01
#: A stored default stays within the chip's default scoped VMEM limit (no raised vmem_limit_bytes) when a
#: candidate that does is at most this much slower than the fastest legal candidate.
SCOPED_VMEM_BAND = 0.10
#: A stored default that needs a raised vmem_limit_bytes never asks for more than this share of the physical VMEM.
MAX_RAISED_VMEM_FRACTION = 0.75
#: Where the stored defaults live: perfmodel/data/tuned/<kernel>.json.
TUNED_DIR = Path(__file__).resolve().parent.parent / "data" / "tuned"
#: The chips the attention and sampling kernels keep defaults for (the others fall back, see their blocks.py).
PALLAS_CHIPS: tuple[str, ...] = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x")


@dataclass(frozen=True, kw_only=True)
class TunedConfig:
    """One dtype configuration of a kernel's defaults table and the representative problem it is tuned on."""

    #: Key in the JSON and in the kernel's lookup: "bf16", "fp32", or matmul's "bf16 x int8".
    key: str
    #: --shape strings of the representative problem.
    shapes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TunedKernel:
    """What ``--write`` tunes for one bundled kernel (see :func:`tuned_kernels`)."""

    #: kernels/<kernel>/ package and perfmodel/data/tuned/<kernel>.json.
    kernel: str
    #: Catalog entry the advisor runs (e.g. the token-major variant of kv_cache_update).
    entry: str
    #: The representative problem in words (goes into the JSON's "about").
    problem: str
    #: Production configuration first: lookups without a dtype use the first one.
    configs: tuple[TunedConfig, ...]
    #: None: every TPU chip in the registry.
    chips: tuple[str, ...] | None = None
    #: Extra static arguments of the wrapper, built when tuning (e.g. a PRNG key).
    extra: Callable[[], dict[str, Any]] | None = None
    #: Extra fields stored with each choice, from its blocks and the shapes (e.g. paged_attention's tokens).
    derived: Callable[[Mapping[str, int], Mapping[str, Any]], dict[str, Any]] | None = None
    #: A sentence about how to read the choice (goes into the JSON's "about").
    note: str = ""


#: Operand dtype pairs of the bundled matmul's defaults table (x dtype, w dtype) and the --shape dtype names.
MATMUL_PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("bf16", "bf16", "bf16", "bf16"),
    ("fp32", "fp32", "f32", "f32"),
    ("bf16", "int8", "bf16", "int8"),
    ("fp32", "int8", "f32", "int8"),
    ("bf16", "fp8", "bf16", "fp8"),
    ("fp32", "fp8", "f32", "fp8"),
)
#: The matmul problem the per-chip defaults are tuned on (a large square GEMM).
TUNED_SHAPE_MNK = (8192, 8192, 8192)


def _matmul_configs() -> tuple[TunedConfig, ...]:
    m, n, k = TUNED_SHAPE_MNK
    configs = []
    for x_name, w_name, x_flag, w_flag in MATMUL_PAIRS:
        # With a bias: the stored defaults must also fit when the epilogue is fused.
        shapes = [f"x={m}x{k}:{x_flag}", f"w={k}x{n}:{w_flag}", f"bias={n}:f32"]
        if w_name in ("int8", "fp8"):
            shapes.append(f"w_scale={n}:f32")
        configs.append(TunedConfig(key=f"{x_name} x {w_name}", shapes=tuple(shapes)))
    return tuple(configs)


def _sampling_extra() -> dict[str, Any]:
    import jax

    # A random draw with top-k and top-p: the bisection passes over the resident rows run.
    return {"key": jax.random.key(0), "temperature": 0.8, "top_k": 50, "top_p": 0.9}


def _paged_tokens(blocks: Mapping[str, int], specs: Mapping[str, Any]) -> dict[str, Any]:
    # The lookup keeps this many KV tokens per compute block for other page sizes and table widths.
    return {"tokens_per_compute_block": blocks["pages_per_compute_block"] * specs["k_pages"].shape[2]}


def tuned_kernels() -> tuple[TunedKernel, ...]:
    """Every bundled kernel with block sizes, its representative problem and its dtype configurations."""
    llama8b_prefill = ("q=1x32x8192x128:bf16", "k=1x8x8192x128:bf16", "v=1x8x8192x128:bf16")
    return (
        TunedKernel(
            kernel="matmul", entry="matmul", configs=_matmul_configs(),
            problem="an M=N=K=%d GEMM with a fused bias (and per-channel scales for int8/fp8 weights)"
                    % TUNED_SHAPE_MNK[0]),
        TunedKernel(
            kernel="rms_norm", entry="rms_norm",
            configs=(TunedConfig(key="bf16", shapes=("x=8192x4096:bf16", "residual=8192x4096:bf16",
                                                     "weight=4096:f32")),),
            problem="8192 tokens of a 4096-wide model (Llama-3-8B); the kernel halves block_tokens for wider "
                    "rows until they fit"),
        TunedKernel(
            kernel="flash_attention", entry="flash_attention", chips=PALLAS_CHIPS,
            configs=(TunedConfig(key="bf16", shapes=llama8b_prefill),),
            problem="a causal 8192-token prefill with 32 q / 8 kv heads of 128 (Llama-3-8B); the kernel shrinks "
                    "block_q, then block_kv, for larger GQA groups or f32 until a step fits",
            note="K/V block candidates stop at 2048 tokens (see the catalog) so that causal and sliding-window "
                 "block skipping keep working on long contexts."),
        TunedKernel(
            kernel="paged_attention", entry="paged_attention", chips=PALLAS_CHIPS,
            configs=(TunedConfig(key="bf16", shapes=(
                "q=64x32x128:bf16", "k_pages=8x8192x16x128:bf16", "v_pages=8x8192x16x128:bf16",
                "page_table=64x128:int32=arange", "lengths=64:int32=2048")),),
            derived=_paged_tokens,
            problem="decode of 64 sequences at 2048-token contexts, 32 q / 8 kv heads of 128, bf16 pages of 16 "
                    "tokens; the kernel keeps tokens_per_compute_block for other page sizes",
            note="The model counts the kernel's manual K/V DMAs as a total, so pages_per_compute_block choices "
                 "tie and the tie-break (least VMEM) decides."),
        TunedKernel(
            kernel="ragged_paged_attention", entry="ragged_paged_attention", chips=PALLAS_CHIPS,
            configs=(TunedConfig(key="bf16", shapes=(
                "q=256x32x128:bf16", "k_pages=8x512x16x128:bf16", "v_pages=8x512x16x128:bf16",
                "kv_lens=8:int32=1024", "page_table=8x64:int32=arange", "cu_q_lens=9:int32=arange*32",
                "num_seqs=1:int32=8")),),
            problem="8 sequences of 32 new tokens over 1024-token contexts (chunked prefill), 32 q / 8 kv heads "
                    "of 128, bf16 pages of 16 tokens (kept small: the model interprets the kernel's loops)",
            note="The model counts the kernel's manual K/V DMAs as a total and its data-dependent loops once, "
                 "so block_kv choices mostly tie and the tie-break decides."),
        TunedKernel(
            kernel="sampling", entry="sampling", chips=PALLAS_CHIPS, extra=_sampling_extra,
            configs=(TunedConfig(key="fp32", shapes=("logits=64x128256:f32",)),),
            problem="64 rows of f32 logits over a 128256-entry vocabulary (Llama-3), drawn with a key, top-k 50 "
                    "and top-p 0.9; the kernel rounds block_b up for bf16, shrinks block_v to small vocabularies and "
                    "halves block_b for huge ones"),
        TunedKernel(
            kernel="kv_cache_update", entry="kv_cache_update_token_major",
            configs=(TunedConfig(key="bf16 -> int8", shapes=(
                "new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=2048x16x8x128:int8",
                "v_cache=2048x16x8x128:int8", "slot_mapping=512:int32=arange",
                "k_scale_cache=2048x16x8x1:f32", "v_scale_cache=2048x16x8x1:f32")),),
            problem="a 512-token write of bf16 K/V into a token-major int8 cache (quantize on write: the larger "
                    "VMEM need, so the defaults fit bf16 caches too) of 8 kv heads of 128, pages of 16 tokens "
                    "(layout='token-major'; the default head-major layout has no block sizes)"),
    )


def get_tuned_kernel(kernel: str) -> TunedKernel:
    for t in tuned_kernels():
        if t.kernel == kernel:
            return t
    known = ", ".join(t.kernel for t in tuned_kernels())
    raise InputError(f"--write: '{kernel}' has no tuned defaults; kernels with block sizes: {known}")


def robust_choice(result: TuneResult) -> Candidate:
    """The default to store, safe to compile on the chip.

    The pool: candidates within the chip's default scoped VMEM limit (the kernel
    passes no vmem_limit_bytes) when the fastest of them is within
    SCOPED_VMEM_BAND of the fastest legal candidate; otherwise those and the
    candidates whose raised vmem_limit_bytes (and VMEM) stay within
    MAX_RAISED_VMEM_FRACTION of the physical VMEM. Among the pool's candidates
    within DEFAULT_TIE_BAND of its fastest: the fewest HBM bytes moved, then the
    fewest grid steps, then the least VMEM (the choice least exposed to model
    error and HBM contention).
    """
    from perfmodel.schedule.analyze import resolve_chip

    fastest = result.best.expected_s
    pool = [c for c in result.ranked if c.vmem_limit_bytes is None]
    if not pool or min(c.expected_s for c in pool) > fastest * (1 + SCOPED_VMEM_BAND):
        physical = resolve_chip(result.chip).memory.vmem_bytes_per_core
        cap = MAX_RAISED_VMEM_FRACTION * physical if physical else math.inf
        pool = [c for c in result.ranked if c.vmem_limit_bytes is None or max(c.vmem_limit_bytes, c.vmem_bytes) <= cap]
        if not pool:
            raise InputError(f"tune {result.kernel}: no candidate fits the default scoped VMEM or "
                             f"{MAX_RAISED_VMEM_FRACTION:.0%} of the physical VMEM of {result.chip}")
    best = min(c.expected_s for c in pool)
    close = [c for c in pool if c.expected_s <= best * (1 + DEFAULT_TIE_BAND)]
    return min(close, key=lambda c: (c.hbm_bytes, c.steps, c.vmem_bytes))


def _stored(choice: Candidate, result: TuneResult, derived: dict[str, Any]) -> dict[str, Any]:
    # How many candidates the model cannot tell from the fastest (many: the tie-break decided).
    ties = sum(c.expected_s <= result.best.expected_s * (1 + DEFAULT_TIE_BAND) for c in result.ranked)
    return {**choice.blocks, **derived, "expected_s": choice.expected_s, "fastest_s": result.best.expected_s,
            "vmem_bytes": choice.vmem_bytes, "vmem_limit_bytes": choice.vmem_limit_bytes,
            "legal_candidates": len(result.ranked), "within_tie_band": ties, "reason": choice.reason}


def tune_kernel_defaults(spec: TunedKernel, chips: Sequence[str] | None = None) -> dict[str, Any]:
    """{chip: {config: stored choice}} for one kernel; chips or configurations it rejects are left out."""
    from perfmodel.hw.registry import all_chips
    from perfmodel.schedule.analyze import resolve_chip

    names = list(chips or spec.chips or [c.name for c in all_chips() if c.kind == "tpu"])
    entry = get_entry(spec.entry)
    extra = spec.extra() if spec.extra else None
    out: dict[str, Any] = {}
    for name in names:
        chip = resolve_chip(name)
        per_config = {}
        for config in spec.configs:
            try:
                result = tune(entry, config.shapes, chip, extra=extra, prune_slack=SCOPED_VMEM_BAND)
                choice = robust_choice(result)
            except InputError:
                continue  # e.g. fp8 weights on a chip without an fp8 MXU path
            derived = spec.derived(choice.blocks, entry.specs(config.shapes)) if spec.derived else {}
            per_config[config.key] = _stored(choice, result, derived)
        if per_config:
            out[chip.name] = per_config
    return out


def tune_matmul_defaults(chips: Sequence[str] | None = None) -> dict[str, Any]:
    """Best blocks of the bundled matmul per TPU chip and operand pair (pairs a chip cannot run are skipped)."""
    return tune_kernel_defaults(get_tuned_kernel("matmul"), chips)


def _about(spec: TunedKernel) -> str:
    return (f"Per-chip default block sizes of kernels/{spec.kernel}, chosen by `perfmodel tune {spec.entry}` (the "
            f"schedule model) on {spec.problem}; 'shapes' lists the --shape flags per configuration. The choice: "
            f"among candidates within {SCOPED_VMEM_BAND:.0%} of the fastest, only those within the chip's default "
            f"scoped VMEM limit (vmem_limit_bytes null); if none is that close, also those whose raised vmem_limit_bytes "
            f"stays within {MAX_RAISED_VMEM_FRACTION:.0%} of the physical VMEM; then, within {DEFAULT_TIE_BAND:.0%} "
            f"of the fastest of those, the fewest HBM bytes, grid steps and VMEM bytes. "
            + (spec.note + " " if spec.note else "")
            + "Regenerate with `python -m perfmodel.schedule.tune --write`.")


def write_tuned_defaults(kernel: str = "matmul", path: str | Path | None = None,
                         chips: Sequence[str] | None = None) -> Path:
    """Tune one kernel's per-chip defaults and write them as JSON (default: perfmodel/data/tuned/<kernel>.json)."""
    spec = get_tuned_kernel(kernel)
    data = {
        "kernel": spec.kernel,
        "about": _about(spec),
        "entry": spec.entry,
        "shapes": {c.key: list(c.shapes) for c in spec.configs},
        "rule": {"tie_band": DEFAULT_TIE_BAND, "scoped_vmem_band": SCOPED_VMEM_BAND,
                 "max_raised_vmem_fraction": MAX_RAISED_VMEM_FRACTION},
        "defaults": tune_kernel_defaults(spec, chips),
    }
    path = Path(path) if path is not None else TUNED_DIR / f"{spec.kernel}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path


def load_tuned_file(kernel: str) -> dict[str, Any]:
    """The whole stored JSON of a kernel (json only, no jax): "about", "entry", "shapes", "rule", "defaults"."""
    import importlib.resources

    return json.loads(importlib.resources.files("perfmodel").joinpath(f"data/tuned/{kernel}.json").read_text())


def load_tuned_defaults(kernel: str = "matmul") -> dict[str, Any]:
    """The stored tuned defaults (json only, no jax): {chip: {config: {block fields.., "expected_s": ..}}}."""
    return load_tuned_file(kernel)["defaults"]


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    import sys
    import time

    if "--write" not in sys.argv[1:]:
        sys.exit("usage: python -m perfmodel.schedule.tune --write [KERNEL ...]  (all kernels with block sizes "
                 "when none is named)")
    for name in [a for a in sys.argv[1:] if a != "--write"] or [t.kernel for t in tuned_kernels()]:
        start = time.perf_counter()
        print(write_tuned_defaults(name), f"({time.perf_counter() - start:.0f} s)", flush=True)
