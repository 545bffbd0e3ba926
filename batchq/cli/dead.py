"""``batchq dead``: list, show, retry or purge the dead-lettered jobs of one queue.

Ids, task names and error texts are data written by workers (or by hand): they are
shown escaped, so a control character cannot drive the terminal and a name that is not
UTF-8 prints as ``\\xNN`` instead of stopping the listing.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..ops.queue import DeadJob, Queue
from ..worker import exitcodes
from .audit import audited
from .common import add_common, app_and, dumps, err, guarded, iso, out, table, target, text, usage
from .flags import int_at_least

DEAD_LIST_LIMIT = 100


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
    if action in ("retry", "purge"):
        which = "all" if ids is None else " ".join(ids) if len(ids) <= 5 else f"{len(ids)} ids"
        with audited(t, f"dead_{action}", f"queue {q.name} dead jobs: {which}") as note:
            n = q.retry_dead(ids) if action == "retry" else q.purge_dead(ids)
            note.detail = f"{n} jobs"
        _report_count(args, "retried" if action == "retry" else "purged", n, ids, q,
                      "back to ready" if action == "retry" else "deleted")
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


ACTIONS = {
    "list": ("list the dead jobs of a queue, oldest first",
             f"A table of the dead jobs of QUEUE (at most {DEAD_LIST_LIMIT} unless --limit or "
             "--all): id, task, reason, first line of the error, attempts, when."),
    "show": ("show dead jobs in full (arguments, error, traceback)",
             "Every field of the dead jobs named by --id (repeatable), or of the oldest N "
             "(--limit N), or of all (--all)."),
    "retry": ("put dead jobs back to ready with fresh attempts",
              "Move the dead jobs named by --id (repeatable), or every one (--all), back "
              "to the ready list of QUEUE."),
    "purge": ("delete dead jobs for good",
              "Delete the dead jobs named by --id (repeatable), or every one (--all)."),
}


def add_commands(sub: Any) -> None:
    top = sub.add_parser(
        "dead", help="list, show, retry or purge dead-lettered jobs",
        usage="batchq dead {list,show,retry,purge} [MODULE:APP] QUEUE [options]",
        description="Dead-lettered jobs of one queue. retry and purge need --id or --all; "
        "show needs --id, --all or --limit. The app comes first, as in every command "
        "(the older order QUEUE MODULE:APP still works). "
        "batchq dead ACTION --help for each action.")
    acts = top.add_subparsers(dest="action", required=True, metavar="{list,show,retry,purge}",
                              prog="batchq dead")
    for action, (summary, description) in ACTIONS.items():
        limited = action in ("list", "show")
        flags = "[--id ID ... | --all" + (" | --limit N] " if limited else "] ")
        p = acts.add_parser(
            action, help=summary, description=description,
            usage=f"batchq dead {action} [MODULE:APP] QUEUE {flags}[--json] "
            "[--redis-url URL] [--namespace NS]")
        p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE",
                       help="the app (optional) and the queue")
        add_common(p, app=False)
        p.add_argument("--id", dest="ids", action="append", default=[], metavar="ID",
                       help="a dead job id (repeatable)")
        p.add_argument("--all", action="store_true", help="every dead job of the queue")
        p.add_argument("--json", action="store_true", help="print JSON")
        # retry and purge take --limit only to say that it does not apply to them
        p.add_argument("--limit", type=int_at_least(1), default=None, metavar="N",
                       help=("at most N jobs, oldest first" + (
                           f" [default {DEAD_LIST_LIMIT}]" if action == "list" else ""))
                       if limited else argparse.SUPPRESS)
        p.set_defaults(handler=guarded("dead", cmd_dead))
