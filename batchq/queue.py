"""``Queue``: what an operator asks of one queue — counts, the dead-letter store, pause."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import codec
from .scripts import calls

if TYPE_CHECKING:
    from .app import App

PAGE = 500


@dataclass(frozen=True)
class QueueStats:
    """Job counts of one queue by state; ``oldest_age_s`` is how long the oldest ready job
    has been waiting since it was enqueued (or came due), 0 when none is waiting."""

    ready: int
    delayed: int
    reserved: int
    dead: int
    paused: bool = False
    oldest_age_s: float = 0.0
    ready_by_priority: dict[int, int] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        """Jobs not finished yet: ready + delayed + reserved."""
        return self.ready + self.delayed + self.reserved


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
    """Inspection and dead-letter operations on one queue (synchronous)."""

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = name
        self.keys = app.keys(name)

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, namespace={self.app.namespace!r})"

    def stats(self) -> QueueStats:
        k = self.keys
        pipe = self.app.redis.pipeline(transaction=False)
        for key in k.ready:
            pipe.llen(key)
        pipe.zcard(k.delayed)
        pipe.zcard(k.reserved)
        pipe.zcard(k.dead)
        pipe.exists(k.paused)
        for key in k.ready:
            pipe.lindex(key, 0)
        # TIME by name: a cluster pipeline refuses pipe.time()
        pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
        res = pipe.execute()
        n = len(k.ready)
        ready = res[:n]
        delayed, reserved, dead, paused = res[n : n + 4]
        heads = res[n + 4 : 2 * n + 4]
        sec, usec = res[-1]
        now_ms = int(sec) * 1000 + int(usec) // 1000
        oldest = 0.0
        for head in heads:
            if head:
                try:
                    enq = codec.decode_entry(head, self.name).ready_ms
                except codec.DecodeError:
                    continue
                oldest = max(oldest, (now_ms - enq) / 1000)
        return QueueStats(
            ready=sum(ready),
            delayed=delayed,
            reserved=reserved,
            dead=dead,
            paused=bool(paused),
            oldest_age_s=oldest,
            ready_by_priority={9 - i: c for i, c in enumerate(ready) if c},
        )

    # --- dead letters ------------------------------------------------------------------

    def dead_ids(self, limit: int | None = None) -> list[str]:
        """Dead-lettered job ids, oldest first."""
        end = -1 if limit is None else limit - 1
        ids = self.app.redis.zrange(self.keys.dead, 0, end)
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]

    def dead_jobs(self, ids: list[str] | None = None, limit: int | None = None) -> list[DeadJob]:
        """Dead-lettered jobs (all, the given ids, or the oldest ``limit``), oldest first."""
        if ids is None:
            ids = self.dead_ids(limit)
        out: list[DeadJob] = []
        for start in range(0, len(ids), PAGE):
            page = ids[start : start + PAGE]
            pipe = self.app.redis.pipeline(transaction=False)
            pipe.hmget(self.keys.dead_jobs, page)
            for i in page:
                pipe.zscore(self.keys.dead, i)
            res = pipe.execute()
            for jid, rec, score in zip(page, res[0], res[1:], strict=True):
                if rec is not None:
                    out.append(self._dead_job(jid, rec, score or 0.0))
        return out

    def _dead_job(self, jid: str, data: bytes, score: float) -> DeadJob:
        rec = codec.decode_dead_record(data)
        raw = rec.get("raw", b"")
        task: str | None = None
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        attempts = 0
        try:
            job = codec.decode_entry(raw, self.name)
            task, args, kwargs, attempts = job.task, list(job.args), dict(job.kwargs), job.attempt
        except codec.DecodeError:
            with contextlib.suppress(codec.DecodeError):
                attempts = codec.parse_header(raw)[1]
        return DeadJob(
            id=jid,
            queue=self.name,
            task=task,
            args=args,
            kwargs=kwargs,
            attempts=attempts,
            reason=str(rec.get("reason", "")),
            error_type=str(rec.get("error_type", "")),
            error_message=str(rec.get("error_message", "")),
            traceback=str(rec.get("traceback", "")),
            died_at=score / 1000,
            raw=raw,
        )

    def retry_dead(self, ids: list[str] | None = None) -> int:
        """Move dead jobs (all, or the given ids) back to ready with fresh attempts.

        Jobs whose bytes are not a batchq job (reason ``decode_error`` with a malformed
        header) cannot run and stay in the store. Returns how many were moved.
        """
        k = self.keys
        moved = 0
        scripts = self.app.sync_scripts
        todo = ids if ids is not None else self.dead_ids()
        for start in range(0, len(todo), PAGE):
            page = todo[start : start + PAGE]
            recs = self.app.redis.hmget(k.dead_jobs, page)
            pairs: list[tuple[str, bytes]] = []
            for jid, data in zip(page, recs, strict=True):
                if not isinstance(data, bytes):
                    continue
                entry = codec.reset_attempt(codec.decode_dead_record(data).get("raw", b""))
                if entry is not None:
                    pairs.append((jid, entry))
            if pairs:
                moved += int(scripts.call(calls.redrive(k, pairs)))
        if moved:
            self.app.register_queue(self.name)
        return moved

    def purge_dead(self, ids: list[str] | None = None) -> int:
        """Delete dead jobs (all, or the given ids). Returns how many were deleted."""
        k = self.keys
        r = self.app.redis
        if ids is None:
            n = int(r.zcard(k.dead))
            r.delete(k.dead, k.dead_jobs)
            return n
        n = 0
        for start in range(0, len(ids), PAGE):
            page = ids[start : start + PAGE]
            pipe = r.pipeline(transaction=True)
            pipe.zrem(k.dead, *page)
            pipe.hdel(k.dead_jobs, *page)
            n += int(pipe.execute()[0])
        return n

    # --- control -----------------------------------------------------------------------

    def pause(self) -> None:
        """Workers stop taking jobs from this queue; enqueue still works."""
        self.app.redis.set(self.keys.paused, str(int(time.time())))

    def resume(self) -> None:
        """Workers take jobs from this queue again."""
        pipe = self.app.redis.pipeline(transaction=False)
        pipe.delete(self.keys.paused)
        pipe.rpush(self.keys.wake, "1")
        pipe.execute()

    def is_paused(self) -> bool:
        return bool(self.app.redis.exists(self.keys.paused))

    def clear(self) -> None:
        """Delete every job of the queue in every state, and its dead letters."""
        self.app.redis.delete(*self.keys.all())
