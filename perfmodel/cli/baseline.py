"""``perfmodel baseline write|check|table FILE``: a deviceless performance-regression gate (thin: parse, call
:mod:`perfmodel.harness.baseline`, print)."""

from __future__ import annotations

from typing import Any

import click

from perfmodel.cli.common import (Progress, UserError, echo_json, echo_text, emit, json_option, output_format,
                                  user_errors)

_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _calls_option(fn: Any) -> Any:
    fn = click.option("--workers", type=click.IntRange(min=1), default=None,
                      help="Compiles at a time (default: every core).")(fn)
    fn = click.option("--chips", default=None, metavar="A,B",
                      help="Only these chips (comma list, e.g. tpu-v5e,tpu-v6e; default: each call's chips).")(fn)
    return click.option("--calls", "calls_path", type=click.Path(dir_okay=False), default=None, metavar="YAML",
                        help="Calls to record: a YAML list of {target: KERNEL or MODULE:FUNCTION, shapes, args, "
                             "blocks, chips, name} (default: every bundled kernel at its production shapes on "
                             "every generation).")(fn)


def _calls(calls_path: str | None, chips: str | None) -> tuple[Any, ...]:
    from perfmodel.harness import baseline

    calls = baseline.load_calls(calls_path) if calls_path else baseline.default_calls()
    if chips is not None:
        names = [c.strip() for c in chips.split(",")]
        if not all(names):
            raise UserError(f"--chips '{chips}': an empty chip name; e.g. --chips tpu-v5e,tpu-v6e")
        calls = baseline.select_chips(calls, names)
        if not calls:
            raise UserError(f"--chips {chips}: no call runs on these chips")
    return calls


def _record(calls: Any, workers: int | None, label: str) -> Any:
    from perfmodel.harness import baseline

    with Progress(label, total=sum(len(c.chips) for c in calls)) as bar:
        return baseline.record(calls, workers=workers, progress=bar)


@click.group("baseline", context_settings=_CTX)
def baseline() -> None:
    """Deviceless performance-regression gate: record what the TPU compiler makes of each kernel call (loop-body
    bundles per grid step, compiler-backed time, Mosaic's scoped VMEM, spills and fills, DMA starts) and fail
    when a later compile grows past a tolerance; print a baseline as markdown tables per kernel.

    \b
    Examples:
      perfmodel baseline write kernels/baseline.json
      perfmodel baseline check kernels/baseline.json --markdown
      perfmodel baseline table kernels/baseline.json --write-readme kernels/README.md
      perfmodel baseline check my_baseline.json --calls my_calls.yaml --chips tpu-v5e
    """


@baseline.command("write", context_settings=_CTX)
@click.argument("file", type=click.Path(dir_okay=False))
@_calls_option
@json_option
@user_errors
def write_cmd(file: str, calls_path: str | None, chips: str | None, workers: int | None, as_json: bool) -> None:
    """Compile the calls and (re)write FILE with their figures. With --chips, the file's records on the other
    chips are kept."""
    from pathlib import Path

    from perfmodel.harness import baseline as lib
    from perfmodel.harness import baseline_report as rep

    fmt = output_format(as_json)
    calls = _calls(calls_path, chips)
    records = _record(calls, workers, "baseline write")
    if chips is not None and Path(file).exists():
        done = {r.chip for r in records}
        records = tuple(r for r in lib.read(file).records if r.chip not in done) + tuple(records)
    libtpu, jax_version = lib.libtpu_versions()
    path = lib.write(file, records, libtpu_version=libtpu, jax_version=jax_version)
    emit(fmt, text=lambda: rep.records_text(records) + f"\nwrote {path}: {len(records)} record(s), libtpu {libtpu}",
         json=lambda: {"file": str(path), "libtpu_version": libtpu, "records": rep.records_json(records)})


@baseline.command("check", context_settings=_CTX)
@click.argument("file", type=click.Path(dir_okay=False))
@_calls_option
@click.option("--tolerance", type=click.FloatRange(min=0), default=0.02, show_default=True,
              help="Relative growth of bundles or compiler-backed time that fails (0.02 = 2%).")
@click.option("--markdown", is_flag=True, help="Print a markdown table fit for a pull-request comment.")
@json_option
@user_errors
def check_cmd(file: str, calls_path: str | None, chips: str | None, workers: int | None, tolerance: float,
              markdown: bool, as_json: bool) -> None:
    """Recompile the calls and compare with FILE; exit 1 when bundles or time grow past --tolerance, a spill or
    fill appears, scoped VMEM passes the chip's limit or a call stops compiling. After an intended change, rewrite
    the file in the same commit (perfmodel baseline write FILE)."""
    from perfmodel.harness import baseline as lib
    from perfmodel.harness import baseline_report as rep

    if markdown and as_json:
        raise UserError("--markdown and --json: pick one output format")
    stored = lib.read(file)  # a missing or malformed file fails before compiling anything
    calls = _calls(calls_path, chips)
    records = _record(calls, workers, "baseline check")
    checked = {ch for c in calls for ch in c.chips}
    old = [r for r in stored.records if r.chip in checked]
    rows = lib.compare(old, records, tolerance)
    libtpu, _ = lib.libtpu_versions()
    note = "" if stored.libtpu_version in (None, libtpu) else \
        f"\nnote: {file} was written with libtpu {stored.libtpu_version}, this check compiled with {libtpu}"
    if as_json:
        echo_json({**rep.report_records(rows, tolerance), "file": file, "libtpu_version": libtpu,
                   "baseline_libtpu_version": stored.libtpu_version})
    elif markdown:
        click.echo(rep.report_markdown(rows, tolerance) + note)
    else:
        echo_text(rep.report_text(rows, tolerance) + note)
    if lib.regressions(rows):
        raise UserError(f"{len(lib.regressions(rows))} regression(s) against {file}; if intended, rewrite it in "
                        f"the same commit: perfmodel baseline write {file}", exit_code=1)


def _shown(path: str) -> str:
    """``path`` as a README caption names it: relative to the current folder when inside it (the same text
    whether given relative or absolute), else as given."""
    from pathlib import Path

    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path


@baseline.command("table", context_settings=_CTX)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--kernel", default=None, metavar="NAME",
              help="Only this kernel's table (a record's target, e.g. rms_norm; default: every kernel).")
@click.option("--write-readme", "readme", type=click.Path(dir_okay=False), default=None, metavar="README",
              help="Rewrite the tables between <!-- baseline-table: NAME --> and <!-- /baseline-table --> in this "
                   "markdown file in place (atomically) instead of printing them.")
@json_option
@user_errors
def table_cmd(file: str, kernel: str | None, readme: str | None, as_json: bool) -> None:
    """Print FILE's figures as one markdown table per kernel (a row per call and chip: loop bundles per grid step,
    every-step / predicated; compiler-backed time; scoped VMEM; spills / fills and DMA starts per step). Nothing
    is compiled. With --write-readme, rewrite the README's marked tables (how kernels/README.md is kept).

    \b
    Examples:
      perfmodel baseline table kernels/baseline.json --kernel rms_norm
      perfmodel baseline table kernels/baseline.json --write-readme kernels/README.md
    """
    from pathlib import Path

    from perfmodel.compiler.toolchain import compile_targets
    from perfmodel.errors import InputError
    from perfmodel.harness import baseline as lib
    from perfmodel.harness import baseline_report as rep
    from perfmodel.fileio import write_text_atomic

    stored = lib.read(file)
    order = tuple(compile_targets())  # oldest generation first, whatever order the file's records are in
    if readme is None:
        if as_json:
            echo_json({"file": file, "libtpu_version": stored.libtpu_version,
                       "kernels": rep.tables_json(stored.records, order, kernel)})
        else:  # markdown lines are never wrapped to the terminal (echo_text would break a table row)
            click.echo(rep.tables_markdown(rep.kernel_tables(stored.records, order, kernel)))
        return
    try:
        text = Path(readme).read_text()
    except OSError as exc:
        raise InputError(f"--write-readme {readme}: cannot read it ({exc.strerror or exc}); give the markdown file "
                         "holding the baseline-table markers, e.g. kernels/README.md") from None
    tables = rep.kernel_tables(stored.records, order)
    if kernel is not None:
        rep.kernel_tables(stored.records, order, kernel)  # an unknown --kernel fails as it does without a README
    caption = rep.readme_caption(_shown(file), _shown(readme), stored.libtpu_version)
    only = None if kernel is None else [kernel]
    marked = [k for k, _, _ in rep.readme_regions(text, readme)]
    stale = [k for k in rep.stale_regions(text, tables, caption, readme) if only is None or k in only]
    new = rep.fill_readme(text, tables, caption, where=readme, only=only)
    if new != text:
        write_text_atomic(readme, new)
    without = [k for k in tables if k not in marked and (only is None or k in only)]
    unchanged = [k for k in marked if k not in stale and (only is None or k in only)]
    note = f"; no marked region for {', '.join(without)} (add {rep.README_OPEN.format(kernel=without[0])} " \
           f"... {rep.README_CLOSE} where its table belongs)" if without else ""
    emit(output_format(as_json),
         text=lambda: f"{readme}: {len(stale)} table(s) rewritten{' (' + ', '.join(stale) + ')' if stale else ''}, "
                      f"{len(unchanged)} unchanged{note}",
         json=lambda: {"readme": readme, "file": file, "rewritten": stale, "unchanged": unchanged,
                       "without_region": without})
