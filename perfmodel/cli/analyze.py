"""`perfmodel analyze` and `perfmodel tune`: the kernel-schedule model on the command line.

``analyze MODULE:FUNCTION`` traces any function that runs Pallas TPU kernels
and models each pallas_call; ``tune KERNEL`` ranks block sizes of a kernel
from the catalog (`perfmodel tune --list`). Both take array arguments as
``--shape NAME=DIMS[:DTYPE][=FILL]`` (see perfmodel.schedule.shapes). The
work is :func:`perfmodel.schedule.inspection.analyze_target` and
:func:`perfmodel.schedule.tune.tune`; the text is
:mod:`perfmodel.schedule.analysis_render` and :mod:`perfmodel.schedule.tune_render`.
"""

from __future__ import annotations

import click

from perfmodel.cli.common import (Progress, UserError, echo_text, emit, json_option, one_chip_option,
                                   output_format, user_errors)
from perfmodel.hw.registry import DEFAULT_CHIP

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
@one_chip_option(DEFAULT_CHIP, "TPU name, alias or spec file.")
@click.option("--compile", "with_compile", is_flag=True,
              help="Also compile with the TPU compiler (libtpu, no TPU needed; cached) and show Mosaic's VMEM, the "
                   "grid-step bundles and the compiler-backed expected time next to the analytic one.")
@click.option("--loop-trips", type=click.IntRange(min=1), default=None, metavar="N",
              help="Iterations to assume for an in-kernel loop whose trip count is read from an array given only "
                   "as a shape (default: counted once, with a note; better: give that array values with a FILL).")
@json_option
@user_errors
def analyze(target: str, shapes: tuple[str, ...], args: tuple[str, ...], hw: str, with_compile: bool,
            loop_trips: int | None, as_json: bool) -> None:
    from perfmodel.compiler.render import render_report
    from perfmodel.schedule.analysis_render import render
    from perfmodel.schedule.inspection import analyze_target, compiled_record

    fmt = output_format(as_json)
    with Progress("compile") as bar:
        result = analyze_target(target, shapes, args, hw, with_compile=with_compile, progress=bar,
                                loop_trips=loop_trips)
    a, c = result.analysis, result.compiled
    if c is None:
        emit(fmt, text=lambda: render(a), json=a.as_dict)
    else:
        emit(fmt, text=lambda: render(a) + "\n\n" + render_report(c.compile, c.compiled_kernels),
             json=lambda: {"analysis": a.as_dict(), **compiled_record(c)})


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
@one_chip_option(DEFAULT_CHIP, "TPU name, alias or spec file.")
@click.option("--top", default=5, show_default=True, type=click.IntRange(min=1), help="How many candidates to print.")
@click.option("--compile", "compile_top", type=click.IntRange(min=1), default=None, metavar="N",
              help="Compile the best N candidates with the TPU compiler (parallel processes, cached), drop those "
                   "Mosaic rejects and re-rank the rest by the compiler-backed expected time.")
@click.option("--list", "list_kernels", is_flag=True, help="List the kernels tune and inspect know, and exit.")
@click.option("--write", "write", is_flag=True,
              help="Re-tune the stored per-chip defaults of a bundled kernel (every one when KERNEL is not given) "
                   "on its representative problem and rewrite kernels/<name>/tuned.json (minutes); with --compile N "
                   "the N preferred candidates are compiled per chip and the compiler-backed fastest is stored.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="With --write: (kernel, chip) pairs tuned on a local pool of this many processes (default: every "
                   "core; 1: in this process); with --compile: this many compiles at once.")
@click.option("--ray", "ray_address", default=None, metavar="auto|ADDRESS",
              help="Run --write's pairs or --compile's compiles on Ray: auto starts or joins a local instance, else a "
                   "cluster address (perfmodel[ray]; compiles need the tpu-compiler extra on the workers).")
@json_option
@user_errors
def tune(kernel: str | None, shapes: tuple[str, ...], args: tuple[str, ...], hw: str, top: int,
         compile_top: int | None, list_kernels: bool, write: bool, workers: int | None, ray_address: str | None,
         as_json: bool) -> None:
    from perfmodel.schedule import tune_render
    from perfmodel.schedule.catalog import entries

    fmt = output_format(as_json)
    if list_kernels:
        echo_text(tune_render.catalog_table(entries()))
        return
    if write:
        from perfmodel.schedule.tuned import write_all

        if shapes or args:
            raise UserError("--write: tunes each kernel's representative problem (kernels/<name>/entry.py); "
                            "drop --shape/--arg")
        with Progress("tune --write") as bar:
            backend = "ray" if ray_address else ("inprocess" if workers == 1 else "auto")
            written = [str(p) for p in write_all([kernel] if kernel else [], compile_top=compile_top, progress=bar,
                                                 backend=backend, workers=workers, address=ray_address)]
        emit(fmt, text=lambda: "\n".join(f"wrote {p}" for p in written), json=lambda: {"written": written})
        return
    if kernel is None:
        raise UserError("KERNEL: missing; pick one of " + ", ".join(e.name for e in entries() if e.tunable)
                        + " (perfmodel tune --list)")
    from perfmodel.schedule.binding import parse_arg
    from perfmodel.schedule.tune import tune as run_tune

    extra = dict(parse_arg(a) for a in args)
    with Progress(f"tune {kernel}") as bar:
        result = run_tune(kernel, shapes, hw, extra=extra, progress=bar)
    if compile_top is None:
        emit(fmt, text=lambda: tune_render.render_tune(result, top), json=lambda: tune_render.tune_record(result, top))
        return
    from perfmodel.schedule.analyze import resolve_chip
    from perfmodel.schedule.compiled import rerank_compiled

    with Progress("compile") as bar:
        reranked = rerank_compiled(result, result.shapes, resolve_chip(hw), top=compile_top, extra=extra,
                                   progress=bar, jobs=workers, address=ray_address)
    emit(fmt, text=lambda: tune_render.render_compiled_tune(result, reranked),
         json=lambda: tune_render.compiled_tune_record(result, reranked))
