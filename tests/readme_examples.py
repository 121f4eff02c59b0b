"""The README's shown outputs, regenerated from the tool as it is now.

The documents are README.md and the reference pages beside the code (every README.md under the project's
folders: hwspecs/README.md, perfmodel/predict/README.md, ...). Every ```console block of each is a short session: ``$ `` lines are commands (a trailing backslash continues
one), the lines after each are what it printed. This script runs each block's commands in order, in a fresh
temporary directory that links the repository's top-level folders (so relative paths work and nothing is written
into the checkout), and compares or rewrites the shown output.

    python tests/readme_examples.py            # check: exit 1 and a diff for each example that drifted
    python tests/readme_examples.py --write    # regenerate the shown outputs in every document
    python tests/readme_examples.py --compiled # also the examples that compile with libtpu (minutes; not in CI)

`make readme-check` (part of `make ci`) runs the check. Examples whose output depends on the machine (a compile, a
measurement, a file the reader edits first) are listed in SKIP with the reason; they are not run, except that
``--compiled`` runs the ones that compile (after a change to what the compiled outputs read: their compile time
and "(from cache)" are not compared). An output
shown with a line "..." is an excerpt: the lines shown before and after it are kept, the rest is cut.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: Top-level entries linked into the scratch directory the examples run in.
LINKED = ("perfmodel", "kernels", "hwspecs", "tests", "notebooks", "pyproject.toml")
COMPILES = "compiles with libtpu: minutes, and figures that move with the compiler version"
#: Substring of a command -> why its shown output is not regenerated here.
SKIP = {
    "--compile": COMPILES,
    "perfmodel xla": COMPILES,
    "perfmodel measure": "times kernels on the JAX backend present: machine-dependent",
    "my-chip.yaml": "the reader edits the file first; the error shown is for that edit",
    "--group serving-sim": "simulates 86 published serving runs: minutes",
}
#: Lines libtpu prints on stderr that are not the tool's output.
NOISE = ("WARNING", "E0000", "Source Location", "learning/", "Logging before")
BLOCK = re.compile(r"(```console\n)(.*?)(```)", re.S)


@dataclass(frozen=True)
class Example:
    command: str  # as run (continuations joined)
    lines: tuple[str, ...]  # the command's lines as written
    shown: str  # the output shown under it


def parse_block(body: str) -> list[Example]:
    """The commands of one console block with the output shown under each."""
    lines = body.rstrip("\n").split("\n")
    examples: list[Example] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, cmd = i, lines[i][2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("$ "):
            j += 1
        examples.append(Example(command=cmd, lines=tuple(lines[start : i + 1]), shown="\n".join(lines[i + 1 : j])))
        i = j
    return examples


def skip_reason(command: str, compiled: bool = False) -> str | None:
    """Why ``command`` is not run (None: it is); ``compiled``: the examples that compile are run too."""
    return next((why for key, why in SKIP.items() if key in command and not (compiled and why == COMPILES)), None)


#: What a compiled example prints that changes from run to run: the compile's wall time, or that it was cached
#: ("compiled in 21.8 s", "compiled (from cache)", "from cache").
VOLATILE = re.compile(r"compiled in [0-9.]+ s|compiled \(from cache\)|from cache")


def comparable(output: str) -> str:
    return VOLATILE.sub("compiled", output).strip()


def run(command: str, cwd: Path) -> str:
    env = dict(os.environ, COLUMNS="200", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT))
    r = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    out = (r.stdout + r.stderr).rstrip("\n")
    return "\n".join(line.rstrip() for line in out.split("\n") if not any(n in line for n in NOISE))


def excerpt(got: str, shown: str) -> str:
    """An output shown with a line "..." is an excerpt: as many lines of the output as are shown before it, and as
    many as are shown after it, are kept."""
    shown_lines = shown.rstrip("\n").split("\n")
    if "..." not in (line.strip() for line in shown_lines):
        return got
    cut = [line.strip() for line in shown_lines].index("...")
    head, tail = cut, len(shown_lines) - cut - 1
    lines = got.split("\n")
    if len(lines) <= head + tail:
        return got
    return "\n".join(lines[:head] + ["..."] + (lines[len(lines) - tail:] if tail else []))


def documents() -> list[Path]:
    """README.md, then every README.md under the project's folders (the reference pages), in path order."""
    pages = sorted(p for name in LINKED if (ROOT / name).is_dir() for p in (ROOT / name).rglob("README.md"))
    return [README, *pages]


def scratch_dir() -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="perfmodel-readme-")
    for name in LINKED:
        if (ROOT / name).exists():
            os.symlink(ROOT / name, Path(tmp.name) / name)
    (Path(tmp.name) / "out").mkdir()
    return tmp


def regenerate(text: str, progress=lambda msg: None, compiled: bool = False) -> tuple[str, list[tuple[str, str, str]]]:
    """(README text with every runnable example's output regenerated, [(command, shown, got)] that differ);
    ``compiled``: the examples that compile too."""
    drifted: list[tuple[str, str, str]] = []

    def block(match: re.Match) -> str:
        body = match.group(2)
        examples = parse_block(body)
        if not examples or any(skip_reason(e.command, compiled) for e in examples):
            for e in examples:
                if skip_reason(e.command, compiled):
                    progress(f"skip  {e.command[:80]}  ({skip_reason(e.command, compiled)})")
            return match.group(0)  # a session runs whole or not at all
        with scratch_dir() as cwd:
            out_lines: list[str] = []
            for e in examples:
                progress(f"run   {e.command[:80]}")
                got = excerpt(run(e.command, Path(cwd)), e.shown)
                if comparable(got) != comparable(e.shown):
                    drifted.append((e.command, e.shown, got))
                else:
                    got = e.shown.strip("\n")  # the same up to its compile time: kept as shown
                out_lines.extend(e.lines)
                if got:
                    out_lines.append(got)
        return match.group(1) + "\n".join(out_lines) + "\n" + match.group(3)

    return BLOCK.sub(block, text), drifted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the documents with the regenerated outputs")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--compiled", action="store_true",
                        help="also run the examples that compile with libtpu (minutes; their compile time is not compared)")
    args = parser.parse_args()
    progress = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    total = 0
    for doc in documents():
        name = doc.relative_to(ROOT)
        progress(f"== {name}")
        text = doc.read_text(encoding="utf-8")
        new, drifted = regenerate(text, progress, args.compiled)
        total += len(drifted)
        if args.write:
            if new != text:
                doc.write_text(new, encoding="utf-8")
            print(f"{name}: {len(drifted)} example(s) regenerated")
            continue
        for command, shown, got in drifted:
            print(f"=== drifted in {name}: $ {command}")
            sys.stdout.writelines(line + "\n" for line in
                                  difflib.unified_diff(shown.split("\n"), got.split("\n"), "shown", "now", lineterm=""))
    if args.write:
        return 0
    print(f"{total} example(s) differ from the tool's output"
          + ("; run: python tests/readme_examples.py --write" if total else ""))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
