"""``batchq limit set|list|rm``: the flow-control limits of a queue from the shell
(``Queue.limit``, ``Queue.limits``, ``Queue.remove_limit``; see ``batchq/flow/limits.py``).

Limits live in Redis: a change applies on every worker's next fetch, no redeploy.
``set`` replaces the limit of the queue (no ``--group``), of one group, or of every
group without a limit of its own (``--group '*'``) and prints what is stored now;
``list`` prints every limit of the queue and the groups that wait now (held by
``RateLimited`` or an operator, throttled by a rate, or blocked at a concurrency limit);
``rm`` drops one (``batchq release`` lifts a hold). ``set`` and ``rm`` leave an entry in
the audit log. A bad value exits 2 with one line naming the flag, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from ..flow import view as flow_view
from ..flow.limits import (
    DEFAULT_GROUP,
    MAX_COUNT,
    MAX_RATE,
    MAX_WEIGHT,
    QUEUE_FIELD,
    Limit,
    check_group,
)
from ..ops.queue import Queue
from ..store.keys import queues_key
from ..worker import exitcodes
from . import limit_window
from .audit import audited
from .common import (
    Target,
    add_common,
    app_and,
    dumps,
    duration,
    err,
    guarded,
    out,
    table,
    target,
    usage,
)
from .common import text as show
from .flags import count_between, positive_number, rate
from .info import limit_group, wait_text

USAGE = ("batchq limit {action} [MODULE:APP] QUEUE [--group G] {flags}[--json] "
         "[--redis-url URL] [--namespace NS]")
SET_FLAGS = ("[--rate R|R/s|R/m] [--burst N] [--concurrency N] [--max-pending N] "
             "[--weight W] [--max-per-minute|hour|day|month N] [--tz TZ] ")
CAL_FLAGS = ("max_per_minute", "max_per_hour", "max_per_day", "max_per_month")
WAITING_DEFAULT = 20


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    """A bad flag: one line naming it, exit 2 (argparse would print the usage too)."""

    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{p.prog}: {message}\n")
        sys.exit(exitcodes.EXIT_USAGE)

    p.error = error  # type: ignore[method-assign]


def _group(raw: str | None) -> str | None:
    if raw is None or raw == DEFAULT_GROUP:
        return raw
    try:
        return check_group(raw)
    except ValueError as exc:
        raise usage(f"--group: {exc}") from None


def _queue(args: argparse.Namespace) -> tuple[Target, Queue]:
    args.app, loaded, name = app_and(args.where, "QUEUE")
    t = target(args, loaded)
    q = t.queue(name)
    known = {show(m) for m in t.app.redis.smembers(queues_key(t.namespace))}
    if q.name not in known and q.name not in t.app_queues:
        err(f"batchq: note: queue {q.name!r} has not been used yet in {t.where()}")
    return t, q


def _where(q: Queue, group: str | None) -> str:
    if group is None:
        return f"queue {q.name}"
    if group == DEFAULT_GROUP:
        return f"queue {q.name}, every group without a limit of its own ('*')"
    return f"queue {q.name}, group {show(group)}"


def _subject(q: Queue, group: str | None) -> str:
    """The audit target of a limit."""
    return f"queue {q.name}" if group is None else f"queue {q.name} group {show(group)}"


def limit_dict(lim: Limit) -> dict[str, Any]:
    row = {"group": lim.group, "rate_per_s": lim.rate_per_s, "burst": lim.burst,
           "concurrency": lim.concurrency, "max_pending": lim.max_pending,
           "weight": lim.weight}
    for kind, n in lim.calendar.items():
        row[f"max_per_{kind}"] = n
    if lim.calendar:
        row["tz"] = lim.tz or "UTC"
    return row


def cmd_set(args: argparse.Namespace) -> int:
    group = _group(args.group)
    cal = {f: getattr(args, f) for f in CAL_FLAGS}
    values = (args.rate, args.concurrency, args.max_pending, args.weight, *cal.values())
    if args.burst is not None and args.rate is None:
        raise usage("--burst needs --rate (it is the size of the rate's token bucket)")
    if all(v is None for v in values):
        raise usage("give at least one of --rate, --concurrency, --max-pending, --weight, "
                    "--max-per-minute, --max-per-hour, --max-per-day, --max-per-month")
    if group is None and args.max_pending is not None:
        raise usage("--max-pending needs --group (a quota is per group; --group '*' "
                    "for every group)")
    if group is None and args.weight is not None:
        raise usage("--weight needs --group (a group's share of the turns)")
    try:
        lim = Limit(group, args.rate, args.burst, args.concurrency, args.max_pending,
                    args.weight, tz=args.tz, **cal)
    except (TypeError, ValueError) as exc:
        raise usage(str(exc)) from None
    t, q = _queue(args)
    before = {x.group: x for x in flow_view.all_limits(t.app.redis, q.keys)[0]}.get(group)
    try:
        with audited(t, "limit_set", _subject(q, group), lim.describe()):
            stored = q.limit(group, rate_per_s=lim.rate_per_s, burst=lim.burst,
                             concurrency=lim.concurrency, max_pending=lim.max_pending,
                             weight=lim.weight, tz=lim.tz, **cal)
    except ValueError as exc:  # a queue-wide limit on a sharded queue
        raise usage(str(exc)) from None
    if args.json:
        out(dumps({"queue": q.name, "limit": limit_dict(stored),
                   "replaced": limit_dict(before) if before else None}))
    else:
        was = f" (was: {before.describe()})" if before else ""
        out(f"limit of {_where(q, group)}: {stored.describe()}{was}")
    return exitcodes.EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    group = _group(args.group)
    t, q = _queue(args)
    with audited(t, "limit_rm", _subject(q, group)) as note:
        removed = q.remove_limit(group)
        note.detail = "removed" if removed else "no limit"
    if args.json:
        out(dumps({"queue": q.name, "group": group, "removed": removed}))
    elif removed:
        out(f"removed the limit of {_where(q, group)}")
    else:
        out(f"no limit on {_where(q, group)}: nothing removed")
        if group is None and q.holds().queue_s:
            out(f"note: the queue is held, which is not a limit: batchq release "
                f"{show(q.name)} lifts the hold")
    return exitcodes.EXIT_OK


def _num(v: float | int | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:g}{unit}"


def cmd_list(args: argparse.Namespace) -> int:
    t, q = _queue(args)
    lims, bad = flow_view.all_limits(t.app.redis, q.keys)
    for name in bad:
        shown = "(queue)" if name == QUEUE_FIELD else repr(show(name))
        err(f"batchq limit list: the limit of {shown} is not a valid limit "
            "(written by hand?); skipped: batchq limit set or rm replaces it")
    st = q.stats()
    flow = flow_view.read_shards(t.app.redis, {q.name: [x.keys for x in q.shards()]},
                                 groups=args.groups)[q.name]
    use = {u.limit.group: u for u in flow.limits}

    def row(lim: Limit) -> dict[str, Any]:
        u = use.get(lim.group)
        return u.as_dict() if u is not None and u.limit == lim else limit_dict(lim)

    waiting = [{"group": g.group, "state": g.state, "until_s": round(g.until_s, 3),
                "why": g.why or None, "pending": g.pending, "running": g.running}
               for g in flow.waiting]
    wins = {"windows": [limit_window.window_dict(w) for w in q.windows()]}
    if args.json:
        out(dumps({"queue": q.name, "limits": [row(x) for x in lims],
                   **(wins if wins["windows"] else {}),
                   "grouped": st.grouped, "groups_ready": st.groups_active,
                   "groups_waiting": st.groups_waiting, "held_s": round(st.held_s, 3),
                   "held_why": flow.held_why or None, "waiting_groups": waiting}))
        return exitcodes.EXIT_OK
    if lims:
        rows = [[show(q.name), limit_group(x.group), _num(x.rate_per_s, "/s"),
                 _num(x.burst), _num(x.concurrency), _num(x.max_pending), _num(x.weight)]
                for x in lims]
        out(table(["QUEUE", "GROUP", "RATE", "BURST", "CONCURRENCY", "MAX_PENDING",
                   "WEIGHT"], rows, right={2, 3, 4, 5, 6}))
        limit_window.print_quotas(lims, use)
    else:
        out(f"no limits on queue {q.name}")
    limit_window.print_windows(q)
    why = f" ({flow.held_why})" if flow.held_why else ""
    held = f"; the queue is held for {duration(st.held_s)}{why}" if st.held_s else ""
    out(f"groups: {st.groups_active} ready, {st.groups_waiting} waiting "
        f"({st.grouped} grouped jobs ready){held}")
    if flow.waiting:
        rows = [[show(g.group), wait_text(g.state, g.until_s, g.why), str(g.pending),
                 str(g.running)] for g in flow.waiting]
        out("held, throttled or blocked now (blocked and longest held first):")
        out(table(["GROUP", "STATE", "PENDING", "RUNNING"], rows, right={2, 3}))
        if st.groups_waiting > len(flow.waiting):
            out(f"({len(flow.waiting)} of {st.groups_waiting} waiting groups shown; "
                "--groups N for more)")
    return exitcodes.EXIT_OK


def _common(p: argparse.ArgumentParser, group_help: str | None) -> None:
    p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE",
                   help="the app (optional) and the queue")
    add_common(p, app=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    if group_help:
        p.add_argument("--group", default=None, metavar="G", help=group_help)
    _one_line_errors(p)


def add_commands(sub: Any) -> None:
    top = sub.add_parser(
        "limit", help="set, list or remove the flow-control limits of a queue",
        usage="batchq limit {set,list,rm,window,window-rm} [MODULE:APP] QUEUE [options]",
        description="Rate, concurrency and quota limits of a queue or of its groups, "
        "kept in Redis: every worker applies a change on its next fetch. The app comes "
        "first, as in every command.")
    _one_line_errors(top)
    acts = top.add_subparsers(dest="action", required=True,
                              metavar="{set,list,rm,window,window-rm}")

    p = acts.add_parser(
        "set", prog="batchq limit set", help="set (replace) the limit of the queue or of a group",
        usage=USAGE.format(action="set", flags=SET_FLAGS),
        description="Replace the limit of the queue (no --group), of group G, or of "
        "every group without a limit of its own (--group '*'); flags not given are not "
        "part of the new limit. Prints the limit stored.")
    _common(p, "the group (default: the whole queue; '*': every group without a limit "
            "of its own)")
    p.add_argument("--rate", type=rate(MAX_RATE), default=None, metavar="R",
                   help="job starts per second across every worker: 100, 100/s, 600/m "
                   "or 3600/h")
    p.add_argument("--burst", type=count_between(1, MAX_COUNT), default=None, metavar="N",
                   help="starts allowed at once after a quiet spell (needs --rate; "
                   "default a tenth of a second's worth, at least 1)")
    p.add_argument("--concurrency", type=count_between(1, MAX_COUNT), default=None,
                   metavar="N", help="jobs running at once across every worker")
    p.add_argument("--max-pending", type=count_between(1, MAX_COUNT), default=None,
                   metavar="N", help="quota of a group (needs --group): jobs not "
                   "finished; an enqueue past it raises QuotaExceeded")
    p.add_argument("--weight", type=positive_number(MAX_WEIGHT), default=None,
                   metavar="W", help="a group's share of the turns (default 1)")
    for kind in ("minute", "hour", "day", "month"):
        p.add_argument(f"--max-per-{kind}", type=count_between(1, MAX_COUNT), default=None,
                       metavar="N", help=f"job starts per calendar {kind} in --tz; past "
                       "it the jobs wait, ready, for the next one")
    p.add_argument("--tz", default=None, metavar="TZ", help="the time zone of the calendar "
                   "quotas (IANA name, default UTC; daylight saving included)")
    p.set_defaults(handler=guarded("limit set", cmd_set))

    p = acts.add_parser("list", prog="batchq limit list",
                        help="the limits of a queue and the groups that wait now",
                        usage="batchq limit list [MODULE:APP] QUEUE [--groups N] [--json] "
                        "[--redis-url URL] [--namespace NS]")
    _common(p, None)
    p.add_argument("--groups", type=count_between(1, 1000), default=WAITING_DEFAULT,
                   metavar="N", help=f"show at most N waiting groups (default "
                   f"{WAITING_DEFAULT})")
    p.set_defaults(handler=guarded("limit list", cmd_list))

    p = acts.add_parser("rm", prog="batchq limit rm",
                        help="remove the limit of the queue or of a group",
                        usage=USAGE.format(action="rm", flags=""))
    _common(p, "the group whose limit goes (default: the queue's own; '*': the default "
            "limit of every group)")
    p.set_defaults(handler=guarded("limit rm", cmd_rm))
    limit_window.add_actions(acts, _common, _queue, _group)
