"""What an operator sees of a namespace: queue counts, live workers, periodic tasks.

The one data layer behind ``batchq info --json`` (:func:`snapshot`) and the web console
(:func:`read_queues`, :func:`queue_page`, :func:`live_workers`, :func:`periodic`). It
reads only; actions (pause, retry, purge) stay on :class:`batchq.ops.queue.Queue`.

Every queue read is one pipelined round trip for the whole page of queues (200 queues:
one pipeline, not 200 calls), with the server's ``TIME`` in the same pipeline so ages use
the Redis clock (``batchq.ops.stats.read``, the reader ``Queue.stats`` and ``/metrics``
share, which never fails on data written by hand). Flow control (limits, groups that
wait, holds) is read by ``batchq.flow.view`` in two more pipelined round trips, bounded
per queue, and shown under the queue's ``flow`` key when the queue uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from ..flow import view as flow_view
from ..produce.periodic import periodic_status
from ..store import shards
from ..worker import registry as worker_registry
from . import stats
from .stats import QueueStats

if TYPE_CHECKING:
    from ..tasks.app import App


@dataclass(frozen=True)
class QueueView:
    """One queue as read in one pipeline (``stats.read``): its counts by state, the
    oldest ready job's age (server clock), ready jobs by priority, the heads that are not
    runnable jobs, and the scripts' cumulative counters (``stats.OUTCOMES``)."""

    name: str
    stats: QueueStats
    counters: dict[str, int]
    shards: int = 1
    """How many shards were read (``batchq.store.shards``); 1: not sharded."""

    def info(self) -> dict[str, Any]:
        """The per-queue shape of ``batchq info --json``; ``malformed_heads`` (the
        priorities whose ready list starts with an entry that is not a runnable job)
        only when there are some."""
        st = self.stats
        row: dict[str, Any] = {
            "ready": st.ready,
            "delayed": st.delayed,
            "reserved": st.reserved,
            "dead": st.dead,
            "paused": st.paused,
            "oldest_age_s": round(st.oldest_age_s, 3),
        }
        if st.malformed_heads:
            row["malformed_heads"] = list(st.malformed_heads)
        if self.shards > 1:
            row["shards"] = self.shards
        return row

    def as_dict(self) -> dict[str, Any]:
        """Everything, for the console's JSON API."""
        return {"name": self.name, **self.info(),
                "ready_by_priority": {str(p): n for p, n in
                                      sorted(self.stats.ready_by_priority.items(),
                                             reverse=True)},
                "counters": dict(self.counters)}


def _names(app: App, extra: Iterable[str]) -> tuple[list[str], list[bytes]]:
    good, bad = stats.registered_queues(app.redis, app.namespace)
    return sorted(set(good).union(extra)), bad


def queue_names(app: App, extra: Iterable[str] = ()) -> list[str]:
    """Every queue of the namespace (the registry set) plus ``extra`` (an app's declared
    queues), sorted; names batchq itself would never register are left out."""
    return _names(app, extra)[0]


def read_queues(app: App, names: list[str]) -> dict[str, QueueView]:
    """Counts of ``names`` (valid queue names) in one pipelined round trip."""
    snaps = stats.read_queues(app.redis, app.namespace, names, app.clients.shards)
    return {s.name: QueueView(s.name, s.stats, s.outcomes, s.shards) for s in snaps}


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
    """Periodic tasks with their last and next run (``batchq.produce.periodic.periodic_status``)."""
    return periodic_status(app)


def snapshot(app: App, app_queues: Iterable[str] = ()) -> dict[str, Any]:
    """What ``batchq info --json`` prints (and ``/api/info`` answers): counts of every
    queue, the live workers and the periodic tasks. Data written by hand never fails it:
    a name in the registry that is not a queue name is listed with an ``error``, a head
    that is not a job in ``malformed_heads``, and periodic tasks that cannot be read
    leave ``periodic`` empty with a ``periodic_error``. A queue that uses flow control
    has a ``flow`` entry: grouped jobs, groups ready and waiting, seconds left of a hold
    of the whole queue, its limits (at most ``flow_view.LIMITS_SHOWN`` group limits) and
    up to ``flow_view.WAITING_SHOWN`` groups that wait now, blocked and longest held
    first (``flow_view.info``)."""
    names, bad = _names(app, app_queues)
    views = read_queues(app, names) if names else {}
    flows = flow_view.read_shards(app.redis, {
        n: [app.keys(s) for s in shards.names(n, views[n].shards)] for n in names}
        ) if names else {}
    queues = {n: views[n].info() for n in names}
    for n in names:
        flow = flow_view.info(flows.get(n), views[n].stats)
        if flow is not None:
            queues[n]["flow"] = flow
    for raw in bad:
        queues[raw.decode("utf-8", "backslashreplace")] = {
            "error": "not a valid queue name (written by hand?)"}
    snap: dict[str, Any] = {"queues": dict(sorted(queues.items())),
                            "workers": live_workers(app)}
    try:
        snap["periodic"] = periodic(app)
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except Exception as exc:  # a schedule hash edited by hand: report, do not crash
        snap["periodic"] = []
        snap["periodic_error"] = f"cannot read the periodic tasks: {type(exc).__name__}: {exc}"
    return snap
