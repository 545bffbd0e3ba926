"""The Lua scripts, one atomic operation per file, loaded once per process.

Every script gets ``_lib.lua`` prepended (time from the server, the job header parser,
the dead-record writer). Calls use EVALSHA and, on NOSCRIPT (a restarted or failed-over
server), SCRIPT LOAD and one retry: a NOSCRIPT reply means the script did not run, so the
retry cannot apply it twice. Inside pipelines scripts are queued as plain EVALSHA
commands (no SCRIPT EXISTS round trip per pipeline, unlike redis-py's ``Script``);
``run_pipeline`` / ``arun_pipeline`` re-run just the commands that hit NOSCRIPT.

Cluster clients work the same way: a cluster pipeline routes each queued EVALSHA by its
keys (one slot: all keys of a queue share a hash tag), ``SCRIPT LOAD`` on a cluster
client goes to every primary, and the re-run ``evalsha`` is routed by key to its node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.client import Pipeline as SyncPipeline
from redis.cluster import ClusterPipeline as SyncClusterPipeline
from redis.exceptions import NoScriptError

NAMES = ("enqueue", "schedule", "pop", "ack", "nack", "release", "extend", "redrive",
         "lock_acquire", "lock_release", "lock_extend", "periodic_tick", "trim_dead")

_CALLS = "_batchq_calls"

_SYNC_PIPELINES = (SyncPipeline, SyncClusterPipeline)
_ASYNC_PIPELINES = (AsyncPipeline, AsyncClusterPipeline)


@cache
def source(name: str) -> str:
    """The full text of one script as sent to the server (library included)."""
    if name not in NAMES:
        raise KeyError(name)
    files = resources.files(__name__)
    lib = files.joinpath("_lib.lua").read_text(encoding="utf-8")
    body = files.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return lib + "\n" + body


class _Lua:
    def __init__(self, name: str) -> None:
        self.name = name
        self.source = source(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def _queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        calls = getattr(pipe, _CALLS, None)
        if calls is None:
            calls = []
            setattr(pipe, _CALLS, calls)
        calls.append((self, keys, args))
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


class SyncScript(_Lua):
    """A script bound to a synchronous client: ``script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.Redis) -> None:
        super().__init__(name)
        self.client = client

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                 client: redis.Redis | SyncPipeline | SyncClusterPipeline | None = None,
                 ) -> Any:
        c = client if client is not None else self.client
        if isinstance(c, _SYNC_PIPELINES):
            self._queue(c, keys, args)
            return c
        try:
            return c.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            c.script_load(self.source)
            return c.evalsha(self.sha, len(keys), *keys, *args)


class AsyncScript(_Lua):
    """A script bound to an asyncio client: ``await script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.asyncio.Redis) -> None:
        super().__init__(name)
        self.client = client

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                       client: redis.asyncio.Redis | AsyncPipeline | AsyncClusterPipeline
                       | None = None) -> Any:
        c = client if client is not None else self.client
        if isinstance(c, _ASYNC_PIPELINES):
            self._queue(c, keys, args)
            return c
        try:
            return await c.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await c.script_load(self.source)
            return await c.evalsha(self.sha, len(keys), *keys, *args)


def run_pipeline(pipe: SyncPipeline | SyncClusterPipeline, client: redis.Redis) -> list[Any]:
    """Execute a pipeline of queued scripts (``raise_on_error=False``); commands that
    hit NOSCRIPT are loaded and run again one by one. Other errors come back in place."""
    calls = getattr(pipe, _CALLS, [])
    results: list[Any] = pipe.execute(raise_on_error=False)
    loaded: set[str] = set()
    for i, res in enumerate(results):
        if isinstance(res, NoScriptError) and i < len(calls):
            script, keys, args = calls[i]
            if script.name not in loaded:  # once per script (a cluster: every primary)
                client.script_load(script.source)
                loaded.add(script.name)
            try:
                results[i] = client.evalsha(script.sha, len(keys), *keys, *args)
            except redis.ResponseError as exc:
                results[i] = exc
    setattr(pipe, _CALLS, [])
    return results


async def arun_pipeline(pipe: AsyncPipeline | AsyncClusterPipeline,
                        client: redis.asyncio.Redis) -> list[Any]:
    """``run_pipeline`` for asyncio."""
    calls = getattr(pipe, _CALLS, [])
    results: list[Any] = await pipe.execute(raise_on_error=False)
    loaded: set[str] = set()
    for i, res in enumerate(results):
        if isinstance(res, NoScriptError) and i < len(calls):
            script, keys, args = calls[i]
            if script.name not in loaded:
                await client.script_load(script.source)
                loaded.add(script.name)
            try:
                results[i] = await client.evalsha(
                    script.sha, len(keys), *keys, *args)
            except redis.ResponseError as exc:
                results[i] = exc
    setattr(pipe, _CALLS, [])
    return results


class SyncScripts:
    """The scripts bound to a synchronous client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.enqueue = SyncScript("enqueue", client)
        self.schedule = SyncScript("schedule", client)
        self.pop = SyncScript("pop", client)
        self.ack = SyncScript("ack", client)
        self.nack = SyncScript("nack", client)
        self.release = SyncScript("release", client)
        self.extend = SyncScript("extend", client)
        self.redrive = SyncScript("redrive", client)


class AsyncScripts:
    """The scripts bound to an asyncio client."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.enqueue = AsyncScript("enqueue", client)
        self.schedule = AsyncScript("schedule", client)
        self.pop = AsyncScript("pop", client)
        self.ack = AsyncScript("ack", client)
        self.nack = AsyncScript("nack", client)
        self.release = AsyncScript("release", client)
        self.extend = AsyncScript("extend", client)
        self.redrive = AsyncScript("redrive", client)
