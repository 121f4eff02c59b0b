"""The README example runner (tests/readme_examples.py): parsing sessions and excerpts. `make readme-check` runs
the examples themselves."""

from __future__ import annotations

import pytest

from tests.readme_examples import excerpt, parse_block, skip_reason


def test_a_session_is_split_into_commands_with_their_output():
    body = "$ perfmodel hw list \\\n    --json\n[1]\n$ sed -n 1p f\nx\ny\n"
    first, second = parse_block(body)
    assert first.command == "perfmodel hw list --json" and first.shown == "[1]"
    assert first.lines == ("$ perfmodel hw list \\", "    --json")
    assert second.command == "sed -n 1p f" and second.shown == "x\ny"


@pytest.mark.parametrize("shown, got, kept", [
    # No "...": the whole output.
    ("a\nb", "a\nb\nc", "a\nb\nc"),
    # One line shown before "...": the first line of four, then "...".
    ("a\n...", "a\nb\nc\nd", "a\n..."),
    # One before, one after: the first and the last of four.
    ("a\n...\nd", "a\nb\nc\nd", "a\n...\nd"),
    # An output no longer than the excerpt is kept whole (the "..." goes).
    ("a\n...", "a", "a"),
])
def test_an_excerpt_keeps_the_lines_shown_around_the_ellipsis(shown, got, kept):
    assert excerpt(got, shown) == kept


def test_machine_dependent_examples_are_skipped_with_a_reason():
    assert "libtpu" in skip_reason("perfmodel inspect matmul --compile")
    assert skip_reason("perfmodel predict gemm --hw v5e -m 1 -n 1 -k 1") is None


def test_compiled_examples_run_on_request_and_compare_without_their_compile_time():
    from tests.readme_examples import comparable

    # --compiled runs what compiles, not what measures on the local backend
    assert skip_reason("perfmodel xla kernels.matmul:matmul --hw v6e", compiled=True) is None
    assert "machine-dependent" in skip_reason("perfmodel measure matmul --hw v5e", compiled=True)
    shown = "compile matmul for tpu-v6e: compiled in 21.8 s\n  bundles 33,080"
    assert comparable(shown) == comparable("compile matmul for tpu-v6e: compiled (from cache)\n  bundles 33,080")
    assert comparable("x on v6e: compiled in 4.6 s") == comparable("x on v6e: from cache")
    assert comparable(shown) != comparable("compile matmul for tpu-v6e: compiled in 21.8 s\n  bundles 33,081")


def test_the_reference_pages_are_checked_with_the_readme():
    from tests.readme_examples import ROOT, documents

    docs = [p.relative_to(ROOT).as_posix() for p in documents()]
    assert docs[0] == "README.md"
    assert {"hwspecs/README.md", "perfmodel/predict/README.md", "perfmodel/harness/README.md"} <= set(docs)


def test_every_page_the_readme_links_exists():
    import re

    from tests.readme_examples import README, ROOT

    links = re.findall(r"\]\(([^)#]+)\)", README.read_text(encoding="utf-8"))
    assert len(links) >= 7  # one reference page per subject
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to missing pages: {missing}"
