"""``batchq limit window|window-rm``: the send windows (quiet hours) of a queue or of
its groups (``Queue.window``, ``Queue.remove_window``; ``batchq/flow/windows.py``), and the
calendar quotas and windows that ``batchq limit list`` prints.

A window applies on every worker's next fetch, to the jobs already queued too. A bad
value (hours, days, time zone, holiday) exits 2 with one line naming it, nothing
written; ``window`` and ``window-rm`` leave an entry in the audit log.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..flow import windows
from ..flow.limits import Limit
from ..ops.queue import Queue
from ..worker import exitcodes
from .audit import audited
from .common import Target, dumps, duration, guarded, out, table, usage
from .common import text as show
from .info import limit_group

WINDOW_USAGE = ("batchq limit window [MODULE:APP] QUEUE --hours HH:MM-HH:MM [--hours ...] "
                "[--days mon-fri] [--tz TZ] [--holiday YYYY-MM-DD ...] [--group G] [--json] "
                "[--redis-url URL] [--namespace NS]")


def window_dict(w: windows.Window) -> dict[str, Any]:
    return {"group": w.group, "hours": [s.text().split(" ")[0] for s in w.spans],
            "days": [s.text().split(" ")[1] for s in w.spans], "tz": w.tz,
            "holidays": [d.isoformat() for d in w.holidays]}


def print_quotas(lims: list[Limit], use: dict[str | None, Any]) -> None:
    """The calendar quotas of ``lims`` and their use now (``use``: ``LimitUse`` by
    group, from ``flow_view``)."""
    rows = []
    for lim in lims:
        if not lim.calendar:
            continue
        u = use.get(lim.group)
        used = {w.window: w for w in (u.windows if u is not None else ())}
        for kind, n in lim.calendar.items():
            w = used.get(kind)
            rows.append([limit_group(lim.group), kind, str(n),
                         "-" if w is None else str(w.used),
                         "-" if w is None else duration(w.reset_s), lim.tz or "UTC"])
    if rows:
        out("calendar quotas (job starts per period; '*' counts per group):")
        out(table(["GROUP", "WINDOW", "MAX", "USED", "RESETS IN", "TZ"], rows,
                  right={2, 3}))


def print_windows(q: Queue) -> None:
    wins = q.windows()
    if wins:
        out("send windows (jobs start only inside them):")
        out(table(["GROUP", "WINDOW"], [[limit_group(w.group), w.describe()]
                                        for w in wins]))


def add_actions(acts: Any, common: Callable[[argparse.ArgumentParser, str | None], None],
                queue_of: Callable[[argparse.Namespace], tuple[Target, Queue]],
                group_of: Callable[[str | None], str | None]) -> None:
    """Add ``window`` and ``window-rm`` to ``batchq limit``'s actions."""

    def subject(q: Queue, group: str | None) -> str:
        return f"queue {q.name}" if group is None else f"queue {q.name} group {show(group)}"

    def cmd_window(args: argparse.Namespace) -> int:
        group = group_of(args.group)
        try:
            w = windows.make_window(group, args.hours, args.days or ["daily"], args.tz,
                                    args.holiday)
        except (TypeError, ValueError) as exc:
            raise usage(str(exc)) from None
        t, q = queue_of(args)
        try:
            with audited(t, "limit_window", subject(q, group), w.describe()):
                stored = q.window(group, hours=args.hours, days=args.days or ["daily"],
                                  tz=args.tz, holidays=args.holiday)
        except ValueError as exc:
            raise usage(str(exc)) from None
        if args.json:
            out(dumps({"queue": q.name, "window": window_dict(stored)}))
        else:
            out(f"send window of queue {q.name}, {limit_group(group)}: {stored.describe()}")
        return exitcodes.EXIT_OK

    def cmd_window_rm(args: argparse.Namespace) -> int:
        group = group_of(args.group)
        t, q = queue_of(args)
        with audited(t, "limit_window_rm", subject(q, group)) as note:
            removed = q.remove_window(group)
            note.detail = "removed" if removed else "no window"
        if args.json:
            out(dumps({"queue": q.name, "group": group, "removed": removed}))
        else:
            out(f"{'removed the' if removed else 'no'} send window of queue {q.name}, "
                f"{limit_group(group)}")
        return exitcodes.EXIT_OK

    p = acts.add_parser(
        "window", prog="batchq limit window", usage=WINDOW_USAGE,
        help="set (replace) the send window of the queue or of a group",
        description="Jobs of the queue (no --group), of group G, or of every group "
        "without a window of its own (--group '*') start only inside the window; "
        "outside it they wait in Redis, ready, and start when it opens. Applies to jobs "
        "already queued.")
    common(p, "the group (default: the whole queue; '*': every group without a window "
           "of its own)")
    p.add_argument("--hours", action="append", required=True, metavar="HH:MM-HH:MM",
                   help="open hours, local time; overnight like 22:00-06:00 (belongs to "
                   "the day it opens); repeat for several ranges")
    p.add_argument("--days", action="append", default=None, metavar="DAYS",
                   help="weekdays: mon-fri, sat,sun, daily (default); one, or one per "
                   "--hours")
    p.add_argument("--tz", default=None, metavar="TZ",
                   help="IANA time zone (default UTC; daylight saving included)")
    p.add_argument("--holiday", action="append", default=None, metavar="YYYY-MM-DD",
                   help="a local date the window does not open; repeat")
    p.set_defaults(handler=guarded("limit window", cmd_window))

    p = acts.add_parser("window-rm", prog="batchq limit window-rm",
                        help="remove the send window of the queue or of a group",
                        usage="batchq limit window-rm [MODULE:APP] QUEUE [--group G] "
                        "[--json] [--redis-url URL] [--namespace NS]")
    common(p, "the group whose window goes (default: the queue's own; '*': the default)")
    p.set_defaults(handler=guarded("limit window-rm", cmd_window_rm))

