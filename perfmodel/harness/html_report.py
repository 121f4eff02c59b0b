"""A roofline report as one self-contained HTML file: inline SVG plots, inline CSS, no script, no network.

:func:`to_html` renders a :class:`perfmodel.harness.roofline_report.Report`:
its inputs, the roofline (SVG from matplotlib's svg backend, text drawn as
paths so no font is fetched), each per-op / per-kernel table, measured vs
predicted (when the report has measurement records) and the notes. Each part
is a ``<section>`` with an ``id`` (``inputs``, ``roofline``, ``table-1``...,
``measured-vs-predicted``, ``notes``) so that tests can find them.
:func:`write_html` writes it.
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from perfmodel.errors import InputError
from perfmodel.harness.roofline_report import Report, Table

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; }
th { background: #f0f0f0; } td.r { text-align: right; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
figure { margin: 0.5em 0; } figure svg { max-width: 100%; height: auto; }
code, pre { font-size: 0.85em; } .source { color: #555; }
"""


def figure_svg(fig: Any) -> str:
    """``fig`` as an inline ``<svg>`` element (matplotlib's svg backend; text as paths; no XML prolog, no
    date, ids stable between runs)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "perfmodel"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # the RDF metadata block (creator, format) names vocabularies by URL: nothing to show, so left out
    start, end = text.find("<metadata>"), text.find("</metadata>")
    return text[:start] + text[end + len("</metadata>"):] if 0 <= start < end else text


def to_html(report: Report) -> str:
    """The report as one HTML document (no external resource of any kind)."""
    from perfmodel.harness.plots import compare_figure, roofline_figure

    parts = [f"<h1>{_e(report.title)}</h1>", f'<p class="source">Source: <code>{_e(report.source)}</code></p>']
    parts.append(_section("inputs", "Inputs", _inputs_table(report.inputs)))
    parts.append(_section("roofline", "Roofline",
                          f"<figure>{figure_svg(roofline_figure(report.roofline, report.title))}</figure>"))
    for i, table in enumerate(report.sections, start=1):
        parts.append(_section(f"table-{i}", table.heading, _table(table)))
    if report.records:
        parts.append(_section("measured-vs-predicted", "Measured vs predicted",
                              f"<figure>{figure_svg(compare_figure(report.records))}</figure>"))
    if report.warnings or report.notes:
        items = [f"<li>warning: {_e(w)}</li>" for w in report.warnings] + [f"<li>{_e(n)}</li>" for n in report.notes]
        parts.append(_section("notes", "Notes", "<ul>" + "".join(items) + "</ul>"))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{_e(report.title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def write_html(report: Report, out: str | os.PathLike) -> Path:
    """Write :func:`to_html` of ``report`` to ``out``; InputError naming `out` when it cannot be written."""
    path = Path(out)
    if path.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"`out` '{path}': give a .html path for the HTML report", fields=("out",))
    text = to_html(report)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"`out` '{path}': cannot write ({exc.strerror})", fields=("out",)) from None
    return path


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _section(section_id: str, heading: str, content: str) -> str:
    return f'<section id="{section_id}">\n<h2>{_e(heading)}</h2>\n{content}\n</section>'


def _table(table: Table) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in table.headers)
    rows = "".join("<tr>" + "".join(f'<td class="{a}">{_e(c)}</td>' for a, c in zip(table.align, row)) + "</tr>"
                   for row in table.text_rows)
    out = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    if table.summary:
        out += "<ul>" + "".join(f"<li>{_e(s)}</li>" for s in table.summary) + "</ul>"
    return out


def _inputs_table(inputs: Sequence[Mapping[str, Any]]) -> str:
    """One row per input record, a column per key any of them has."""
    if not inputs:
        return "<p>-</p>"
    keys = list(dict.fromkeys(k for i in inputs for k in i))
    head = "".join(f"<th>{_e(k)}</th>" for k in keys)
    rows = "".join("<tr>" + "".join(f"<td>{_e(_value(i.get(k)))}</td>" for k in keys) + "</tr>" for i in inputs)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _value(v: Any, limit: int = 120) -> str:
    """An input value as text, cut to ``limit`` characters (a per-sequence context list can be long)."""
    text = "-" if v is None else str(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"
