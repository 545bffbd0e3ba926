"""The docs as a whole: the generated CLI reference is complete, the pages name no issue
or dated sitting, every snippet is included somewhere, every environment variable is on
the configuration page, and the two READMEs stay short."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .test_examples import DOCS, REPO, expand, pages

sys.path.insert(0, str(DOCS / "hooks"))
import cli_reference

pytestmark = pytest.mark.unit

HISTORY = [
    (re.compile(r"(?i)\bissues?\s+#?\d+"), "an issue number"),
    (re.compile(r"(?<![\w/])#\d{1,4}\b"), "an issue number"),
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"), "a date"),
    (re.compile(r"(?i)\bsittings?\b"), "a bench sitting"),
    (re.compile(r'README(?:\.md)?`?,?\s+"\d+\.\d+\.\d+"'), "a dated journal entry"),
]


def test_cli_reference_has_every_command() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert cli_reference.MARKER in page
    assert "docs/hooks/cli_reference.py" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    text = cli_reference.render()
    words = [" ".join(w) for w, _ in cli_reference.commands()]
    assert {"worker", "info", "dead", "limit set", "campaign", "bench load", "web"} <= set(words)
    for command in words:
        assert re.search(rf"^#+ batchq {re.escape(command)}$", text, re.M), command
        # the section holds that command's own usage line
        section = text.split(f" batchq {command}\n", 1)[1]
        assert f"usage: batchq {command}" in section.split("```", 2)[1].replace("\n", " ")


@pytest.mark.parametrize("page", [*pages(), REPO / "bench" / "README.md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_names_an_issue_or_a_sitting(page: Path) -> None:
    text = expand(page)
    found = [(what, m.group(0)) for rx, what in HISTORY for m in rx.finditer(text)]
    assert not found, f"{page.relative_to(REPO)} names history (git keeps it): {found}"


def test_every_snippet_is_included() -> None:
    snippets = sorted((DOCS / "snippets").glob("*.md")) if (DOCS / "snippets").is_dir() else []
    included = "\n".join(p.read_text(encoding="utf-8") for p in pages())
    missing = [s.name for s in snippets if f'"snippets/{s.name}"' not in included]
    assert not missing, f"docs/snippets written but included by no page: {missing}"


def test_every_environment_variable_is_documented() -> None:
    code = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "batchq").rglob("*.py"))
    names = set(re.findall(r'"(BATCHQ_[A-Z][A-Z0-9_]*)"', code))
    names |= {f"BATCHQ_{n}" for n in re.findall(r'\benv="([A-Z][A-Z0-9_]*)"', code)}
    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    missing = sorted(n for n in names if f"`{n}`" not in page)
    assert not missing, f"not in docs/reference/configuration.md: {missing}"


@pytest.mark.parametrize("name", ["README.md", "bench/README.md"])
def test_readmes_stay_short(name: str) -> None:
    lines = (REPO / name).read_text(encoding="utf-8").count("\n")
    assert lines <= 320, f"{name}: {lines} lines; the rest belongs in docs/"
