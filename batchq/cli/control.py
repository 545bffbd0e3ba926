"""``batchq pause`` / ``resume`` (workers stop or start taking a queue's jobs; both say
what still holds the queue: a pause, a hold of the whole queue and why, held groups) and
``batchq check`` (is Redis reachable and safe to use?)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..ops.queue import Queue
from ..store.connection import RedisSettings
from ..store.keys import queues_key
from ..worker import exitcodes
from .audit import audited
from .common import (
    Handler,
    add_common,
    app_and,
    dumps,
    duration,
    err,
    guarded,
    iso,
    out,
    target,
    text,
)

USAGE = "batchq {name} [MODULE:APP] QUEUE [--json] [--redis-url URL] [--namespace NS]"


WHY = {"operator": "by an operator (batchq hold)",
       "RateLimited": "by a handler that raised RateLimited"}


def state_lines(q: Queue, paused: bool, ready: int, where: str) -> list[str]:
    """What holds the queue, truthfully: a pause, a hold of the whole queue (until when,
    and why when known), and how many groups are held."""
    h = q.holds()
    name = text(q.name)
    if paused:
        lines = [f"queue {name} ({where}) is paused: workers take no new jobs from it "
                 f"({ready} ready)"]
    elif h.queue_s:
        lines = [f"queue {name} ({where}) is not paused, but it is held: workers start "
                 f"none of its jobs ({ready} ready)"]
    else:
        lines = [f"queue {name} ({where}) is running: workers take jobs from it "
                 f"({ready} ready)"]
    if h.queue_s:
        until = iso(time.time() + h.queue_s)
        why = WHY.get(h.queue_why, f"({text(h.queue_why)})" if h.queue_why else "")
        lines.append(f"the whole queue is held for {duration(h.queue_s)} more (until "
                     f"{until}){' ' + why if why else ''}: batchq release {name} lifts it")
    if h.groups:
        lines.append(f"{h.groups} group{'s are' if h.groups != 1 else ' is'} held: batchq "
                     f"limit list {name} shows them, batchq release {name} --group G "
                     "lifts one")
    return lines


def _pause_cmd(paused: bool) -> Handler:
    def cmd(args: argparse.Namespace) -> int:
        args.app, loaded, queue = app_and(args.where, "QUEUE")
        t = target(args, loaded)
        q = t.queue(queue)
        known = {text(m) for m in t.app.redis.smembers(queues_key(t.namespace))}
        if q.name not in known and q.name not in t.app_queues:
            err(f"batchq: note: queue {q.name!r} has not been used yet in {t.where()}")
        with audited(t, "pause" if paused else "resume", f"queue {q.name}"):
            q.pause() if paused else q.resume()
        st = q.stats()
        if args.json:
            h = q.holds()
            out(dumps({"queue": q.name, "paused": st.paused, "ready": st.ready,
                       "held_s": round(h.queue_s, 3), "held_why": h.queue_why or None,
                       "groups_held": h.groups}))
        else:
            for line in state_lines(q, st.paused, st.ready, t.where()):
                out(line)
        return exitcodes.EXIT_OK

    return cmd


def cmd_check(args: argparse.Namespace) -> int:
    from ..ops.health import check, probe_lines

    t = target(args)
    h = check(RedisSettings(t.url))
    if h.ok:
        out(f"ok: {h.reason}")
        for line in probe_lines(h):
            out(line)
        return exitcodes.EXIT_OK
    err(f"batchq check: {h.reason}")
    for line in probe_lines(h):
        err(line)
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
        "else 1 with the reason. Then each optional command batchq uses (CONFIG GET, "
        "SCRIPT LOAD, CLIENT SETINFO, ...) and what is disabled where the server refuses "
        "it (a managed Redis that renames or denies them).")
    add_common(p, namespace=False)
    p.set_defaults(handler=guarded("check", cmd_check))
