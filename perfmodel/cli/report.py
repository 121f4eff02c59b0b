"""`perfmodel report`: a roofline report (markdown + PNG) for a `predict model` step or measured records.

Thin layer over :mod:`perfmodel.harness.report` (data and markdown) and
:mod:`perfmodel.harness.plots` (the figure). No jax for a step or a results
file; a published-measurement YAML runs the schedule model (jax).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from perfmodel.cli.common import echo_json, json_option, user_errors
from perfmodel.errors import InputError

_HELP = """Write a roofline report: OUT (markdown: per-op or per-kernel table with time, bound and share of
peak) and a roofline PNG with the points.

\b
INPUT is one of:
  - the output of `perfmodel predict model ... --json` (a file, or - for stdin);
  - a results file of `perfmodel measure` (.jsonl);
  - a published-measurement YAML (perfmodel/data/validation/tpu_v5e_matmul.yaml).

\b
Examples:
  perfmodel predict model llama-3.1-8b --hw v5e --batch 1 --context 1024 --json | perfmodel report - --out step.md
  perfmodel report results.jsonl --out kernels.md
"""


@click.command("report", help=_HELP, context_settings={"max_content_width": 110})
@click.argument("input_path", metavar="INPUT")
@click.option("--out", required=True, type=click.Path(dir_okay=False), metavar="REPORT.md",
              help="Markdown file to write.")
@click.option("--plot", default=None, type=click.Path(dir_okay=False), metavar="ROOFLINE.png",
              help="Roofline image (default: REPORT.png next to the markdown).")
@json_option
@user_errors
def report(input_path: str, out: str, plot: str | None, as_json: bool) -> None:
    from perfmodel.harness.plots import roofline_figure, save
    from perfmodel.harness.report import as_dict, to_markdown

    rep = build_report(input_path)
    md_path = Path(out)
    png_path = Path(plot) if plot is not None else md_path.with_suffix(".png")
    for path, flag in ((md_path, "--out"), (png_path, "--plot")):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{flag} '{path}': cannot create its directory ({exc.strerror})") from None
    save(roofline_figure(rep.roofline, rep.title), png_path, flag="--plot")
    link = os.path.relpath(png_path.resolve(), md_path.resolve().parent)
    try:
        md_path.write_text(to_markdown(rep, plot_name=link))
    except OSError as exc:
        raise InputError(f"--out '{md_path}': cannot write ({exc.strerror})") from None
    if as_json:
        echo_json({**as_dict(rep), "files": [str(md_path), str(png_path)]})
        return
    rows = sum(len(s.rows) for s in rep.sections)
    click.echo(f"wrote {md_path} ({rows} table rows) and {png_path} ({len(rep.roofline.points)} roofline points)")


def build_report(input_path: str) -> Any:
    """Read INPUT and build the report data (kind of input detected from its name and content)."""
    from perfmodel.harness.records import load_results
    from perfmodel.harness.report import records_report, step_report

    if input_path.endswith((".yaml", ".yml")):
        loaded = _warn(load_results([input_path]))
        return records_report(loaded.items, source=input_path)
    if input_path == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(input_path).read_text()
        except FileNotFoundError:
            raise InputError(f"INPUT '{input_path}': no such file") from None
        except OSError as exc:
            raise InputError(f"INPUT '{input_path}': cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if _is_step(data):
        return step_report(data, source="stdin" if input_path == "-" else input_path)
    if input_path == "-":
        raise InputError("INPUT -: not `perfmodel predict model --json` output; report reads that (also from stdin), "
                         "or a measure results file or the published results YAML given by path")
    loaded = _warn(load_results([input_path]))
    return records_report(loaded.items, source=input_path)


def _is_step(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(isinstance(d, dict) and "ops" in d for d in items)


def _warn(loaded: Any) -> Any:
    for w in loaded.warnings:
        click.echo(f"warning: {w}", err=True)
    return loaded
