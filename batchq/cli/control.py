"""``batchq pause`` / ``resume`` (workers stop or start taking a queue's jobs) and
``batchq check`` (is Redis reachable and safe to use?)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import exitcodes
from ..connection import RedisSettings
from ..keys import queues_key
from .common import Handler, add_common, app_and, dumps, err, guarded, out, target, text

USAGE = "batchq {name} [MODULE:APP] QUEUE [--json] [--redis-url URL] [--namespace NS]"


def _pause_cmd(paused: bool) -> Handler:
    def cmd(args: argparse.Namespace) -> int:
        args.app, loaded, queue = app_and(args.where, "QUEUE")
        t = target(args, loaded)
        q = t.queue(queue)
        known = {text(m) for m in t.app.redis.smembers(queues_key(t.namespace))}
        if q.name not in known and q.name not in t.app_queues:
            err(f"batchq: note: queue {q.name!r} has not been used yet in {t.where()}")
        q.pause() if paused else q.resume()
        st = q.stats()
        if args.json:
            out(dumps({"queue": q.name, "paused": st.paused, "ready": st.ready}))
        else:
            state = ("paused: workers take no new jobs from it" if st.paused
                     else "running: workers take jobs from it")
            out(f"queue {q.name} ({t.where()}) is {state} ({st.ready} ready)")
        return exitcodes.EXIT_OK

    return cmd


def cmd_check(args: argparse.Namespace) -> int:
    from ..health import check

    t = target(args)
    h = check(RedisSettings(t.url))
    if h.ok:
        out(f"ok: {h.reason}")
        return exitcodes.EXIT_OK
    err(f"batchq check: {h.reason}")
    return exitcodes.EXIT_ERROR


def add_commands(sub: Any) -> None:
    for name, paused in (("pause", True), ("resume", False)):
        p = sub.add_parser(
            name, usage=USAGE.format(name=name),
            help=f"{name} a queue" + (" (workers stop taking its jobs)" if paused else ""),
            description="The app comes first, as in every command (the older order "
            "QUEUE MODULE:APP still works).")
        p.add_argument("where", nargs="+", metavar="[MODULE:APP] QUEUE",
                       help="the app (optional) and the queue")
        add_common(p, app=False)
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(handler=guarded(name, _pause_cmd(paused)))

    p = sub.add_parser(
        "check", help="is Redis reachable and safe (maxmemory-policy noeviction)?",
        description="Exit 0 if Redis is reachable and its eviction policy is noeviction, "
        "else 1 with the reason.")
    add_common(p, namespace=False)
    p.set_defaults(handler=guarded("check", cmd_check))
