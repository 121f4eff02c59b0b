"""`perfmodel xla`: any jittable function through the TPU compiler, op by op on the roofline.

Parses the options, calls :func:`perfmodel.xla.program.function_program` and
prints it with :mod:`perfmodel.xla.render`. No jax import until it runs.
"""

from __future__ import annotations

import click

from perfmodel.cli.analyze import SHAPE_HELP
from perfmodel.cli.common import Progress, emit, json_option, one_chip_option, output_format, user_errors
from perfmodel.hw.registry import DEFAULT_CHIP

_HELP = """Compile MODULE:FUNCTION with the TPU compiler (libtpu, deviceless; cached) and list every op of
the compiled program that does work: FLOPs and HBM bytes (optimized HLO), bundles (the compiler's VLIW
schedule), a time per op (bundles at the clock, bytes at the achievable HBM rate, collectives over ICI),
its bound and share of the step; totals and the HBM footprint (memory_analysis).

\b
Arguments as for `perfmodel analyze`. --topology compiles for a whole slice: arrays are replicated
over its chips unless --shard splits them (one entry per dimension, tp or _).
Examples:
  perfmodel xla kernels.matmul.reference:matmul --shape x=1024x4096 --shape w=4096x4096 --hw v6e
  perfmodel xla mymod:mlp --shape x=8x4096 --shape w=4096x14336 --hw v5e --topology v5e:2x2 --shard w=_,tp
"""


@click.command("xla", help=_HELP, context_settings={"max_content_width": 110})
@click.argument("target", metavar="MODULE:FUNCTION")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS[:DTYPE][=FILL]", help=SHAPE_HELP)
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", help="Static argument (Python literal).")
@one_chip_option(DEFAULT_CHIP, "TPU name, alias or spec file.")
@click.option("--topology", default=None, metavar="SLICE",
              help="Compile for a slice of the chip's generation, e.g. v5e:2x4 (8 chips); default: one chip.")
@click.option("--shard", "shard", multiple=True, metavar="NAME=SPEC",
              help="With --topology: split array NAME over the slice's chips, e.g. w=_,tp (columns).")
@click.option("--top", type=int, default=30, show_default=True, help="Ops listed (the slowest first; 0: all).")
@click.option("--plot", "plot", default=None, metavar="FILE.png", help="Write a roofline plot of the ops.")
@json_option
@user_errors
def xla(target: str, shapes: tuple[str, ...], args: tuple[str, ...], hw: str, topology: str | None,
        shard: tuple[str, ...], top: int, plot: str | None, as_json: bool) -> None:
    from perfmodel.hw.registry import get_chip
    from perfmodel.xla import render
    from perfmodel.xla.program import function_program

    fmt = output_format(as_json)
    chip = get_chip(hw)
    with Progress("compile") as bar:
        prog = function_program(target, shapes, args, chip, topology=topology, shard=shard, progress=bar)
    if plot:
        click.echo(f"wrote {render.save_plot(prog, plot, title=f'{target} on {chip.name} ({prog.topology})')}", err=True)
    emit(fmt, text=lambda: render.program_text(prog, title=target, top=top or None),
         json=lambda: render.program_record(prog))
