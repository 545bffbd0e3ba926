"""``batchq info``: queue counts and live workers, once or refreshed.

Data is read defensively: a queue whose entries cannot be read (a malformed job at the
head of a ready list, a name that is not UTF-8) is flagged in its row with the problem,
and every other queue and worker is still shown. Worker ages (up, last heartbeat) come
from the timestamps in the worker registry, so a worker that died recently shows how
stale its entry is.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

import redis

from .. import exitcodes
from ..app import App
from ..keys import queues_key, worker_info_key, workers_key
from ..queue import Queue
from .common import (
    Target,
    add_common,
    dumps,
    duration,
    err,
    guarded,
    out,
    table,
    target,
    text,
    unreachable,
)
from .flags import seconds

WORKER_TTL_S = 30.0
"""A registry entry whose heartbeat is older than this is a dead worker."""
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_INT_FIELDS = frozenset({"pid", "concurrency", "succeeded", "failed", "in_flight"})
_FLOAT_FIELDS = frozenset({"started_at", "heartbeat_at"})
_BOOL_FIELDS = frozenset({"paused"})


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _parse_worker(fields: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        key, val = text(k), text(v)
        parsed: Any = val
        try:
            if key in _INT_FIELDS:
                parsed = int(val)
            elif key in _FLOAT_FIELDS:
                parsed = float(val)
            elif key in _BOOL_FIELDS:
                parsed = val not in ("", "0", "false")
        except ValueError:
            parsed = val
        out[key] = parsed
    return out


def live_workers(app: App) -> list[dict[str, Any]]:
    """Registry entries whose heartbeat is at most ``WORKER_TTL_S`` old (server clock);
    stale ids are pruned from the registry zset. ``heartbeat_age_s`` is measured on the
    server's clock, so a worker on a machine with a skewed clock shows its true age."""
    r = app.redis
    key = workers_key(app.namespace)
    now_ms = _server_ms(r)
    cutoff = now_ms - int(WORKER_TTL_S * 1000)
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", f"({cutoff}")
    pipe.zrangebyscore(key, cutoff, "+inf", withscores=True)
    _, entries = pipe.execute()
    if not entries:
        return []
    pipe = r.pipeline(transaction=False)
    for member, _ in entries:
        # the member as stored (bytes): an escaped form would name another key
        wid = member.decode("utf-8", "surrogateescape") if isinstance(member, bytes) \
            else str(member)
        pipe.hgetall(worker_info_key(app.namespace, wid).encode("utf-8", "surrogateescape"))
    workers: list[dict[str, Any]] = []
    for (member, score), fields in zip(entries, pipe.execute(), strict=True):
        wid = text(member)
        w: dict[str, Any] = _parse_worker(fields) if fields else {"id": wid}
        w["id"] = text(w.get("id", wid))
        w.setdefault("heartbeat_at", float(score) / 1000)
        w["heartbeat_age_s"] = round(max(0.0, now_ms - float(score)) / 1000, 3)
        workers.append(w)
    workers.sort(key=lambda w: str(w["id"]))
    return workers


def _queue_row(q: Queue) -> dict[str, Any]:
    """One queue's counts; a queue whose data cannot be read is flagged, not fatal."""
    try:
        st = q.stats()
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except Exception as exc:  # malformed data written by hand: report, do not crash
        return {"error": f"cannot read the queue's counts: {type(exc).__name__}: {exc} "
                "(malformed entry?)"}
    row: dict[str, Any] = {
        "ready": st.ready,
        "delayed": st.delayed,
        "reserved": st.reserved,
        "dead": st.dead,
        "paused": st.paused,
        "oldest_age_s": round(st.oldest_age_s, 3),
    }
    # filled by Queue.stats when a ready list starts with an entry it cannot decode
    malformed = getattr(st, "malformed_heads", None)
    if malformed:
        row["malformed_heads"] = malformed
    return row


def snapshot(t: Target) -> dict[str, Any]:
    """What ``batchq info --json`` prints: queue counts and live workers."""
    r = t.app.redis
    names = {text(m) for m in r.smembers(queues_key(t.namespace))} | set(t.app_queues)
    queues: dict[str, Any] = {}
    for name in sorted(names):
        try:
            q = t.app.queue(name)
        except ValueError:
            queues[name] = {"error": "not a valid queue name (written by hand?)"}
            continue
        queues[name] = _queue_row(q)
    return {"queues": queues, "workers": live_workers(t.app)}


def _problems(snap: dict[str, Any]) -> list[str]:
    notes = []
    for name, q in snap["queues"].items():
        if "error" in q:
            notes.append(f"queue {name}: {q['error']}")
        elif q.get("malformed_heads"):
            notes.append(f"queue {name}: malformed entry at the head of a ready list "
                         f"({text(q['malformed_heads'])}); the worker dead-letters it as "
                         "decode_error when it pops it")
    return notes


def render_info(t: Target, snap: dict[str, Any]) -> str:
    lines = [f"batchq {t.where()}  ({datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z})", ""]
    qs: dict[str, dict[str, Any]] = snap["queues"]
    if qs:
        rows = []
        for name, q in qs.items():
            if "error" in q:
                rows.append([name + " (!)", "?", "?", "?", "?", "?", "?"])
                continue
            rows.append([name + (" (!)" if q.get("malformed_heads") else ""), str(q["ready"]),
                         str(q["delayed"]), str(q["reserved"]), str(q["dead"]),
                         "yes" if q["paused"] else "no",
                         duration(q["oldest_age_s"]) if q["ready"] else "-"])
        lines.append(table(["QUEUE", "READY", "DELAYED", "RESERVED", "DEAD", "PAUSED",
                            "OLDEST"], rows, right={1, 2, 3, 4, 6}))
        lines += [f"(!) {p}" for p in _problems(snap)]
    else:
        lines.append("no queues")
    lines.append("")
    ws: list[dict[str, Any]] = snap["workers"]
    lines.append(f"workers: {len(ws)} live")
    if ws:
        rows = []
        for w in ws:
            started, beat, age = w.get("started_at"), w.get("heartbeat_at"), \
                w.get("heartbeat_age_s")
            up = "-"
            if isinstance(started, float) and isinstance(beat, float):
                up = duration(max(0.0, beat - started + (age or 0.0)))
            rows.append([
                text(w.get("id", "")), text(w.get("host", "")), text(w.get("pid", "")),
                text(w.get("queues", "")), text(w.get("concurrency", "")),
                text(w.get("in_flight", "")), text(w.get("succeeded", "")),
                text(w.get("failed", "")), up,
                duration(age) + " ago" if isinstance(age, float) else "-",
                "yes" if w.get("paused") else "no",
            ])
        lines.append(table(["ID", "HOST", "PID", "QUEUES", "CONC", "IN-FLIGHT", "OK",
                            "FAILED", "UP", "HEARTBEAT", "PAUSED"], rows,
                           right={2, 4, 5, 6, 7, 8, 9}))
        lines.append(f"(worker counts are as of each one's last heartbeat; a worker that "
                     f"stopped is listed until its heartbeat is {WORKER_TTL_S:g}s old)")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    t = target(args)
    if args.interval is None:
        snap = snapshot(t)
        out(dumps(snap) if args.json else render_info(t, snap))
        for p in _problems(snap) if args.json else []:
            err(f"batchq info: {p}")
        return exitcodes.EXIT_OK
    try:
        while True:
            try:
                snap = snapshot(t)
                shown = dumps(snap) if args.json else render_info(t, snap)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                shown = f"{unreachable(t.url, exc)} (retrying every {args.interval:g}s)"
                if args.json:
                    err(shown)
                    shown = ""
            if args.json:
                if shown:
                    out(shown)
            else:
                out(CLEAR_SCREEN + shown + "\n\n(Ctrl-C to stop)", end="")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if not args.json:
            out()
        return exitcodes.EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "info", help="queue counts and live workers",
        description="Per queue: ready, delayed, reserved and dead jobs, whether it is "
        "paused and the age of its oldest ready job; then the live workers with the age "
        "of their last heartbeat. A queue whose data cannot be read is flagged (!).")
    add_common(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {queues: {...}, workers: [...]}")
    p.add_argument("-i", "--interval", type=seconds(zero_ok=False), default=None,
                   metavar="SECONDS",
                   help="refresh every SECONDS until Ctrl-C (with --json: one object per "
                   "line each time)")
    p.set_defaults(handler=guarded("info", cmd_info))
