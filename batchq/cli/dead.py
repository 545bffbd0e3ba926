"""``batchq dead``: list, show, retry or purge the dead-lettered jobs of one queue.

Ids, task names and error texts are data written by workers (or by hand): they are
shown escaped, so a control character cannot drive the terminal and a name that is not
UTF-8 prints as ``\\xNN`` instead of stopping the listing.
"""

from __future__ import annotations

import argparse
from typing import Any

from .. import exitcodes
from ..queue import DeadJob, Queue
from .common import add_common, app_and, dumps, err, guarded, iso, out, table, target, text, usage
from .flags import int_at_least

DEAD_LIST_LIMIT = 100
USAGE = ("batchq dead {list,show,retry,purge} [MODULE:APP] QUEUE [--id ID ... | --all | "
         "--limit N] [--json] [--redis-url URL] [--namespace NS]")


def _summary(j: DeadJob) -> dict[str, Any]:
    return {
        "id": j.id,
        "task": j.task,
        "reason": j.reason,
        "error_type": j.error_type,
        "error_message": j.error_message,
        "attempts": j.attempts,
        "died_at": iso(j.died_at),
    }


def _full(j: DeadJob) -> dict[str, Any]:
    return {**_summary(j), "queue": j.queue, "args": j.args, "kwargs": j.kwargs,
            "traceback": j.traceback}


def _error_text(j: DeadJob, width: int | None = 60) -> str:
    msg = j.error_message.strip().splitlines()[0] if j.error_message.strip() else ""
    line = text(f"{j.error_type}: {msg}" if j.error_type else msg)
    if width is not None and len(line) > width:
        line = line[: width - 1] + "…"
    return line or "-"


def cmd_dead(args: argparse.Namespace) -> int:
    action: str = args.action
    if args.ids and args.all:
        raise usage("give --id or --all, not both")
    if args.limit is not None and action in ("retry", "purge"):
        raise usage(f"--limit applies to list and show, not {action}")
    if action in ("retry", "purge") and not args.ids and not args.all:
        raise usage(f"{action} needs --id ID (repeatable) or --all")
    if action == "show" and not args.ids and not args.all and args.limit is None:
        raise usage("show needs --id ID (repeatable), --all or --limit N")
    args.app, loaded, queue = app_and(args.where, "QUEUE")
    t = target(args, loaded)
    q = t.queue(queue)
    ids: list[str] | None = list(dict.fromkeys(args.ids)) if args.ids else None
    if action == "retry":
        n = q.retry_dead(ids)
        _report_count(args, "retried", n, ids, q, "back to ready")
        return exitcodes.EXIT_OK
    if action == "purge":
        n = q.purge_dead(ids)
        _report_count(args, "purged", n, ids, q, "deleted")
        return exitcodes.EXIT_OK
    total = q.dead_count()
    limit: int | None = args.limit
    if limit is None and ids is None and not args.all and action == "list":
        limit = DEAD_LIST_LIMIT
    jobs = q.dead_jobs(ids, limit=limit)
    missing = [i for i in ids if i not in {j.id for j in jobs}] if ids else []
    for i in missing:
        err(f"batchq dead {action}: no dead job {text(i)!r} in queue {q.name}")
    if action == "list":
        _list(args, q, jobs, total)
    else:
        _show(args, q, jobs)
    return exitcodes.EXIT_ERROR if missing else exitcodes.EXIT_OK


def _report_count(args: argparse.Namespace, verb: str, n: int, ids: list[str] | None,
                  q: Queue, what: str) -> None:
    if args.json:
        out(dumps({"queue": q.name, verb: n}))
        return
    extra = ""
    if ids is not None and n < len(ids):
        extra = f" ({len(ids) - n} of the {len(ids)} ids not found"
        extra += " or not retryable)" if verb == "retried" else ")"
    out(f"{verb} {n} dead job{'s' if n != 1 else ''} of queue {q.name} ({what}){extra}")


def _list(args: argparse.Namespace, q: Queue, jobs: list[DeadJob], total: int) -> None:
    if args.json:
        out(dumps({"queue": q.name, "total": total, "jobs": [_summary(j) for j in jobs]}))
        return
    if not jobs:
        out(f"no dead jobs in queue {q.name}" if total == 0 else "no matching dead jobs")
        return
    rows = [[text(j.id), text(j.task or "?"), text(j.reason), _error_text(j),
             str(j.attempts), iso(j.died_at)] for j in jobs]
    out(table(["ID", "TASK", "REASON", "ERROR", "ATTEMPTS", "DIED AT"], rows, right={4}))
    if not args.ids and len(jobs) < total:
        out(f"({len(jobs)} of {total} dead jobs shown, oldest first; --limit N or --all "
            "for more)")
    else:
        out(f"({len(jobs)} dead job{'s' if len(jobs) != 1 else ''})")


def _show(args: argparse.Namespace, q: Queue, jobs: list[DeadJob]) -> None:
    if args.json:
        out(dumps({"queue": q.name, "jobs": [_full(j) for j in jobs]}))
        return
    for n, j in enumerate(jobs):
        if n:
            out("")
        out(f"id:         {text(j.id)}")
        out(f"queue:      {text(j.queue)}")
        out(f"task:       {text(j.task or '?')}")
        out(f"attempts:   {j.attempts}")
        out(f"reason:     {text(j.reason)}")
        out(f"died at:    {iso(j.died_at)}")
        out(f"error:      {_error_text(j, None)}")
        for line in j.error_message.strip().splitlines()[1:]:
            out(f"            {text(line)}")
        out(f"args:       {dumps(j.args)}")
        out(f"kwargs:     {dumps(j.kwargs)}")
        if j.traceback.strip():
            out("traceback:")
            for line in j.traceback.rstrip().splitlines():
                out(f"  {text(line)}")
        else:
            out("traceback:  -")


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "dead", help="list, show, retry or purge dead-lettered jobs", usage=USAGE,
        description="Dead-lettered jobs of one queue. retry and purge need --id or --all; "
        "show needs --id, --all or --limit. The app comes first, as in every command "
        "(the older order QUEUE MODULE:APP still works).")
    p.add_argument("action", choices=("list", "show", "retry", "purge"))
    p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE",
                   help="the app (optional) and the queue")
    add_common(p, app=False)
    p.add_argument("--id", dest="ids", action="append", default=[], metavar="ID",
                   help="a dead job id (repeatable)")
    p.add_argument("--all", action="store_true", help="every dead job of the queue")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int_at_least(1), default=None, metavar="N",
                   help=f"list/show at most N jobs, oldest first (list default "
                   f"{DEAD_LIST_LIMIT})")
    p.set_defaults(handler=guarded("dead", cmd_dead))
