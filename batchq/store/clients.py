"""The per-process Redis clients of one app: the second stop of a job, after ``App``.

``Clients`` holds the plain settings until a client is asked for, then builds the sync
client (and its scripts), one asyncio client (and scripts, and ``aenqueue`` coalescer) per
event loop, and remembers which queues this process already put in the registry of
queues. Everything is dropped and rebuilt after a fork (the pid check), so a supervisor
can import an app and fork workers that never touch the parent's sockets.

``producer`` and ``queue`` take a ``Clients`` and never import ``app``: the import
graph is app -> producer/queue -> clients -> connection/scripts, with no circle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import redis
from redis.asyncio import Redis as AsyncRedis

from . import _twins
from .connection import RedisSettings
from .keys import QueueKeys, queues_key, shards_key, split_shard
from .replicas import Durability
from .scripts import AsyncScripts, SyncScripts
from .shards import ShardTable

if TYPE_CHECKING:
    from ..ops.otel import Tracing

T = TypeVar("T")


class Clients:
    """Lazy, fork-safe clients of one namespace. Thread-safe for the sync client."""

    def __init__(self, settings: RedisSettings, namespace: str,
                 max_payload_bytes: int = 1 << 20) -> None:
        self._settings = settings
        self.namespace = namespace
        self.max_payload_bytes = max_payload_bytes
        self._keys: dict[str, QueueKeys] = {}
        self._pid = -1
        self._sync: redis.Redis | None = None
        self._sync_scripts: SyncScripts | None = None
        self._async: dict[asyncio.AbstractEventLoop, tuple[AsyncRedis, AsyncScripts]] = {}
        # the aenqueue coalescer of each loop (it lives in producer, which imports this)
        self._per_loop: dict[asyncio.AbstractEventLoop, object] = {}
        self._registered: set[str] = set()
        self._lock = threading.Lock()
        self.shards = ShardTable()
        """The shard counts this app's queues are configured with (``batchq.store.shards``)."""
        self.otel: Tracing | None = None
        """The span hooks of ``batchq.ops.otel.instrument``; None: not traced (the producer
        and the worker check only that)."""
        self.durability = Durability()
        """How many replicas must hold a write (``App(min_replicas=...)``)."""

    @property
    def settings(self) -> RedisSettings:
        return self._settings

    @settings.setter
    def settings(self, value: RedisSettings) -> None:
        # new settings (the CLI's --redis-url): clients built from the old ones are
        # dropped, not closed, since another thread may still hold them; the Sentinels'
        # password given to the app stays unless the new settings carry their own
        if value.sentinel_password is None and self._settings.sentinel_password is not None:
            value = dataclasses.replace(value,
                                        sentinel_password=self._settings.sentinel_password)
        self._settings = value
        self._pid = -1
        self.check_fork()

    def keys(self, queue: str) -> QueueKeys:
        """The key names of ``queue`` (validates the name; cached)."""
        k = self._keys.get(queue)
        if k is None:
            k = self._keys[queue] = QueueKeys(self.namespace, queue)
        return k

    def check_fork(self) -> None:
        """Forget every client if this is not the process that built them."""
        if self._pid != os.getpid():
            # a forked child (or new settings): never touch the old sockets
            self._pid = os.getpid()
            self._sync = None
            self._sync_scripts = None
            self._async = {}
            self._per_loop = {}
            self._registered = set()

    # --- sync --------------------------------------------------------------------------

    @property
    def redis(self) -> redis.Redis:
        """The synchronous client of this process."""
        self.check_fork()
        if self._sync is None:
            with self._lock:
                if self._sync is None:
                    self._sync = self._settings.sync_client()
        return self._sync

    @property
    def sync_scripts(self) -> SyncScripts:
        client = self.redis  # runs the fork check first
        if self._sync_scripts is None or self._sync_scripts.client is not client:
            self._sync_scripts = SyncScripts(client)
        return self._sync_scripts

    def register_queue(self, queue: str) -> None:
        """Record the queue name in the namespace's registry (once per process)."""
        _twins.run(self.registering(queue))

    def registering(self, queue: str) -> _twins.Core[None]:
        """The core of ``register_queue`` / ``aregister_queue``."""
        self.check_fork()
        if queue not in self._registered:
            base, k = split_shard(queue)
            if k:  # a shard: the registry names its queue, the shard registry its index
                yield _twins.Pipeline(self, [
                    ("sadd", (queues_key(self.namespace), base), {}),
                    ("zadd", (shards_key(self.namespace), self._shard_count(base, k)),
                     {"gt": True})])
            else:
                yield _twins.Command(self, "sadd", queues_key(self.namespace), queue)
            self._registered.add(queue)

    def _shard_count(self, base: str, k: int) -> dict[str, int]:
        """The shard registry's entry for a write to shard ``k``: the count this process
        is configured with (every shard it may write to), at least ``k + 1``."""
        return {base: max(k + 1, self.shards.count(base))}

    def close(self) -> None:
        """Close the synchronous client (asyncio clients close with ``aclose``)."""
        if self._sync is not None:
            self._sync.close()
            self._sync = None
            self._sync_scripts = None

    # --- asyncio -----------------------------------------------------------------------

    def _async_pair(self) -> tuple[AsyncRedis, AsyncScripts]:
        self.check_fork()
        loop = asyncio.get_running_loop()
        pair = self._async.get(loop)
        if pair is None:
            for old in [lp for lp in self._async if lp.is_closed()]:
                del self._async[old]
            client = self._settings.async_client()
            pair = self._async[loop] = (client, AsyncScripts(client))
        return pair

    def async_redis(self) -> AsyncRedis:
        """The asyncio client of the running event loop (one per loop)."""
        return self._async_pair()[0]

    def async_scripts(self) -> AsyncScripts:
        """The scripts bound to the running loop's asyncio client."""
        return self._async_pair()[1]

    def per_loop(self, factory: Callable[[], T]) -> T:
        """One object per running event loop, made by ``factory()`` on first use (the
        ``aenqueue`` coalescer, the only user); dropped with the loop and after a fork."""
        self.check_fork()
        loop = asyncio.get_running_loop()
        obj = self._per_loop.get(loop)
        if obj is None:
            for old in [lp for lp in self._per_loop if lp.is_closed()]:
                del self._per_loop[old]
            obj = self._per_loop[loop] = factory()
        return cast(T, obj)

    async def aregister_queue(self, queue: str) -> None:
        """``register_queue`` over the running loop's client."""
        await _twins.arun(self.registering(queue))

    async def aclose(self) -> None:
        """Close the asyncio client of the running loop."""
        pair = self._async.pop(asyncio.get_running_loop(), None)
        if pair is not None:
            await pair[0].aclose()
