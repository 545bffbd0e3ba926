"""``batchq hold`` / ``batchq release``: hold a queue or one of its groups (workers start
none of its jobs until the hold ends), or lift a hold now, whoever set it: an operator,
or a handler that raised ``RateLimited`` (``Queue.hold``, ``Queue.release``; holds are
kept in Redis, ``batchq/flow/limits.py``). A release wakes an idle worker, so the held jobs
start at once. Each leaves an entry in the audit log (``batchq audit``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, NoReturn

from ..flow.limits import MAX_HOLD_S, check_group
from ..ops.queue import Queue
from ..store.keys import queues_key
from ..worker import exitcodes
from .audit import audited
from .common import (
    Target,
    add_common,
    app_and,
    dumps,
    duration,
    err,
    guarded,
    iso,
    out,
    target,
    usage,
)
from .common import text as show
from .flags import seconds

USAGE = ("batchq {name} [MODULE:APP] QUEUE {secs}[--group G] [--json] [--redis-url URL] "
         "[--namespace NS]")


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{p.prog}: {message}\n")
        sys.exit(exitcodes.EXIT_USAGE)

    p.error = error  # type: ignore[method-assign]


def _group(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return check_group(raw)
    except ValueError as exc:
        raise usage(f"--group: {exc}") from None


def _queue(args: argparse.Namespace, where: list[str]) -> tuple[Target, Queue]:
    args.app, loaded, name = app_and(where, "QUEUE")
    t = target(args, loaded)
    q = t.queue(name)
    known = {show(m) for m in t.app.redis.smembers(queues_key(t.namespace))}
    if q.name not in known and q.name not in t.app_queues:
        err(f"batchq: note: queue {q.name!r} has not been used yet in {t.where()}")
    return t, q


def what(q: Queue, group: str | None) -> str:
    """The audit target and the text of a hold's subject."""
    return f"queue {q.name}" if group is None else f"queue {q.name} group {show(group)}"


def cmd_hold(args: argparse.Namespace) -> int:
    if len(args.where) < 2:
        raise usage("expected [MODULE:APP] QUEUE SECONDS")
    raw = args.where[-1]
    try:
        secs = seconds(zero_ok=False, high=MAX_HOLD_S)(raw)
    except argparse.ArgumentTypeError as exc:
        raise usage(f"SECONDS: {exc}") from None
    group = _group(args.group)
    t, q = _queue(args, args.where[:-1])
    subject = what(q, group)
    with audited(t, "hold", subject, f"{secs:g}s"):
        left = q.hold(secs, group)
    until = time.time() + left
    kept = left > secs + 1
    if args.json:
        out(dumps({"queue": q.name, "group": group, "held_s": round(left, 3),
                   "until": iso(until), "kept_longer": kept}))
        return exitcodes.EXIT_OK
    more = f" (a longer hold was kept: {duration(left)} left)" if kept else ""
    out(f"{subject} is held until {iso(until)}{more}: workers start none of its jobs; "
        f"batchq release {show(q.name)}" + (f" --group {show(group)}" if group else "")
        + " lifts it")
    return exitcodes.EXIT_OK


def cmd_release(args: argparse.Namespace) -> int:
    group = _group(args.group)
    t, q = _queue(args, args.where)
    subject = what(q, group)
    with audited(t, "release", subject) as note:
        left = q.release(group)
        note.detail = f"{left:.0f}s left" if left else "not held"
    paused = q.is_paused()
    if args.json:
        out(dumps({"queue": q.name, "group": group, "released": left > 0,
                   "left_s": round(left, 3), "paused": paused}))
        return exitcodes.EXIT_OK
    if left:
        out(f"released {subject} (its hold had {duration(left)} left): workers start its "
            "jobs now")
    else:
        out(f"{subject} was not held: nothing released")
    if paused:
        out(f"note: queue {q.name} is paused: batchq resume {show(q.name)} lets workers "
            "take its jobs")
    return exitcodes.EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "hold", usage=USAGE.format(name="hold", secs="SECONDS "),
        help="hold a queue or a group: workers start none of its jobs for SECONDS",
        description="Hold the whole queue (every shard), or one group with --group, for "
        f"SECONDS (at most {MAX_HOLD_S:g}), as a handler raising RateLimited does; a "
        "longer hold already set is kept. batchq release lifts it. The app comes first, "
        "as in every command.")
    p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE SECONDS",
                   help="the app (optional), the queue and the seconds")
    add_common(p, app=False)
    p.add_argument("--group", default=None, metavar="G", help="hold this group only")
    p.add_argument("--json", action="store_true", help="print JSON")
    _one_line_errors(p)
    p.set_defaults(handler=guarded("hold", cmd_hold))

    p = sub.add_parser(
        "release", usage=USAGE.format(name="release", secs=""),
        help="lift the hold of a queue or a group now (an operator's or RateLimited's)",
        description="End the hold of the whole queue (every shard), or of one group with "
        "--group, now, whoever set it (batchq hold, or a handler raising RateLimited), "
        "and wake an idle worker so the held jobs start at once. A pause is not a hold: "
        "batchq resume ends that.")
    p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE",
                   help="the app (optional) and the queue")
    add_common(p, app=False)
    p.add_argument("--group", default=None, metavar="G", help="release this group only")
    p.add_argument("--json", action="store_true", help="print JSON")
    _one_line_errors(p)
    p.set_defaults(handler=guarded("release", cmd_release))
