"""Every numeric flag of every ``batchq`` command is range-checked where it is parsed.

The flags are found by walking the real parser tree (``batchq.cli._parser``): every
action whose type is a ``Numeric`` (``batchq.cli.flags``), so a flag added later is
covered without touching this file, and a flag typed with a bare ``int`` or ``float``
fails the walk. Each is fed 0, -1, 1e20, nan, inf, 2**63 and a word through the real
entry point (``batchq.cli.main``): a value outside the flag's declared bounds must exit 2
with one line on stderr (no usage block, no traceback); a value inside them must pass
the parser. A few cases run as real subprocesses, and the ``BATCHQ_*`` variable behind
a flag is refused the same way.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import pytest
from helpers import run_cli

from batchq.cli import _parser, main
from batchq.cli.flags import Numeric

pytestmark = pytest.mark.e2e

VALUES = ["0", "-1", "1e20", "nan", "inf", str(2**63), "many"]
APP = "tests.apps.ops_app:app"


def _walk(p: argparse.ArgumentParser, path: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, child in a.choices.items():
                yield from _walk(child, (*path, name))


def _minimal_argv(p: argparse.ArgumentParser) -> list[str]:
    """Positionals and required options that let the parser reach a flag."""
    argv: list[str] = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction | argparse._HelpAction):
            continue
        if a.option_strings:
            if a.required:
                argv += [a.option_strings[-1], "x.jsonl"]
            continue
        if a.nargs in ("?", "*", argparse.REMAINDER):
            continue
        value = next(iter(a.choices)) if a.choices else "default"
        argv += [value] * (1 if a.nargs in (None, "+") else int(a.nargs or 1))
    return argv


def _numeric_flags() -> list[tuple[tuple[str, ...], list[str], str, Numeric]]:
    found = []
    for path, p in _walk(_parser()):
        for a in p._actions:
            assert a.type not in (int, float), (
                f"batchq {' '.join(path)} {a.option_strings}: typed {a.type!r}; use a "
                "checked type of batchq.cli.flags")
            if isinstance(a.type, Numeric):
                flag = max(a.option_strings, key=len)
                found.append((path, _minimal_argv(p), flag, a.type))
    return found


FLAGS = _numeric_flags()


def _valid(t: Numeric, raw: str) -> bool:
    """What the flag's declared bounds say of ``raw`` (computed here, not by the type)."""
    try:
        v = int(raw) if t.integer else float(raw)
    except ValueError:
        return False
    if not math.isfinite(v) or v > t.high:
        return False
    return v > t.low if t.low_open else v >= t.low


def test_the_walk_finds_the_flags_of_every_command() -> None:
    paths = {" ".join(path) for path, *_ in FLAGS}
    assert {"worker", "server", "info", "dead list", "dead show", "campaign list",
            "enqueue", "limit set", "limit list", "web", "bench load"} <= paths, paths
    flags = {(" ".join(path), flag) for path, _, flag, _ in FLAGS}
    assert ("worker", "--gc-threshold") in flags and ("worker", "--concurrency") in flags
    assert len(FLAGS) >= 30, len(FLAGS)


@pytest.mark.parametrize(("path", "argv", "flag", "kind"), FLAGS,
                         ids=[f"{' '.join(f[0])} {f[2]}" for f in FLAGS])
def test_every_numeric_flag_refuses_what_is_out_of_its_bounds(
        path: tuple[str, ...], argv: list[str], flag: str, kind: Numeric,
        capsys: pytest.CaptureFixture[str]) -> None:
    # no flag may take a count or duration Redis or the C runtime would refuse
    assert kind.high < 1e18, (flag, kind)
    for raw in VALUES:
        args = [*path, *argv, f"{flag}={raw}"]
        if _valid(kind, raw):
            _parser().parse_args(args)  # not refused where it is parsed
            continue
        with pytest.raises(SystemExit) as exit_:
            main(args)
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (args, err)
        assert "Traceback" not in err and "usage:" not in err, err
        assert flag in lines[0] and lines[0].startswith(f"batchq {' '.join(path)}"), err


def test_the_environment_variable_behind_a_flag_is_refused_the_same_way(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for var, raw in [("BATCHQ_CONCURRENCY", "10001"), ("BATCHQ_GC_THRESHOLD", "3000000000"),
                     ("BATCHQ_LEASE_S", "1e20"), ("BATCHQ_PROCESSES", str(2**63)),
                     ("BATCHQ_METRICS_PORT", "nan")]:
        monkeypatch.setenv(var, raw)
        assert main(["worker", APP]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and var in err and raw in err, err
        monkeypatch.delenv(var)


@pytest.mark.parametrize(("args", "named"), [
    (["worker", APP, "--gc-threshold", "3000000000", "-p", "1"], "--gc-threshold"),
    (["worker", APP, "-c", "10001"], "-c/--concurrency"),
    (["worker", APP, "-c", "1e20"], "-c/--concurrency"),
    (["dead", "show", "default", "--limit", "100000000000000000000"], "--limit"),
    (["campaign", "list", "--limit", "1e20"], "--limit"),
    (["limit", "set", "default", "--concurrency", str(2**63)], "--concurrency"),
    (["bench", "load", APP, "add", "--rate", "1e9", "--duration", "1"], "--rate"),
    (["info", "-i", "inf"], "-i/--interval"),
    (["worker"], "required"),
])
def test_a_real_run_exits_2_with_the_error_as_its_only_line(args: list[str],
                                                            named: str) -> None:
    res = run_cli(args, env={"BATCHQ_REDIS_URL": "redis://127.0.0.1:1/0"}, timeout_s=30)
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not res.stdout
