"""``batchq campaign``: list campaigns, show one (``--watch``: a live progress bar), or
cancel one. Every form takes ``--json``.

The progress bar is drawn with ``rich`` (done/total, rate, ETA, failures); with
``--json``, ``--watch`` prints one JSON object per look instead (one per line), so a
script can follow a campaign too. Campaign ids are data: shown escaped.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..produce import campaign as campaigns
from ..produce.campaign import CampaignStats
from ..produce.tracked import check_campaign_id
from ..tasks.errors import CampaignNotFound
from ..worker import exitcodes
from .audit import audited
from .common import (
    Fail,
    add_common,
    app_and,
    app_only,
    dumps,
    duration,
    guarded,
    iso,
    out,
    table,
    target,
    text,
    usage,
)
from .flags import int_at_least, seconds

LIST_LIMIT = 50
MAX_INTERVAL_S = 86400.0
"""``show --watch --interval``: at most a day between looks."""


def _as_json(s: CampaignStats) -> dict[str, Any]:
    d = s.as_dict()
    d["created_at"] = iso(s.created_at)
    d["finished_at"] = iso(s.finished_at) if s.finished_at is not None else None
    return d


def _where(args: argparse.Namespace) -> tuple[Any, str | None]:
    values: list[str] = args.where
    if args.action == "list":
        args.app = app_only(values, "list takes no campaign id")
        return target(args), None
    if not values:
        raise usage(f"{args.action} needs a campaign ID")
    args.app, loaded, cid = app_and(values, "ID")
    try:
        check_campaign_id(cid)
    except ValueError as exc:
        raise usage(str(exc)) from None
    return target(args, loaded), cid


def cmd_campaign(args: argparse.Namespace) -> int:
    if args.watch and args.action != "show":
        raise usage("--watch applies to show")
    t, maybe_id = _where(args)
    c = t.app.clients
    if maybe_id is None:
        _list(args, list(campaigns.list_stats(c, args.limit)))
        return exitcodes.EXIT_OK
    cid: str = maybe_id
    try:
        if args.action == "cancel":
            with audited(t, "campaign_cancel", f"campaign {cid}") as note:
                n = campaigns.Campaign(c, cid).cancel()
                note.detail = f"{n} jobs not started"
            out(dumps({"id": cid, "cancelled": n}) if args.json else
                f"campaign {text(cid)} cancelled: {n} jobs not started will not run")
        elif args.watch:
            _watch(args, c, cid)
        else:
            s = campaigns.stats(c, cid)
            out(dumps(_as_json(s)) if args.json else _show(s))
    except CampaignNotFound as exc:
        raise Fail(exitcodes.EXIT_ERROR, str(exc)) from None
    return exitcodes.EXIT_OK


def _list(args: argparse.Namespace, rows: list[CampaignStats]) -> None:
    if args.json:
        out(dumps({"campaigns": [_as_json(s) for s in rows]}))
        return
    if not rows:
        out("no campaigns")
        return
    out(table(["ID", "STATE", "TOTAL", "PENDING", "SUCCEEDED", "DEAD", "CANCELLED",
               "EXPIRED", "CREATED"],
              [[text(s.id), s.state, str(s.total), str(s.pending), str(s.succeeded),
                str(s.dead), str(s.cancelled), str(s.expired), iso(s.created_at)]
               for s in rows],
              right={2, 3, 4, 5, 6, 7}))


def _show(s: CampaignStats) -> str:
    finished = s.total - s.pending
    pct = f" ({100 * finished / s.total:.1f}%)" if s.total else ""
    lines = [
        f"id:         {text(s.id)}",
        f"state:      {s.state}",
        f"progress:   {finished}/{s.total}{pct}",
        f"pending:    {s.pending}",
        f"succeeded:  {s.succeeded}",
        f"dead:       {s.dead}",
        f"cancelled:  {s.cancelled}",
        f"expired:    {s.expired}",
        f"queues:     {', '.join(text(q) for q in s.queues) or '-'}",
        f"created at: {iso(s.created_at)}",
    ]
    if s.finished_at is not None:
        lines.append(f"finished:   {iso(s.finished_at)} (after "
                     f"{duration(s.finished_at - s.created_at)})")
    return "\n".join(lines)


def _watch(args: argparse.Namespace, c: Any, cid: str) -> None:
    if args.json:
        while True:
            s = campaigns.stats(c, cid)
            out(dumps(_as_json(s)))
            if s.done:
                return
            time.sleep(args.interval)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    s = campaigns.stats(c, cid)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}/s"), TimeRemainingColumn(),
               TextColumn("dead {task.fields[dead]} cancelled {task.fields[cancelled]} "
                          "expired {task.fields[expired]}"),
               TimeElapsedColumn())
    with Progress(*columns, refresh_per_second=4) as bar:
        task = bar.add_task(text(cid), total=s.total or None, rate="-", dead=s.dead,
                            cancelled=s.cancelled, expired=s.expired)
        while True:
            finished = s.total - s.pending
            speed = bar.tasks[0].speed
            bar.update(task, total=s.total or None, completed=finished, dead=s.dead,
                       cancelled=s.cancelled, expired=s.expired,
                       rate=f"{speed:,.0f}" if speed else "-",
                       description=f"{text(cid)} [{s.state}]")
            if s.done:
                break
            time.sleep(args.interval)
            s = campaigns.stats(c, cid)
    out(_show(s))


ACTIONS = {
    "list": ("list campaigns, newest first",
             "A table of the campaigns of the namespace, newest first: id, state and the "
             "counts of their jobs.", "[MODULE:APP] [--limit N]"),
    "show": ("show one campaign (--watch: follow it)",
             "The counts of one campaign; --watch draws a live progress bar until it "
             "completes (with --json: one object per look).",
             "[MODULE:APP] ID [--watch] [--interval S]"),
    "cancel": ("cancel a campaign's jobs that have not started",
               "Cancel every job of the campaign that has not started; jobs running now "
               "finish.", "[MODULE:APP] ID"),
}


def add_commands(sub: Any) -> None:
    top = sub.add_parser(
        "campaign", help="list campaigns, show one (--watch: live progress), cancel one",
        usage="batchq campaign {list,show,cancel} [MODULE:APP] [ID] [options]",
        description="Campaigns: many jobs as one object. show --watch draws a live "
        "progress bar until the campaign completes. batchq campaign ACTION --help for "
        "each action.")
    acts = top.add_subparsers(dest="action", required=True, metavar="{list,show,cancel}",
                              prog="batchq campaign")
    for action, (summary, description, shape) in ACTIONS.items():
        p = acts.add_parser(action, help=summary, description=description,
                            usage=f"batchq campaign {action} {shape} [--json] "
                            "[--redis-url URL] [--namespace NS]")
        p.add_argument("where", nargs="*", metavar="[MODULE:APP] ID" if action != "list"
                       else "MODULE:APP", help="the app (optional)" + (
                           " and the campaign id" if action != "list" else ""))
        add_common(p, app=False)
        p.add_argument("--json", action="store_true", help="print JSON" + (
            " (with --watch: one object per line)" if action == "show" else ""))
        # flags of another action are accepted, hidden, to say where they apply
        show, listing = action == "show", action == "list"
        p.add_argument("--watch", action="store_true",
                       help="follow until completed" if show else argparse.SUPPRESS)
        p.add_argument("--interval", type=seconds(zero_ok=False, high=MAX_INTERVAL_S),
                       default=1.0, metavar="S",
                       help="--watch: seconds between looks [default 1]" if show
                       else argparse.SUPPRESS)
        p.add_argument("--limit", type=int_at_least(1), default=LIST_LIMIT, metavar="N",
                       help=f"at most N campaigns [default {LIST_LIMIT}]" if listing
                       else argparse.SUPPRESS)
        p.set_defaults(handler=guarded("campaign", cmd_campaign))
