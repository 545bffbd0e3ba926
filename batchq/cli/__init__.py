"""The ``batchq`` command: argument parsing and output only; every command returns an exit
code from ``batchq.worker.exitcodes`` (0 ok, 1 error, 2 usage, 3 cannot import the app, 4 cannot
reach Redis).

One module per command family: ``worker`` (worker, server), ``info``, ``dead``,
``limit`` (flow-control limits), ``control`` (pause, resume, check), ``enqueue``,
``bench``, ``web``; ``common`` holds output, secret scrubbing, exit-code mapping and
target resolution, ``flags`` the checked flag types. Nothing outside this package
imports it but the ``python -m`` entry points (``batchq.__main__``;
``batchq.web.__main__``, which is ``batchq web``); app loading lives in
``batchq.tasks.loading``.

A password given with ``--redis-url`` would be readable by every user in the process
list (``/proc/PID/cmdline``) of the command and of every worker it forks. So before
anything else the command re-executes itself once with that flag removed and its value
moved into the environment (readable only by the same user), and reads it back from
there; ``BATCHQ_REDIS_URL`` keeps the password out of the process list from the start.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..store.connection import redact
from ..tasks.loading import AppImportError, load_app
from ..worker.exitcodes import EXIT_USAGE
from .flags import Parser, UsageError, check_env_url, redis_url, url_problem

__all__ = ["AppImportError", "load_app", "main"]

HIDDEN_URL_ENV = "_BATCHQ_REDIS_URL_FLAG"
"""Where the re-executed command finds the ``--redis-url`` value it was given."""
URL_FLAG = "--redis-url"


def _parser() -> argparse.ArgumentParser:
    from .. import __version__
    from . import audit, bench, campaign, control, dead, enqueue, hold, info, limit, web, worker
    from .breaker import add_commands as add_breaker_commands
    from .events import add_commands as add_events_commands
    from .job import add_commands as add_job_commands

    p = Parser(prog="batchq", description="batchq: a Redis job queue")
    p.add_argument("--version", action="version", version=f"batchq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    worker.add_commands(sub)
    info.add_commands(sub)
    dead.add_commands(sub)
    limit.add_commands(sub)
    campaign.add_commands(sub)
    enqueue.add_commands(sub)
    control.add_commands(sub)
    hold.add_commands(sub)
    add_job_commands(sub)
    add_breaker_commands(sub)
    audit.add_commands(sub)
    add_events_commands(sub)
    bench.add_commands(sub)
    web.add_commands(sub)
    return p


def _url_flag(token: str) -> tuple[bool, str | None]:
    """Is ``token`` the ``--redis-url`` flag (argparse accepts unambiguous prefixes),
    and its ``=value`` if attached."""
    name, eq, value = token.partition("=")
    is_flag = len(name) >= len("--redis") and URL_FLAG.startswith(name)
    return is_flag, (value if eq else None)


def _without_url(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without any ``--redis-url`` flag, and the last value given."""
    kept: list[str] = []
    value: str | None = None
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            kept += args[i:]
            break
        is_flag, attached = _url_flag(tok)
        if is_flag and attached is not None:
            value = attached
        elif is_flag and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        else:
            kept.append(tok)
        i += 1
    return kept, value


def _has_secret(url: str) -> bool:
    try:
        return redact(url) != url
    except ValueError:
        return False  # not a URL: the parser refuses it with a message


def _hide_url_from_ps(args: list[str], command: str | None) -> None:
    """Re-execute this command without a password-bearing ``--redis-url`` in its
    arguments (see the module docstring). Returns when there is nothing to hide or the
    command line cannot be rebuilt faithfully."""
    head = [command, *args[:1]] if command else args[:2]
    if not head or head[0] == "server" or (head[0] == "bench" and head[1:2] != ["load"]):
        return  # no --redis-url there (the harness passes its arguments through)
    kept, value = _without_url(args)
    if value is None or not _has_secret(value) or url_problem(value):
        return  # nothing to hide, or a bad URL that the parser refuses at once
    orig = list(getattr(sys, "orig_argv", []))
    if len(orig) < len(args) or orig[len(orig) - len(args):] != args:
        return
    env = dict(os.environ)
    env[HIDDEN_URL_ENV] = value
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, orig[: len(orig) - len(args)] + kept, env)


def main(argv: Sequence[str] | None = None, *, command: str | None = None) -> int:
    """Run ``batchq`` with ``argv`` (default: this process's arguments); ``command``:
    the subcommand the arguments are for (``python -m batchq.web ARGS`` is ``batchq web
    ARGS``)."""
    if argv is None:
        _hide_url_from_ps(sys.argv[1:], command)
        argv = sys.argv[1:]
    hidden = os.environ.pop(HIDDEN_URL_ENV, None)
    try:
        args = _parser().parse_args([command, *argv] if command else argv)
        if hasattr(args, "redis_url"):
            check_env_url()
            if hidden and args.redis_url is None:
                args.redis_url = redis_url(hidden)
    except (UsageError, argparse.ArgumentTypeError) as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    code: int = args.handler(args)
    return code
