"""`perfmodel report`: a roofline report (markdown + PNG, or one HTML file) for a `predict model` step or
measured records.

Thin layer over :mod:`perfmodel.harness.roofline_report` (data, markdown and
files), :mod:`perfmodel.harness.html_report` (the HTML file) and
:mod:`perfmodel.harness.plots` (the figures). No jax for a step or a results
file; a published-measurement YAML runs the schedule model (jax).
"""

from __future__ import annotations

import sys

import click

from perfmodel.cli.common import emit, json_option, output_format, user_errors

_HELP = """Write a roofline report: OUT (markdown: per-op or per-kernel table with time, bound and share of
peak) and a roofline PNG with the points; or, when OUT ends in .html, one self-contained HTML file (the inputs,
the roofline and, for measurements, measured vs predicted as inline SVG, and the tables; no network needed).

\b
INPUT is one of:
  - the output of `perfmodel predict model ... --json` (a file, or - for stdin);
  - the output of `perfmodel serve ... --json` (a run or a --sweep; a file, or - for stdin);
  - a results file of `perfmodel measure` (.jsonl);
  - a published-measurement YAML (perfmodel/data/validation/tpu_v5e_matmul.yaml).

\b
Examples:
  perfmodel predict model llama-3.1-8b --hw v5e --batch 1 --context 1024 --json | perfmodel report - --out step.md
  perfmodel report results.jsonl --out kernels.md
  perfmodel report perfmodel/data/validation/tpu_v5e_matmul.yaml --out out/v5e.html
"""


@click.command("report", help=_HELP, context_settings={"max_content_width": 110})
@click.argument("input_path", metavar="INPUT")
@click.option("--out", required=True, type=click.Path(dir_okay=False), metavar="REPORT.md|REPORT.html",
              help="Markdown file to write, or an HTML file (.html: self-contained, plots inline).")
@click.option("--plot", default=None, type=click.Path(dir_okay=False), metavar="ROOFLINE.png",
              help="Roofline image of a markdown report (default: REPORT.png next to the markdown).")
@click.option("--force", is_flag=True, help="Replace OUT (and the PNG) when they exist.")
@json_option
@user_errors
def report(input_path: str, out: str, plot: str | None, force: bool, as_json: bool) -> None:
    from pathlib import Path

    from perfmodel.errors import InputError
    from perfmodel.harness.roofline_report import as_dict, build_report, write_report
    from perfmodel.inputcheck import check_new_file

    fmt = output_format(as_json)
    html = Path(out).suffix.lower() in (".html", ".htm")
    if html and plot is not None:
        raise InputError("`plot`: an HTML report carries its plots inline; leave --plot out (or give a .md OUT)",
                         fields=("plot",))
    check_new_file(out, "out", force=force)
    if not html:
        check_new_file(plot if plot is not None else Path(out).with_suffix(".png"), "plot", force=force)
    rep = build_report(input_path, stdin_text=sys.stdin.read() if input_path == "-" else None)
    for w in rep.warnings:
        click.echo(f"warning: {w}", err=True)
    if html:
        from perfmodel.harness.html_report import write_html

        path = write_html(rep, out)
        rows = sum(len(s.rows) for s in rep.sections)
        emit(fmt, text=lambda: f"wrote {path} ({rows} table rows, {len(rep.roofline.points)} roofline points, "
                               "plots inline)",
             json=lambda: {**as_dict(rep), "files": [str(path)]})
        return
    written = write_report(rep, out, plot)
    emit(fmt, text=lambda: f"wrote {written.markdown} ({written.table_rows} table rows) and {written.plot} "
                           f"({len(rep.roofline.points)} roofline points)",
         json=lambda: {**as_dict(rep), "files": [written.markdown, written.plot]})
