"""``Queue``: what an operator asks of one queue — counts, the dead-letter store and its
retention, pause, limits and holds.

The dead-letter store is listed, redriven, purged and trimmed by age and count here
(``trim_dead.lua``). Ids are read as bytes and shown with ``surrogateescape``: one that
is not UTF-8 is listed and handed back to Redis byte for byte.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from ..flow import limits, windows
from ..flow.limits import GroupState, Holds, Limit
from ..flow.windows import Window
from ..store import codec
from ..store.clients import Clients
from ..store.keys import QueueKeys, split_shard
from ..store.scripts import calls
from . import events as events_
from . import stats
from .stats import QueueStats

__all__ = ["DeadJob", "DeadRetention", "Queue", "QueueStats", "atrim_dead"]

PAGE = 500

TRIM_CHUNK = 500
"""Dead jobs removed per ``trim_dead.lua`` call: one call stays short on the server."""

TRIM_MAX_CHUNKS = 200
"""Calls per ``trim_dead`` run at most; the next run goes on where this one stopped."""

DEFAULT_DEAD_MAX_AGE_S = 7 * 86400.0
DEFAULT_DEAD_MAX_COUNT = 100_000


@dataclass(frozen=True)
class DeadRetention:
    """How long the dead-letter store of each queue keeps jobs: at most ``max_age_s``
    seconds and at most ``max_count`` jobs per queue, the oldest trimmed first. 0 turns a
    limit off."""

    max_age_s: float = DEFAULT_DEAD_MAX_AGE_S
    max_count: int = DEFAULT_DEAD_MAX_COUNT

    def __post_init__(self) -> None:
        a = self.max_age_s
        if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) \
                or a < 0:
            raise ValueError(f"dead_max_age_s must be a finite number >= 0, got {a!r}")
        codec.check_int("dead_max_count", self.max_count, 0, codec.HEADER_NUMBER_MAX)

    @classmethod
    def resolve(cls, max_age_s: float | None, max_count: int | None) -> DeadRetention:
        """The given values, else ``$BATCHQ_DEAD_MAX_AGE_S`` / ``$BATCHQ_DEAD_MAX_COUNT``,
        else the defaults (7 days, 100,000)."""
        if max_age_s is None:
            env = os.environ.get("BATCHQ_DEAD_MAX_AGE_S")
            try:
                max_age_s = DEFAULT_DEAD_MAX_AGE_S if env is None else float(env)
            except ValueError:
                raise ValueError(f"BATCHQ_DEAD_MAX_AGE_S must be a number, got {env!r}") \
                    from None
        if max_count is None:
            env = os.environ.get("BATCHQ_DEAD_MAX_COUNT")
            try:
                max_count = DEFAULT_DEAD_MAX_COUNT if env is None else int(env)
            except ValueError:
                raise ValueError(f"BATCHQ_DEAD_MAX_COUNT must be an integer, got {env!r}") \
                    from None
        return cls(max_age_s, max_count)

    def call(self, k: QueueKeys, chunk: int) -> calls.Call:
        """One ``trim_dead.lua`` call of this retention over queue ``k``."""
        return calls.trim_dead(k, round(self.max_age_s * 1000), self.max_count, chunk)


class QueueOwner(Protocol):
    """What a ``Queue`` needs of its app (``App`` is one)."""

    @property
    def clients(self) -> Clients: ...

    @property
    def namespace(self) -> str: ...

    @property
    def dead_retention(self) -> DeadRetention: ...


def _id_bytes(jid: str) -> bytes:
    """An id as listed (``surrogateescape``) back to the bytes Redis holds."""
    return jid.encode("utf-8", "surrogateescape")


def _id_text(raw: Any) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True)
class DeadJob:
    """One dead-lettered job with the reason and the last error."""

    id: str
    queue: str
    task: str | None
    args: list[Any]
    kwargs: dict[str, Any]
    attempts: int
    reason: str
    error_type: str
    error_message: str
    traceback: str
    died_at: float
    raw: bytes

    def __repr__(self) -> str:
        return (f"DeadJob(id={self.id!r}, task={self.task!r}, reason={self.reason!r}, "
                f"attempts={self.attempts}, error={self.error_type}: {self.error_message})")


class Queue:
    """Inspection and dead-letter operations on one queue (synchronous). A sharded queue
    (``batchq.store.shards``) is one queue here: every operation covers all its shards (those
    configured in this app and those the shard registry knows), counts are summed."""

    def __init__(self, app: QueueOwner, name: str) -> None:
        self.app = app
        self.clients = app.clients
        self.name = name
        self.keys = self.clients.keys(name)
        """The keys of the queue itself (shard 0 of a sharded queue)."""

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, namespace={self.app.namespace!r})"

    def shards(self) -> list[Queue]:
        """The queue's shards, shard 0 (this queue's own keys) first: one queue unless it
        is sharded. One ``ZMSCORE`` of the shard registry."""
        names = stats.shard_names(self.clients.redis, self.app.namespace, [self.name],
                                  self.clients.shards)[self.name]
        return [_Shard(self, n) for n in names]

    def stats(self) -> QueueStats:
        """Counts by state (all shards summed). Never fails on data: a ready list whose
        head entry is not a runnable job is listed in ``malformed_heads`` (and left out
        of the age)."""
        parts = self.shards()
        snaps = stats.read(self.clients.redis, [q.keys for q in parts])
        return stats.merge(self.name, snaps).stats

    # --- dead letters ------------------------------------------------------------------

    def dead_ids(self, limit: int | None = None) -> list[str]:
        """Dead-lettered job ids, oldest first. An id that is not UTF-8 is decoded with
        ``surrogateescape``: passed back to ``dead_jobs`` / ``retry_dead`` /
        ``purge_dead`` it names the same bytes."""
        parts = self.shards()
        if len(parts) == 1:
            return self._dead_ids(limit)
        end = -1 if limit is None else limit - 1
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in parts:
            pipe.zrange(q.keys.dead, 0, end, withscores=True)
        merged = sorted((score, _id_text(i)) for res in pipe.execute() for i, score in res)
        return [i for _, i in merged[:limit]]

    def dead_count(self) -> int:
        """How many jobs the dead-letter store holds (every shard)."""
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in self.shards():
            pipe.zcard(q.keys.dead)
        return sum(int(n) for n in pipe.execute())

    def dead_range(self, start: int, stop: int, *, newest_first: bool = True) -> list[str]:
        """Dead job ids of ranks ``start .. stop`` (inclusive), newest (or oldest) first,
        over every shard: each shard's first ``stop + 1`` are merged by time."""
        if stop < start:
            return []
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in self.shards():
            if newest_first:
                pipe.zrevrange(q.keys.dead, 0, stop, withscores=True)
            else:
                pipe.zrange(q.keys.dead, 0, stop, withscores=True)
        merged = sorted(((score, _id_text(i)) for res in pipe.execute() for i, score in res),
                        reverse=newest_first)
        return [i for _, i in merged[start : stop + 1]]

    def _dead_ids(self, limit: int | None) -> list[str]:
        end = -1 if limit is None else limit - 1
        ids = self.clients.redis.zrange(self.keys.dead, 0, end)
        return [_id_text(i) for i in ids]

    def dead_jobs(self, ids: list[str] | None = None, limit: int | None = None) -> list[DeadJob]:
        """Dead-lettered jobs (all, the given ids, or the oldest ``limit``), oldest first.
        A record that cannot be read is listed with reason ``corrupt_record`` rather
        than hiding the others."""
        if ids is None:
            ids = self.dead_ids(limit)
        parts = self.shards()
        if len(parts) > 1:
            found = [j for q in parts for j in q._dead_jobs(ids)]
            order = {jid: n for n, jid in enumerate(ids)}
            return sorted(found, key=lambda j: order.get(j.id, 0))
        return self._dead_jobs(ids)

    def _dead_jobs(self, ids: list[str]) -> list[DeadJob]:
        out: list[DeadJob] = []
        for start in range(0, len(ids), PAGE):
            page = ids[start : start + PAGE]
            keys = [_id_bytes(i) for i in page]
            pipe = self.clients.redis.pipeline(transaction=False)
            pipe.hmget(self.keys.dead_jobs, keys)
            for i in keys:
                pipe.zscore(self.keys.dead, i)
            res = pipe.execute()
            for jid, rec, score in zip(page, res[0], res[1:], strict=True):
                if rec is not None:
                    out.append(self._dead_job(jid, rec, score or 0.0))
        return out

    def _dead_job(self, jid: str, data: bytes, score: float) -> DeadJob:
        rec = codec.decode_dead_record(data)
        raw = rec.get("raw", b"")
        if not isinstance(raw, bytes):  # a record written by hand
            raw = str(raw).encode("utf-8", "surrogateescape")
        task: str | None = None
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        attempts = 0
        try:
            job = codec.decode_entry(raw, self.name)
            if not isinstance(job.task, str) or not isinstance(job.args, list) or \
                    not isinstance(job.kwargs, dict):
                raise codec.DecodeError("body is not [task, args, kwargs, ...]")
            task, args, kwargs, attempts = job.task, list(job.args), dict(job.kwargs), job.attempt
        except Exception:  # any bytes may sit in a dead record: show what can be read
            with contextlib.suppress(codec.DecodeError):
                attempts = codec.parse_header(raw)[1]
        return DeadJob(
            id=jid,
            queue=split_shard(self.name)[0],
            task=task,
            args=args,
            kwargs=kwargs,
            attempts=attempts,
            reason=_text(rec.get("reason", "")),
            error_type=_text(rec.get("error_type", "")),
            error_message=_text(rec.get("error_message", "")),
            traceback=_text(rec.get("traceback", "")),
            died_at=score / 1000,
            raw=raw,
        )

    def retry_dead(self, ids: list[str] | None = None) -> int:
        """Move dead jobs (all, or the given ids) back to ready with fresh attempts.

        Jobs whose bytes are not a batchq job (reason ``decode_error`` with a malformed
        header) cannot run and stay in the store. Returns how many were moved (each to
        the shard it died in).
        """
        parts = self.shards()
        if len(parts) > 1:
            return sum(q.retry_dead(ids) for q in parts)
        k = self.keys
        moved = 0
        scripts = self.clients.sync_scripts
        todo = [_id_bytes(i) for i in (ids if ids is not None else self.dead_ids())]
        for start in range(0, len(todo), PAGE):
            page = todo[start : start + PAGE]
            recs = self.clients.redis.hmget(k.dead_jobs, page)
            pairs: list[tuple[str | bytes, bytes]] = []
            for jid, data in zip(page, recs, strict=True):
                if not isinstance(data, bytes):
                    continue
                raw = codec.decode_dead_record(data).get("raw", b"")
                entry = codec.reset_attempt(raw) if isinstance(raw, bytes) else None
                if entry is not None:
                    pairs.append((jid, entry))
            if pairs:
                moved += int(scripts.call(calls.redrive(k, pairs)))
        if moved:
            self.clients.register_queue(self.name)
        return moved

    def purge_dead(self, ids: list[str] | None = None) -> int:
        """Delete dead jobs (all, or the given ids). Returns how many were deleted."""
        parts = self.shards()
        if len(parts) > 1:
            return sum(q.purge_dead(ids) for q in parts)
        k = self.keys
        r = self.clients.redis
        if ids is None:
            n = int(r.zcard(k.dead))
            r.delete(k.dead, k.dead_jobs)
            return n
        n = 0
        for start in range(0, len(ids), PAGE):
            page = [_id_bytes(i) for i in ids[start : start + PAGE]]
            pipe = r.pipeline(transaction=True)
            pipe.zrem(k.dead, *page)
            pipe.hdel(k.dead_jobs, *page)
            n += int(pipe.execute()[0])
        return n

    def trim_dead(self, retention: DeadRetention | None = None, *,
                  chunk: int = TRIM_CHUNK, max_chunks: int = TRIM_MAX_CHUNKS) -> int:
        """Apply the dead-letter retention (default: the app's): delete dead jobs older
        than ``max_age_s`` and, oldest first, those beyond ``max_count``, in calls of at
        most ``chunk`` jobs (``max_chunks`` calls at most). Returns how many were
        deleted."""
        parts = self.shards()
        if len(parts) > 1:
            return sum(q.trim_dead(retention, chunk=chunk, max_chunks=max_chunks)
                       for q in parts)
        ret = retention or self.app.dead_retention
        run = self.clients.sync_scripts.call
        removed = 0
        for _ in range(_check_chunks(chunk, max_chunks)):
            n, more = run(ret.call(self.keys, chunk))
            removed += int(n)
            if not int(more):
                break
        return removed

    # --- control -----------------------------------------------------------------------

    def pause(self) -> None:
        """Workers stop taking jobs from this queue (every shard); enqueue still works."""
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in self.shards():
            pipe.set(q.keys.paused, str(int(time.time())))
        pipe.execute()

    def resume(self) -> None:
        """Workers take jobs from this queue (every shard) again."""
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in self.shards():
            pipe.delete(q.keys.paused)
            pipe.rpush(q.keys.wake, "1")
        pipe.execute()

    def is_paused(self) -> bool:
        """True when the queue (any of its shards) is paused."""
        pipe = self.clients.redis.pipeline(transaction=False)
        for q in self.shards():
            pipe.exists(q.keys.paused)
        return any(pipe.execute())

    def clear(self) -> None:
        """Delete every job of the queue (every shard) in every state, and its dead
        letters (its limits stay: see ``remove_limit``)."""
        for q in self.shards():
            # one DEL per shard: a shard's keys share one slot, shards do not
            self.clients.redis.delete(*q.keys.all())

    # --- flow control (batchq/flow/limits.py) -------------------------------------------------

    def limit(self, group: str | None = None, *, rate_per_s: float | None = None,
              burst: int | None = None, concurrency: int | None = None,
              max_pending: int | None = None, weight: float | None = None,
              max_per_minute: int | None = None, max_per_hour: int | None = None,
              max_per_day: int | None = None, max_per_month: int | None = None,
              tz: str | None = None) -> Limit:
        """Set the limit of the whole queue (``group`` None), of one group, or of every
        group without its own (``group="*"``); replaces the one there was. Kept in Redis:
        every worker applies it on its next fetch. See ``Limit`` for each field.

        A sharded queue keeps every group in one shard, so a group's limit (and ``"*"``)
        is written to every shard and stays exact; a limit of the whole queue (``group``
        None) is refused there (``ValueError``): each shard would apply it on its own."""
        lim = Limit(group, rate_per_s, burst, concurrency, max_pending, weight,
                    max_per_minute, max_per_hour, max_per_day, max_per_month, tz)
        parts = self.shards()
        if group is None and len(parts) > 1:
            raise ValueError(
                f"queue {self.name!r} is sharded ({len(parts)} shards): a limit of the "
                "whole queue (group=None) cannot be kept exact across shards; limit its "
                "groups (group=... or group='*') instead")
        for q in parts[1:]:
            windows.set_limit(self.clients.redis, q.keys, lim)
        return windows.set_limit(self.clients.redis, self.keys, lim)

    def limits(self) -> list[Limit]:
        """The queue's limits: the queue's own first, then ``"*"``, then groups (shard 0's;
        written to every shard alike). Extends calendar boundaries running low."""
        for q in self.shards():
            windows.refresh(self.clients.redis, q.keys)
        return limits.limits(self.clients.redis, self.keys)

    def window(self, group: str | None = None, *, hours: str | Sequence[str],
               days: str | Sequence[str] = "daily", tz: str | None = None,
               holidays: Iterable[date | str] | None = None) -> Window:
        """Start jobs of ``group`` (``"*"``, None: the queue) only inside ``hours`` on
        ``days`` in ``tz``, never on ``holidays``, queued jobs too (``batchq/flow/windows.py``)."""
        w = windows.make_window(group, hours, days, tz, holidays)
        return windows.set_window(self.clients.redis, [q.keys for q in self.shards()], w)

    def windows(self) -> list[Window]:
        """The queue's send windows: the queue's own first, then ``"*"``, then groups."""
        return windows.read(self.clients.redis, self.keys)[1]

    def remove_window(self, group: str | None = None) -> bool:
        """Drop the window of the queue (``group`` None), ``"*"`` or a group; True if any."""
        return any([windows.remove_window(self.clients.redis, q.keys, group)
                    for q in self.shards()])

    def remove_limit(self, group: str | None = None) -> bool:
        """Drop the limit of the queue (``group`` None) or of a group; True if there
        was one."""
        had = [windows.remove_limit(self.clients.redis, q.keys, group) for q in self.shards()]
        return any(had)

    def groups(self, limit: int = 100) -> list[GroupState]:
        """Groups with ready jobs and their flow state (bounded by ``limit``; of a
        sharded queue, up to ``limit`` from each shard, at most ``limit`` in all)."""
        out = [g for q in self.shards() for g in limits.groups(self.clients.redis, q.keys,
                                                                 limit)]
        return out[:limit]

    def hold(self, seconds: float, group: str | None = None) -> float:
        """Start no job of ``group`` (or of the queue: every shard) for ``seconds``, as a
        handler's ``RateLimited`` does (its reason: ``"operator"``); a longer hold
        already set is kept. Returns the seconds left of the hold in force; ``release``
        lifts it."""
        return max(limits.hold(self.clients.sync_scripts, q.keys, seconds, group)
                   for q in self.shards())

    def release(self, group: str | None = None) -> float:
        """Lift the hold of ``group`` (or of the whole queue; every shard) now, whoever
        set it (``hold`` or a handler's ``RateLimited``), and wake an idle worker: held
        jobs start at once. Returns the seconds the hold had left (0.0: none)."""
        return max((limits.release(self.clients.sync_scripts, q.keys, group)
                    for q in self.shards()), default=0.0)

    def events(self, enabled: bool = True, *, max_len: int = events_.DEFAULT_MAX_LEN,
               max_age_s: float = events_.DEFAULT_MAX_AGE_S) -> None:
        """Turn the queue's job events on (every shard; kept: about ``max_len`` events,
        none older than ``max_age_s``, 0: no age limit) or off (``events(False)``). Stored
        in Redis: every worker applies it on its next call. See ``batchq.ops.events``."""
        for q in self.shards():
            events_.configure(self.clients.redis, q.keys, enabled, max_len, max_age_s)

    def events_config(self) -> events_.EventsConfig:
        """The queue's events setting (shard 0's)."""
        return events_.config(self.clients.redis, self.keys)

    def holds(self) -> Holds:
        """What holds the queue now (``limits.Holds``: a hold of the whole queue, its
        reason, groups held); ``is_paused`` says whether it is paused."""
        parts = [limits.holds(self.clients.redis, q.keys) for q in self.shards()]
        top = max(parts, key=lambda h: h.queue_s)
        return Holds(top.queue_s, top.queue_why, sum(h.groups for h in parts))


class _Shard(Queue):
    """One shard of a sharded queue: the single-queue operations on its own keys."""

    def __init__(self, queue: Queue, name: str) -> None:
        super().__init__(queue.app, name)

    def shards(self) -> list[Queue]:
        return [self]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _check_chunks(chunk: int, max_chunks: int) -> int:
    codec.check_int("chunk", chunk, 1, 5000)  # Lua's unpack() takes about 8,000 values
    return codec.check_int("max_chunks", max_chunks, 1, 1_000_000)


async def atrim_dead(app: QueueOwner, queue: str, retention: DeadRetention | None = None,
                     *, chunk: int = TRIM_CHUNK, max_chunks: int = TRIM_MAX_CHUNKS) -> int:
    """``Queue.trim_dead`` for asyncio code (the worker calls it now and then): the
    dead-letter retention of one queue over the running loop's client."""
    ret = retention or app.dead_retention
    k = app.clients.keys(queue)
    scripts = app.clients.async_scripts()
    removed = 0
    for _ in range(_check_chunks(chunk, max_chunks)):
        n, more = await scripts.call(ret.call(k, chunk))
        removed += int(n)
        if not int(more):
            break
    return removed
