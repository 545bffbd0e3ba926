"""Replica-acknowledged writes: ``WAIT`` (or ``WAITAOF``) after a write, on its connection.

Redis replicates asynchronously: a failover loses what the old primary acknowledged but
had not sent yet. ``App(min_replicas=N)`` makes every enqueue (and every flush of a
worker's acks) wait until N replicas hold it: the script calls and a ``WAIT N timeout``
go in one pipeline, so they share a connection (``WAIT`` counts the replicas that reached
the last write *of its own connection*). Calls that hit NOSCRIPT did not run: their
scripts are loaded and they go again with a ``WAIT`` of their own, which, the
replication stream being ordered, covers the first round's writes too.

``replica_fsync=True`` sends ``WAITAOF 0 N timeout`` instead: the replicas have written
the change to their append-only file, not only received it (Redis 7.2+, Valkey 8+). A
server without it is a clear ``ValueError``, not a silent downgrade.

Redis Cluster is refused for now: a ``WAIT`` must go to the node that took the write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from .connection import RedisSettings, redact
from .scripts import _Lua, load_async, load_sync

log = logging.getLogger("batchq.replicas")

SHORT_LOG_S = 10.0
"""At most one warning this often (per process) about writes too few replicas confirmed."""

_short_logged = [-SHORT_LOG_S]

MAX_ROUNDS = 3
"""Pipelines one replicated write takes at most (a script missing after a failover or a
restart costs one more; missing again right after the load would be a third failover)."""


Item = tuple[_Lua, Sequence[Any], Sequence[Any]]
"""One script call: the script (``scripts.SyncScript`` / ``AsyncScript``), keys, args."""


@dataclass(frozen=True)
class Durability:
    """How many replicas must hold a write, and for how long to wait for them."""

    min_replicas: int = 0
    timeout_ms: int = 1000
    fsync: bool = False

    def __post_init__(self) -> None:
        check_min_replicas(self.min_replicas)
        if type(self.timeout_ms) is not int or not 0 < self.timeout_ms <= 600_000:
            raise ValueError(f"replica_timeout_ms must be an int of 1..600000 ms, got "
                             f"{self.timeout_ms!r}")
        if type(self.fsync) is not bool:
            raise ValueError(f"replica_fsync must be True or False, got {self.fsync!r}")

    @property
    def command(self) -> tuple[Any, ...]:
        if self.fsync:
            return ("WAITAOF", 0, self.min_replicas, self.timeout_ms)
        return ("WAIT", self.min_replicas, self.timeout_ms)

    def with_min(self, n: int | None) -> Durability:
        """This durability with a call's own ``min_replicas`` (None: the app's)."""
        if n is None or n == self.min_replicas:
            return self
        return Durability(n, self.timeout_ms, self.fsync)


def check_min_replicas(n: object) -> int:
    if type(n) is not int or not 0 <= n <= 100:
        raise ValueError(f"min_replicas must be an int of 0..100, got {n!r}")
    return n


def _acked(reply: Any, d: Durability) -> int:
    if isinstance(reply, BaseException):
        if d.fsync and "unknown command" in str(reply).lower():
            raise ValueError("replica_fsync=True needs WAITAOF (Redis 7.2+ or Valkey 8+); "
                             "this server does not have it") from reply
        raise reply
    if d.fsync:  # [local fsyncs, replica fsyncs]
        return int(reply[1])
    return int(reply)


def _round(items: Sequence[Item], todo: list[int], out: list[Any], d: Durability
           ) -> tuple[list[int], int]:
    """Record one round's replies in ``out``; (calls to run again, replicas acked)."""
    acked = _acked(out[-1], d)
    return [i for i, r in zip(todo, out[:-1], strict=True)
            if isinstance(r, redis.ResponseError) and items[i][0].missed(r)], acked


def run_sync(client: redis.Redis, items: Sequence[Item], d: Durability
             ) -> tuple[list[Any], int]:
    """Run the script calls ``items`` and a ``WAIT`` on one connection: (their replies,
    errors in place as ``run_pipeline`` gives them; replicas that confirmed)."""
    results: list[Any] = [None] * len(items)
    todo = list(range(len(items)))
    acked = 0
    for _ in range(MAX_ROUNDS):
        pipe: Any = client.pipeline(transaction=False)
        for i in todo:
            script, keys, args = items[i]
            pipe.execute_command(*script.command(keys, args))
        pipe.execute_command(*d.command)
        out = pipe.execute(raise_on_error=False)
        for i, r in zip(todo, out, strict=False):
            results[i] = r
        todo, acked = _round(items, todo, out, d)
        if not todo:
            break
        for script in {items[i][0].name: items[i][0] for i in todo}.values():
            load_sync(client, script)
    return results, acked


async def run_async(client: redis.asyncio.Redis, items: Sequence[Item], d: Durability
                    ) -> tuple[list[Any], int]:
    """``run_sync`` for asyncio."""
    results: list[Any] = [None] * len(items)
    todo = list(range(len(items)))
    acked = 0
    for _ in range(MAX_ROUNDS):
        pipe: Any = client.pipeline(transaction=False)
        for i in todo:
            script, keys, args = items[i]
            pipe.execute_command(*script.command(keys, args))
        pipe.execute_command(*d.command)
        out = await pipe.execute(raise_on_error=False)
        for i, r in zip(todo, out, strict=False):
            results[i] = r
        todo, acked = _round(items, todo, out, d)
        if not todo:
            break
        for script in {items[i][0].name: items[i][0] for i in todo}.values():
            await load_async(client, script)
    return results, acked


def replicas_present(client: redis.Redis) -> int:
    """Replicas connected to the primary now (``INFO replication``)."""
    info = client.info("replication")
    return int(info.get("connected_slaves", 0))


async def areplicas_present(client: redis.asyncio.Redis) -> int:
    info = await client.info("replication")
    return int(info.get("connected_slaves", 0))


def shortfall(d: Durability, acked: int, present: int | None) -> str:
    """The reason part of a ``NotReplicated`` message."""
    what = "wrote to their AOF" if d.fsync else "confirmed"
    found = f"; the primary has {present} connected replicas" if present is not None else ""
    return (f"{acked} of min_replicas={d.min_replicas} replicas {what} it within "
            f"{d.timeout_ms} ms{found}")


def warn_short(d: Durability, acked: int, what: str) -> None:
    """Log (at most every ``SHORT_LOG_S``) that ``what`` was written but confirmed by too
    few replicas: a worker's acks, which a failover may undo (the jobs then run again)."""
    now = time.monotonic()
    if acked < d.min_replicas and now - _short_logged[0] >= SHORT_LOG_S:
        _short_logged[0] = now
        log.warning("%s written, but %s", what, shortfall(d, acked, None))


def check_start(settings: RedisSettings, d: Durability) -> str | None:
    """Why a worker must not start with ``d`` (None: it may): ``min_replicas`` on a
    Cluster, or above the replicas the primary has now (the count found is in the
    message). Refusing at start beats a fleet whose every flush waits out the timeout."""
    if not d.min_replicas:
        return None
    where = redact(settings.url)
    if settings.cluster:
        return f"min_replicas={d.min_replicas} is not supported on Redis Cluster ({where})"
    client = settings.sync_client()
    try:
        present = replicas_present(client)
    finally:
        client.close()
    if present < d.min_replicas:
        return (f"min_replicas={d.min_replicas} but the primary at {where} has {present} "
                f"connected replicas; add replicas or lower min_replicas")
    return None
