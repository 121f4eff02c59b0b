"""Shared CLI plumbing: library errors as one-line messages naming flags, output formats, printing.

Nothing here imports numpy, yaml, jax or the model.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import click

from perfmodel.errors import InputError, PerfmodelError


class UserError(click.ClickException):
    """A one-line error with the exit code of the library error behind it: 2 for a user error (as click's usage
    errors), 1 for a failure that is not the input's fault."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def flag_of(field: str, ctx: click.Context | None = None) -> str:
    """The flag (or argument name) of the running command that sets keyword argument ``field``:
    ``context_lens`` -> ``--context-lens``, ``config_path`` -> ``--config``, ``kernel`` -> ``KERNEL``."""
    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    if ctx is not None:
        for p in ctx.command.params:
            if p.name != field:
                continue
            if isinstance(p, click.Option):
                preferred = "--" + field.replace("_", "-")
                longs = [o for o in p.opts if o.startswith("--")]
                return preferred if preferred in longs else (longs[0] if longs else p.opts[0])
            return p.human_readable_name
    return "--" + field.replace("_", "-")


def cli_message(exc: PerfmodelError) -> str:
    """The error's message with each field it names in backticks (listed in ``exc.fields``) written as the
    command's flag: "`context_lens`: ..." -> "--context-lens: ..."."""
    text = str(exc)
    for field in exc.fields:
        text = text.replace(f"`{field}`", flag_of(field))
    return text


def user_errors(fn: Callable) -> Callable:
    """Turn library errors (PerfmodelError) into one-line click errors naming the command's flags."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PerfmodelError as exc:
            raise UserError(cli_message(exc), exc.exit_code) from None

    return wrapper


def chip_list(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Callback of --hw in commands that compare chips (repeatable, comma lists): no empty name."""
    from perfmodel.inputcheck import short

    for v in value:
        if not all(n.strip() for n in v.split(",")):
            raise UserError(f"--hw '{short(v)}': an empty chip name; e.g. --hw v5e or --hw v5e,v6e")
    return value


def one_chip_option(default: str | None, help: str) -> Callable:
    """--hw CHIP for a command that takes one chip: given twice or as a comma list it is an error (not the last
    one silently, as click would take)."""
    from perfmodel.inputcheck import short

    def callback(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
        if len(value) > 1:
            raise UserError(f"--hw given {len(value)} times ({short(', '.join(value))}); this command takes one "
                            "chip (`perfmodel predict` and `perfmodel hw compare` take several)")
        if not value:
            return default
        name = value[0]
        if not name.strip() or ("," in name and not name.endswith((".yaml", ".yml"))):
            raise UserError(f"--hw '{short(name)}': give one chip name or spec file, e.g. --hw v5e")
        return name

    return click.option("--hw", "hw", multiple=True, callback=callback, metavar="CHIP",
                        help=help + (f"  [default: {default}]" if default else ""))


#: Default output width: the terminal's, at most this (also when stdout is not a terminal).
MAX_OUTPUT_COLUMNS = 120


def output_columns() -> int:
    """The width tables fit by default: the terminal's columns, at most MAX_OUTPUT_COLUMNS."""
    import shutil

    return min(shutil.get_terminal_size((MAX_OUTPUT_COLUMNS, 24)).columns, MAX_OUTPUT_COLUMNS)


def _wide(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    from perfmodel.units import table_width

    ctx.with_resource(table_width(None if value else output_columns()))


#: --wide: tables at full width; by default their widest text columns wrap to fit output_columns().
wide_option = click.option("--wide", is_flag=True, expose_value=False, callback=_wide,
                           help=f"Print tables at full width (default: wrap text columns to fit the terminal, "
                                f"at most {MAX_OUTPUT_COLUMNS} columns).")


def json_option(fn: Callable) -> Callable:
    """--json (and --wide, which every command with a table takes)."""
    fn = wide_option(fn)
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")(fn)


def output_format(as_json: bool, as_csv: bool = False) -> str:
    """"json", "csv" or "text"; an InputError when both --json and --csv are given."""
    if as_json and as_csv:
        raise InputError("--json and --csv: pick one output format")
    return "json" if as_json else "csv" if as_csv else "text"


def emit(fmt: str, *, text: Callable[[], str], json: Callable[[], Any] | None = None,
         csv: Callable[[], str] | None = None) -> None:
    """Print a result in the format asked for (each renderer runs only when its format is asked for)."""
    if fmt == "json" and json is not None:
        echo_json(json())
    elif fmt == "csv" and csv is not None:
        click.echo(csv(), nl=False)
    else:
        echo_text(text())


def echo_text(text: str) -> None:
    """Text output, its prose lines wrapped to the width tables fit (none with --wide)."""
    from perfmodel.units import current_table_width, fit_text

    click.echo(fit_text(text, current_table_width()))


def echo_json(obj: Any) -> None:
    from perfmodel.jsonable import dumps

    click.echo(dumps(obj, indent=2))


def stderr_is_terminal() -> bool:
    """Whether progress may be drawn: stderr is a terminal (never under CliRunner, a pipe or a file)."""
    stream = sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def _raw_stderr(text: str) -> None:
    """Terminal control text as is (click.echo would strip the escape codes off a terminal)."""
    sys.stderr.write(text)
    sys.stderr.flush()


class Progress:
    """A progress callback for the library, drawn on stderr as click's progress bar when stderr is a terminal
    (nothing otherwise). Use as a context manager around the work and pass it as ``progress=``:

    * ``progress(message, done=i, total=n)``: step i of n (the bar moves; ``message`` shows beside it);
    * ``progress(message)``: a library message without counts (e.g. "compiling ...") shows beside the bar,
      which advances one step when ``total`` was given up front (one message per step of work).
    """

    def __init__(self, label: str, total: int | None = None, *, min_total: int = 2, enabled: bool | None = None):
        """``min_total``: work of fewer steps shows no bar (it is over before a bar would help)."""
        self.label = label
        self.total = total
        self.min_total = min_total
        self.enabled = stderr_is_terminal() if enabled is None else enabled
        self.calls = 0
        self._bar: Any = None
        self._done = 0
        self._line = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._line:
            _raw_stderr("\r\x1b[K")
            self._line = False
        if self._bar is not None:
            self._finish_bar()

    def _finish_bar(self) -> None:
        """Clear the bar's line (the result follows on stdout) and show the cursor again."""
        self._bar.finished = True
        _raw_stderr("\r\x1b[K\x1b[?25h")
        self._bar = None

    def _ensure_bar(self, total: int) -> Any:
        if self._bar is None or self._bar.length != total:
            if self._bar is not None:
                self._finish_bar()
            self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr,
                                          show_pos=True, item_show_func=lambda m: m, width=24)
            self._bar._is_atty = True  # drawn because enabled (click shows only the label off a terminal)
            self._bar.render_progress()
            self._done = 0
        return self._bar

    def __call__(self, message: str = "", *, done: int | None = None, total: int | None = None) -> None:
        self.calls += 1
        if not self.enabled:
            return
        total = total if total is not None else self.total
        if total is None:
            # no counts: the latest message on one line, rewritten in place (cleared on exit)
            self._line = True
            _raw_stderr(f"\r{self.label}: {message[:100]}\x1b[K")
            return
        if total < self.min_total:
            return
        bar = self._ensure_bar(total)
        step = (done if done is not None else self._done + 1) - self._done
        self._done += step
        bar.update(max(step, 0), message[:40] or None)
