"""Helpers shared by the Lua script tests: build entries, call pop, read the server clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from batchq import codec
from batchq.keys import QueueKeys
from batchq.scripts import SyncScripts, calls
from batchq.scripts.replies import PopReply, decode_pop_reply


def entry(jid: str, prio: int = 0, max_attempts: int = 3, attempt: int = 0,
          task: str = "t", args: Sequence[object] | None = None,
          kwargs: dict[str, Any] | None = None, ms: int = 1_700_000_000_000) -> bytes:
    """An encoded ready-list entry; ``args`` defaults to ``[jid]``, ``kwargs`` to ``{}``."""
    e = (codec.header(prio, max_attempts) + jid.encode() + b":"
         + codec.encode_body(task, [jid] if args is None else list(args),
                             {} if kwargs is None else kwargs, ms))
    return with_attempt(e, attempt) if attempt else e


def with_attempt(e: bytes, attempt: int) -> bytes:
    p, _, m, jid, body = e.split(b":", 4)
    return b":".join((p, b"%d" % attempt, m, jid, body))


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def ns_keys(r: redis.Redis, namespace: str) -> set[bytes]:
    return set(r.scan_iter(match=f"{namespace}:*", count=1000))


PIN = b":table"
"""The field that keeps the in-flight hash a hash table (``_lib.lua``), not a lease."""


def leases(r: redis.Redis, k: QueueKeys) -> dict[bytes, bytes]:
    """The in-flight hash, id -> leased entry, without its pin (a hash a test wrote by
    hand has none)."""
    got = r.hgetall(k.inflight)
    got.pop(PIN, None)
    return got


def enqueued(r: redis.Redis, k: QueueKeys) -> int:
    return int(r.hget(k.stats, "enqueued") or 0)


def _pop(s: SyncScripts, k: QueueKeys, want: int, lease: int, chunk: int) -> PopReply:
    return decode_pop_reply(s.call(calls.pop(k, want, lease, chunk)))


def pop_reply(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
              chunk: int = 100) -> tuple[list[int], list[bytes]]:
    """pop.lua's reply: the first seven numbers (now, next_due, next_deadline, promoted,
    reaped, expired, malformed) and the popped jobs (``crashed`` and the recovered
    positions: ``pop_marks``)."""
    r = _pop(s, k, want, lease, chunk)
    return [r.now, r.next_due, r.next_deadline, r.promoted, r.reaped, r.expired,
            r.malformed], r.jobs


def pop_marks(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
              chunk: int = 100) -> tuple[int, list[int], list[bytes]]:
    """(crashed, 1-based positions of recovered jobs, jobs) of one pop."""
    r = _pop(s, k, want, lease, chunk)
    return r.crashed, r.recovered, r.jobs


def pop(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
        chunk: int = 100) -> list[bytes]:
    """Only the jobs of pop.lua's reply."""
    return _pop(s, k, want, lease, chunk).jobs


def refunded(e: bytes, attempt: int, times: int = 1) -> bytes:
    """``e`` with ``attempt`` and its max_attempts raised by ``times``: how the reaper
    refunds the attempt of a job whose worker died before it was known to start."""
    p, _, m, jid, body = e.split(b":", 4)
    return b":".join((p, b"%d" % attempt, b"%d" % (int(m) + times), jid, body))
