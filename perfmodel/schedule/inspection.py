"""One kernel call seen from every side (`perfmodel inspect` and `perfmodel analyze --compile`).

* :func:`inspect_kernel`: lower a catalog kernel for TPU (jax.export; Mosaic
  runs on the host), and set XLA's cost analysis of its jnp reference
  (compiled for the CPU) next to perfmodel's op model and the schedule model,
  flagging counts more than 5% apart (:class:`Inspection`);
  :func:`save_inspection` writes the artifacts, :func:`render_inspection`
  prints them.
* :func:`compile_inspection`: the TPU compiler's report of a catalog kernel
  or of MODULE:FUNCTION, paired kernel by kernel with the schedule model
  (:class:`CompiledInspection`).
* :func:`analyze_target`: the schedule model of MODULE:FUNCTION, with the
  compile report when asked (:class:`TargetAnalysis`).

Errors name the keyword arguments (`` `blocks` ``, `` `out_dir` ``); the CLI
turns them into its flags. jax is imported when a function runs.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from perfmodel.errors import InputError
from perfmodel.jsonable import dumps, to_jsonable


@dataclass(frozen=True, kw_only=True)
class Inspection:
    """A catalog kernel lowered for TPU, and its costs three ways."""

    kernel: str
    chip: str
    #: --shape texts of every array (defaults filled in).
    shapes: tuple[str, ...]
    #: The blocks used, or "kernel default".
    blocks: dict[str, int] | str
    #: Per Mosaic kernel: name, MLIR characters, serialized body bytes.
    mosaic_kernels: tuple[dict[str, Any], ...]
    #: CostCount rows: XLA's (when the kernel has a jnp reference), perfmodel's op model, the schedule model.
    costs: tuple[Any, ...]
    #: (source, field, relative difference) of each count more than 5% from XLA's compiled reference.
    disagreements: tuple[dict[str, Any], ...]
    schedule_hbm_bytes_moved: int
    schedule_expected_s: float
    #: The StableHLO and Mosaic MLIR (perfmodel.schedule.artifacts.Lowered); not in the JSON.
    lowered: Any
    #: Files written by :func:`save_inspection`.
    files: tuple[str, ...] = ()

    JSON_OMIT: ClassVar[tuple[str, ...]] = ("lowered",)


def check_blocks(entry: Any, blocks: Mapping[str, int] | None) -> None:
    """InputError unless ``blocks`` names every block field of the catalog entry, and nothing else."""
    if blocks is None:
        return
    fields = {ax.field for ax in entry.block_axes}
    unknown = set(blocks) - fields if fields else set()
    if unknown:
        raise InputError(f"`blocks`: {', '.join(sorted(unknown))} not a block field of {entry.name}; "
                         f"fields: {', '.join(sorted(fields))}", fields=("blocks",))
    missing = fields - set(blocks)
    if missing:
        raise InputError(f"`blocks`: give every block field of {entry.name} together; missing "
                         f"{', '.join(sorted(missing))}", fields=("blocks",))


def inspect_kernel(kernel: str, shapes: Sequence[str] = (), blocks: Mapping[str, int] | None = None,
                   chip: Any = None, extra: Mapping[str, Any] | None = None) -> Inspection:
    """Lower, analyze and cost one catalog kernel (``perfmodel tune --list``); shapes default to its example,
    blocks to the kernel's own default (or the entry's reference blocks)."""
    from perfmodel.hw.registry import DEFAULT_CHIP
    from perfmodel.schedule.analyze import analyze, resolve_chip
    from perfmodel.schedule.artifacts import CostCount, compare_costs, lower_for_tpu, xla_cost
    from perfmodel.schedule.catalog import get_entry

    entry = get_entry(kernel)
    spec = resolve_chip(chip if chip is not None else DEFAULT_CHIP)
    extra = dict(extra or {})
    specs = entry.specs(shapes)
    check_blocks(entry, blocks)
    use_blocks = blocks if blocks is not None else (dict(entry.reference_blocks) if entry.reference_blocks else None)
    fn = entry.make_function(specs, use_blocks, spec, extra=extra)
    lowered = lower_for_tpu(fn, *entry.arguments(specs, concrete=False))
    analysis = analyze(fn, *entry.arguments(specs), chip=spec)

    rows: list[CostCount] = []
    est = [k.cost_estimate for k in analysis.kernels if k.cost_estimate]
    if est:
        rows.append(CostCount(source="perfmodel op model (the kernel's pl.CostEstimate)",
                              flops=sum(e["flops"] for e in est),
                              transcendentals=sum(e["transcendentals"] for e in est),
                              hbm_bytes=sum(e["bytes_accessed"] for e in est)))
    elif entry.op_model is not None:
        cost = entry.op_model(specs, {**entry.static, **extra})
        rows.append(CostCount(source="perfmodel op model", flops=float(cost.useful_flops) + float(cost.vpu_ops),
                              transcendentals=float(cost.eup_ops), hbm_bytes=float(cost.hbm_bytes)))
    rows.append(CostCount(
        source="schedule model (useful work, each byte once)",
        flops=sum(k.work.mxu_useful_flops + k.work.vpu_ops for k in analysis.kernels),
        transcendentals=sum(k.work.eup_ops for k in analysis.kernels),
        hbm_bytes=float(sum(k.ideal_hbm_bytes for k in analysis.kernels)),
    ))
    comparison = None
    if entry.reference_fn() is not None:
        compiled, unoptimized = xla_cost(*_reference_call(entry, specs, spec, extra))
        comparison = compare_costs(compiled, rows, context=(unoptimized,))
    return Inspection(
        kernel=entry.name,
        chip=spec.name,
        shapes=tuple(s.text() for s in specs.values()),
        blocks=dict(use_blocks) if use_blocks else "kernel default",
        mosaic_kernels=tuple({"name": k.name, "mlir_chars": len(k.mlir), "body_bytes": k.body_bytes}
                             for k in lowered.kernels),
        costs=tuple(comparison.rows if comparison else rows),
        disagreements=tuple({"source": s, "field": f, "relative_difference": r}
                            for s, f, r in (comparison.disagreements if comparison else ())),
        schedule_hbm_bytes_moved=sum(k.hbm_bytes for k in analysis.kernels),
        schedule_expected_s=analysis.expected_s,
        lowered=lowered,
    )


def _reference_call(entry: Any, specs: Mapping[str, Any], chip: Any, extra: Mapping[str, Any]) -> tuple[Any, ...]:
    """(function, *abstract arrays) of the jnp reference; arrays given a FILL are baked in as constants
    (references may need concrete values, e.g. a sequence count)."""
    from perfmodel.schedule.binding import free_function

    full = entry.make_function(specs, None, chip, reference=True, extra=extra)
    names = entry.names(specs)
    values = list(entry.arguments(specs))
    fn, _, free_values = free_function(full, values, [specs[n] for n in names])
    return (fn, *free_values)


def _out_dir(out_dir: str | Path) -> Path:
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"`out_dir` '{path}': cannot create the directory ({exc.strerror})",
                         fields=("out_dir",)) from None
    return path


def save_inspection(result: Inspection, out_dir: str | Path) -> Inspection:
    """Write stablehlo.mlir, mosaic_<n>_<kernel>.mlir and costs.json into out_dir; the result with its files."""
    path = _out_dir(out_dir)
    lowered = result.lowered
    written = [path / "stablehlo.mlir"]
    written[0].write_text(lowered.stablehlo)
    for i, k in enumerate(lowered.kernels):
        mlir = path / f"mosaic_{i}_{k.name}.mlir"
        mlir.write_text(k.mlir)
        written.append(mlir)
    costs = path / "costs.json"
    record = to_jsonable(result)
    record.pop("files")
    costs.write_text(dumps(record, indent=2) + "\n")
    written.append(costs)
    return dataclasses.replace(result, files=tuple(str(p) for p in written))


def render_inspection(result: Inspection, *, print_mlir: bool) -> str:
    """The MLIR (or the files written) and the costs table, disagreements with XLA marked '!'."""
    from perfmodel.units import nbytes, seconds, si, table

    lowered = result.lowered
    lines = [f"inspect {result.kernel} on {result.chip}: {' '.join(result.shapes)}", f"blocks: {result.blocks}"]
    if print_mlir:
        lines += ["", "== StableHLO (jax.export, platforms=['tpu']) ==", lowered.stablehlo_elided()]
        for i, k in enumerate(lowered.kernels):
            lines += ["", f"== Mosaic MLIR #{i}: {k.name} ({k.body_bytes} bytes serialized) ==", k.mlir]
    else:
        lines += ["", "wrote:", *(f"  {p}" for p in result.files)]
    lines += ["", "== costs =="]
    rows = []
    flagged = {(d["source"], d["field"]): d["relative_difference"] for d in result.disagreements}
    for c in result.costs:
        def cell(field: str, unit: str) -> str:
            v = getattr(c, field)
            text = "n/a" if v is None else si(v, unit)
            rel = flagged.get((c.source, field))
            return text + (f" ({rel:+.0%} vs XLA!)" if rel is not None else "")
        rows.append([c.source, cell("flops", "FLOP"), cell("transcendentals", "op"), cell("hbm_bytes", "B")])
    lines.append(table(["source", "FLOPs", "transcendentals", "HBM bytes"], rows, align="lrrr"))
    lines.append(f"schedule model: {nbytes(result.schedule_hbm_bytes_moved)} actually moved by the pipeline, "
                 f"expected {seconds(result.schedule_expected_s)}")
    if result.disagreements:
        lines.append(f"{len(result.disagreements)} count(s) differ from the compiled reference's by more than 5% "
                     "(marked '!'). XLA counts the reference's own program: f32 upcasts and intermediates XLA:CPU "
                     "materializes (e.g. attention scores) add bytes a fused kernel never moves.")
    else:
        lines.append("all counts within 5% of XLA's")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the compiler's view


@dataclass(frozen=True, kw_only=True)
class CompiledInspection:
    """A call compiled by the TPU compiler, paired kernel by kernel with the schedule model."""

    #: What was compiled: a catalog kernel's name or MODULE:FUNCTION.
    label: str
    chip: str
    #: perfmodel.compiler.api.CompileReport and the perfmodel.schedule.compiled.CompiledKernel of each kernel.
    compile: Any
    compiled_kernels: tuple[Any, ...]
    files: tuple[str, ...] = ()


def _compile(call: Any, analysis: Any, chip: Any, progress: Callable[[str], None] | None) -> CompiledInspection:
    from perfmodel.compiler.api import compile_report
    from perfmodel.schedule.compiled import pair

    report = compile_report(call, chip, progress=progress)
    if not report.compiled:
        raise InputError(f"{call.label} does not compile for {chip.name}: {report.error}")
    return CompiledInspection(label=call.label, chip=chip.name, compile=report,
                              compiled_kernels=tuple(pair(analysis, report, chip)))


def compile_inspection(target: str, shapes: Sequence[str] = (), blocks: Mapping[str, int] | None = None,
                       args: Sequence[str] = (), chip: Any = None,
                       progress: Callable[[str], None] | None = None) -> CompiledInspection:
    """The compile report of a catalog kernel, or of MODULE:FUNCTION (``args``: its NAME=VALUE texts)."""
    from perfmodel.compiler.api import CompileCall
    from perfmodel.compiler.toolchain import toolchain
    from perfmodel.hw.registry import DEFAULT_CHIP
    from perfmodel.schedule.analyze import analyze, resolve_chip
    from perfmodel.schedule.binding import bind_function, parse_arg
    from perfmodel.schedule.catalog import get_entry

    toolchain()  # fail fast, in one line, without libtpu
    spec = resolve_chip(chip if chip is not None else DEFAULT_CHIP)
    if ":" in target:
        if blocks is not None:
            raise InputError("`blocks`: applies to catalog kernels; pass MODULE:FUNCTION's block sizes with `args`",
                             fields=("blocks", "args"))
        call = CompileCall(kind="function", target=target, shapes=tuple(shapes), args=tuple(args))
        fn, arrays = bind_function(target, shapes, args, spec)
    else:
        entry = get_entry(target)
        extra = dict(parse_arg(a) for a in args)
        specs = entry.specs(shapes)
        call = CompileCall(kind="catalog", target=entry.name, shapes=tuple(s.text() for s in specs.values()),
                           blocks=blocks, extra=extra)
        fn, arrays = entry.make_function(specs, blocks, spec, extra=extra), entry.arguments(specs)
    analysis = analyze(fn, *arrays, chip=spec, keep_step_times=True)
    return _compile(call, analysis, spec, progress)


def save_compiled(result: CompiledInspection, out_dir: str | Path) -> CompiledInspection:
    """Copy each kernel's grid-loop bundles and write compile.json into out_dir; the result with its files."""
    path = _out_dir(out_dir)
    written = []
    for k in result.compile.kernels:
        if k.body_bundles_path:
            dest = path / Path(k.body_bundles_path).name
            shutil.copyfile(k.body_bundles_path, dest)
            written.append(str(dest))
    dest = path / "compile.json"
    dest.write_text(dumps(compiled_record(result), indent=2) + "\n")
    written.append(str(dest))
    return dataclasses.replace(result, files=tuple(written))


def compiled_record(result: CompiledInspection) -> dict[str, Any]:
    """JSON-ready: {"compile": report, "compiled_kernels": [...]} (and "files" once saved)."""
    out = {"compile": to_jsonable(result.compile), "compiled_kernels": to_jsonable(result.compiled_kernels)}
    if result.files:
        out["files"] = list(result.files)
    return out


@dataclass(frozen=True, kw_only=True)
class TargetAnalysis:
    """`perfmodel analyze MODULE:FUNCTION`: the schedule model, and the compiler's view when asked."""

    analysis: Any  # perfmodel.schedule.results.Analysis
    compiled: CompiledInspection | None = None


def analyze_target(target: str, shapes: Sequence[str] = (), args: Sequence[str] = (), chip: Any = None, *,
                   with_compile: bool = False, progress: Callable[[str], None] | None = None,
                   loop_trips: int | None = None) -> TargetAnalysis:
    """Bind MODULE:FUNCTION's arguments (``--shape`` / ``--arg`` texts), model every pallas_call it runs and,
    ``with_compile``, compile it with the TPU compiler and pair the two views. ``loop_trips``: see
    :func:`perfmodel.schedule.analyze.analyze`."""
    from perfmodel.hw.registry import DEFAULT_CHIP
    from perfmodel.schedule.analyze import analyze, resolve_chip
    from perfmodel.schedule.binding import bind_function

    spec = resolve_chip(chip if chip is not None else DEFAULT_CHIP)
    if with_compile:
        from perfmodel.compiler.toolchain import toolchain

        toolchain()  # fail fast, in one line, without libtpu
    fn, arrays = bind_function(target, shapes, args, spec)
    analysis = analyze(fn, *arrays, chip=spec, keep_step_times=with_compile, loop_trips=loop_trips)
    if not with_compile:
        return TargetAnalysis(analysis=analysis)
    from perfmodel.compiler.api import CompileCall

    call = CompileCall(kind="function", target=target, shapes=tuple(shapes), args=tuple(args))
    return TargetAnalysis(analysis=analysis, compiled=_compile(call, analysis, spec, progress))
