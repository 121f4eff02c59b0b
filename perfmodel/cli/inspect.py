"""`perfmodel inspect`: a kernel's compiler artifacts and its costs three ways.

Lowers KERNEL for TPU with jax.export (Mosaic runs on the CPU; no TPU
needed), prints or saves (--out DIR) the Mosaic MLIR of each kernel and the
surrounding StableHLO, then compiles the kernel's pure-jnp reference for the
CPU and prints XLA's cost analysis next to perfmodel's op model and the
schedule model, flagging counts more than 5% away from XLA's. The work and
the text are :mod:`perfmodel.schedule.inspection`'s.
"""

from __future__ import annotations

from pathlib import Path

import click

from perfmodel.cli.analyze import SHAPE_HELP
from perfmodel.cli.common import Progress, emit, json_option, one_chip_option, output_format, user_errors
from perfmodel.errors import InputError
from perfmodel.hw.registry import DEFAULT_CHIP

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
    """``--block FIELD=INT`` texts as a dict (None when none is given)."""
    from perfmodel.schedule.binding import parse_arg

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
@one_chip_option(DEFAULT_CHIP, "TPU name, alias or spec file.")
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
    from perfmodel.schedule import inspection
    from perfmodel.schedule.binding import parse_arg

    fmt = output_format(as_json)
    if with_compile:
        from perfmodel.compiler.render import render_report

        with Progress("compile") as bar:
            compiled = inspection.compile_inspection(kernel, shapes, parse_blocks(blocks), args, hw, progress=bar)
        if out_dir is not None:
            compiled = inspection.save_compiled(compiled, out_dir)
        wrote = "\n\nwrote:\n" + "\n".join(f"  {p}" for p in compiled.files) if compiled.files else ""
        emit(fmt, text=lambda: render_report(compiled.compile, compiled.compiled_kernels) + wrote,
             json=lambda: inspection.compiled_record(compiled))
        return
    result = inspection.inspect_kernel(kernel, shapes, parse_blocks(blocks), hw, dict(parse_arg(a) for a in args))
    if out_dir is not None:
        result = inspection.save_inspection(result, out_dir)
    emit(fmt, text=lambda: inspection.render_inspection(result, print_mlir=out_dir is None), json=lambda: result)
