"""`perfmodel profile`: a captured xprof profile op by op on perfmodel's roofline.

Parses the options, calls :mod:`perfmodel.harness.profile` and prints its report. No xprof import until it runs.
"""

from __future__ import annotations

import click

from perfmodel.cli.common import emit, json_option, one_chip_option, output_format, user_errors

_HELP = """Read an xprof / TensorBoard profile (the plugins/profile/<run>/*.xplane.pb files that
jax.profiler.trace(DIR) writes) and put every device op on the chip's roofline: measured time, FLOPs and
bytes (xprof's hlo_stats; on the CPU backend the trace's XLA op events and each module's HLO), the floor
for the op on the chip, measured / floor, the bounding unit, and the ops that lose the most time
against their floor ("why not faster").

\b
Examples:
  perfmodel profile /tmp/trace                      # a TPU profile: the chip from its device type
  perfmodel profile /tmp/trace --hw tpu-v5e --top 20 --plot ops.png
"""


@click.command("profile", help=_HELP, context_settings={"max_content_width": 110})
@click.argument("profile_dir", metavar="PROFILE_DIR", type=click.Path(path_type=str))
@one_chip_option(None, "Chip of the floors, name or spec file (default: the profile's device type, where it names "
                       "one; required for a CPU profile).")
@click.option("--top", type=int, default=10, show_default=True,
              help="Ops listed, the most time lost against the floor first (0: all).")
@click.option("--plot", "plot", default=None, metavar="FILE.png",
              help="Write a roofline plot: arithmetic intensity vs achieved FLOP/s per op, with the chip's roofline.")
@json_option
@user_errors
def profile(profile_dir: str, hw: str | None, top: int, plot: str | None, as_json: bool) -> None:
    from perfmodel.harness import profile as prof

    fmt = output_format(as_json)
    if top < 0:
        from perfmodel.errors import InputError

        raise InputError(f"`top` {top}: give 0 (every op) or more")
    data = prof.read_profile(profile_dir)
    chip = prof.chip_for(data, hw)
    report = prof.profile_report(data, chip, top=top)
    if plot:
        click.echo(f"wrote {prof.save_plot(report, plot, title=f'{profile_dir} on {chip.name}')}", err=True)
    emit(fmt, text=lambda: prof.report_text(report), json=lambda: prof.report_record(report))
