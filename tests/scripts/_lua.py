"""Helpers shared by the Lua script tests: build entries, call pop, read the server clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from batchq import codec
from batchq.keys import QueueKeys
from batchq.scripts import SyncScripts


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


def enqueued(r: redis.Redis, k: QueueKeys) -> int:
    return int(r.hget(k.stats, "enqueued") or 0)


def _pop(s: SyncScripts, k: QueueKeys, want: int, lease: int, chunk: int) -> list[Any]:
    res: list[Any] = s.pop(
        [k.delayed, k.reserved, k.inflight, k.dead, k.dead_jobs, k.wake, k.paused, *k.ready],
        [want, lease, chunk])
    return res


def pop_reply(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
              chunk: int = 100) -> tuple[list[int], list[bytes]]:
    """pop.lua's whole reply: the seven counters and the popped jobs."""
    res = _pop(s, k, want, lease, chunk)
    return [int(x) for x in res[:7]], list(res[7:])


def pop(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
        chunk: int = 100) -> list[bytes]:
    """Only the jobs of pop.lua's reply."""
    return list(_pop(s, k, want, lease, chunk)[7:])
