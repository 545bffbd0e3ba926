"""The worker registry: each worker publishes itself; ``batchq info`` reads it back.

``NS:workers`` is a zset of worker id -> last heartbeat (ms); ``NS:worker:<id>`` a hash
of that worker's details, expiring after ``INFO_TTL_S``. The heartbeat loop (every
``heartbeat_interval_s``, 1 s) touches the supervisor's heartbeat file and:

* when anything shown changed since the last publish (jobs in flight, counts, paused),
  writes the details and the heartbeat (ZADD + HSET): the registry follows a busy
  worker within about a second;
* otherwise refreshes only the heartbeat, every ``REGISTRY_EVERY_S`` (ZADD + EXPIRE):
  an idle worker adds one command a second at most.

A worker that dies stops refreshing: :func:`live_workers` leaves it out once its
heartbeat is ``STALE_AFTER_S`` old, and reports every worker's heartbeat age.

The same loop applies the dead-letter retention of each served queue
(``queue.atrim_dead``) at start and then every ``TRIM_EVERY_S``: housekeeping off the
hot path, whose errors are logged and never stop the heartbeat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from ..ops.queue import atrim_dead
from ..store.keys import worker_info_key, workers_key
from .state import REDIS_ERRORS, State

log = logging.getLogger("batchq.worker")

REGISTRY_EVERY_S = 2.0
"""How often an idle worker refreshes its heartbeat in the registry."""

STALE_AFTER_S = 10.0
"""A registry entry whose heartbeat is older than this is a dead worker (five missed
refreshes)."""

INFO_TTL_S = STALE_AFTER_S
"""The details hash expires when its worker stops refreshing it."""

TRIM_EVERY_S = 60.0
"""How often a worker applies the dead-letter retention to the queues it serves (and
once at start)."""

_INT_FIELDS = frozenset({"pid", "concurrency", "succeeded", "failed", "in_flight"})
_FLOAT_FIELDS = frozenset({"started_at", "heartbeat_at"})
_BOOL_FIELDS = frozenset({"paused"})


class Registry:
    def __init__(self, state: State) -> None:
        self.st = state
        self._info_key = worker_info_key(state.app.namespace, state.worker_id)
        self._workers_key = workers_key(state.app.namespace)
        self._shown: tuple[int, ...] | None = None
        self._last_beat = float("-inf")
        self._trim_at = float("-inf")  # monotonic: at start, then every TRIM_EVERY_S
        # a worker forked by a supervisor stops when the supervisor is gone (SIGKILLed,
        # OOM-killed): nobody would reap, replace or stop it any more (gunicorn does the
        # same check); its jobs are given back by the normal stop order
        self._parent_pid = os.getppid() if state.settings.heartbeat_path else None
        self.on_orphaned: Callable[[], None] | None = None

    def _view(self) -> tuple[int, ...]:
        c = self.st.counters
        return (self.st.in_flight, c.succeeded, c.failed, int(self.st.paused))

    async def heartbeat_loop(self) -> None:
        """Prove the loop turns: refresh the supervisor's heartbeat file every interval,
        and the worker registry as described above; apply the dead-letter retention
        now and then. Runs until cancelled (stop step 4): it keeps beating while
        running jobs drain."""
        st = self.st
        path = st.settings.heartbeat_path
        while not st.closing:
            if path:
                with contextlib.suppress(OSError):
                    os.utime(path)
            if self._parent_pid is not None and os.getppid() != self._parent_pid \
                    and not st.stopping and self.on_orphaned is not None:
                log.warning("the supervisor (pid %d) is gone: stopping", self._parent_pid)
                self.on_orphaned()
            with contextlib.suppress(*REDIS_ERRORS):
                await self.publish()
            if not st.stopping and time.monotonic() >= self._trim_at:
                self._trim_at = time.monotonic() + TRIM_EVERY_S
                await self.trim_dead()
            # a pause that a stop does not cut short (the stop event stays set while jobs
            # drain, and the loop would spin), but the close does: a cancellation
            # swallowed inside a redis-py call above must not hold the exit for a beat
            await st.sleep_unless_closed(st.settings.heartbeat_interval_s)

    async def trim_dead(self) -> int:
        """Apply the app's dead-letter retention to every served queue; returns how many
        dead jobs were deleted. A queue that fails (Redis down, a key of the wrong type)
        is logged and skipped: retention is housekeeping, and an error here must never
        end the heartbeat (the supervisor would kill the worker)."""
        removed = 0
        for k in self.st.queues:
            try:
                n = await atrim_dead(self.st.app, k.queue)
            except Exception as exc:
                log.warning("dead-letter retention of queue %s failed (%s: %s); retrying in "
                            "%.0fs", k.queue, type(exc).__name__, exc, TRIM_EVERY_S)
                continue
            if n:
                log.info("dead-letter retention: deleted %d dead jobs of queue %s", n,
                         k.queue)
            removed += n
        return removed

    async def publish(self, force: bool = False) -> None:
        now = time.time()
        view = self._view()
        changed = force or view != self._shown
        if not changed and time.monotonic() - self._last_beat < REGISTRY_EVERY_S:
            return
        st = self.st
        pipe = st.redis.pipeline(transaction=False)
        pipe.zadd(self._workers_key, {st.worker_id: int(now * 1000)})
        if changed:
            c = st.counters
            pipe.hset(self._info_key, mapping={
                "id": st.worker_id,
                "host": os.uname().nodename,
                "pid": os.getpid(),
                "queues": ",".join(st.names),  # a sharded queue once
                "concurrency": st.settings.concurrency,
                "started_at": f"{st.started_at:.3f}",
                "heartbeat_at": f"{now:.3f}",
                "succeeded": c.succeeded,
                "failed": c.failed,
                "in_flight": st.in_flight,
                "paused": int(st.paused),
                # the supervisor's replacements by reason when it forked this process
                "restarts": ",".join(f"{k}={v}" for k, v in
                                     st.settings.supervisor_restarts),
            })
        pipe.expire(self._info_key, int(INFO_TTL_S))
        await pipe.execute()
        self._shown = view
        self._last_beat = time.monotonic()

    async def unpublish(self) -> None:
        st = self.st
        with contextlib.suppress(*REDIS_ERRORS):
            pipe = st.redis.pipeline(transaction=False)
            pipe.zrem(self._workers_key, st.worker_id)
            pipe.delete(self._info_key)
            await pipe.execute()


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _parse(fields: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        key, val = _text(k), _text(v)
        parsed: Any = val
        try:
            if key == "restarts":
                parsed = {r: int(n) for r, _, n in
                          (x.partition("=") for x in val.split(",") if x)}
            elif key in _INT_FIELDS:
                parsed = int(val)
            elif key in _FLOAT_FIELDS:
                parsed = float(val)
            elif key in _BOOL_FIELDS:
                parsed = val not in ("", "0", "false")
        except ValueError:
            parsed = val
        out[key] = parsed
    return out


def live_workers(r: redis.Redis, namespace: str, *,
                 stale_after_s: float = STALE_AFTER_S) -> list[dict[str, Any]]:
    """The workers whose heartbeat is at most ``stale_after_s`` old (server clock), each
    a dict of its published details plus ``heartbeat_age_s`` (how old its last
    heartbeat is, seconds); sorted by id. Ids gone stale are pruned from the zset. An id
    that is not UTF-8 is a ``surrogateescape`` string (print it escaped)."""
    key = workers_key(namespace)
    sec, usec = r.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    cutoff = now_ms - int(stale_after_s * 1000)
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", f"({cutoff}")
    pipe.zrangebyscore(key, cutoff, "+inf", withscores=True)
    _, entries = pipe.execute()
    if not entries:
        return []
    # ids as stored: a member that is not UTF-8 (written by hand) comes back as a
    # surrogateescape string, so it names its own details key, not a "replaced" one
    ids = [m.decode("utf-8", "surrogateescape") if isinstance(m, bytes) else str(m)
           for m, _ in entries]
    pipe = r.pipeline(transaction=False)
    for wid in ids:
        pipe.hgetall(worker_info_key(namespace, wid).encode("utf-8", "surrogateescape"))
    workers: list[dict[str, Any]] = []
    for wid, (_, score), fields in zip(ids, entries, pipe.execute(), strict=True):
        w: dict[str, Any] = _parse(fields) if fields else {}
        w["id"] = wid  # the registry's member is the id
        # the details hash is written only when they change; the zset score is the
        # heartbeat itself
        w["heartbeat_at"] = float(score) / 1000
        w["heartbeat_age_s"] = round(max(0.0, now_ms - float(score)) / 1000, 3)
        workers.append(w)
    workers.sort(key=lambda w: str(w["id"]))
    return workers
