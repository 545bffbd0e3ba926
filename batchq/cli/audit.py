"""``batchq audit``: the namespace's audit log (``batchq.ops.audit``), newest first; and
``audited``, which every command that changes something wraps its action in, so the
action leaves one entry (who: ``cli:<os user>``; the result: ``ok`` or the error).

An action that ran is never reported as failed because its entry could not be written:
the command warns on stderr and keeps its exit code.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from ..ops import audit
from ..worker import exitcodes
from .common import Fail, Target, add_common, dumps, err, guarded, iso, out, table, target
from .common import text as show
from .flags import count_between

LIMIT_DEFAULT = 50


@dataclass
class Note:
    """What an action adds to its entry once it ran (``detail``: ``"3 jobs"``)."""

    detail: str = ""


def write(t: Target, action: str, what: str, result: str = "ok", detail: str = "") -> None:
    """Record one action of this command; a failed write is a warning, never an error."""
    try:
        audit.record(t.app.redis, t.namespace, who=audit.cli_who(), action=action,
                     target=what, result=result, detail=detail)
    except (redis.RedisError, ValueError) as exc:
        err(f"batchq: warning: the audit log was not written: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def audited(t: Target, action: str, what: str, detail: str = "") -> Iterator[Note]:
    """Run the action in the ``with`` block and record it: ``ok`` with the note's detail,
    or the error it raised (then raised on)."""
    note = Note(detail)
    try:
        yield note
    except Fail as exc:
        write(t, action, what, f"error: {exc}", note.detail)
        raise
    except Exception as exc:
        write(t, action, what, f"error: {type(exc).__name__}: {exc}", note.detail)
        raise
    write(t, action, what, "ok", note.detail)


def cmd_audit(args: argparse.Namespace) -> int:
    t = target(args)
    try:
        entries = audit.read(t.app.redis, t.namespace, args.limit)
    except ValueError as exc:  # a bad $BATCHQ_AUDIT_MAX_AGE_S
        raise Fail(exitcodes.EXIT_USAGE, str(exc)) from None
    if args.json:
        out(dumps([e.as_dict() for e in entries]))
        return exitcodes.EXIT_OK
    if not entries:
        out(f"no audit entries in {t.where()}")
        return exitcodes.EXIT_OK
    rows = [[iso(e.ts_ms / 1000), show(e.who), show(e.action), show(e.target),
             show(e.detail) or "-", show(e.result)] for e in entries]
    out(table(["WHEN", "WHO", "ACTION", "TARGET", "DETAIL", "RESULT"], rows))
    return exitcodes.EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "audit", help="the audit log: who paused, resumed, limited, held, released, "
        "cancelled, retried or purged what, and when",
        description="Every action taken from the CLI or the web console, newest first, "
        "with who took it (the console's user, or cli:<os user>), the target, when "
        "(server clock, UTC) and the result. Kept in Redis, bounded by "
        f"${audit.MAX_COUNT_ENV} entries (default {audit.DEFAULT_MAX_COUNT:,}) and "
        f"${audit.MAX_AGE_ENV} seconds (default {audit.DEFAULT_MAX_AGE_S / 86400:g} days).")
    add_common(p)
    p.add_argument("--limit", type=count_between(1, audit.READ_MAX), default=LIMIT_DEFAULT,
                   metavar="N", help=f"show the newest N entries (default {LIMIT_DEFAULT})")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {id, ts_ms, who, action, target, result, "
                   "detail}")
    p.set_defaults(handler=guarded("audit", cmd_audit))
