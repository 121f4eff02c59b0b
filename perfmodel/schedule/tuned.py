"""Tuned defaults as data: the advisor's choice per chip for each bundled kernel, written to its folder.

:func:`write_tuned_defaults` tunes one kernel's representative problem (its
``kernels/<name>/entry.py:TUNED``) on each chip and writes
``kernels/<name>/tuned.json``, which the kernel's ``blocks.py`` reads
(:mod:`kernels.tuned`); ``perfmodel tune --write [KERNEL]`` runs it.
:func:`robust_choice` says which candidate is stored. With ``compile_top=N`` (``tune --write --compile N``) the
N candidates robust_choice would consider first are compiled with the TPU compiler (deviceless libtpu) on each
chip it targets, and the stored one is the fastest by the compiler-backed time among those Mosaic accepts
(:func:`compiled_choice`), so every stored default is one the compiler has seen fit in VMEM.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from kernels.spec import TunedKernel
from kernels.tuned import load_tuned_file, tuned_path
from perfmodel.errors import InputError
from perfmodel.schedule.catalog import get_entry, get_tuned_kernel, tuned_kernels
from perfmodel.schedule.tune import Candidate, TuneResult, tune

#: Candidates this close to the best expected time count as ties when picking a stored default.
DEFAULT_TIE_BAND = 0.01
#: A stored default stays within the chip's default scoped VMEM limit (no raised vmem_limit_bytes) when a
#: candidate that does is at most this much slower than the fastest legal candidate.
SCOPED_VMEM_BAND = 0.10
#: A stored default that needs a raised vmem_limit_bytes never asks for more than this share of the physical VMEM.
MAX_RAISED_VMEM_FRACTION = 0.75


def robust_choice(result: TuneResult) -> Candidate:
    """The default to store, safe to compile on the chip.

    The pool (:func:`_pool`): candidates within the chip's default scoped VMEM limit (the kernel
    passes no vmem_limit_bytes) when the fastest of them is within
    SCOPED_VMEM_BAND of the fastest legal candidate; otherwise those and the
    candidates whose raised vmem_limit_bytes (and VMEM) stay within
    MAX_RAISED_VMEM_FRACTION of the physical VMEM. Among the pool's candidates
    within DEFAULT_TIE_BAND of its fastest: the fewest HBM bytes moved, then the
    fewest grid steps, then the least VMEM (the choice least exposed to model
    error and HBM contention).
    """
    pool = _pool(result)
    best = min(c.expected_s for c in pool)
    close = [c for c in pool if c.expected_s <= best * (1 + DEFAULT_TIE_BAND)]
    return min(close, key=_tie_break)


def _pool(result: TuneResult) -> list[Candidate]:
    """The candidates robust_choice may store, fastest first."""
    fastest = result.best.expected_s
    pool = [c for c in result.ranked if c.vmem_limit_bytes is None]
    if not pool or min(c.expected_s for c in pool) > fastest * (1 + SCOPED_VMEM_BAND):
        raised = {id(c) for c in _raised_within_cap(result)}
        pool = [c for c in result.ranked if c.vmem_limit_bytes is None or id(c) in raised]
        if not pool:
            raise InputError(f"tune {result.kernel}: no candidate fits the default scoped VMEM or "
                             f"{MAX_RAISED_VMEM_FRACTION:.0%} of the physical VMEM of {result.chip}")
    return pool


def _raised_within_cap(result: TuneResult) -> list[Candidate]:
    """Candidates that need a raised VMEM limit, at most MAX_RAISED_VMEM_FRACTION of the physical VMEM (limit and
    need), fastest first."""
    from perfmodel.schedule.analyze import resolve_chip

    physical = resolve_chip(result.chip).memory.vmem_bytes_per_core
    cap = MAX_RAISED_VMEM_FRACTION * physical if physical else math.inf
    return [c for c in result.ranked
            if c.vmem_limit_bytes is not None and max(c.vmem_limit_bytes, c.vmem_bytes) <= cap]


def _tie_break(c: Candidate) -> tuple[int, int, int]:
    return c.hbm_bytes, c.steps, c.vmem_bytes


def preference_order(result: TuneResult) -> list[Candidate]:
    """robust_choice's pick first, then the rest of its pool fastest first (what ``--compile N`` compiles)."""
    choice = robust_choice(result)
    return [choice] + [c for c in _pool(result) if c is not choice]


def raised_candidates(result: TuneResult, n: int) -> list[Candidate]:
    """``n`` candidates outside robust_choice's pool that need a raised VMEM limit within MAX_RAISED_VMEM_FRACTION
    of the physical VMEM (none when the pool already admits raised limits): those within DEFAULT_TIE_BAND of the
    fastest of them first, the least vector-unit work first (then the fastest by the model), then the rest fastest
    first.

    The model overlaps VPU work with the MXU completely; the compiler's schedule hides only part of it under a
    large dot, so among raised candidates the model cannot tell apart the one with the least VPU work is the one
    worth compiling (v5e's w4a8: 256-row tiles unpack each int4 weight tile for 256 rows, 1024-row tiles for
    1024, and compile 7% slower at the same model time)."""
    if n <= 0 or any(c.vmem_limit_bytes is not None for c in _pool(result)):
        return []
    raised = _raised_within_cap(result)  # fastest first: the model's ties are a prefix
    ties = sum(c.expected_s <= raised[0].expected_s * (1 + DEFAULT_TIE_BAND) for c in raised)
    return (sorted(raised[:ties], key=lambda c: (c.vpu_ops, c.expected_s, *_tie_break(c))) + raised[ties:])[:n]


def incumbent_candidate(result: TuneResult, stored: dict[str, Any] | None, fields: Sequence[str],
                        exclude: Sequence[Candidate] = ()) -> list[Candidate]:
    """The candidate with the blocks already stored for this chip and configuration (``stored``: its entry in the
    kernel's tuned.json, None when there is none), as a one-element list, when it is still legal and not among
    ``exclude`` (the candidates compiled anyway) and within the VMEM any stored choice may take (the default scoped
    limit, or a raised one within MAX_RAISED_VMEM_FRACTION of the physical VMEM); else an empty list. Compiled
    next to the pool, a re-tune keeps a default the model now ranks lower unless one of the pool compiles
    faster."""
    if not stored:
        return []
    want = {f: stored.get(f) for f in fields}
    taken = {id(c) for c in exclude}
    capped = {id(c) for c in _raised_within_cap(result)}
    return [c for c in result.ranked if {f: c.blocks.get(f) for f in fields} == want and id(c) not in taken
            and (c.vmem_limit_bytes is None or id(c) in capped)][:1]


def compiled_choice(compiled: Sequence[Any]) -> Any:
    """Of compiled candidates (:class:`perfmodel.schedule.compiled.CompiledCandidate`), the one to store: among
    those Mosaic accepted, within DEFAULT_TIE_BAND of the fastest compiler-backed time, the fewest HBM bytes, grid
    steps and VMEM bytes. InputError when the compiler rejected every one."""
    ok = [c for c in compiled if c.compiled_s is not None]
    if not ok:
        errors = "; ".join(sorted({(c.error or "?").split("\n")[0][:120] for c in compiled}))
        raise InputError(f"the compiler rejected all {len(compiled)} candidates compiled: {errors}")
    best = min(c.compiled_s for c in ok)
    close = [c for c in ok if c.compiled_s <= best * (1 + DEFAULT_TIE_BAND)]
    return min(close, key=lambda c: _tie_break(c.candidate))


def compiled_choice_with_raised(pool: Sequence[Any], raised: Sequence[Any]) -> Any:
    """:func:`compiled_choice` among the pool's compiled candidates; one of the raised-limit candidates
    ``compile_raised`` added replaces it only when it compiles faster by more than DEFAULT_TIE_BAND (at a tie the
    default scoped limit stays), or when the compiler rejected the whole pool."""
    try:
        pick = compiled_choice(pool)
    except InputError:
        if not any(c.compiled_s is not None for c in raised):
            raise
        return compiled_choice(raised)
    faster = [c for c in raised if c.compiled_s is not None and c.compiled_s * (1 + DEFAULT_TIE_BAND) < pick.compiled_s]
    return compiled_choice(faster) if faster else pick


def _stored(choice: Candidate, result: TuneResult, derived: dict[str, Any], compiled: Any = None,
            compiled_count: int | None = None) -> dict[str, Any]:
    # How many candidates the model cannot tell from the fastest (many: the tie-break decided).
    ties = sum(c.expected_s <= result.best.expected_s * (1 + DEFAULT_TIE_BAND) for c in result.ranked)
    out = {**choice.blocks, **derived, "expected_s": choice.expected_s, "fastest_s": result.best.expected_s,
           "vmem_bytes": choice.vmem_bytes, "vmem_limit_bytes": choice.vmem_limit_bytes,
           "legal_candidates": len(result.ranked), "within_tie_band": ties, "reason": choice.reason}
    if compiled is not None:
        out.update(compiled_s=compiled.compiled_s, vmem_allocated_bytes=compiled.vmem_allocated_bytes,
                   candidates_compiled=compiled_count)
    return out


def tune_kernel_defaults(spec: TunedKernel, chips: Sequence[str] | None = None, *, compile_top: int | None = None,
                         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """{chip: {config: stored choice}} for one kernel; chips or configurations it rejects are left out.

    ``compile_top``: compile that many candidates per chip and configuration (see the module docstring); chips
    the installed compiler has no deviceless target for keep the schedule model's choice, with ``compiled_s``
    null."""
    stored = _stored_defaults(spec) if compile_top is not None else {}
    out: dict[str, Any] = {}
    for name in tuned_chip_names(spec, chips):
        chip_name, per_config = chip_defaults(spec, name, compile_top=compile_top, stored=stored, progress=progress)
        if per_config:
            out[chip_name] = per_config
    return out


def tuned_chip_names(spec: TunedKernel, chips: Sequence[str] | None = None) -> list[str]:
    """The chips a kernel's defaults are tuned for: ``chips``, else the kernel's own list, else every TPU."""
    from perfmodel.hw.registry import all_chips

    return list(chips or spec.chip_names() or [c.name for c in all_chips() if c.kind == "tpu"])


def chip_defaults(spec: TunedKernel, chip_name: str, *, compile_top: int | None = None,
                  stored: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None
                  ) -> tuple[str, dict[str, Any]]:
    """(chip's registry name, {config: stored choice}) of one kernel on one chip (configurations the chip
    rejects left out); ``stored``: the kernel's stored defaults, the incumbents of a --compile re-tune."""
    from perfmodel.compiler.toolchain import deviceless_topology
    from perfmodel.schedule.analyze import resolve_chip

    entry = get_entry(spec.entry)
    extra = spec.extra() if spec.extra else None
    stored = stored or {}
    chip = resolve_chip(chip_name)
    per_config = {}
    for config in spec.configs:
        static = {**(extra or {}), **config.static} or None
        try:
            result = tune(entry, config.shapes, chip, extra=static, prune_slack=SCOPED_VMEM_BAND)
            choice = robust_choice(result)
        except InputError:
            continue  # e.g. fp8 weights on a chip without an fp8 MXU path
        compiled, count = None, None
        if compile_top is not None and deviceless_topology(chip) is not None:
            from perfmodel.schedule.compiled import rerank_compiled

            if progress is not None:
                progress(f"compiling {spec.kernel} {config.key} on {chip.name} ...")
            pool = preference_order(result)[:compile_top]
            order = pool + raised_candidates(result, spec.compile_raised)
            order += incumbent_candidate(result, stored.get(chip.name, {}).get(config.key),
                                         [ax.field for ax in entry.block_axes], exclude=order)
            reranked = rerank_compiled(dataclasses.replace(result, ranked=tuple(order)), config.shapes, chip,
                                       top=len(order), extra=static)
            in_pool = {id(c) for c in pool}
            try:
                compiled = compiled_choice_with_raised([c for c in reranked if id(c.candidate) in in_pool],
                                                       [c for c in reranked if id(c.candidate) not in in_pool])
            except InputError as exc:
                raise InputError(f"tune --write --compile {spec.kernel} ({config.key}) on {chip.name}: "
                                 f"{exc}; widen --compile") from None
            choice, count = compiled.candidate, len(order)
        derived = spec.derived(choice.blocks, entry.specs(config.shapes)) if spec.derived else {}
        per_config[config.key] = _stored(choice, result, derived, compiled, count)
    return chip.name, per_config


def _stored_defaults(spec: TunedKernel) -> dict[str, Any]:
    """The kernel's stored defaults ({chip: {config: entry}}) of the configurations tuned on the --shape flags
    ``spec`` tunes them on now (an entry for another problem is no incumbent); empty without a tuned.json."""
    try:
        data = load_tuned_file(spec.kernel)
    except FileNotFoundError:
        return {}
    same = {c.key for c in spec.configs if data.get("shapes", {}).get(c.key) == list(c.shapes)}
    return {chip: {k: v for k, v in configs.items() if k in same} for chip, configs in data["defaults"].items()}


def _about(spec: TunedKernel, compile_top: int | None = None) -> str:
    raised = ("" if not spec.compile_raised else
              f" (plus, where the pool kept only candidates within the default scoped VMEM limit, the model's "
              f"first {spec.compile_raised} with a raised limit within {MAX_RAISED_VMEM_FRACTION:.0%} of the physical "
              f"VMEM, those within {DEFAULT_TIE_BAND:.0%} of the fastest such ordered by the least vector-unit work, "
              f"stored only when it compiles more than {DEFAULT_TIE_BAND:.0%} faster than the "
              f"pool's pick: the compiler-backed time decides whether raising the limit pays)")
    compiled = ("" if compile_top is None else
                f" With --compile {compile_top}: the first {compile_top} candidates of that order (the choice, then the "
                f"rest of its pool fastest first){raised} compiled with libtpu on each chip it targets, and the "
                f"fastest by the compiler-backed time among those Mosaic accepts stored (within "
                f"{DEFAULT_TIE_BAND:.0%}: the same tie-break); the blocks stored before the run are compiled too and "
                f"kept only when they compile more than {DEFAULT_TIE_BAND:.0%} faster than that pick (a re-tune does not "
                f"drop a default the model now ranks lower but the compiler finds faster); compiled_s and "
                f"vmem_allocated_bytes are the compiler's figures.")
    return (f"Per-chip default block sizes of kernels/{spec.kernel}, chosen by `perfmodel tune {spec.entry}` (the "
            f"schedule model) on {spec.problem}; 'shapes' lists the --shape flags per configuration. The choice: "
            f"among candidates within {SCOPED_VMEM_BAND:.0%} of the fastest, only those within the chip's default "
            f"scoped VMEM limit (vmem_limit_bytes null); if none is that close, also those whose raised vmem_limit_bytes "
            f"stays within {MAX_RAISED_VMEM_FRACTION:.0%} of the physical VMEM; then, within {DEFAULT_TIE_BAND:.0%} "
            f"of the fastest of those, the fewest HBM bytes, grid steps and VMEM bytes. "
            + (spec.note + " " if spec.note else "") + compiled
            + (" " if compiled else "") + "Regenerate with `perfmodel tune --write"
            + ("" if compile_top is None else f" --compile {compile_top}") + "`.")


def write_tuned_defaults(kernel: str | TunedKernel, path: str | Path | None = None,
                         chips: Sequence[str] | None = None, *, compile_top: int | None = None,
                         progress: Callable[[str], None] | None = None,
                         defaults: dict[str, Any] | None = None) -> Path:
    """Tune one kernel's per-chip defaults and write them as JSON (default: kernels/<kernel>/tuned.json).

    ``kernel``: a bundled kernel's name (its folder's ``entry.py:TUNED``), or a :class:`TunedKernel` (e.g. a
    smaller problem); ``defaults``: the {chip: {config: choice}} already tuned (:func:`write_all` tunes on
    perfmodel.runner), else tuned here.
    """
    spec = kernel if isinstance(kernel, TunedKernel) else get_tuned_kernel(kernel)
    compiler = _compiler_record(spec, compile_top)  # one line when libtpu is missing, before any tuning
    if defaults is None:
        defaults = tune_kernel_defaults(spec, chips, compile_top=compile_top, progress=progress)
    data = {
        "kernel": spec.kernel,
        "about": _about(spec, compile_top),
        "entry": spec.entry,
        "shapes": {c.key: list(c.shapes) for c in spec.configs},
        "rule": {"tie_band": DEFAULT_TIE_BAND, "scoped_vmem_band": SCOPED_VMEM_BAND,
                 "max_raised_vmem_fraction": MAX_RAISED_VMEM_FRACTION},
        "defaults": defaults,
    }
    if compiler is not None:
        data["compiler"] = compiler
    path = Path(path) if path is not None else tuned_path(spec.kernel)
    from perfmodel.fileio import write_text_atomic

    # Written whole: a crash never leaves a kernel with half a defaults file.
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
    load_tuned_file.cache_clear()
    return path


def _compiler_record(spec: TunedKernel, compile_top: int | None) -> dict[str, Any] | None:
    """The tuned file's "compiler" record of a --compile re-tune (None without one); raises the one-line error
    when libtpu is missing."""
    if compile_top is None:
        return None
    from perfmodel.compiler.toolchain import toolchain

    tools = toolchain()
    compiler: dict[str, Any] = {"compile_top": compile_top, "libtpu": tools.libtpu_version, "jax": tools.jax_version}
    if spec.compile_raised:
        compiler["compile_raised"] = spec.compile_raised
    return compiler


def _tune_task(task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One (kernel, chip) of :func:`write_all` (module level: perfmodel.runner's workers call it)."""
    spec = get_tuned_kernel(task["kernel"])
    stored = _stored_defaults(spec) if task["compile_top"] is not None else {}
    return chip_defaults(spec, task["chip"], compile_top=task["compile_top"], stored=stored)


def write_all(kernels: Sequence[str] = (), *, compile_top: int | None = None,
              progress: Callable[[str], None] | None = None, backend: str = "auto", workers: int | None = None,
              address: str | None = None) -> list[Path]:
    """Rewrite the stored defaults of the named bundled kernels (all with block sizes when none is named): every
    (kernel, chip) is one task on perfmodel.runner's ``backend``; each kernel's file is written when all of its
    chips are done, whole (a failed task fails the run with the kernel and chip named, before any file of the
    failed kernel is written)."""
    from perfmodel.runner import run_tasks

    specs = [get_tuned_kernel(name) for name in (list(kernels) or [t.kernel for t in tuned_kernels()])]
    for spec in specs:
        _compiler_record(spec, compile_top)
    tasks = [{"kernel": spec.kernel, "chip": chip, "compile_top": compile_top}
             for spec in specs for chip in tuned_chip_names(spec)]

    def tick(message: str, *, done: int, total: int) -> None:
        if progress is not None:
            progress(f"tuned {done}/{total} (kernel, chip) pairs")

    results = run_tasks(_tune_task, tasks, backend=backend, workers=workers, address=address, progress=tick)
    failed = next((r for r in results if not r.ok), None)
    if failed is not None:
        t = failed.inputs
        raise InputError(f"tune --write: {t['kernel']} on {t['chip']}: {failed.error}")
    written = []
    for spec in specs:
        defaults = {chip: per for r in results if r.inputs["kernel"] == spec.kernel
                    for chip, per in [r.value] if per}
        written.append(write_tuned_defaults(spec, compile_top=compile_top, defaults=defaults))
    return written
