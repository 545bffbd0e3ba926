"""MkDocs hook: the CLI reference, rendered from the argparse parsers at build time.

``docs/reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook
replaces it with every ``batchq`` command's usage and help as the parser prints them,
so the page cannot drift from the code. ``tests/docs`` imports ``render`` to check that
every subcommand is on the page.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "88"  # the terminal width argparse wraps the help text to


def root_parser() -> argparse.ArgumentParser:
    """The parser ``batchq`` itself builds (its builder is private to the CLI)."""
    from batchq import cli

    for name in ("build_parser", "parser", "_parser"):
        builder = getattr(cli, name, None)
        if callable(builder):
            parser = builder()
            if isinstance(parser, argparse.ArgumentParser):
                return parser
    raise RuntimeError("batchq.cli has no parser builder (build_parser / _parser)")


def _children(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if id(child) not in seen:  # aliases point at the same parser
                    seen.add(id(child))
                    yield name, child


def commands(parser: argparse.ArgumentParser | None = None,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                           argparse.ArgumentParser]]:
    """Every subcommand, depth first, as (its words after ``batchq``, its parser)."""
    parser = parser if parser is not None else root_parser()
    for name, child in _children(parser):
        yield (*path, name), child
        yield from commands(child, (*path, name))


def _help(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        text = parser.format_help()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return text.rstrip().replace("```", "'''")


def render() -> str:
    """The reference as Markdown: one section per command, its help in a text block."""
    root = root_parser()
    out = ["## batchq", "", "```text", _help(root), "```", ""]
    for words, parser in commands(root):
        level = "#" * min(2 + len(words), 6)
        out += [f"{level} batchq {' '.join(words)}", "", "```text", _help(parser), "```", ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown
