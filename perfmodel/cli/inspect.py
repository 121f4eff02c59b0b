"""`perfmodel inspect`: a kernel's compiler artifacts and its costs three ways.

Lowers KERNEL for TPU with jax.export (Mosaic runs on the CPU; no TPU
needed), prints or saves (--out DIR) the Mosaic MLIR of each kernel and the
surrounding StableHLO, then compiles the kernel's pure-jnp reference for the
CPU and prints XLA's cost analysis next to perfmodel's op model and the
schedule model, flagging counts more than 5% away from XLA's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import click

from perfmodel.cli.analyze import DEFAULT_CHIP, SHAPE_HELP, parse_arg
from perfmodel.cli.common import UserError, echo_json, json_option, user_errors
from perfmodel.errors import InputError

_HELP = """Lower KERNEL for TPU (jax.export, no TPU needed): print or save the Mosaic MLIR and the
surrounding StableHLO; compare XLA's cost analysis of the jnp reference (compiled on CPU) with
perfmodel's op model and the schedule model, flagging disagreements over 5%.

\b
KERNEL is one of `perfmodel tune --list`; shapes default to the kernel's example.
Examples:
  perfmodel inspect matmul --shape x=2048x4096:bf16 --shape w=4096x1024:bf16 --hw v5e
  perfmodel inspect jax-matmul --block bm=512 --block bk=1024 --block bn=1024 --out /tmp/mm
"""


def parse_blocks(texts: tuple[str, ...]) -> dict[str, int] | None:
    if not texts:
        return None
    out = {}
    for t in texts:
        name, value = parse_arg(t)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"--block '{t}': expected NAME=POSITIVE_INT, e.g. --block bm=512")
        out[name] = value
    return out


@click.command("inspect", help=_HELP, context_settings={"max_content_width": 110})
@click.argument("kernel")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS[:DTYPE][=FILL]", help=SHAPE_HELP)
@click.option("--block", "blocks", multiple=True, metavar="FIELD=INT",
              help="Block-size field of the kernel (all fields together); default: the kernel's own default.")
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", help="Extra static argument (Python literal).")
@click.option("--hw", default=DEFAULT_CHIP, show_default=True, metavar="CHIP", help="TPU name, alias or spec file.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write stablehlo.mlir, mosaic_<n>_<kernel>.mlir and costs.json here instead of printing the MLIR "
                   "(with --compile: compile.json and each kernel's grid-loop bundles).")
@click.option("--compile", "with_compile", is_flag=True,
              help="Compile with the TPU compiler (libtpu, deviceless; cached) and print the compile report: "
                   "Mosaic's VMEM vs perfmodel's estimate, grid-step bundles, slot use, spills, DMAs, trip count. "
                   "KERNEL may then also be MODULE:FUNCTION (arguments as for analyze).")
@json_option
@user_errors
def inspect_cmd(kernel: str, shapes: tuple[str, ...], blocks: tuple[str, ...], args: tuple[str, ...], hw: str,
                out_dir: Path | None, with_compile: bool, as_json: bool) -> None:
    if with_compile:
        run_compile_inspect(kernel, shapes, parse_blocks(blocks), args, hw, out_dir, as_json)
        return
    result = run_inspect(kernel, shapes, parse_blocks(blocks), hw, dict(parse_arg(a) for a in args))
    if out_dir is not None:
        written = save(result, out_dir)
        result["files"] = [str(p) for p in written]
    if as_json:
        echo_json({k: v for k, v in result.items() if k not in ("lowered",)})
        return
    click.echo(render(result, print_mlir=out_dir is None))


def run_compile_inspect(kernel: str, shapes: tuple[str, ...], blocks: Mapping[str, int] | None,
                        args: tuple[str, ...], hw: str, out_dir: Path | None, as_json: bool) -> None:
    """``inspect --compile``: the compile report of a catalog kernel or of MODULE:FUNCTION."""
    import json
    import shutil

    from perfmodel.cli.analyze import progress_echo
    from perfmodel.cli.common import to_jsonable
    from perfmodel.compiler.api import CompileCall, compile_report
    from perfmodel.compiler.render import render_report
    from perfmodel.schedule.analyze import analyze, resolve_chip
    from perfmodel.schedule.binding import bind_function
    from perfmodel.schedule.catalog import get_entry
    from perfmodel.schedule.compiled import pair

    from perfmodel.compiler.toolchain import toolchain

    toolchain()  # fail fast, in one line, without libtpu
    chip = resolve_chip(hw)
    if ":" in kernel:
        if blocks is not None:
            raise InputError("--block: applies to catalog kernels; pass MODULE:FUNCTION's block sizes with --arg")
        call = CompileCall(kind="function", target=kernel, shapes=tuple(shapes), args=tuple(args))
        fn, arrays = bind_function(kernel, shapes, args, chip)
    else:
        entry = get_entry(kernel)
        extra = dict(parse_arg(a) for a in args)
        specs = entry.specs(shapes)
        call = CompileCall(kind="catalog", target=entry.name, shapes=tuple(s.text() for s in specs.values()),
                           blocks=blocks, extra=extra)
        fn, arrays = entry.make_function(specs, blocks, chip, extra=extra), entry.arguments(specs)
    analysis = analyze(fn, *arrays, chip=chip, keep_step_times=True)
    report = compile_report(call, chip, progress=progress_echo)
    if not report.compiled:
        raise UserError(f"{call.label} does not compile for {chip.name}: {report.error}")
    views = pair(analysis, report, chip)
    payload = {"compile": to_jsonable(report), "compiled_kernels": to_jsonable(views)}
    written = []
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--out '{out_dir}': cannot create the directory ({exc.strerror})") from None
        for k in report.kernels:
            if k.body_bundles_path:
                dest = out_dir / Path(k.body_bundles_path).name
                shutil.copyfile(k.body_bundles_path, dest)
                written.append(str(dest))
        dest = out_dir / "compile.json"
        dest.write_text(json.dumps(payload, indent=2) + "\n")
        written.append(str(dest))
        payload["files"] = written
    if as_json:
        echo_json(payload)
        return
    click.echo(render_report(report, views))
    if written:
        click.echo("\nwrote:\n" + "\n".join(f"  {p}" for p in written))


def run_inspect(kernel: str, shapes: tuple[str, ...], blocks: Mapping[str, int] | None, hw: str,
                extra: Mapping[str, Any]) -> dict[str, Any]:
    """Lower, analyze and cost one catalog kernel; a dict the renderers and --json use."""
    from perfmodel.cli.common import to_jsonable
    from perfmodel.schedule.analyze import analyze, resolve_chip
    from perfmodel.schedule.artifacts import CostCount, compare_costs, lower_for_tpu, xla_cost
    from perfmodel.schedule.catalog import get_entry

    entry = get_entry(kernel)
    chip = resolve_chip(hw)
    specs = entry.specs(shapes)
    if blocks is not None:
        fields = {ax.field for ax in entry.block_axes}
        unknown = set(blocks) - fields if fields else set()
        if unknown:
            raise InputError(f"--block: {', '.join(sorted(unknown))} not a block field of {entry.name}; "
                             f"fields: {', '.join(sorted(fields))}")
        missing = fields - set(blocks)
        if missing:
            raise InputError(f"--block: give every block field of {entry.name} together; missing "
                             f"{', '.join(sorted(missing))}")
    use_blocks = blocks if blocks is not None else (dict(entry.reference_blocks) if entry.reference_blocks else None)
    fn = entry.make_function(specs, use_blocks, chip, extra=extra)
    abstract_args = entry.arguments(specs, concrete=False)
    lowered = lower_for_tpu(fn, *abstract_args)
    analysis = analyze(fn, *entry.arguments(specs), chip=chip)

    rows: list[CostCount] = []
    est = [k.cost_estimate for k in analysis.kernels if k.cost_estimate]
    if est:
        rows.append(CostCount(source="perfmodel op model (the kernel's pl.CostEstimate)",
                              flops=sum(e["flops"] for e in est), transcendentals=sum(e["transcendentals"] for e in est),
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
    ref = entry.reference_fn()
    comparison = None
    if ref is not None:
        compiled, unoptimized = xla_cost(*_reference_call(entry, specs, chip, extra))
        comparison = compare_costs(compiled, rows, context=(unoptimized,))
    moved = sum(k.hbm_bytes for k in analysis.kernels)
    return {
        "kernel": entry.name,
        "chip": chip.name,
        "shapes": [s.text() for s in specs.values()],
        "blocks": dict(use_blocks) if use_blocks else "kernel default",
        "mosaic_kernels": [{"name": k.name, "mlir_chars": len(k.mlir), "body_bytes": k.body_bytes} for k in lowered.kernels],
        "costs": to_jsonable(comparison.rows if comparison else rows),
        "disagreements": [{"source": s, "field": f, "relative_difference": r}
                          for s, f, r in (comparison.disagreements if comparison else ())],
        "schedule_hbm_bytes_moved": moved,
        "schedule_expected_s": analysis.expected_s,
        "lowered": lowered,
    }


def _reference_call(entry: Any, specs: Mapping[str, Any], chip: Any, extra: Mapping[str, Any]) -> tuple[Any, ...]:
    """(function, *abstract arrays) of the jnp reference; arrays given a FILL are baked in as constants
    (references may need concrete values, e.g. a sequence count)."""
    from perfmodel.schedule.binding import free_function

    full = entry.make_function(specs, None, chip, reference=True, extra=extra)
    names = entry.names(specs)
    values = list(entry.arguments(specs))
    fn, _, free_values = free_function(full, values, [specs[n] for n in names])
    return (fn, *free_values)


def save(result: dict[str, Any], out_dir: Path) -> list[Path]:
    import json

    from perfmodel.cli.common import to_jsonable

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out '{out_dir}': cannot create the directory ({exc.strerror})") from None
    lowered = result["lowered"]
    written = [out_dir / "stablehlo.mlir"]
    written[0].write_text(lowered.stablehlo)
    for i, k in enumerate(lowered.kernels):
        path = out_dir / f"mosaic_{i}_{k.name}.mlir"
        path.write_text(k.mlir)
        written.append(path)
    costs = out_dir / "costs.json"
    costs.write_text(json.dumps(to_jsonable({k: v for k, v in result.items() if k != "lowered"}), indent=2) + "\n")
    written.append(costs)
    return written


def render(result: dict[str, Any], *, print_mlir: bool) -> str:
    from perfmodel.units import nbytes, seconds, si, table

    lowered = result["lowered"]
    lines = [f"inspect {result['kernel']} on {result['chip']}: {' '.join(result['shapes'])}",
             f"blocks: {result['blocks']}"]
    if print_mlir:
        lines += ["", "== StableHLO (jax.export, platforms=['tpu']) ==", lowered.stablehlo_elided()]
        for i, k in enumerate(lowered.kernels):
            lines += ["", f"== Mosaic MLIR #{i}: {k.name} ({k.body_bytes} bytes serialized) ==", k.mlir]
    else:
        lines += ["", "wrote:", *(f"  {p}" for p in result.get("files", []))]
    lines += ["", "== costs =="]
    rows = []
    flagged = {(d["source"], d["field"]): d["relative_difference"] for d in result["disagreements"]}
    for c in result["costs"]:
        def cell(field: str, unit: str) -> str:
            v = c[field]
            text = "n/a" if v is None else si(v, unit)
            rel = flagged.get((c["source"], field))
            return text + (f" ({rel:+.0%} vs XLA!)" if rel is not None else "")
        rows.append([c["source"], cell("flops", "FLOP"), cell("transcendentals", "op"), cell("hbm_bytes", "B")])
    lines.append(table(["source", "FLOPs", "transcendentals", "HBM bytes"], rows, align="lrrr"))
    lines.append(f"schedule model: {nbytes(result['schedule_hbm_bytes_moved'])} actually moved by the pipeline, "
                 f"expected {seconds(result['schedule_expected_s'])}")
    if result["disagreements"]:
        lines.append(f"{len(result['disagreements'])} count(s) differ from the compiled reference's by more than 5% "
                     "(marked '!'). XLA counts the reference's own program: f32 upcasts and intermediates XLA:CPU "
                     "materializes (e.g. attention scores) add bytes a fused kernel never moves.")
    else:
        lines.append("all counts within 5% of XLA's")
    return "\n".join(lines)
