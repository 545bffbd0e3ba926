"""``batchq info``: queue counts, live workers and periodic tasks, once or refreshed.

What it shows is ``batchq.ops.overview.snapshot`` (``--json`` prints it as it is; the web
console's ``/api/info`` answers the same). Data is read defensively: a queue whose
entries cannot be read (a malformed job at the head of a ready list, a name that is not
a queue name) is flagged in its row with the problem, and every other queue and worker
is still shown. Worker ages (up, last heartbeat) come
from the timestamps in the worker registry, so a worker that died recently shows how
stale its entry is.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

import redis

from ..flow.view import WAITING_SHOWN
from ..ops.overview import snapshot
from ..worker import exitcodes
from ..worker.registry import STALE_AFTER_S
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

CLEAR_SCREEN = "\x1b[H\x1b[2J"
LIMITS_LISTED = 10
"""Limits of a queue the text of ``batchq info`` lists (``--json``: up to 50 group
limits; ``batchq limit list``: all)."""


def _problems(snap: dict[str, Any]) -> list[str]:
    notes = []
    for name, q in snap["queues"].items():
        if "error" in q:
            notes.append(f"queue {text(name)}: {q['error']}")
        elif q.get("malformed_heads"):
            notes.append(f"queue {text(name)}: malformed entry at the head of a ready list "
                         f"({text(q['malformed_heads'])}); the worker dead-letters it as "
                         "decode_error when it pops it")
    if snap.get("periodic_error"):
        notes.append(snap["periodic_error"])
    return notes


def render_info(t: Target, snap: dict[str, Any]) -> str:
    lines = [f"batchq {t.where()}  ({datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z})", ""]
    qs: dict[str, dict[str, Any]] = snap["queues"]
    if qs:
        rows = []
        for name, q in qs.items():
            if "error" in q:
                rows.append([text(name) + " (!)", "?", "?", "?", "?", "?", "?"])
                continue
            flag = " (!)" if q.get("malformed_heads") else ""
            if q.get("shards"):
                flag = f" [{q['shards']} shards]" + flag
            rows.append([text(name) + flag, str(q["ready"]), str(q["delayed"]),
                         str(q["reserved"]), str(q["dead"]), "yes" if q["paused"] else "no",
                         duration(q["oldest_age_s"]) if q["ready"] else "-"])
        lines.append(table(["QUEUE", "READY", "DELAYED", "RESERVED", "DEAD", "PAUSED",
                            "OLDEST"], rows, right={1, 2, 3, 4, 6}))
        lines += [f"(!) {p}" for p in _problems(snap)]
        lines += _flow_lines(qs)
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
                     f"stopped is listed until its heartbeat is {STALE_AFTER_S:g}s old)")
        for w in ws:
            r = w.get("restarts")
            if isinstance(r, dict) and any(r.values()):
                lines.append(f"worker {text(w.get('id', ''))}: its supervisor had replaced "
                             + ", ".join(f"{n} ({text(k)})" for k, n in r.items() if n)
                             + " worker processes before it")
    ps: list[dict[str, Any]] = snap.get("periodic", [])
    if ps:
        lines += ["", f"periodic tasks: {len(ps)}", _periodic_table(ps)]
    return "\n".join(lines)


def limit_group(group: str | None) -> str:
    """A limit's group as the CLI shows it: ``(queue)`` for the queue's own."""
    return "(queue)" if group is None else text(group)


def _limit_text(lim: dict[str, Any]) -> str:
    bits = [limit_group(lim["group"])]
    for key, label, unit in (("rate_per_s", "rate", "/s"), ("burst", "burst", ""),
                             ("concurrency", "concurrency", ""),
                             ("max_pending", "max_pending", ""), ("weight", "weight", "")):
        if lim.get(key) is not None:
            bits.append(f"{label} {lim[key]:g}{unit}")
    if lim.get("running") is not None and lim.get("concurrency") is not None:
        bits.append(f"(running {lim['running']})")
    if lim.get("state") in ("waiting", "blocked"):
        bits.append(f"[{lim['state']}]")
    return " ".join(bits)


def wait_text(state: str, until_s: float, why: str | None = None) -> str:
    """How a waiting group waits: ``blocked`` (at its concurrency limit), ``held 4m10s``
    (a hold or its next rate token; ``(RateLimited)`` or ``(operator)``: a hold and who
    set it) or ``throttled``."""
    if state == "blocked":
        return "blocked (concurrency)"
    if why:
        return f"held {duration(until_s)} ({text(why)})"
    return f"held {duration(until_s)}" if until_s >= 1 else "throttled"


def _flow_lines(qs: dict[str, dict[str, Any]]) -> list[str]:
    """Per queue that uses flow control: its limits, groups and the groups that wait."""
    lines: list[str] = []
    for name, q in qs.items():
        f = q.get("flow")
        if not f:
            continue
        if not lines:
            lines += ["", "flow control:"]
        why = f" ({text(f['held_why'])})" if f.get("held_why") else ""
        held = f", queue held {duration(f['held_s'])}{why}" if f["held_s"] else ""
        lines.append(f"  {text(name)}: {f['grouped']} grouped jobs ready, groups "
                     f"{f['groups_ready']} ready / {f['groups_waiting']} waiting{held}")
        lines += [f"    limit {_limit_text(x)}" for x in f["limits"][:LIMITS_LISTED]]
        more = f["limits_total"] - min(len(f["limits"]), LIMITS_LISTED)
        if more > 0:
            lines.append(f"    (+{more} more limits: batchq limit list {text(name)})")
        lines += [f"    waiting {text(g['group'])}: "
                  f"{wait_text(g['state'], g['until_s'], g.get('why'))} "
                  f"(pending {g['pending']}, running {g['running']})"
                  for g in f["waiting_groups"]]
    return lines


def _periodic_table(ps: list[dict[str, Any]]) -> str:
    now = time.time()
    rows = []
    for p in ps:
        last, nxt = p.get("last_run_s"), p.get("next_run_s")
        if nxt is None:
            when = "-"
        elif nxt >= now:
            when = "in " + duration(nxt - now)
        else:  # no scheduler has recorded a later tick: none runs, or it is stuck
            when = "overdue " + duration(now - nxt)
        rows.append([text(p["name"]), text(p["queue"]), text(p["schedule"]),
                     duration(max(0.0, now - last)) + " ago" if last is not None else "never",
                     when, text(p["leader"]) if p.get("leader") else "none"])
    return table(["TASK", "QUEUE", "SCHEDULE", "LAST RUN", "NEXT RUN", "LEADER"], rows)


def cmd_info(args: argparse.Namespace) -> int:
    t = target(args)
    if args.interval is None:
        snap = snapshot(t.app, t.app_queues)
        out(dumps(snap) if args.json else render_info(t, snap))
        for p in _problems(snap) if args.json else []:
            err(f"batchq info: {p}")
        return exitcodes.EXIT_OK
    try:
        while True:
            try:
                snap = snapshot(t.app, t.app_queues)
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
        "info", help="queue counts, live workers and periodic tasks",
        description="Per queue: ready, delayed, reserved and dead jobs, whether it is "
        "paused and the age of its oldest ready job; then the live workers with the age "
        "of their last heartbeat; then the periodic tasks with their last and next run "
        "and the leading process. A queue whose data cannot be read is flagged (!). "
        "Queues that use flow control also show their limits, grouped jobs, groups ready "
        f"and waiting, a hold of the queue, and up to {WAITING_SHOWN} groups that wait "
        "now (blocked or longest held first).")
    add_common(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {queues: {...}, workers: [...], "
                   "periodic: [...]}")
    p.add_argument("-i", "--interval", type=seconds(zero_ok=False), default=None,
                   metavar="SECONDS",
                   help="refresh every SECONDS until Ctrl-C (with --json: one object per "
                   "line each time)")
    p.set_defaults(handler=guarded("info", cmd_info))
