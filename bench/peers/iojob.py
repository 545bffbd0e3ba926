"""The job that does I/O (``bench peers --job io``): one Redis round trip per job.

Every system's ``io`` handler sends one pipeline of two commands (``SET`` a per-process
key, ``GET`` it back) and awaits the reply, on the handler's own client, the way an
application's handler touches its own Redis: an asyncio handler on a ``redis.asyncio``
client shared by the process, a synchronous one on a shared ``redis.Redis``. Only the
standard library and redis-py are imported: the peers' virtualenvs load this too.

``$BENCH_IO_CLIENT`` picks how an asyncio handler's client is made, for the
comparison of ways to touch Redis from a handler (``bench peers --io-client``):

* ``shared`` (default): one ``redis.asyncio.Redis.from_url(url)`` per process and
  loop (redis-py's pool: up to 100 connections, hiredis when installed);
* ``blocking``: the same with a ``BlockingConnectionPool`` of ``$BENCH_IO_POOL``
  connections (default 100), so a burst waits for a connection instead of opening one;
* ``per-job``: a client made and closed in every job (what not to do);
* ``batched``: the jobs of one loop share pipelines: a job's commands join the
  pipeline being filled, which is sent when the previous one returned (the recipe
  the docs gave before ``batchq.BatchingRedis``);
* ``batchq``: ``batchq.BatchingRedis(url)``, batchq's handle for handlers (the same
  sharing, on a connection of its own: ``batchq/tasks/handler_redis.py``). batchq's
  worker only: the peers' virtualenvs have no batchq.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import redis
import redis.asyncio

from bench import record

CLIENT_ENV = "BENCH_IO_CLIENT"
POOL_ENV = "BENCH_IO_POOL"
KINDS = ("shared", "blocking", "per-job", "batched", "batchq")

_sync: redis.Redis | None = None
_async: dict[Any, Any] = {}
_handle: Any = None  # the BatchingRedis of kind "batchq" (made on first use)


def _url() -> str:
    return os.environ.get(record.URL_ENV, "redis://127.0.0.1:6379/0")


def _key() -> str:
    return f"bench:io:{os.getpid()}"


def round_trip() -> None:
    """One pipelined ``SET`` + ``GET`` on the process's synchronous client."""
    global _sync
    if _sync is None:
        _sync = redis.Redis.from_url(_url())
    key = _key()
    pipe = _sync.pipeline(transaction=False)
    pipe.set(key, b"1")
    pipe.get(key)
    pipe.execute()


class _Batcher:
    """Jobs of one loop share pipelines: each waits for its pipeline's reply."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pending: list[tuple[str, asyncio.Future[Any]]] = []
        self.busy = False

    async def call(self, key: str) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((key, fut))
        if not self.busy:
            self.busy = True
            asyncio.get_running_loop().create_task(self._send())
        return await fut

    async def _send(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                pipe = self.client.pipeline(transaction=False)
                for key, _ in batch:
                    pipe.set(key, b"1")
                    pipe.get(key)
                try:
                    replies = await pipe.execute()
                except Exception as exc:  # every waiter sees the error
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for i, (_, fut) in enumerate(batch):
                    if not fut.done():
                        fut.set_result(replies[2 * i + 1])
        finally:
            self.busy = False


def _client(kind: str) -> Any:
    loop = asyncio.get_running_loop()
    got = _async.get(loop)
    if got is None:
        if kind == "blocking":
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                _url(), max_connections=int(os.environ.get(POOL_ENV, "100")))
            got = redis.asyncio.Redis(connection_pool=pool)
        else:
            got = redis.asyncio.Redis.from_url(_url())
        if kind == "batched":
            got = _Batcher(got)
        _async.clear()  # a client belongs to one loop
        _async[loop] = got
    return got


async def around_trip() -> None:
    """One pipelined ``SET`` + ``GET`` from an asyncio handler (``$BENCH_IO_CLIENT``)."""
    global _handle
    kind = os.environ.get(CLIENT_ENV, "shared")
    key = _key()
    if kind == "batchq":
        if _handle is None:
            import batchq  # not in the peers' virtualenvs: imported for this kind only

            _handle = batchq.BatchingRedis(_url())
        await _handle.execute_many(("SET", key, b"1"), ("GET", key))
        return
    if kind == "per-job":
        client = redis.asyncio.Redis.from_url(_url())
        try:
            pipe = client.pipeline(transaction=False)
            pipe.set(key, b"1")
            pipe.get(key)
            await pipe.execute()
        finally:
            await client.aclose()
        return
    got = _client(kind)
    if kind == "batched":
        await got.call(key)
        return
    pipe = got.pipeline(transaction=False)
    pipe.set(key, b"1")
    pipe.get(key)
    await pipe.execute()
