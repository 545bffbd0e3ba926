"""Campaigns: many jobs as one object, with exact counts, cancel, and one completion.

State, and which script touches it:

- the campaign's record (hash) and the set of queues it touched, in the campaign's own
  hash tag (``keys.campaign_keys``): ``campaign_open.lua`` creates the record,
  ``campaign_join.lua`` adds a queue (refused once sealed), ``campaign_close.lua`` seals
  or cancels, ``campaign_finish.lua`` is the exactly-once guard of completion;
- per queue, in the queue's hash tag, the campaign's flag and counters (the queue's
  ``campaigns`` hash), moved by the same scripts that move the jobs: enqueue_tracked
  (total, pending), ack (succeeded), nack and the reaper in pop (dead), pop (cancelled,
  for jobs of a cancelled campaign it drops instead of reserving). A job counts once: by
  its jobmeta entry, removed when it is settled (see ``_lib.lua`` settle_tracked).

Completion. Pending only falls once every queue is closed (sealed or cancelled there),
so "closed everywhere and nothing pending on any queue" stays true once seen. Whoever
sees it (the worker whose ack, nack or pop settled a queue's last job, ``seal()``
itself, or the safety net ``check_open`` that workers run now and then) calls
``try_complete``: ``campaign_finish.lua`` lets one caller store the final counts, and
``on_complete`` is enqueued with a dedup key naming the campaign, so even two callers
racing (or one retrying after a crash) write one job. Then "notified" is set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol

from ..store import codec
from ..store.clients import Clients
from ..store.keys import CampaignKeys, campaign_keys, campaigns_key, campaigns_open_key
from ..store.scripts import calls
from ..tasks.errors import CampaignNotFound
from . import producer, tracked
from .options import check_expiry, eta_seconds

DEFAULT_CAMPAIGN_TTL_S = 7 * 86400.0
"""How long a finished campaign's record is kept."""

RECHECK_S = 30.0
"""The safety net looks at an open sealed campaign again after this long."""

COMPLETE_KEY = "batchq:campaign-complete:{}"
"""The dedup key of a campaign's ``on_complete`` job: one per campaign."""


class TaskLike(Protocol):
    """What a campaign needs of its ``on_complete`` task (``batchq.Task`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> Any: ...


@dataclass(frozen=True)
class CampaignStats:
    """A campaign's counts. ``total == succeeded + dead + cancelled + expired + pending``
    always (each queue's counts are read atomically); ``done`` once ``on_complete`` is
    due; ``expired``: jobs not started by their deadline (``expires_at``)."""

    id: str
    total: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    done: bool
    created_at: float
    """Unix seconds."""
    finished_at: float | None
    state: str
    """``open``, ``sealed``, ``cancelled`` or ``done``."""
    queues: tuple[str, ...] = ()
    expired: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["queues"] = list(self.queues)
        return d


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _record(c: Clients, ck: CampaignKeys) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in c.redis.hgetall(ck.record).items()}


def _queues(c: Clients, ck: CampaignKeys) -> list[str]:
    return sorted(_text(q) for q in c.redis.smembers(ck.queues))


def _counts(c: Clients, cid: str, queues: list[str]
            ) -> tuple[int, int, int, int, int, int]:
    """(total, pending, succeeded, dead, cancelled, expired) summed over ``queues``."""
    sums = [0] * 6
    for q in queues:
        reply = c.sync_scripts.call(calls.campaign_queue(c.keys(q), cid, "read"))
        for i in range(5):
            sums[i] += int(reply[i + 1])
        sums[5] += int(reply[7])
    t, p, s, d, x, e = sums
    return t, p, s, d, x, e


def _state(rec: dict[str, str]) -> str:
    if "finished_ms" in rec:
        return "done"
    if "cancelled" in rec:
        return "cancelled"
    return "sealed" if "sealed" in rec else "open"


def stats(c: Clients, cid: str) -> CampaignStats:
    """The counts of campaign ``cid``; ``CampaignNotFound`` when there is none."""
    ck = campaign_keys(c.namespace, cid)
    rec = _record(c, ck)
    if not rec:
        raise CampaignNotFound(cid)
    queues = _queues(c, ck)
    finished = "finished_ms" in rec
    if finished:
        t, s, d, x, e = (int(rec.get(f, 0)) for f in ("total", "succeeded", "dead",
                                                       "cancelled", "expired"))
        p = 0
    else:
        t, p, s, d, x, e = _counts(c, cid, queues)
    return CampaignStats(cid, t, p, s, d, x, finished, int(rec["created_ms"]) / 1000,
                         int(rec["finished_ms"]) / 1000 if finished else None, _state(rec),
                         tuple(queues), e)


def create(c: Clients, cid: str | None, on_complete: TaskLike | None,
           ttl_s: float, expires_at: datetime | float | None = None) -> str:
    """Create campaign ``cid`` (a new id when None) unless it exists; returns the id.
    ``expires_at``: its jobs not started by then never run (each job is stamped with it
    when written: ``options(expires_at=...)``)."""
    cid = tracked.check_campaign_id(cid) if cid is not None else codec.new_id()
    if expires_at is not None:
        check_expiry(None, expires_at, None)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s < 1e10:
        raise ValueError(f"campaign_ttl_s must be a number of seconds > 0, got {ttl_s!r}")
    if on_complete is not None and not hasattr(on_complete, "config"):
        raise TypeError(f"on_complete must be a task (@app.task), got {on_complete!r}")
    cfg = on_complete.config if on_complete is not None else None
    created = c.sync_scripts.call(calls.campaign_open(
        campaign_keys(c.namespace, cid), cfg.name if cfg else "", cfg.queue if cfg else "",
        cfg.priority if cfg else 0, cfg.max_attempts if cfg else 1, round(ttl_s * 1000),
        None if expires_at is None else round(eta_seconds(expires_at) * 1000)))
    if created:
        c.redis.zadd(campaigns_key(c.namespace), {cid: time.time() * 1000}, nx=True)
    return cid


def close(c: Clients, cid: str, mode: str) -> int:
    """Seal (``mode="seal"``) or cancel a campaign; returns, for a cancel, how many of
    its jobs had not started (pending and not leased when each queue was closed)."""
    ck = campaign_keys(c.namespace, cid)
    reply = c.sync_scripts.call(calls.campaign_close(ck, mode))
    status = int(reply[0])
    if status == -1:
        raise CampaignNotFound(cid)
    if status == 0:
        return 0  # finished already
    # listed for the safety net before the queues are closed: a crash half way through
    # is finished by the next look
    c.redis.zadd(campaigns_open_key(c.namespace), {cid: time.time() * 1000}, nx=True)
    not_started = 0
    for q in (_text(x) for x in reply[2:]):
        r = c.sync_scripts.call(calls.campaign_queue(c.keys(q), cid, mode))
        not_started += max(0, int(r[2]) - int(r[6]))
    c.redis.hset(ck.record, "closed", 1)
    return not_started


def try_complete(c: Clients, cid: str) -> bool:
    """Complete campaign ``cid`` if it is closed everywhere with nothing pending: store
    its final counts once and enqueue ``on_complete(cid, stats)`` exactly once.
    Returns True when this call found it complete (and saw the callback enqueued)."""
    ck = campaign_keys(c.namespace, cid)
    rec = _record(c, ck)
    open_key = campaigns_open_key(c.namespace)
    if not rec or "notified" in rec:
        c.redis.zrem(open_key, cid)
        return False
    if "closed" not in rec:
        if "sealed" not in rec:
            return False
        close(c, cid, "cancel" if "cancelled" in rec else "seal")  # an interrupted seal
    queues = _queues(c, ck)
    if "finished_ms" not in rec:
        t, p, s, d, x, e = _counts(c, cid, queues)
        if p > 0:
            return False
        if int(c.sync_scripts.call(calls.campaign_finish(ck, t, s, d, x, e))) < 0:
            return False
    st = stats(c, cid)
    rec = _record(c, ck)
    if rec.get("on_complete"):
        plan = producer.plan(c, rec["on_complete"], rec["oc_queue"], int(rec["oc_priority"]),
                             int(rec["oc_max_attempts"]), None, None, keyed=True,
                             key_ttl_s=int(rec.get("ttl_ms", 0)) / 1000 or None)
        producer.enqueue(c, plan, (cid, st.as_dict()), {}, key=COMPLETE_KEY.format(cid))
    c.redis.hset(ck.record, "notified", 1)
    c.redis.zrem(open_key, cid)
    for q in queues:
        c.sync_scripts.call(calls.campaign_queue(c.keys(q), cid, "done"))
    return True


def check_open(c: Clients, limit: int = 10) -> int:
    """The safety net: try to complete up to ``limit`` sealed campaigns not looked at
    for ``RECHECK_S`` (a worker killed between a last ack and its follow-up). Returns
    how many completed."""
    key = campaigns_open_key(c.namespace)
    now_ms = time.time() * 1000
    done = 0
    for raw in c.redis.zrangebyscore(key, "-inf", now_ms, start=0, num=limit):
        cid = _text(raw)
        c.redis.zadd(key, {cid: now_ms + RECHECK_S * 1000}, xx=True)
        done += try_complete(c, cid)
    return done


def ids(c: Clients, limit: int = 100) -> list[str]:
    """Campaign ids, newest first (expired records are dropped from the index)."""
    return [_text(x) for x in c.redis.zrevrange(campaigns_key(c.namespace), 0, limit - 1)]


def list_stats(c: Clients, limit: int = 100) -> Iterator[CampaignStats]:
    for cid in ids(c, limit):
        try:
            yield stats(c, cid)
        except CampaignNotFound:
            c.redis.zrem(campaigns_key(c.namespace), cid)


def recent(c: Clients, max_age_s: float = 3600.0, limit: int = 50,
           scan: int = 200) -> list[CampaignStats]:
    """Campaigns still running or finished less than ``max_age_s`` ago, at most
    ``limit`` (newest first, among the newest ``scan`` created): the metrics' bounded
    set of label values."""
    now = time.time()
    out = []
    for st in list_stats(c, scan):
        if st.finished_at is None or now - st.finished_at < max_age_s:
            out.append(st)
            if len(out) == limit:
                break
    return out


class Campaign:
    """A campaign: ``app.campaign(id, on_complete=task)``. Jobs join it with
    ``task.options(campaign=c)``; ``seal()`` says no more will come (``with`` seals on
    a clean exit); ``on_complete(campaign_id, stats_dict)`` is enqueued exactly once when
    it is sealed and nothing is pending."""

    def __init__(self, clients: Clients, campaign_id: str) -> None:
        self._clients = clients
        self.id = campaign_id

    def __repr__(self) -> str:
        return f"<Campaign {self.id}>"

    def seal(self) -> None:
        """No more jobs: adding one raises ``CampaignClosed``; completion may now fire
        (at once for an empty campaign)."""
        close(self._clients, self.id, "seal")
        try_complete(self._clients, self.id)

    def cancel(self) -> int:
        """Jobs not started never run: a pop drops them (counted as cancelled) as fast
        as it reads them, charging them to no rate, concurrency or batch; running ones
        finish. Seals the campaign. Returns how many had not started."""
        n = close(self._clients, self.id, "cancel")
        try_complete(self._clients, self.id)
        return n

    def stats(self) -> CampaignStats:
        return stats(self._clients, self.id)

    def __enter__(self) -> Campaign:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.seal()

    async def __aenter__(self) -> Campaign:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            await asyncio.to_thread(self.seal)


class HasClients(Protocol):
    @property
    def clients(self) -> Clients: ...


CAMPAIGN_SERIES = 50
"""Campaigns exported at most to ``/metrics`` (each: 5 job series and a done flag)."""

_metrics_log = logging.getLogger("batchq.metrics")


class CampaignCollector:
    """Jobs by campaign and state (total, pending, succeeded, dead, cancelled) for
    campaigns running or finished in the last hour, read at scrape time: at most
    ``CAMPAIGN_SERIES`` of them, so the label set stays bounded whatever the producers
    do."""

    def __init__(self, app: HasClients) -> None:
        self.app = app

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        jobs = GaugeMetricFamily("batchq_campaign_jobs", "Jobs of a campaign by state",
                                 labels=["campaign", "state"])
        done = GaugeMetricFamily("batchq_campaign_done", "1 once the campaign completed",
                                 labels=["campaign"])
        try:
            found = recent(self.app.clients, limit=CAMPAIGN_SERIES)
        except Exception as exc:  # the queue gauges still answer
            _metrics_log.warning("cannot read campaign metrics from Redis: %s", exc)
            return
        for st in found:
            for state in ("total", "pending", "succeeded", "dead", "cancelled", "expired"):
                jobs.add_metric([st.id, state], getattr(st, state))
            done.add_metric([st.id], 1 if st.done else 0)
        yield from (jobs, done)
