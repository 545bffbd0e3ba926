"""``batchq events [MODULE:APP] [-q QUEUE] [--follow] [--since ID] [--json]``: the job
events of queues (``batchq.ops.events``), oldest kept first, one line each (``--json``: one
JSON object a line, for scripts); ``--follow`` waits for new ones until interrupted. A
reader behind the trim gets a ``gap`` line with the count it missed. ``--enable`` /
``--disable`` turn a queue's events on or off (``Queue.events``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

from ..ops import events
from ..worker import exitcodes
from .common import add_common, app_only, dumps, guarded, out, target, usage
from .common import text as show

USAGE = ("batchq events [MODULE:APP] [-q QUEUE]... [--since ID] [--follow] [--json] "
         "[--enable [--max-len N] [--max-age-s S] | --disable] [--redis-url URL] "
         "[--namespace NS]")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def line(e: events.Event) -> str:
    """One event as a line of text."""
    if e.kind == "gap":
        n = "an unknown number of" if e.missed < 0 else str(e.missed)
        return f"-- gap: {n} events of {show(e.queue)} were trimmed before they were read"
    parts = [_iso(e.at_ms), e.id, show(e.queue), e.kind]
    if e.job_id:
        parts.append(show(e.job_id))
    if e.task:
        parts.append(show(e.task))
    if e.attempt is not None:
        parts.append(f"attempt={e.attempt}")
    if e.group is not None:
        parts.append(f"group={show(e.group)}")
    elif e.kind in ("held", "hold_lifted"):
        parts.append("group=(whole queue)")
    if e.campaign:
        parts.append(f"campaign={show(e.campaign)}")
    if e.until_ms is not None:
        parts.append(f"until={_iso(e.until_ms)}")
    if e.error:
        parts.append(f"error={show(e.error)}")
    return "  ".join(parts)


def cmd_events(args: argparse.Namespace) -> int:
    args.app = app_only(args.where, "the queues go with -q")
    t = target(args)
    names = args.queue or t.app_queues
    if not names:
        raise usage("no queue: give -q QUEUE (or an app whose tasks name queues)")
    qs = [t.queue(n) for n in names]
    if args.enable or args.disable:
        if args.enable and args.disable:
            raise usage("--enable and --disable exclude each other")
        for q in qs:
            try:
                q.events(bool(args.enable), max_len=args.max_len, max_age_s=args.max_age_s)
            except ValueError as exc:
                raise usage(str(exc)) from None
            state = "on" if args.enable else "off"
            out(f"events of {q.name} {state}" + (
                f" (keep ~{args.max_len} events, {args.max_age_s:g} s)" if args.enable
                else ""))
        return exitcodes.EXIT_OK
    since: Any = args.since
    if since not in ("0", "$"):
        with contextlib.suppress(ValueError):  # else an event id, checked by the reader
            since = datetime.fromisoformat(since)
    try:
        it = t.app.events([q.name for q in qs], since=since, follow=args.follow)
        for e in it:
            out(dumps(e.as_dict()) if args.json else line(e))
            sys.stdout.flush()
    except ValueError as exc:
        raise usage(str(exc)) from None
    except KeyboardInterrupt:
        pass  # --follow ends with ^C: not an error
    return exitcodes.EXIT_OK


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{p.prog}: {message}\n")
        sys.exit(exitcodes.EXIT_USAGE)

    p.error = error  # type: ignore[method-assign]


def _count(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v!r}")
    return n


def _seconds(v: str) -> float:
    try:
        s = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {v!r}") from None
    if not 0 <= s < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {v!r}")
    return s


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "events", usage=USAGE,
        help="print the job events of queues (started, succeeded, retried, dead, ...)",
        description="Print the job events of queues, oldest kept first (or from --since: "
        "an event id, 0, $ for new ones only, or an ISO time), one line each; --follow "
        "waits for new ones. Events are opt-in per queue: --enable turns them on.")
    p.add_argument("where", nargs="*", metavar="MODULE:APP", help="the app (optional)")
    add_common(p, app=False)
    p.add_argument("-q", "--queue", action="append", default=None, metavar="QUEUE",
                   help="a queue (repeat for more) [default: the app's queues]")
    p.add_argument("--since", default="0", metavar="ID",
                   help="start after this event id; 0 the oldest kept (default), $ new "
                   "ones only, or an ISO date and time")
    p.add_argument("--follow", action="store_true", help="wait for new events")
    p.add_argument("--json", action="store_true", help="print one JSON object a line")
    p.add_argument("--enable", action="store_true", help="turn the queues' events on")
    p.add_argument("--disable", action="store_true", help="turn the queues' events off")
    p.add_argument("--max-len", type=_count, default=events.DEFAULT_MAX_LEN, metavar="N",
                   help=f"with --enable: events kept, about [{events.DEFAULT_MAX_LEN}]")
    p.add_argument("--max-age-s", type=_seconds, default=events.DEFAULT_MAX_AGE_S,
                   metavar="S", help="with --enable: seconds an event is kept, 0 no limit "
                   f"[{events.DEFAULT_MAX_AGE_S:g}]")
    _one_line_errors(p)
    p.set_defaults(handler=guarded("events", cmd_events))
