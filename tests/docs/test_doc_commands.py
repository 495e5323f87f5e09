"""Commands in the docs run as written on a fresh machine: the project's venv by path (`.venv/bin/python -m`,
`.venv/bin/hpctl`), never a bare `python` or `hpctl` (a Debian user has neither on PATH). On the cluster the
controller's and the nodes' interpreter is `python3`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A command in an inline code span, or on a line of a code block (after `$ `, `&&`, `;` or `|`).
BARE_IN_SPAN = re.compile(r"`(python -m |hpctl(?=[ `]))")  # `hpctl/x.py` is a file, not the command
BARE_ON_LINE = re.compile(r"(?:^\s*(?:\$ )?|&& |; |\| )(python -m |hpctl\b(?!/))")  # hpctl/ is the folder


def bare_commands(text: str) -> list[str]:
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        indented = line.startswith("    ") and not line.lstrip().startswith(("-", "*"))
        pattern = BARE_ON_LINE if fenced or indented else BARE_IN_SPAN
        if pattern.search(line):
            found.append(f"{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_docs_name_the_venv_s_python_and_hpctl(doc):
    assert bare_commands(doc.read_text()) == [], f"{doc.name}: write .venv/bin/python -m / .venv/bin/hpctl"


def test_the_check_finds_a_bare_command_in_a_span_and_a_block():
    text = "Run `hpctl status`.\n```bash\ncd x && python -m llm_pipeline.data --preview run.toml\n```\n"
    found = bare_commands(text)
    assert found == ["1: Run `hpctl status`.", "3: cd x && python -m llm_pipeline.data --preview run.toml"]
    assert bare_commands("Run `.venv/bin/hpctl status`, then `python3 -m llm_pipeline.submit` there.\n") == []
    assert bare_commands("```\nhpctl/   the operations CLI\nhpctl status\n```\n") == ["3: hpctl status"]


def test_every_docs_page_is_in_the_docs_index():
    """docs/README.md's table is the way in: a page it does not name is a page nobody finds."""
    index = (REPO / "docs" / "README.md").read_text()
    unlisted = [path.name for path in DOCS if path.parent.name == "docs" and f"]({path.name})" not in index]
    assert [name for name in unlisted if name != "README.md"] == []
