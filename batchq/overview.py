"""What an operator sees of a namespace: queue counts, live workers, periodic tasks.

The one data layer behind ``batchq info --json`` (:func:`snapshot`) and the web console
(:func:`read_queues`, :func:`queue_page`, :func:`live_workers`, :func:`periodic`). It
reads only; actions (pause, retry, purge) stay on :class:`batchq.queue.Queue`.

Every queue read is one pipelined round trip for the whole page of queues (200 queues:
one pipeline, not 200 calls), with the server's ``TIME`` in the same pipeline so ages use
the Redis clock. Sections that later issues add (campaigns, groups and limits) get their
own reader here next to these, and a key of their own in the console's overview.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import codec
from .keys import queues_key
from .periodic import periodic_status
from .worker import registry as worker_registry

if TYPE_CHECKING:
    from .app import App

COUNTERS = ("enqueued", "succeeded", "dead", "retried")
"""Fields of ``T:stats`` kept by the scripts themselves (see ``metrics.QueueCollector``)."""


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class QueueView:
    """One queue as read in one pipeline: counts by state, the oldest ready job's age
    (server clock), ready jobs by priority and the scripts' cumulative counters."""

    name: str
    ready: int
    delayed: int
    reserved: int
    dead: int
    paused: bool
    oldest_age_s: float
    ready_by_priority: dict[int, int] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        """The per-queue shape of ``batchq info --json``."""
        return {
            "ready": self.ready,
            "delayed": self.delayed,
            "reserved": self.reserved,
            "dead": self.dead,
            "paused": self.paused,
            "oldest_age_s": round(self.oldest_age_s, 3),
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything, for the console's JSON API."""
        return {"name": self.name, **self.info(),
                "ready_by_priority": {str(p): n for p, n in
                                      sorted(self.ready_by_priority.items(), reverse=True)},
                "counters": dict(self.counters)}


def queue_names(app: App, extra: Iterable[str] = ()) -> list[str]:
    """Every queue of the namespace (the registry set) plus ``extra`` (an app's declared
    queues), sorted; names batchq itself would never register are left out."""
    names = {_text(m) for m in app.redis.smembers(queues_key(app.namespace))} | set(extra)
    out = []
    for name in sorted(names):
        try:
            app.keys(name)
        except ValueError:
            continue
        out.append(name)
    return out


def server_ms(app: App) -> int:
    """The Redis server's clock in ms."""
    sec, usec = app.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def read_queues(app: App, names: list[str]) -> dict[str, QueueView]:
    """Counts of ``names`` (valid queue names) in one pipelined round trip."""
    pipe = app.redis.pipeline(transaction=False)
    # TIME by name: a cluster pipeline refuses pipe.time()
    pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
    for name in names:
        k = app.keys(name)
        for key in k.ready:
            pipe.llen(key)
        for key in k.ready:
            pipe.lindex(key, 0)
        pipe.zcard(k.delayed)
        pipe.zcard(k.reserved)
        pipe.zcard(k.dead)
        pipe.exists(k.paused)
        pipe.hmget(k.stats, list(COUNTERS))
    res = pipe.execute()
    sec, usec = res[0]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    out: dict[str, QueueView] = {}
    i = 1
    for name in names:
        n = len(app.keys(name).ready)
        lens = [int(x) for x in res[i : i + n]]
        heads = res[i + n : i + 2 * n]
        delayed, reserved, dead, paused, counts = res[i + 2 * n : i + 2 * n + 5]
        i += 2 * n + 5
        oldest = 0.0
        for head in heads:
            if head:
                with contextlib.suppress(codec.DecodeError):
                    ready_ms = codec.decode_entry(head, name).ready_ms
                    oldest = max(oldest, (now_ms - ready_ms) / 1000)
        out[name] = QueueView(
            name=name, ready=sum(lens), delayed=int(delayed), reserved=int(reserved),
            dead=int(dead), paused=bool(paused), oldest_age_s=oldest,
            ready_by_priority={9 - j: c for j, c in enumerate(lens) if c},
            counters={f: int(v or 0) for f, v in zip(COUNTERS, counts, strict=True)})
    return out


def queue_page(app: App, *, extra: Iterable[str] = (), contains: str = "", offset: int = 0,
               limit: int = 100) -> tuple[int, list[QueueView]]:
    """One page of queues (sorted by name, ``contains``: a name filter) and how many
    queues match in all; only the page's queues are read."""
    names = [n for n in queue_names(app, extra) if contains.lower() in n.lower()]
    page = names[offset : offset + limit]
    views = read_queues(app, page) if page else {}
    return len(names), [views[n] for n in page]


def live_workers(app: App) -> list[dict[str, Any]]:
    """The live workers, sorted by id (``batchq.worker.live_workers``: the registry's
    own reader, with each heartbeat's age)."""
    return worker_registry.live_workers(app.redis, app.namespace)


def periodic(app: App) -> list[dict[str, Any]]:
    """Periodic tasks with their last and next run (``batchq.periodic.periodic_status``)."""
    return periodic_status(app)


def snapshot(app: App, app_queues: Iterable[str] = ()) -> dict[str, Any]:
    """What ``batchq info --json`` prints: counts of every queue, the live workers and
    the periodic tasks."""
    names = queue_names(app, app_queues)
    views = read_queues(app, names) if names else {}
    return {"queues": {n: views[n].info() for n in names}, "workers": live_workers(app),
            "periodic": periodic(app)}
