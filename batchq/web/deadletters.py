"""Dead letters for the console: pages, a bounded search, and chunked bulk actions.

A queue may hold 100,000 dead jobs or more, so nothing here loads them all:

* a page is one ``ZREVRANGE`` (newest first) and one ``HMGET`` of its records;
* a search walks the store newest first in chunks of ``CHUNK`` records and stops after
  ``SEARCH_SCAN`` records per request, handing back a cursor to go on from;
* "retry all" and "purge all" move at most ``ACTION_MAX`` jobs per request, in chunks
  of ``CHUNK`` (each one short script call or transaction, so Redis is never pinned:
  bull#2357), and report what remains; the page repeats the request until nothing does.

The moves themselves are :meth:`batchq.ops.queue.Queue.retry_dead` (``redrive.lua``) and
:meth:`~batchq.ops.queue.Queue.purge_dead`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..ops.queue import DeadJob, Queue
    from ..tasks.app import App

CHUNK = 500
SEARCH_SCAN = 5_000
"""Records examined by one search request at most."""
ACTION_MAX = 5_000
"""Jobs retried or purged by one "all" request at most."""
MAX_IDS = 1_000
"""Ids one selection request may name."""
PAGE_MAX = 200
MESSAGE_CHARS = 300
"""The error text shown in a list row (the full text is on the job's page)."""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def summary(j: DeadJob) -> dict[str, Any]:
    """A list row: the same fields as ``batchq dead list --json``, the error cut short."""
    msg = j.error_message
    return {"id": j.id, "task": j.task, "reason": j.reason, "error_type": j.error_type,
            "error_message": msg if len(msg) <= MESSAGE_CHARS
            else msg[: MESSAGE_CHARS - 1] + "…",
            "attempts": j.attempts, "died_at": _iso(j.died_at)}


def full(j: DeadJob) -> dict[str, Any]:
    """The whole record, as ``batchq dead show --json``."""
    return {**summary(j), "error_message": j.error_message, "queue": j.queue,
            "args": j.args, "kwargs": j.kwargs, "traceback": j.traceback}


def _ids(app: App, q: Queue, start: int, stop: int) -> list[str]:
    return q.dead_range(start, stop)  # every shard of a sharded queue, newest first


def page(app: App, q: Queue, offset: int, limit: int) -> dict[str, Any]:
    """Dead jobs ``offset .. offset+limit`` counted from the newest."""
    total = q.dead_count()
    ids = _ids(app, q, offset, offset + limit - 1) if limit else []
    jobs = q.dead_jobs(ids)
    return {"queue": q.name, "total": total, "offset": offset, "limit": limit,
            "jobs": [summary(j) for j in jobs]}


def matches(j: DeadJob, needle: str) -> bool:
    """Case-insensitive match on the task name, the reason and the error text."""
    hay = "\n".join((j.task or "", j.reason, j.error_type, j.error_message)).lower()
    return needle in hay


def search(app: App, q: Queue, text: str, cursor: int, limit: int) -> dict[str, Any]:
    """Up to ``limit`` matches of ``text``, walking from rank ``cursor`` (newest first)
    over ``SEARCH_SCAN`` records at most. ``next_cursor`` is where to go on, ``None`` at
    the end of the store."""
    needle = text.lower()
    total = q.dead_count()
    found: list[dict[str, Any]] = []
    pos = cursor
    end = min(total, cursor + SEARCH_SCAN)
    while pos < end and len(found) < limit:
        ids = _ids(app, q, pos, min(end, pos + CHUNK) - 1)
        if not ids:
            break
        advance = len(ids)
        for j in q.dead_jobs(ids):
            if matches(j, needle):
                found.append(summary(j))
                if len(found) >= limit:
                    advance = ids.index(j.id) + 1  # go on after this record next time
                    break
        pos += advance
    return {"queue": q.name, "total": total, "q": text, "cursor": cursor,
            "scanned": pos - cursor, "next_cursor": pos if pos < total else None,
            "jobs": found}


def job(q: Queue, jid: str) -> dict[str, Any] | None:
    jobs = q.dead_jobs([jid])
    return full(jobs[0]) if jobs else None


def retry(app: App, q: Queue, ids: list[str] | None, skip: int = 0) -> dict[str, Any]:
    """Retry the given ids, or (``ids`` None) the next ``ACTION_MAX`` dead jobs, oldest
    first. Jobs that cannot run again (a malformed entry) stay dead; ``skip`` counts those
    already passed over, so the next request starts after them."""
    if ids is not None:
        return {"queue": q.name, "retried": q.retry_dead(ids),
                "remaining": q.dead_count(), "more": False}
    done = 0
    for _ in range(ACTION_MAX // CHUNK):
        raw = q.dead_range(skip, skip + CHUNK - 1, newest_first=False)
        chunk = [i.decode() if isinstance(i, bytes) else str(i) for i in raw]
        if not chunk:
            break
        moved = q.retry_dead(chunk)
        done += moved
        skip += len(chunk) - moved
    remaining = q.dead_count()
    return {"queue": q.name, "retried": done, "remaining": remaining, "skip": skip,
            "more": remaining > skip}


def purge(app: App, q: Queue, ids: list[str] | None) -> dict[str, Any]:
    """Delete the given ids, or (``ids`` None) the next ``ACTION_MAX`` dead jobs."""
    if ids is not None:
        return {"queue": q.name, "purged": q.purge_dead(ids),
                "remaining": q.dead_count(), "more": False}
    done = 0
    for _ in range(ACTION_MAX // CHUNK):
        raw = q.dead_range(0, CHUNK - 1, newest_first=False)
        chunk = [i.decode() if isinstance(i, bytes) else str(i) for i in raw]
        if not chunk:
            break
        done += q.purge_dead(chunk)
    remaining = q.dead_count()
    return {"queue": q.name, "purged": done, "remaining": remaining, "more": remaining > 0}
