"""The ``--help`` of every ``batchq`` command and subcommand, read from the real parser
tree (so a command added later is covered): each subcommand has its own text, every
flag says what it does, and no default is shown where there is none to show."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
from helpers import run_cli

from batchq.cli import _parser

pytestmark = pytest.mark.e2e


def _walk(p: argparse.ArgumentParser, path: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser,
                              argparse.ArgumentParser | None]]:
    yield path, p, None
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, child in a.choices.items():
                for sub_path, sub, parent in _walk(child, (*path, name)):
                    yield sub_path, sub, parent if sub_path != (*path, name) else p


PARSERS = list(_walk(_parser()))


def _help(p: argparse.ArgumentParser) -> str:
    return p.format_help() if p.add_help else ""


def test_each_subcommand_has_its_own_help() -> None:
    nested = [(path, p, parent) for path, p, parent in PARSERS if parent is not None]
    assert {("campaign", "cancel"), ("dead", "purge"), ("bench", "load"),
            ("limit", "set")} <= {path for path, _, _ in nested}
    for path, p, parent in nested:
        if not p.add_help:
            continue  # the harness commands pass everything to python -m bench
        assert parent is not None
        mine, theirs = _help(p), _help(parent)
        assert mine != theirs, f"batchq {' '.join(path)} --help is its parent's"
        # its description is its own, not the parent's repeated
        if parent.description:
            assert parent.description not in mine, path
        assert "``" not in mine, f"reST literal in batchq {' '.join(path)} --help"


def test_no_empty_or_switch_default_is_shown() -> None:
    for path, p, _ in PARSERS:
        text = " ".join(_help(p).split())  # the formatter wraps lines anywhere
        for bad in ("default ]", "default False", "default True", "default ()",
                    "default unset"):
            assert bad not in text, f"batchq {' '.join(path)} --help shows {bad!r}"


def test_every_flag_says_what_it_does() -> None:
    for path, p, _ in PARSERS:
        if not p.add_help:
            continue
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if a.help == argparse.SUPPRESS:
                continue
            assert a.help, f"batchq {' '.join(path)} {a.option_strings or a.dest}: no help"


def test_server_help_documents_port_and_host() -> None:
    res = run_cli(["server", "--help"], timeout_s=30)
    assert res.returncode == 0, res
    text = " ".join(res.stdout.split())
    assert "--port PORT TCP port" in text and "default 6399" in text, res.stdout
    assert "--host HOST address to listen on" in text, res.stdout


def test_worker_help_shows_real_defaults_only() -> None:
    res = run_cli(["worker", "--help"], timeout_s=30)
    assert res.returncode == 0, res
    text = " ".join(res.stdout.split())
    assert "[env BATCHQ_QUEUES]" in text and "[env BATCHQ_BURST]" in text, text
    assert "[env BATCHQ_CONCURRENCY; default 100]" in text, text
