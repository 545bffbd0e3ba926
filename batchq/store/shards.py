"""Sharded queues: one hot queue spread over several hash tags, so a Redis Cluster
spreads it over its nodes.

``@app.task(queue="emails", shards=8)`` (or ``app.queue("emails", shards=8)``) makes
"emails" 8 sub-queues: shard 0 is the queue ``emails`` itself, shard k > 0 the queue
``emails:s<k>`` (``keys.shard_name``; a user's queue name has no colon, so no shard
collides with a queue). Each shard is a complete queue with its own keys and scripts;
this module only decides which shard a write goes to, and which shards a reader or a
worker looks at:

* producers: ``enqueue_many`` spreads its chunks over the shards (the first chunk's
  shard rotates per call), a single enqueue rotates too; a job with a group goes to
  ``stable(group)``, a job with a dedup key to ``stable(key)``, so a group's limits and a
  key's uniqueness stay exact (both in one shard);
* the registry ``NS:shards`` (``keys.shards_key``: zset name -> the highest shard count
  any process wrote with, only raised) is written once per process and shard, at its
  first write there (``Clients.register_queue``), and by a worker configured with
  shards at its start, so a worker serving "emails" finds every shard that may hold
  jobs, also after the count was lowered (the old shards keep draining) or raised by
  another process (a running worker looks again every ``SHARDS_EVERY_S``);
* workers, ``Queue`` operations, ``batchq info`` and metrics expand a queue into
  ``names(base, count)`` with ``count`` = max(configured, registered) and report it as
  one queue.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from .keys import MAX_SHARDS, check_queue_name, shard_name, shards_key, split_shard

__all__ = ["MAX_SHARDS", "ShardTable", "aknown", "base_of", "check_shards", "known",
           "names", "shard_name", "split_shard", "stable"]


def check_shards(shards: object) -> int:
    """A shard count: an int 1..MAX_SHARDS."""
    if isinstance(shards, bool) or not isinstance(shards, int) or \
            not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer 1..{MAX_SHARDS}, got {shards!r}")
    return shards


def base_of(name: str) -> str:
    """The queue a (sub-)queue name belongs to: ``"emails:s3"`` -> ``"emails"``."""
    return split_shard(name)[0]


def names(base: str, count: int) -> list[str]:
    """The sub-queue names of ``base`` with ``count`` shards, shard 0 first."""
    return [shard_name(base, k) for k in range(max(1, count))]


def stable(text: str, count: int) -> int:
    """The shard a group or a dedup key always goes to (CRC-32: the same in every
    process and every Python, unlike ``hash``)."""
    if count <= 1:
        return 0
    return zlib.crc32(text.encode("utf-8", "surrogateescape")) % count


class ShardTable:
    """The shard counts one process was configured with (``@app.task(shards=)``,
    ``app.queue(name, shards=)``), and the per-process rotation of unkeyed writes."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._turn: dict[str, int] = {}

    def configure(self, base: str, shards: int) -> None:
        """Record ``shards`` for ``base``; refuses a second, different count."""
        check_queue_name(base)
        check_shards(shards)
        had = self.counts.get(base)
        if had is not None and had != shards:
            raise ValueError(f"queue {base!r} is already configured with shards={had}; "
                             f"got shards={shards} (one count per queue and app)")
        if shards > 1 or had is not None:
            self.counts[base] = shards

    def count(self, base: str) -> int:
        return self.counts.get(base, 1)

    def turn(self, base: str, count: int, step: int = 1) -> int:
        """The next shard in this process's rotation over ``base`` (``step``: how many
        turns the caller takes, e.g. one per chunk of an ``enqueue_many``)."""
        t = self._turn.get(base, _start())
        self._turn[base] = t + step
        return t % count


def _start() -> int:
    # processes start their rotation at different shards, so many short-lived producers
    # do not all write their first chunk to shard 0
    return os.getpid()


def _count(raw: Any) -> int:
    try:
        return max(1, min(MAX_SHARDS, int(float(raw))))
    except (TypeError, ValueError):
        return 1


def counts_of(bases: Sequence[str], reply: Any) -> dict[str, int]:
    """A ``ZMSCORE`` reply of the shard registry as counts (1: none registered)."""
    if not isinstance(reply, list):
        return dict.fromkeys(bases, 1)
    return {b: _count(r) if r is not None else 1 for b, r in zip(bases, reply, strict=True)}


def known(client: Any, namespace: str, bases: Sequence[str]) -> dict[str, int]:
    """The registered shard count of each queue (1 when none): one ``ZMSCORE``."""
    if not bases:
        return {}
    return counts_of(bases, client.zmscore(shards_key(namespace), list(bases)))


async def aknown(client: Any, namespace: str, bases: Sequence[str]) -> dict[str, int]:
    """``known`` over an asyncio client."""
    if not bases:
        return {}
    return counts_of(bases, await client.zmscore(shards_key(namespace), list(bases)))


def expand(bases: Iterable[str], configured: ShardTable, registered: dict[str, int]
           ) -> list[str]:
    """Every sub-queue of ``bases`` that may hold jobs: max(configured, registered)
    shards of each, grouped by queue (shard 0 first). A name that is already a shard
    (``-q emails:s3``) stays as it is."""
    out: list[str] = []
    for b in dict.fromkeys(bases):
        if split_shard(b)[1]:
            out.append(b)
            continue
        out.extend(names(b, max(configured.count(b), registered.get(b, 1))))
    return list(dict.fromkeys(out))
