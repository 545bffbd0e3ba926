"""Periodic jobs: ``@app.periodic(cron="*/5 * * * *", tz="UTC")`` or ``every_s=30``.

The decorator registers the function as an ordinary task (same options as
``app.task``) plus a ``Schedule``. Every worker process runs ``run_scheduler``; exactly
one of them at a time is the *leader* and enqueues the ticks:

- **Leader election** uses a ``batchq.tasks.lock.Lock`` (``leader_lock_name``) with a lease
  of ``LEASE_S`` seconds. The leader renews it every lease/3 with a compare-token extend
  (never a blind PEXPIRE), and steps down the moment an extend finds the lock gone. A
  follower tries once per lease/3 (one command), or right after the holder's lease runs
  out, so when a leader dies another process leads within one lease.
- **One run per tick, even with two leaders** (a paused leader that does not know it
  lost): ``periodic_tick.lua`` keeps each schedule's last enqueued tick in the queue's
  ``T:periodic`` hash and RPUSHes the job in the same atomic call, on the queue's slot.
  A tick at or before the recorded one is never enqueued again.
- **No storm after downtime.** A leader only ever considers the latest tick at or
  before now. If it is at most ``grace_s`` late (a takeover, a slow start) it runs;
  older, it was missed: skipped, or run once with ``catch_up=True``. The ticks in
  between are never run.
- Ticks are points in Unix time taken from the server's clock: cron times in the
  schedule's time zone (croniter, zoneinfo), or multiples of ``every_s`` since the epoch,
  so every process names the same tick the same way. A periodic job carries its tick as
  its due time (``Job.ready_ms``).

``periodic_status`` reads what ``batchq info`` and the metric
``batchq_periodic_last_run_timestamp_seconds`` show.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar
from weakref import WeakKeyDictionary
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
import redis.asyncio
from redis.exceptions import RedisClusterException

from ..store.keys import queues_key
from ..store.scripts import calls
from ..tasks.durations import MAX_DURATION_S, check_seconds
from ..tasks.errors import LockLost
from ..tasks.lock import Lock, holder, token_owner
from ..tasks.task import Task
from . import producer

if TYPE_CHECKING:
    from croniter import croniter

    from ..store.clients import Clients


class PeriodicOwner(Protocol):
    """What the scheduler needs of an app (``PeriodicOwner`` is one): its clients, its task
    registry and its ``task`` decorator (for ``@app.periodic``)."""

    @property
    def clients(self) -> Clients: ...

    @property
    def tasks(self) -> dict[str, Task[..., Any]]: ...

log = logging.getLogger("batchq.periodic")

P = ParamSpec("P")
R = TypeVar("R")

LEADER_LOCK = "batchq.periodic"
"""Prefix of the lock the schedulers elect their leader with (see ``leader_lock_name``)."""

LEASE_S = 5.0
"""The leader's lease: another process takes over at most this long after it died."""

DEFAULT_GRACE_S = 3 * LEASE_S
"""A tick found at most this late still runs (covers a takeover and a slow start)."""

CRON_MAX_GAP_YEARS = 10
"""A cron schedule must match at least once in this many years, before and after now
(29 February matches every 4 to 8 years; 30 February never): checked at registration."""

SCHEDULE_ERROR_LOG_S = 60.0
"""A schedule whose computation fails is logged at most once per this many seconds
(it is retried at every round; the other schedules go on)."""

_REDIS_ERRORS = (redis.RedisError, RedisClusterException, OSError, RuntimeError)
"""What a scheduler survives (logged, then retried with backoff): it never ends the
worker it runs in."""



def _croniter() -> type[croniter]:
    """croniter (and dateutil under it), imported for the first cron schedule only: a
    worker whose app has none never pays for them (~10 ms of start-up)."""
    from croniter import croniter

    return croniter

@dataclass(frozen=True)
class Schedule:
    """When a periodic task runs. Exactly one of ``cron`` and ``every_s`` is set."""

    task: Task[..., Any]
    cron: str | None = None
    every_s: float | None = None
    tz: str = "UTC"
    catch_up: bool = False
    grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError(f"periodic task {self.name!r}: give cron=... or every_s=..., "
                             "exactly one")
        if self.cron is not None and not (isinstance(self.cron, str)
                                          and _croniter().is_valid(self.cron)):
            raise ValueError(f"periodic task {self.name!r}: invalid cron expression "
                             f"{self.cron!r}")
        if self.every_s is not None and not (
                isinstance(self.every_s, int | float) and math.isfinite(self.every_s)
                and 1 <= self.every_s <= MAX_DURATION_S):
            raise ValueError(f"periodic task {self.name!r}: every_s must be a number of "
                             f"seconds >= 1 and <= {MAX_DURATION_S} (10 years), got "
                             f"{self.every_s!r}")
        try:
            self.zone  # noqa: B018 - validates the time zone now, not at the first tick
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(f"periodic task {self.name!r}: unknown time zone {self.tz!r}"
                             ) from None
        if not (isinstance(self.grace_s, int | float) and self.grace_s >= 0):
            raise ValueError(f"periodic task {self.name!r}: grace_s must be >= 0 seconds, "
                             f"got {self.grace_s!r}")
        try:
            check_seconds("grace_s", self.grace_s)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"periodic task {self.name!r}: {exc}") from None
        if self.cron is not None:
            self._check_fires()

    def _check_fires(self) -> None:
        """A cron expression that is valid but never fires (30 February) would make the
        scheduler's every look fail: refused now, from a search bounded by
        ``CRON_MAX_GAP_YEARS`` both ways (croniter's own)."""
        assert self.cron is not None
        start = datetime.now(self.zone)
        try:
            it = _croniter()(self.cron, start,
                             max_years_between_matches=CRON_MAX_GAP_YEARS)
            it.get_next(float)
            it = _croniter()(self.cron, start,
                             max_years_between_matches=CRON_MAX_GAP_YEARS)
            it.get_prev(float)
        except Exception as exc:  # croniter's CroniterBadDateError, or anything it raises
            raise ValueError(f"periodic task {self.name!r}: cron expression {self.cron!r} "
                             f"never fires (no time matches it within "
                             f"{CRON_MAX_GAP_YEARS} years: {exc})") from None

    @property
    def name(self) -> str:
        return self.task.config.name

    @property
    def queue(self) -> str:
        return self.task.config.queue

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def text(self) -> str:
        """The schedule as people write it: ``cron */5 * * * * (UTC)`` or ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.tz})"
        return f"every {self.every_s:g}s"

    def latest_tick_ms(self, now_ms: int) -> int:
        """The latest tick at or before ``now_ms`` (Unix ms)."""
        if self.every_s is not None:
            every_ms = round(self.every_s * 1000)
            return now_ms - now_ms % every_ms
        assert self.cron is not None
        # croniter's get_prev is strict: start 1 ms later so a tick exactly now counts
        start = datetime.fromtimestamp((now_ms + 1) / 1000, self.zone)
        return round(_croniter()(self.cron, start).get_prev(float) * 1000)

    def next_tick_ms(self, now_ms: int) -> int:
        """The first tick after ``now_ms`` (Unix ms)."""
        if self.every_s is not None:
            return self.latest_tick_ms(now_ms) + round(self.every_s * 1000)
        assert self.cron is not None
        start = datetime.fromtimestamp(now_ms / 1000, self.zone)
        return round(_croniter()(self.cron, start).get_next(float) * 1000)


_SCHEDULES: WeakKeyDictionary[PeriodicOwner, dict[str, Schedule]] = WeakKeyDictionary()


def register(app: PeriodicOwner, t: Task[P, R], *, cron: str | None,
             every_s: float | None, tz: str, catch_up: bool, grace_s: float | None,
             ) -> Task[P, R]:
    """``@app.periodic``: the schedule of task ``t`` (already registered by ``app.task``,
    which checked its options); a bad schedule unregisters the task and raises."""
    try:
        s = Schedule(t, cron, every_s, tz, catch_up,
                     DEFAULT_GRACE_S if grace_s is None else grace_s)
    except ValueError:
        del app.tasks[t.config.name]  # a bad schedule registers nothing
        raise
    _SCHEDULES.setdefault(app, {})[s.name] = s
    return t


def schedules(app: PeriodicOwner) -> list[Schedule]:
    """The periodic schedules of an app, in registration order."""
    return list(_SCHEDULES.get(app, {}).values())


def leader_lock_name(app: PeriodicOwner) -> str:
    """The leader lock of this app's set of periodic tasks: ``batchq.periodic.<digest>``
    of their (queue, name) pairs. Two apps that share a namespace but schedule different
    tasks elect a leader each (one would otherwise lead and run only its own tasks).
    Versions of one app whose sets differ (a rolling deploy that adds a task) may both
    lead for a while: the per-tick guard keeps every tick once even then."""
    pairs = sorted(f"{s.queue}\x00{s.name}" for s in schedules(app))
    digest = hashlib.sha1("\x01".join(pairs).encode(), usedforsecurity=False).hexdigest()
    return f"{LEADER_LOCK}.{digest[:12]}"


# --- the scheduler --------------------------------------------------------------------


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max(0.0, seconds))


class Scheduler:
    """The periodic scheduler of one process: a follower until it wins the leader lock,
    then the one that enqueues the ticks. ``run`` until ``stop`` is set."""

    def __init__(self, app: PeriodicOwner, *, lease_s: float = LEASE_S, owner: str | None = None
                 ) -> None:
        self.app = app
        self.lease_s = lease_s
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}".replace("/", "_")
        self.lock = Lock(app.clients, leader_lock_name(app), ttl_s=lease_s, owner=self.owner)
        self.enqueued = 0
        """Ticks this process enqueued (for logs and tests)."""
        self._done: dict[str, int] = {}  # task -> latest tick the script answered for
        self._renew_at = 0.0  # monotonic
        self._registered: set[str] = set()
        self._failed_at: dict[str, float] = {}  # task -> when its failure was logged

    @property
    def is_leader(self) -> bool:
        return self.lock.held

    async def run(self, stop: asyncio.Event) -> None:
        scheds = schedules(self.app)
        if not scheds:
            return  # nothing to schedule: not even a lock attempt
        # the tasks registered by now (the app is imported before the worker starts)
        self.lock = Lock(self.app.clients, leader_lock_name(self.app), ttl_s=self.lease_s,
                         owner=self.owner)
        backoff_s = 0.1
        try:
            while not stop.is_set():
                try:
                    wait_s = await self._step(scheds)
                    backoff_s = 0.1
                except LockLost:
                    log.warning("periodic scheduler %s: lost the leader lock; following",
                                self.owner)
                    wait_s = 0.0
                except _REDIS_ERRORS as exc:
                    log.warning("periodic scheduler %s: Redis error (%s); retrying in %.1fs",
                                self.owner, exc, backoff_s)
                    wait_s, backoff_s = backoff_s, min(backoff_s * 2, 5.0)
                except Exception:  # a bug must not end scheduling in this process
                    log.exception("periodic scheduler %s: unexpected error; retrying in "
                                  "%.1fs", self.owner, backoff_s)
                    wait_s, backoff_s = backoff_s, min(backoff_s * 2, 5.0)
                await _sleep(stop, wait_s)
        finally:
            if self.lock.held:  # hand over at once rather than after the lease
                with contextlib.suppress(LockLost, *_REDIS_ERRORS, TimeoutError):
                    await asyncio.wait_for(self.lock.arelease(), 2.0)
                self.lock.token = None

    async def _step(self, scheds: list[Schedule]) -> float:
        """One round; returns how long to sleep before the next."""
        third = self.lease_s / 3
        if not self.lock.held:
            t0 = time.monotonic()
            ok, _, ttl_ms = await self.lock.try_aacquire()
            if not ok:  # try again in lease/3, or just after the holder's lease ends
                return min(third, ttl_ms / 1000 + 0.005) if ttl_ms > 0 else third
            self._renew_at = t0 + third
            self._done.clear()  # a new term: ask the script about every schedule again
            log.info("periodic scheduler %s: leading %d schedule(s)", self.owner, len(scheds))
        elif time.monotonic() >= self._renew_at:
            t0 = time.monotonic()
            await self.lock.aextend()  # raises LockLost: step down
            self._renew_at = t0 + third
        until_tick_s = await self._tick(scheds)
        return min(until_tick_s, self._renew_at - time.monotonic())

    async def _tick(self, scheds: list[Schedule]) -> float:
        """Enqueue every schedule's due tick (once); returns seconds to the next tick."""
        client = self.app.clients.async_redis()
        sec, usec = await client.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        t_local = time.monotonic()
        wait_ms = 3_600_000
        for s in scheds:
            try:
                due = s.latest_tick_ms(now_ms)
                nxt = s.next_tick_ms(now_ms)
            except Exception as exc:  # one broken schedule must not stop the others
                self._failed(s, exc)
                continue
            if self._done.get(s.name, -1) < due:
                try:
                    code, value = await self._fire(s, due, nxt, now_ms)
                except (LockLost, *_REDIS_ERRORS):
                    raise  # the round's concern: backoff, or step down
                except Exception as exc:
                    self._failed(s, exc)
                    continue
                if code == -1:  # this node's clock is behind the one we asked: soon
                    wait_ms = min(wait_ms, int(value) + 2)
                    continue
                self._done[s.name] = due
                if code == 1:
                    self.enqueued += 1
                    log.debug("periodic %s: enqueued the tick of %s", s.name,
                             _fmt_ms(due))
                elif code == 2:
                    log.warning("periodic %s: missed the tick of %s (more than %gs late); "
                                "skipped", s.name, _fmt_ms(due), s.grace_s)
            wait_ms = min(wait_ms, nxt - now_ms)
        # +2 ms: wake just after the tick, not just before it
        return (max(wait_ms, 0) + 2) / 1000 - (time.monotonic() - t_local)

    def _failed(self, s: Schedule, exc: Exception) -> None:
        """Schedule ``s`` could not be computed or enqueued: skipped this round (the
        others go on), logged at most once per ``SCHEDULE_ERROR_LOG_S``."""
        now = time.monotonic()
        if now - self._failed_at.get(s.name, -SCHEDULE_ERROR_LOG_S) < SCHEDULE_ERROR_LOG_S:
            return
        self._failed_at[s.name] = now
        log.error("periodic %s (%s): skipped, its schedule failed: %s: %s; the other "
                  "schedules go on", s.name, s.text, type(exc).__name__, exc)

    async def _fire(self, s: Schedule, due: int, nxt: int, now_ms: int) -> tuple[int, int]:
        app = self.app
        if s.queue not in self._registered:
            await app.clients.aregister_queue(s.queue)
            self._registered.add(s.queue)
        c = s.task.config
        # the producer's own entry code; the tick is the job's due time
        plan = producer.plan(app.clients, c.name, c.queue, c.priority, c.max_attempts, None,
                             due / 1000)
        _, entry = plan.entry((), {}, now_ms)
        res = await app.clients.async_scripts().call(calls.periodic_tick(
            plan.keys, c.priority, s.name, due, nxt, round(s.grace_s * 1000), s.catch_up,
            entry, s.text, self.lock.name))
        return int(res[0]), int(res[1])


def _fmt_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


async def run_scheduler(app: PeriodicOwner, stop_event: asyncio.Event, *, lease_s: float = LEASE_S,
                        ) -> None:
    """Run the periodic scheduler of this process until ``stop_event`` is set.

    Start it in every worker process (as a task of the worker's event loop): it returns
    at once when the app has no periodic task, costs one command per lease/3 while
    another process leads, and releases the leadership when stopped.
    """
    await Scheduler(app, lease_s=lease_s).run(stop_event)


# --- status -----------------------------------------------------------------------------


def periodic_status(app: PeriodicOwner) -> list[dict[str, Any]]:
    """One dict per periodic task: ``name``, ``queue``, ``schedule`` (text),
    ``last_run_s`` (server time its last tick was enqueued, or ``None``), ``last_tick_s``,
    ``next_run_s`` (as recorded by the leader; ``None`` before any scheduler ran; in the
    past when none runs now) and ``leader`` (``host:pid`` of the leading process, or
    ``None`` when no scheduler leads). Times are Unix seconds.

    The tasks are the app's periodic tasks. An app without any (``batchq info`` run
    without an app) gets every schedule recorded in the queues of its namespace instead,
    from what the leaders wrote; a task removed from the code stays listed there (with
    a ``next_run_s`` in the past) until its fields are deleted from ``T:periodic``."""
    r = app.clients.redis
    scheds = schedules(app)
    if scheds:
        wanted = [(s.queue, s.name, s.text) for s in scheds]
    else:
        wanted = []
        queues = sorted(_text(q) for q in r.smembers(queues_key(app.clients.namespace)))
        for q in queues:
            try:
                k = app.clients.keys(q)
            except ValueError:
                continue
            fields = r.hgetall(k.periodic)
            names = sorted({_text(f).rsplit(":", 1)[0] for f in fields})
            wanted += [(q, n, _text(fields.get(f"{n}:schedule".encode(), b"?")))
                       for n in names]
    leaders: dict[str, str | None] = {}
    out: list[dict[str, Any]] = []
    for queue, name, text in wanted:
        tick, run, nxt, lock_name = r.hmget(
            app.clients.keys(queue).periodic,
            [f"{name}:tick", f"{name}:run", f"{name}:next", f"{name}:lock"])
        lock_name = leader_lock_name(app) if scheds else _text(lock_name or b"")
        if lock_name not in leaders:
            leaders[lock_name] = token_owner(holder(app.clients, lock_name)) if lock_name else None
        out.append({
            "name": name,
            "queue": queue,
            "schedule": text,
            "last_run_s": _seconds(run),
            "last_tick_s": _seconds(tick),
            "next_run_s": _seconds(nxt),
            "leader": leaders[lock_name],
        })
    return out


def periodic_metrics(app: PeriodicOwner) -> list[Any]:
    """Prometheus metric families from ``periodic_status`` (yield them from a collector
    at scrape time): ``batchq_periodic_last_run_timestamp_seconds`` and
    ``batchq_periodic_next_run_timestamp_seconds``, labelled ``task`` and ``queue``; a
    task that never ran (or was never scheduled) has no sample. Alert on
    ``time() - last_run`` above the period, or ``time() > next_run + lease``."""
    from prometheus_client.core import GaugeMetricFamily

    last = GaugeMetricFamily("batchq_periodic_last_run_timestamp_seconds",
                             "When the periodic task's last tick was enqueued (Unix time)",
                             labels=["task", "queue"])
    nxt = GaugeMetricFamily("batchq_periodic_next_run_timestamp_seconds",
                            "The periodic task's next tick as recorded by the scheduler "
                            "(Unix time); in the past when no scheduler runs",
                            labels=["task", "queue"])
    for st in periodic_status(app):
        if st["last_run_s"] is not None:
            last.add_metric([st["name"], st["queue"]], st["last_run_s"])
        if st["next_run_s"] is not None:
            nxt.add_metric([st["name"], st["queue"]], st["next_run_s"])
    return [last, nxt]



class PeriodicCollector:
    """``periodic_metrics`` read at scrape time (``/metrics``); a Redis error costs only
    these families."""

    def __init__(self, app: PeriodicOwner) -> None:
        self.app = app

    def collect(self) -> list[Any]:
        try:
            return periodic_metrics(self.app)
        except Exception as exc:
            logging.getLogger("batchq.metrics").warning(
                "cannot read the periodic tasks' metrics from Redis: %s", exc)
            return []


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _seconds(raw: Any) -> float | None:
    return None if raw is None else int(raw) / 1000
