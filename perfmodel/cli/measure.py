"""`perfmodel measure`, `compare` and `calibrate`: the measurement harness on the command line.

Thin layer over :mod:`perfmodel.harness` (the work) and
:mod:`perfmodel.harness.render` (the text). Only ``measure`` imports jax (and
reading a published-measurement YAML, which runs the schedule model);
``compare`` and ``calibrate`` of a results file do not.
"""

from __future__ import annotations

from typing import Any, Sequence

import click

from perfmodel.cli.common import (Progress, echo_json, echo_text, emit, json_option, one_chip_option, output_format,
                                   user_errors)
from perfmodel.errors import InputError
from perfmodel.jsonable import to_jsonable

_MEASURE_HELP = """Run a bundled kernel on the JAX backend that is present and time it (warm-up, then
--repeat calls, each timed up to block_until_ready; median and spread), next to perfmodel's
predictions for the same call (op floor and the schedule model's expected time).

\b
--timer device (the default where a trace can be read) runs the timed calls under jax.profiler.trace
and reads the trace with xprof: per call the device span (first op start to last op end), the
kernel's own op events and host dispatch (wall - span) apart, the wall clock kept as a cross-check;
the record's measured time is the span. --timer wall times each call with the wall clock alone. On the
CPU backend the trace's ops are XLA:CPU's: the device times are the host's.

\b
On a TPU the kernel is compiled (mode "compiled"). On CPU or GPU a Pallas TPU kernel can only
run in interpret mode: the record says so, the time is printed as "interpret-mode wall time (not
TPU performance)" and its efficiency is null. Predictions are for --hw, else for the device's chip.
KERNEL is one of `perfmodel tune --list`; arrays without a FILL get seeded random values.

\b
Examples:
  perfmodel measure matmul --shape x=4096x4096:bf16 --shape w=4096x4096:bf16 --out results.jsonl
  perfmodel measure jax-matmul --shape x=8192x8192:bf16 --shape y=8192x8192:bf16 \\
      --block bm=512 --block bk=1024 --block bn=512,1024 --out results.jsonl
  perfmodel measure rms_norm --hw v5e --repeat 2 --shape x=16x256:bf16 --shape residual=16x256:bf16 \\
      --shape weight=256:f32      # CPU: interpret mode
"""


def parse_block_sweep(texts: Sequence[str]) -> dict[str, list[int]] | None:
    """``FIELD=N[,N...]`` per --block; a comma list sweeps the field."""
    if not texts:
        return None
    out: dict[str, list[int]] = {}
    for t in texts:
        name, _, values = t.partition("=")
        name = name.strip()
        try:
            numbers = [int(v) for v in values.split(",")]
        except ValueError:
            numbers = []
        if not name.isidentifier() or not numbers or any(v <= 0 for v in numbers):
            raise InputError(f"--block '{t}': expected FIELD=N[,N...] with positive integers, e.g. --block bm=256,512")
        if name in out:
            raise InputError(f"--block: field '{name}' given twice; list its values once, e.g. --block {name}=256,512")
        out[name] = numbers
    return out


@click.command("measure", help=_MEASURE_HELP, context_settings={"max_content_width": 110})
@click.argument("kernel")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=DIMS[:DTYPE][=FILL]",
              help="Array argument, repeatable, as for `perfmodel analyze` (e.g. x=4096x4096:bf16, "
                   "lengths=8:int32=1024); arrays without FILL get seeded random values.")
@click.option("--block", "blocks", multiple=True, metavar="FIELD=N[,N...]",
              help="Block-size field (all fields together); a comma list sweeps it, one record per combination. "
                   "Default: the kernel's own blocks.")
@click.option("--arg", "args", multiple=True, metavar="NAME=VALUE", help="Extra static argument (Python literal).")
@one_chip_option(None, "TPU the predictions are for (name, alias or spec file); default: the device's chip.")
@click.option("--repeat", default=5, show_default=True, type=click.IntRange(min=1), help="Timed calls.")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0),
              help="Untimed calls first (the first one compiles).")
@click.option("--out", default=None, type=click.Path(dir_okay=False), metavar="RESULTS.jsonl",
              help="Append each record to this JSON Lines file as soon as it is finished.")
@click.option("--timer", type=click.Choice(["device", "wall"]), default=None,
              help="device: a profiler trace of the calls (device span, kernel events, dispatch apart); wall: the "
                   "wall clock per call. Default: device where the trace can be read, else wall (the record says "
                   "which and why).")
@json_option
@user_errors
def measure(kernel: str, shapes: tuple[str, ...], blocks: tuple[str, ...], args: tuple[str, ...], hw: str | None,
            repeat: int, warmup: int, out: str | None, timer: str | None, as_json: bool) -> None:
    from perfmodel.harness.measure import Case, block_sets, run_cases
    from perfmodel.harness.render import record_text
    from perfmodel.schedule.binding import parse_arg
    from perfmodel.schedule.catalog import get_entry

    if out is not None:
        from perfmodel.harness.records import check_appendable

        check_appendable(out)  # before anything is measured
    entry = get_entry(kernel)
    static = dict(parse_arg(a) for a in args)
    cases = [Case(kernel=entry.name, shapes=shapes, blocks=b, static=static)
             for b in block_sets(entry, parse_block_sweep(blocks))]

    with Progress(f"measure {entry.name}", total=len(cases)) as bar:
        def show(record: Any) -> None:
            bar(record.kernel)
            if not as_json:
                echo_text(record_text(record))

        records = run_cases(cases, hw=hw, warmup=warmup, repeat=repeat, out=out, on_record=show,
                            timer=timer or "auto")
    if as_json:
        echo_json(records)
    elif out is not None:
        click.echo(f"appended {len(records)} record(s) to {out}")


def _load(paths: Sequence[str]) -> Any:
    from perfmodel.harness.sources import load_results

    loaded = load_results(list(paths))
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    return loaded


_COMPARE_HELP = """Measured vs predicted for every record of RESULTS (results .jsonl files, or a published-
measurement YAML such as perfmodel/data/validation/tpu_v5e_matmul.yaml), with units; --plot writes
a PNG of measured vs predicted time and of the efficiency per record. Interpret-mode records are
shown apart and left out of the statistics (their times are not TPU performance).

\b
Examples:
  perfmodel compare results.jsonl --plot out/compare.png
  perfmodel compare perfmodel/data/validation/tpu_v5e_matmul.yaml
"""


@click.command("compare", help=_COMPARE_HELP, context_settings={"max_content_width": 110})
@click.argument("results", nargs=-1, required=True, metavar="RESULTS...")
@click.option("--plot", default=None, type=click.Path(dir_okay=False), metavar="OUT.png",
              help="Write the comparison plot (PNG).")
@click.option("--force", is_flag=True, help="Replace the --plot file when it exists.")
@json_option
@user_errors
def compare(results: tuple[str, ...], plot: str | None, force: bool, as_json: bool) -> None:
    from perfmodel.harness.comparison import compare as build
    from perfmodel.harness.render import render_compare
    from perfmodel.inputcheck import check_new_file

    fmt = output_format(as_json)
    if plot is not None:
        check_new_file(plot, "plot", force=force)
    loaded = _load(results)
    comparison = build(loaded.items)
    if plot is not None:
        from perfmodel.harness.plots import compare_figure, save

        save(compare_figure(loaded.items), plot)
    wrote = f"\nwrote {plot}" if plot is not None else ""
    emit(fmt, text=lambda: render_compare(comparison) + wrote,
         json=lambda: {"records": [{"where": i.where, **to_jsonable(i.record)} for i in loaded.items],
                       "efficiency": comparison.efficiency, "measured_over_expected": comparison.measured_over_expected,
                       "notes": comparison.notes, "warnings": loaded.warnings, "plot": plot})


_CALIBRATE_HELP = """Fit the expected-time model's achievable-efficiency factors (MXU, HBM, ...) from
real-TPU records: each usable record implies factor = model factor x expected / (measured -
dispatch); the fitted factor is the median per limiting unit and chip. Refuses when RESULTS hold
only interpret-mode records. RESULTS may be results .jsonl files or a published-measurement YAML.

\b
Example:
  perfmodel calibrate perfmodel/data/validation/tpu_v5e_matmul.yaml
"""


@click.command("calibrate", help=_CALIBRATE_HELP, context_settings={"max_content_width": 110})
@click.argument("results", nargs=-1, required=True, metavar="RESULTS...")
@json_option
@user_errors
def calibrate(results: tuple[str, ...], as_json: bool) -> None:
    from perfmodel.harness.calibrate import calibrate as fit
    from perfmodel.harness.render import render_calibration

    fmt = output_format(as_json)
    loaded = _load(results)
    cal = fit(loaded.items)
    emit(fmt, text=lambda: render_calibration(cal), json=lambda: {**to_jsonable(cal), "warnings": loaded.warnings})
