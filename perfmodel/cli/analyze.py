"""`perfmodel analyze` and `perfmodel tune`: the kernel-schedule model on the command line.

``analyze MODULE:FUNCTION`` traces any function that runs Pallas TPU kernels
and models each pallas_call; ``tune KERNEL`` ranks block sizes of a kernel
from the catalog (`perfmodel tune --list`). Both take array arguments as
``--shape NAME=DIMS[:DTYPE][=FILL]`` (see perfmodel.schedule.shapes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import click

from perfmodel.cli.common import UserError, echo_json, json_option, to_jsonable, user_errors
from perfmodel.errors import InputError
from perfmodel.schedule.binding import bind_function, parse_arg

if TYPE_CHECKING:
    from perfmodel.hw.spec import ChipSpec

DEFAULT_CHIP = "tpu-v5e"

SHAPE_HELP = (
    "Array argument NAME=DIMS[:DTYPE][=FILL], repeatable; e.g. x=4096x4096:bf16, lengths=8:int32=1024, "
    "page_table=8x64:int32=arange. DTYPE defaults to bf16; without FILL the array is abstract "
    "(give scalar-prefetch operands a FILL)."
)

_ANALYZE_HELP = """Model every pallas_call that MODULE:FUNCTION runs: grid, HBM traffic per operand
(fetches when a block index changes, write-backs likewise, ideal bytes, re-read factor), VMEM
footprint against the chip's limits, MXU/VPU/EUP work, and an expected time next to the op floor.

\b
Arguments of FUNCTION are bound by name: arrays from --shape, Python values from --arg
(parsed as Python literals, e.g. --arg block_shape=512,1024 --arg causal=True); a dict literal
builds a dataclass parameter, e.g. --arg 'block_sizes={"bm": 512, "bk": 1024, "bn": 1024}'.
A FUNCTION with a `chip` parameter gets --hw (giving --arg chip=... too must name the same chip).

\b
Examples:
  perfmodel analyze jax.experimental.pallas.ops.tpu.matmul:matmul --hw v5e \\
      --shape x=4096x4096:bf16 --shape y=4096x4096:bf16 --arg block_shape=512,1024 --arg block_k=1024
  perfmodel analyze kernels.matmul:matmul --shape x=8192x8192:bf16 --shape w=8192x8192:bf16 --hw v6e --json
"""


@click.command("analyze", help=_ANALYZE_HELP, context_settings={"max_content_width": 110})
@click.argument("target", metavar="MODULE:FUNCTION")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS[:DTYPE][=FILL]", help=SHAPE_HELP)
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", help="Non-array argument (Python literal), repeatable.")
@click.option("--hw", default=DEFAULT_CHIP, show_default=True, metavar="CHIP", help="TPU name, alias or spec file.")
@click.option("--compile", "with_compile", is_flag=True,
              help="Also compile with the TPU compiler (libtpu, no TPU needed; cached) and show Mosaic's VMEM, the "
                   "grid-step bundles and the compiler-backed expected time next to the analytic one.")
@json_option
@user_errors
def analyze(target: str, shapes: tuple[str, ...], args: tuple[str, ...], hw: str, with_compile: bool,
            as_json: bool) -> None:
    from perfmodel.schedule.analyze import analyze as run_analysis
    from perfmodel.schedule.analyze import resolve_chip
    from perfmodel.schedule.report import render, to_json

    chip = resolve_chip(hw)
    if with_compile:
        from perfmodel.compiler.toolchain import toolchain

        toolchain()  # fail fast, in one line, without libtpu
    fn, arrays = bind_function(target, shapes, args, chip)
    result = run_analysis(fn, *arrays, chip=chip, keep_step_times=with_compile)
    if not with_compile:
        echo_json(to_json(result)) if as_json else click.echo(render(result))
        return
    from perfmodel.compiler.api import CompileCall, compile_report
    from perfmodel.compiler.render import render_report
    from perfmodel.schedule.compiled import pair

    report = compile_report(CompileCall(kind="function", target=target, shapes=tuple(shapes), args=tuple(args)),
                            chip, progress=progress_echo)
    if not report.compiled:
        raise UserError(f"{target} does not compile for {chip.name}: {report.error}")
    views = pair(result, report, chip)
    if as_json:
        echo_json({"analysis": to_json(result), "compile": to_jsonable(report), "compiled_kernels": to_jsonable(views)})
        return
    click.echo(render(result))
    click.echo("")
    click.echo(render_report(report, views))


_TUNE_HELP = """Rank the legal block sizes of KERNEL (divisibility, (8,128) tiling, VMEM) by the
schedule model's expected time and print the best few with traffic, VMEM and the reason.

\b
KERNEL is one of the catalog (see --list); shapes default to the kernel's example.
Examples:
  perfmodel tune jax-matmul --hw v5e --shape x=8192x8192:bf16 --shape y=8192x8192:bf16
  perfmodel tune matmul --hw v6e --shape x=4096x8192:bf16 --shape w=8192x28672:bf16 --top 8
"""


@click.command("tune", help=_TUNE_HELP, context_settings={"max_content_width": 110})
@click.argument("kernel", required=False)
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS[:DTYPE][=FILL]", help=SHAPE_HELP)
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", help="Extra static argument of the kernel (Python literal).")
@click.option("--hw", default=DEFAULT_CHIP, show_default=True, metavar="CHIP", help="TPU name, alias or spec file.")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1), help="How many candidates to print.")
@click.option("--compile", "compile_top", type=click.IntRange(min=1), default=None, metavar="N",
              help="Compile the best N candidates with the TPU compiler (parallel processes, cached), drop those "
                   "Mosaic rejects and re-rank the rest by the compiler-backed expected time.")
@click.option("--list", "list_kernels", is_flag=True, help="List the kernels tune and inspect know, and exit.")
@click.option("--write", "write", is_flag=True,
              help="Re-tune the stored per-chip defaults of a bundled kernel (every one when KERNEL is not given) "
                   "on its representative problem and rewrite kernels/<name>/tuned.json (minutes).")
@json_option
@user_errors
def tune(kernel: str | None, shapes: tuple[str, ...], args: tuple[str, ...], hw: str, top: int,
         compile_top: int | None, list_kernels: bool, write: bool, as_json: bool) -> None:
    from perfmodel.schedule.catalog import entries, tuned_kernels

    if list_kernels:
        click.echo(catalog_table(entries()))
        return
    if write:
        from perfmodel.schedule.tuned import write_tuned_defaults

        if shapes or args or compile_top is not None:
            raise UserError("--write: tunes each kernel's representative problem (kernels/<name>/entry.py); "
                            "drop --shape/--arg/--compile")
        names = [kernel] if kernel else [t.kernel for t in tuned_kernels()]
        written = []
        for name in names:
            progress_echo(f"tuning {name} ...")
            written.append(str(write_tuned_defaults(name)))
        if as_json:
            echo_json({"written": written})
        else:
            click.echo("\n".join(f"wrote {p}" for p in written))
        return
    if kernel is None:
        raise UserError("KERNEL: missing; pick one of " + ", ".join(e.name for e in entries() if e.tunable)
                        + " (perfmodel tune --list)")
    from perfmodel.schedule.tune import tune as run_tune

    extra = dict(parse_arg(a) for a in args)
    result = run_tune(kernel, shapes, hw, extra=extra)
    if compile_top is not None:
        from perfmodel.schedule.analyze import resolve_chip
        from perfmodel.schedule.compiled import rerank_compiled

        chip = resolve_chip(hw)
        reranked = rerank_compiled(result, shapes or get_example(kernel), chip, top=compile_top, extra=extra,
                                   progress=progress_echo)
        if as_json:
            echo_json({"kernel": result.kernel, "chip": result.chip, "shapes": result.shapes,
                       "compiled": to_jsonable(reranked)})
        else:
            click.echo(render_compiled_tune(result, reranked))
        return
    if as_json:
        out = to_jsonable(result)
        out["ranked"] = out["ranked"][:top]
        echo_json(out)
        return
    click.echo(render_tune(result, top))


def progress_echo(message: str) -> None:
    """Progress of long work, on stderr so that --json output stays clean."""
    click.echo(message, err=True)


def get_example(kernel: str) -> tuple[str, ...]:
    from perfmodel.schedule.catalog import get_entry

    return tuple(get_entry(kernel).example)


def render_compiled_tune(result: Any, reranked: Sequence[Any]) -> str:
    from perfmodel.units import binary, seconds, table

    rows, rejected = [], []
    for c in reranked:
        if c.compiled_s is None:
            rejected.append(f"  {c.candidate.label}: {c.error}")
            continue
        rows.append([str(len(rows) + 1), c.candidate.label, seconds(c.compiled_s), seconds(c.candidate.expected_s),
                     binary(c.vmem_allocated_bytes) if c.vmem_allocated_bytes else "-",
                     binary(c.candidate.vmem_bytes), f"{c.candidate.steps:,}"])
    lines = [f"tune {result.kernel} on {result.chip} --compile: {' '.join(result.shapes)}", ""]
    if rows:
        lines.append(table(["#", "blocks", "compiler-backed", "analytic", "VMEM (Mosaic)", "VMEM (estimate)", "steps"],
                           rows, align="llrrrrr"))
    else:
        lines.append("the compiler rejected every candidate compiled")
    lines.append("")
    lines.append(f"{len(reranked)} compiled, {len(rows)} accepted, {len(rejected)} rejected by the compiler"
                 + (":" if rejected else ""))
    lines += rejected
    return "\n".join(lines)


def catalog_table(entries: Sequence[Any]) -> str:
    """One line per catalog kernel (name, tuned block fields, what it is), then its example --shape flags."""
    from perfmodel.units import table

    rows = [[e.name, ", ".join(ax.field for ax in e.block_axes) or "-", e.summary] for e in entries]
    lines = [table(["kernel", "tuned blocks", "what"], rows, align="lll"), "", "example shapes:"]
    lines += [f"  {e.name}: " + " ".join(f"--shape {t}" for t in e.example) for e in entries]
    return "\n".join(lines)


def render_tune(result: Any, top: int) -> str:
    from perfmodel.units import binary, nbytes, seconds, table

    if not result.ranked:
        reasons = "; ".join(f"{k} ({v}x)" for k, v in result.rejected.items()) or "no candidates"
        raise InputError(f"tune {result.kernel}: no legal block sizes on {result.chip}: {reasons}")
    best = result.ranked[0]
    base = result.baseline
    rows = []
    for i, c in enumerate(result.ranked[:top], start=1):
        vs = f"{c.expected_s / base.expected_s:.3f}x" if base else "-"
        rows.append([str(i), c.label, seconds(c.expected_s), vs, nbytes(c.hbm_bytes), f"{c.reread_factor:.2f}x",
                     binary(c.vmem_bytes), f"{c.steps:,}", c.reason])
    head = ["#", "blocks", "expected", f"vs {result.baseline_label}", "HBM moved", "re-read", "VMEM", "steps", "reason"]
    lines = [f"tune {result.kernel} on {result.chip}: {' '.join(result.shapes)}", "",
             table(head, rows, align="llrrrrrrl"), ""]
    if base:
        which = f"{result.baseline_label} ({base.label})" if base.label else result.baseline_label
        verdict = (f"best is {base.expected_s / best.expected_s:.3f}x faster" if best.expected_s < base.expected_s
                   else "no candidate is predicted faster")
        lines.append(f"{which}: {seconds(base.expected_s)}; {verdict}")
    else:
        lines.append(f"{result.baseline_label}: not applicable to these shapes, so no comparison")
    lines.append(f"{result.evaluated} candidates evaluated, {len(result.ranked)} legal, "
                 f"{sum(result.rejected.values())} rejected, {result.pruned} pruned by the steps x overhead bound")
    for example, count in result.rejected.items():  # one real message per group of like reasons
        lines.append(f"  rejected {count}x, e.g.: {example}" if count > 1 else f"  rejected 1x: {example}")
    return "\n".join(lines)
