"""The Lua scripts, one atomic operation per file, loaded once per process.

Every script gets the library definitions it uses prepended (time from the server, the
job header parser, the dead-record writer...; ``library.library_for``): ``_lib.lua`` and
the topic include files of ``LIBRARY``.

**Functions first.** On a server with Redis Functions (Redis 7.0+, Valkey) each script is
its own function library (``library.function_library``), named after the script and the
SHA1 of its text (``batchq_pop_<sha>``: two batchq versions on one server never call each
other's code), and called with ``FCALL``. A library's definitions run once, at load; an
``EVALSHA`` runs the script's whole text per call, every ``local function`` a closure
made again (an empty pop: 28 µs of server time by EVALSHA, 17 by FCALL). A function the
server does not know (``Function not found``: a restarted server without persistence, a
new node) is loaded with ``FUNCTION LOAD`` and called once more: the error means it did
not run, so the retry cannot apply it twice. A server without ``FCALL`` or ``FUNCTION
LOAD`` (Redis 6.2, a command renamed or denied by an ACL) turns functions off for the
client's scripts, which go on by ``EVALSHA``. Cluster clients use ``EVALSHA`` (redis-py
asks a node for an ``FCALL``'s keys on every call, where it reads an ``EVALSHA``'s
itself); ``BATCHQ_FUNCTIONS=0`` in the environment turns functions off everywhere.

**EVALSHA**: on NOSCRIPT (a restarted or failed-over server), SCRIPT LOAD and one retry.
Inside pipelines scripts are queued as plain ``FCALL`` / ``EVALSHA`` commands (no SCRIPT
EXISTS round trip per pipeline, unlike redis-py's ``Script``); ``run_pipeline`` /
``arun_pipeline`` re-run just the commands that missed their script.

A managed Redis may refuse ``SCRIPT LOAD`` (the ``SCRIPT`` command renamed or denied by
an ACL). A script whose load is refused, or whose NOSCRIPT outlives its load (a proxy
that sends each command to another node), runs once through ``EVAL`` with its full
source, which also puts it in the server's script cache: the calls after it are EVALSHA
again. A refused load is remembered per script, so it is not tried again.

Each script's KEYS order lives in ``calls.py`` (one typed builder per script); run a
built call with ``scripts.call(c)``. The FCALL/EVALSHA logic is an I/O-free core
(``_Lua.command``, ``_Lua.missed``, ``_reruns``) with thin sync and async shells.

Cluster clients: a cluster pipeline routes each queued EVALSHA by its keys (one slot: all
keys of a queue share a hash tag), ``SCRIPT LOAD`` on a cluster client goes to every
primary, and the re-run ``evalsha`` is routed by key to its node.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Generator, Iterable, Sequence
from functools import cached_property
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
from redis.client import Pipeline as SyncPipeline
from redis.cluster import ClusterPipeline as SyncClusterPipeline
from redis.exceptions import NoScriptError

from ..lane import AsyncLane, SyncLane, async_lane, sync_lane
from .calls import Call
from .library import (
    LIBRARY,
    NAMES,
    _library,
    definitions,
    function_library,
    include,
    library_for,
    source,
)

__all__ = ["LIBRARY", "NAMES", "AsyncScript", "AsyncScripts", "Mode", "SyncScript", "SyncScripts",
           "_library", "arun_pipeline", "definitions", "fcall_missed", "function_library",
           "include", "library_for", "load_async", "load_sync", "run_pipeline", "source"]

_CALLS = "_batchq_calls"

_SYNC_PIPELINES = (SyncPipeline, SyncClusterPipeline)
_ASYNC_PIPELINES = (AsyncPipeline, AsyncClusterPipeline)
_CLUSTERS = (redis.RedisCluster, redis.asyncio.RedisCluster)

# --- the I/O-free core -----------------------------------------------------------------


class Mode:
    """How one client's scripts are called: ``functions`` (FCALL) until the server shows
    it has none (then EVALSHA, for good)."""

    __slots__ = ("functions",)

    def __init__(self, client: Any) -> None:
        self.functions = (not isinstance(client, _CLUSTERS)
                          and os.environ.get("BATCHQ_FUNCTIONS", "1") != "0")


MISSING, UNAVAILABLE = "missing", "unavailable"


def fcall_missed(exc: BaseException) -> str | None:
    """What an error reply to an ``FCALL`` or ``FUNCTION LOAD`` says of functions:
    ``MISSING`` (the server does not know this function: load it), ``UNAVAILABLE``
    (the server has no functions, or the user may not call or load them), None (the
    function ran: a script error, not ours to handle). Only errors that mean the command
    did not run are the first two: an ACL refusal inside a running function names the
    command it refused, not ``fcall``."""
    if not isinstance(exc, redis.ResponseError):
        return None
    msg = str(exc).lower()
    if msg.startswith("function not found"):
        return MISSING
    head = msg[:64]
    if ("unknown command" in head and ("function" in head or "fcall" in head)) or \
            "'fcall' command" in msg or "'function|load' command" in msg:
        return UNAVAILABLE
    return None


def _exists(exc: redis.ResponseError) -> bool:
    """A ``FUNCTION LOAD`` of a library the server has (another process loaded it)."""
    return "already exists" in str(exc)


class _Lua:
    def __init__(self, name: str, mode: Mode | None = None) -> None:
        self.name = name
        self.mode = mode if mode is not None else Mode(None)

    # built at a script's first use: a process builds every script's wrapper at start
    # but calls only some of the scripts (a producer two or three)
    @cached_property
    def source(self) -> str:
        return source(self.name)

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()

    @cached_property
    def fname(self) -> str:
        """The script's function (and library) name: ``batchq_<name>_<sha>``."""
        return f"batchq_{self.name}_{self.sha}"

    @cached_property
    def library(self) -> str:
        """The script as a function library (``FUNCTION LOAD``)."""
        return function_library(self.name, self.fname)

    load_refused = False
    """The server refused this script's ``SCRIPT LOAD``: after NOSCRIPT, go to EVAL."""
    refusal: redis.ResponseError | None = None
    """That refusal."""

    def command(self, keys: Sequence[Any], args: Sequence[Any], way: str = ""
                ) -> tuple[Any, ...]:
        """One call's command: ``way`` (``FCALL`` or ``EVALSHA``), by default ``FCALL``
        while the client's mode says functions, else ``EVALSHA``."""
        if way == FCALL or (not way and self.mode.functions):
            return ("FCALL", self.fname, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def eval_command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVAL arguments of one call (the full source)."""
        return (self.source, len(keys), *keys, *args)

    def missed(self, exc: BaseException) -> bool:
        """Did a call miss its script (it did not run, so running it again is safe)?
        ``UNAVAILABLE`` turns functions off for the client's scripts. An FCALL's reply
        is classed whatever the mode is now: in a pipeline, the reply read before it may
        have turned functions off."""
        if isinstance(exc, NoScriptError):
            return True
        what = fcall_missed(exc)
        if what == UNAVAILABLE:
            self.mode.functions = False
        return what is not None

    def refused(self, exc: redis.ResponseError) -> None:
        """``SCRIPT LOAD`` answered ``exc`` (unknown command, NOPERM): use EVAL."""
        if not isinstance(exc, NoScriptError):
            self.load_refused = True
            self.refusal = exc

    def _queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        calls = getattr(pipe, _CALLS, None)
        if calls is None:
            calls = []
            setattr(pipe, _CALLS, calls)
        calls.append((self, keys, args))
        pipe.execute_command(*self.command(keys, args))


_Queued = tuple[_Lua, Sequence[Any], Sequence[Any]]


def _reruns(pipe: Any, results: list[Any]) -> list[tuple[int, _Lua, bool, Sequence[Any],
                                                         Sequence[Any]]]:
    """The pipelined calls that missed their script: (position, script, load it first?,
    keys, args); each script is loaded once (on a cluster: on every primary). Clears the
    pipeline's record of queued scripts."""
    calls: list[_Queued] = getattr(pipe, _CALLS, [])
    setattr(pipe, _CALLS, [])
    out = []
    loaded: set[str] = set()
    for i, res in enumerate(results):
        if i < len(calls) and isinstance(res, redis.ResponseError) and calls[i][0].missed(res):
            script, keys, args = calls[i]
            out.append((i, script, script.name not in loaded, keys, args))
            loaded.add(script.name)
    return out


# --- sync and async shells -------------------------------------------------------------


FCALL, EVALSHA, EVAL = "FCALL", "EVALSHA", "EVAL"
"""How a script is called right after its load (``load_sync``)."""


def _function_loaded(script: _Lua, exc: redis.ResponseError | None) -> bool:
    """Is ``script``'s library on the server after ``FUNCTION LOAD`` answered ``exc``
    (None: loaded; "already exists": another process loaded it)? A server that refuses
    functions turns them off for the client; any other refusal (a server at
    ``maxmemory`` refuses ``FUNCTION LOAD``, not ``SCRIPT LOAD``) leaves them on, and
    this one call goes by EVALSHA."""
    if exc is None or _exists(exc):
        return True
    if fcall_missed(exc) == UNAVAILABLE:
        script.mode.functions = False
    return False


_Loads = Generator[tuple[str, str], "redis.ResponseError | None", str]


def _load_core(script: _Lua) -> _Loads:
    """The decisions of one load, I/O-free: yields (the client's method, its text) and
    gets back the ``ResponseError`` it raised (None: it worked); returns how to call the
    script now. ``FUNCTION LOAD`` while the client's mode says functions; else, or if
    that load fails, ``SCRIPT LOAD`` unless refused before; both refused: ``EVAL`` (the
    script is marked for it)."""
    if script.mode.functions and _function_loaded(
            script, (yield "function_load", script.library)):
        return FCALL
    if not script.load_refused:
        exc = yield "script_load", script.source
        if exc is None:
            return EVALSHA
        script.refused(exc)
    return EVAL


def load_sync(client: Any, script: _Lua) -> str:
    """Put ``script`` on the server (``_load_core``); returns how to call it now:
    ``FCALL``, ``EVALSHA`` or ``EVAL``. Errors other than a load's refusal raise."""
    core = _load_core(script)
    try:
        method, text = next(core)
        while True:
            try:
                getattr(client, method)(text)
                exc = None
            except redis.ResponseError as e:
                exc = e
            method, text = core.send(exc)
    except StopIteration as done:
        return str(done.value)


async def load_async(client: Any, script: _Lua) -> str:
    """``load_sync`` for asyncio."""
    core = _load_core(script)
    try:
        method, text = next(core)
        while True:
            try:
                await getattr(client, method)(text)
                exc = None
            except redis.ResponseError as e:
                exc = e
            method, text = core.send(exc)
    except StopIteration as done:
        return str(done.value)


class SyncScript(_Lua):
    """A script bound to a synchronous client: ``script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.Redis, lane: SyncLane | None = None,
                 mode: Mode | None = None) -> None:
        super().__init__(name, mode if mode is not None else Mode(client))
        self.client = client
        self.lane = lane
        """The client's fast lane (``lane.py``), shared by the scripts of one client."""

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                 client: redis.Redis | SyncPipeline | SyncClusterPipeline | None = None,
                 ) -> Any:
        c = client if client is not None else self.client
        if isinstance(c, _SYNC_PIPELINES):
            self._queue(c, keys, args)
            return c
        run = self.lane.execute if self.lane is not None and c is self.client \
            else c.execute_command
        try:
            return run(*self.command(keys, args))
        except redis.ResponseError as exc:
            # the script did not run, so running it again cannot apply it twice
            if not self.missed(exc):
                raise
        way = load_sync(c, self)
        if way != EVAL:
            try:
                return run(*self.command(keys, args, way))
            except redis.ResponseError as exc:
                if not self.missed(exc):
                    raise
        return run("EVAL", *self.eval_command(keys, args))


class AsyncScript(_Lua):
    """A script bound to an asyncio client: ``await script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.asyncio.Redis,
                 lane: AsyncLane | None = None, mode: Mode | None = None) -> None:
        super().__init__(name, mode if mode is not None else Mode(client))
        self.client = client
        self.lane = lane
        """The client's fast lane (``lane.py``), shared by the scripts of one client."""

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = (),
                       client: redis.asyncio.Redis | AsyncPipeline | AsyncClusterPipeline
                       | None = None) -> Any:
        c = client if client is not None else self.client
        if isinstance(c, _ASYNC_PIPELINES):
            self._queue(c, keys, args)
            return c
        run = self.lane.execute if self.lane is not None and c is self.client \
            else c.execute_command
        try:
            return await run(*self.command(keys, args))
        except redis.ResponseError as exc:
            if not self.missed(exc):
                raise
        way = await load_async(c, self)
        if way != EVAL:
            try:
                return await run(*self.command(keys, args, way))
            except redis.ResponseError as exc:
                if not self.missed(exc):
                    raise
        return await run("EVAL", *self.eval_command(keys, args))


def _rerun(client: redis.Redis, script: _Lua, keys: Sequence[Any],
           args: Sequence[Any], way: str) -> Any:
    """One pipelined call that missed its script, after its load: the ``way`` the load
    gave, and EVAL if that misses again (unknown where the call runs: send the source)."""
    if way != EVAL:
        try:
            return client.execute_command(*script.command(keys, args, way))  # type: ignore[no-untyped-call]
        except redis.ResponseError as exc:
            if not script.missed(exc):
                raise
    return client.eval(*script.eval_command(keys, args))


async def _arerun(client: redis.asyncio.Redis, script: _Lua, keys: Sequence[Any],
                  args: Sequence[Any], way: str) -> Any:
    """``_rerun`` for asyncio."""
    if way != EVAL:
        try:
            return await client.execute_command(*script.command(keys, args, way))  # type: ignore[no-untyped-call]
        except redis.ResponseError as exc:
            if not script.missed(exc):
                raise
    return await client.eval(*script.eval_command(keys, args))


def run_pipeline(pipe: SyncPipeline | SyncClusterPipeline, client: redis.Redis) -> list[Any]:
    """Execute a pipeline of queued scripts (``raise_on_error=False``); commands that
    missed their script are loaded and run again one by one. Other errors come back in
    place."""
    results: list[Any] = pipe.execute(raise_on_error=False)
    ways: dict[str, str] = {}
    for i, script, load, keys, args in _reruns(pipe, results):
        try:
            if load:
                ways[script.name] = load_sync(client, script)
            results[i] = _rerun(client, script, keys, args, ways[script.name])
        except redis.ResponseError as exc:
            results[i] = exc
    return results


async def arun_pipeline(pipe: AsyncPipeline | AsyncClusterPipeline,
                        client: redis.asyncio.Redis) -> list[Any]:
    """``run_pipeline`` for asyncio."""
    results: list[Any] = await pipe.execute(raise_on_error=False)
    ways: dict[str, str] = {}
    for i, script, load, keys, args in _reruns(pipe, results):
        try:
            if load:
                ways[script.name] = await load_async(client, script)
            results[i] = await _arerun(client, script, keys, args, ways[script.name])
        except redis.ResponseError as exc:
            results[i] = exc
    return results


class SyncScripts:
    """Every script bound to a synchronous client; run a call built by ``calls``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        lane = sync_lane(client)
        self.mode = Mode(client)
        self.by_name = {n: SyncScript(n, client, lane, self.mode) for n in NAMES}

    def call(self, c: Call,
             client: redis.Redis | SyncPipeline | SyncClusterPipeline | None = None) -> Any:
        """Run a call built by ``calls`` (queued, when ``client`` is a pipeline)."""
        return self.by_name[c.script](c.keys, c.args, client=client)


class AsyncScripts:
    """Every script bound to an asyncio client; run a call built by ``calls``."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        lane = async_lane(client)
        self.mode = Mode(client)
        self.by_name = {n: AsyncScript(n, client, lane, self.mode) for n in NAMES}

    async def call(self, c: Call, client: redis.asyncio.Redis | AsyncPipeline
                   | AsyncClusterPipeline | None = None) -> Any:
        """Run a call built by ``calls`` (queued, when ``client`` is a pipeline)."""
        return await self.by_name[c.script](c.keys, c.args, client=client)

    async def load(self, names: Iterable[str]) -> None:
        """Load the scripts ``names`` (``FUNCTION LOAD``, else ``SCRIPT LOAD``; on a
        Cluster, on every primary), so their first calls do not take the detour of a
        missing script: a worker's pop that is sent again can land behind a pop sent
        ahead of it, and its jobs would start after later ones. A refused script load
        marks every script to go through EVAL after NOSCRIPT, and is raised."""
        for name in names:
            script = self.by_name[name]
            await load_async(self.client, script)
            if script.refusal is not None:
                for other in self.by_name.values():
                    other.refused(script.refusal)
                raise script.refusal
