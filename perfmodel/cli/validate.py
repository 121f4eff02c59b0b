"""``perfmodel validate``: the shipped published measurements against the model (thin: parse, call
:mod:`perfmodel.harness.published_validation`, print)."""

from __future__ import annotations

import click

from perfmodel.cli.common import Progress, UserError, emit, json_option, output_format, user_errors


@click.command("validate", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--group", "groups", multiple=True, metavar="NAME",
              help="Only this group (repeatable): xla-matmul, xla-memops, gpu-gemm, gpu-fp8-gemm, collective, serving, pallas-kernel, "
                   "tokamax (every group of tokamax's real-TPU timings, or one: tokamax-7x-ragged-dot-fwd-pallas, ...; only "
                   "when asked), "
                   "serving-sim (the serving simulator against published TPU serving benchmarks; only when asked: "
                   "it simulates about 70 runs).")
@click.option("--no-kernels", is_flag=True, help="Skip the Pallas kernel points (they trace with jax).")
@click.option("--workers", type=int, default=None, help="serving-sim: processes of the local pool (default: every "
              "core).")
@click.option("--compile", "with_compile", is_flag=True,
              help="tokamax groups: also compile each XLA point's call with the TPU compiler (libtpu, deviceless; "
                   "cached) and print its compiled time and error next to the analytic ones (Pallas points: with "
                   "--pallas analyze, tokamax's kernels compiled and timed by the compiler-backed schedule).")
@click.option("--sample", type=int, default=None, metavar="N",
              help="With --compile: at most N XLA points of each tokamax group, evenly spaced (default: all).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --compile: compiles at a time.")
@click.option("--pallas", type=click.Choice(["op-model", "analyze"]), default="op-model", show_default=True,
              help="tokamax groups: how their Pallas points are modelled: by the op models of the work they do, or "
                   "by perfmodel.analyze on tokamax's own kernels at the recorded block configs (needs tokamax "
                   "importable; models the backward and fused cross-entropy kernels too).")
@click.option("--tokamax-file", default=None, metavar="PATH",
              help="tokamax groups: read the timings from this file (the format of perfmodel/data/validation/"
                   "tokamax_tpu_calibration.yaml, e.g. other entries of tokamax's cache) instead of the shipped "
                   "subset; every point is held out. Implies --group tokamax when no group is given.")
@json_option
@user_errors
def validate(groups: tuple[str, ...], no_kernels: bool, workers: int | None, with_compile: bool,
             sample: int | None, jobs: int, pallas: str, tokamax_file: str | None, as_json: bool) -> None:
    """Run every published measurement of perfmodel/data/validation/ through the same library calls as
    `perfmodel predict` / `perfmodel analyze` and print measured vs floor vs expected, the error, and the
    median and worst error per group (points used to fit a constant apart from the held-out ones), and the
    measured vs predicted speedup of paired points (int8 vs bf16 serving).

    Exits 1 when a measurement is faster than its floor.

    \b
    Examples:
      perfmodel validate
      perfmodel validate --group gpu-gemm --json
      perfmodel validate --group tokamax --compile --sample 4
      perfmodel validate --group tokamax --pallas analyze
      perfmodel validate --tokamax-file my_timings.yaml --pallas analyze
    """
    from perfmodel.harness.published_validation import report_records, report_text, run_validation

    if "serving-sim" in groups:
        from perfmodel.serve import validation

        with Progress("validate serving-sim") as bar:
            sim = validation.run_serving_validation(progress=bar, workers=workers)
        emit(output_format(as_json), text=lambda: validation.report_text(sim),
             json=lambda: validation.report_records(sim))
        groups = tuple(g for g in groups if g != "serving-sim")
        if not groups:
            return
    if tokamax_file is not None and not groups:
        groups = ("tokamax",)
    with Progress("validate") as bar:
        report = run_validation(groups=groups, kernels=not no_kernels, progress=bar, with_compile=with_compile,
                                sample=sample, jobs=jobs, pallas=pallas, tokamax_file=tokamax_file)
    emit(output_format(as_json), text=lambda: report_text(report), json=lambda: report_records(report))
    if report.beats_floor:
        raise UserError(f"{len(report.beats_floor)} measurement(s) faster than their floor: "
                        f"{', '.join(report.beats_floor)}", exit_code=1)
