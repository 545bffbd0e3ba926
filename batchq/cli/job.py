"""``batchq job show [MODULE:APP] ID``: one job by its id (``App.job_info``): its state,
attempt, progress and message (``current_job().progress``), last error, group,
campaign and times. Text by default, ``--json`` for scripts. Exit 0 when the job is
known, 1 when nothing is known of it (never seen, or finished and forgotten).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

from ..worker import exitcodes
from .common import add_common, app_and, dumps, guarded, out, target, usage
from .common import text as show

USAGE = "batchq job show [MODULE:APP] ID [--json] [--redis-url URL] [--namespace NS]"

_TIMES = (("enqueued", "enqueued_ms"), ("ready", "ready_ms"), ("started", "started_ms"),
          ("progress at", "progress_at_ms"), ("finished", "finished_ms"))


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _number(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _lines(info: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, str]] = [("id", show(info["id"])), ("state", info["state"])]
    for name in ("queue", "task"):
        if info[name] is not None:
            rows.append((name, show(info[name])))
    if info["attempt"] is not None:
        top = info["max_attempts"]
        rows.append(("attempt", f"{info['attempt']}" + (f" of {top}" if top else "")))
    for name in ("priority", "group", "campaign", "key"):
        if info[name] is not None:
            rows.append((name, show(info[name])))
    if info["progress"] is not None:
        rows.append(("progress", _number(info["progress"])))
    if info["message"] is not None:
        rows.append(("message", show(info["message"])))
    err = info["error"]
    if err:
        rows.append(("error", show(f"{err['type']}: {err['message']} ({err['reason']})")))
    for label, key in _TIMES:
        when = _iso(info[key])
        if when is not None:
            rows.append((label, when))
    width = max(len(k) for k, _ in rows)
    return [f"{k.ljust(width)}  {v}" for k, v in rows]


def cmd_show(args: argparse.Namespace) -> int:
    if not args.where:
        raise usage("expected [MODULE:APP] ID")
    args.app, loaded, jid = app_and(args.where, "ID")
    t = target(args, loaded)
    try:
        info = t.app.job_info(jid).as_dict()
    except ValueError as exc:
        raise usage(str(exc)) from None
    if args.json:
        out(dumps(info))
    else:
        for line in _lines(info):
            out(line)
    return exitcodes.EXIT_OK if info["state"] != "unknown" or info["progress"] is not None \
        else exitcodes.EXIT_ERROR


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{p.prog}: {message}\n")
        sys.exit(exitcodes.EXIT_USAGE)

    p.error = error  # type: ignore[method-assign]


def add_commands(sub: Any) -> None:
    top = sub.add_parser(
        "job", help="show one job: state, attempt, progress and message, error, times",
        usage="batchq job show [MODULE:APP] ID [options]",
        description="One job by its id: where it is, its attempt, the progress and "
        "message its handler reported (current_job().progress), its last error, group, "
        "campaign and times. batchq job show --help for the options.")
    acts = top.add_subparsers(dest="action", required=True, metavar="{show}",
                              prog="batchq job")
    _one_line_errors(top)
    p = acts.add_parser("show", help="show one job by its id", usage=USAGE,
                        description="Show what Redis still knows of one job (App.job_info). "
                        "Exit 1 when nothing is known of it.")
    p.add_argument("where", nargs="*", metavar="[MODULE:APP] ID",
                   help="the app (optional) and the job id")
    add_common(p, app=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    _one_line_errors(p)
    p.set_defaults(handler=guarded("job", cmd_show))
