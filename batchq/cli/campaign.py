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

from .. import campaign as campaigns
from .. import exitcodes
from ..campaign import CampaignStats
from ..errors import CampaignNotFound
from ..tracked import check_campaign_id
from .common import (
    Fail,
    add_common,
    app_and,
    dumps,
    duration,
    guarded,
    iso,
    load,
    out,
    table,
    target,
    text,
    usage,
)
from .flags import int_at_least, seconds

LIST_LIMIT = 50
USAGE = ("batchq campaign {list,show,cancel} [MODULE:APP] [ID] [--watch] [--interval S] "
         "[--limit N] [--json] [--redis-url URL] [--namespace NS]")


def _as_json(s: CampaignStats) -> dict[str, Any]:
    d = s.as_dict()
    d["created_at"] = iso(s.created_at)
    d["finished_at"] = iso(s.finished_at) if s.finished_at is not None else None
    return d


def _where(args: argparse.Namespace) -> tuple[Any, str | None]:
    values: list[str] = args.where
    if args.action == "list":
        if len(values) > 1:
            raise usage(f"too many arguments {values!r}: expected [MODULE:APP]")
        if values and ":" not in values[0]:
            raise usage(f"{values[0]!r} is not MODULE:APP (list takes no campaign id)")
        args.app = values[0] if values else None
        return target(args, load(values[0]) if values else None), None
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
            n = campaigns.Campaign(c, cid).cancel()
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
               "CREATED"],
              [[text(s.id), s.state, str(s.total), str(s.pending), str(s.succeeded),
                str(s.dead), str(s.cancelled), iso(s.created_at)] for s in rows],
              right={2, 3, 4, 5, 6}))


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
               TextColumn("dead {task.fields[dead]} cancelled {task.fields[cancelled]}"),
               TimeElapsedColumn())
    with Progress(*columns, refresh_per_second=4) as bar:
        task = bar.add_task(text(cid), total=s.total or None, rate="-", dead=s.dead,
                            cancelled=s.cancelled)
        while True:
            finished = s.total - s.pending
            speed = bar.tasks[0].speed
            bar.update(task, total=s.total or None, completed=finished, dead=s.dead,
                       cancelled=s.cancelled, rate=f"{speed:,.0f}" if speed else "-",
                       description=f"{text(cid)} [{s.state}]")
            if s.done:
                break
            time.sleep(args.interval)
            s = campaigns.stats(c, cid)
    out(_show(s))


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "campaign", help="list campaigns, show one (--watch: live progress), cancel one",
        usage=USAGE, description="Campaigns: many jobs as one object. show --watch draws "
        "a live progress bar until the campaign completes.")
    p.add_argument("action", choices=("list", "show", "cancel"))
    p.add_argument("where", nargs="*", metavar="[MODULE:APP] ID",
                   help="the app (optional) and, for show and cancel, the campaign id")
    add_common(p, app=False)
    p.add_argument("--json", action="store_true", help="print JSON (with --watch: one "
                   "object per line)")
    p.add_argument("--watch", action="store_true", help="show: follow until completed")
    p.add_argument("--interval", type=seconds(zero_ok=False), default=1.0, metavar="S",
                   help="--watch: seconds between looks [default 1]")
    p.add_argument("--limit", type=int_at_least(1), default=LIST_LIMIT, metavar="N",
                   help=f"list at most N campaigns, newest first [default {LIST_LIMIT}]")
    p.set_defaults(handler=guarded("campaign", cmd_campaign))
