"""The Lua scripts, one atomic operation per file, loaded once per process.

Every script gets the library definitions it uses prepended (time from the server, the
job header parser, the dead-record writer...; ``library_for``): ``_lib.lua`` and the topic
include files of ``LIBRARY``. Calls use EVALSHA and, on
NOSCRIPT (a restarted or failed-over server), SCRIPT LOAD and one retry: a NOSCRIPT reply
means the script did not run, so the retry cannot apply it twice. Inside pipelines
scripts are queued as plain EVALSHA commands (no SCRIPT EXISTS round trip per pipeline,
unlike redis-py's ``Script``); ``run_pipeline`` / ``arun_pipeline`` re-run just the
commands that hit NOSCRIPT.

A managed Redis may refuse ``SCRIPT LOAD`` (the ``SCRIPT`` command renamed or denied by
an ACL). A script whose load is refused, or whose NOSCRIPT outlives its load (a proxy
that sends each command to another node), runs once through ``EVAL`` with its full
source, which also puts it in the server's script cache: the calls after it are EVALSHA
again. A refused load is remembered per script, so it is not tried again.

Each script's KEYS order lives in ``calls.py`` (one typed builder per script); run a
built call with ``scripts.call(c)``. The EVALSHA/NOSCRIPT logic is an I/O-free core
(``_Lua.command``, ``_noscript_reruns``) with thin sync and async shells.

Cluster clients work the same way: a cluster pipeline routes each queued EVALSHA by its
keys (one slot: all keys of a queue share a hash tag), ``SCRIPT LOAD`` on a cluster
client goes to every primary, and the re-run ``evalsha`` is routed by key to its node.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from functools import cache, cached_property
from importlib import resources
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

NAMES = ("enqueue", "schedule", "pop", "ack", "nack", "release", "extend", "redrive",
         "start", "trim_dead", "lock_acquire", "lock_release", "lock_extend", "periodic_tick",
         "cancel", "ack_result", "status", "reserve",
         "load_open", "load_merge", "enqueue_tracked", "campaign_queue", "campaign_open",
         "campaign_join", "campaign_close", "campaign_finish", "enqueue_group", "hold",
         "gready_stats", "breaker_enter", "breaker_failure", "breaker_success",
         "breaker_set", "breaker_state", "reroute")

_CALLS = "_batchq_calls"

_SYNC_PIPELINES = (SyncPipeline, SyncClusterPipeline)
_ASYNC_PIPELINES = (AsyncPipeline, AsyncClusterPipeline)


@cache
def source(name: str) -> str:
    """The full text of one script as sent to the server: the library's definitions the
    script uses (``library_for``), then the script."""
    if name not in NAMES:
        raise KeyError(name)
    body = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return library_for(_library(), body) + "\n" + body


LIBRARY = ("_lib.lua", "_entries.lua", "_dead.lua", "_writes.lua", "_leases.lua",
           "_bundles.lua", "_tracked.lua", "_waiting.lua", "_groups.lua", "_windows.lua",
           "_events.lua",
           "_pop_reap.lua", "_pop_reserve.lua", "_pop_groups.lua",
           "_pop_reply.lua", "_expiry.lua")
"""The library's files in order: a definition may use only those above it (Lua locals)."""


def include(name: str) -> str:
    """The text of one library file."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


@cache
def _library() -> str:
    """The library's definitions, file after file in ``LIBRARY`` order, under the head of
    ``_lib.lua`` (the other files' own head comments are not sent). Read once per
    process."""
    parts = []
    for i, name in enumerate(LIBRARY):
        head, defs = definitions(include(name), name)
        parts.append(head if i == 0 else "")
        parts.extend(text for _, text in defs)
    return "".join(parts)


_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")


def definitions(lib: str, name: str = "library") -> tuple[str, list[tuple[str, str]]]:
    """A library file ``lib`` (called ``name`` in errors) split into its head (the text
    before the first definition) and its top-level definitions in order, ``(name,
    text)``: a line ``local function NAME`` (to its ``end`` at column 0, or on one line)
    or ``local NAME = ...``, with the comment lines right above it; blank lines and
    comments after a blank line stay with the text before them. Any other top-level line
    is a ``ValueError``: the library keeps to this layout."""
    head: list[str] = []
    defs: list[tuple[str, list[str]]] = []
    above: list[str] = []  # top-level comments, for the definition below them
    in_function = False
    for line in lib.splitlines(keepends=True):
        if in_function:
            defs[-1][1].append(line)
            in_function = line.rstrip() != "end"
            continue
        m = _DEFINITION.match(line)
        if m is not None:
            defs.append((m.group(1), [*above, line]))
            above = []
            # a function runs to its "end" at column 0, unless it is all on this line
            in_function = line.startswith("local function ") and \
                not line.rstrip().endswith(" end")
        elif line.startswith("--"):
            above.append(line)
        elif not line.strip():
            (defs[-1][1] if defs else head).extend([*above, line])
            above = []
        else:
            raise ValueError(f"{name}: a top-level line that defines nothing: {line!r}")
    (defs[-1][1] if defs else head).extend(above)
    return "".join(head), [(name, "".join(text)) for name, text in defs]


def library_for(lib: str, body: str) -> str:
    """The part of ``lib`` that ``body`` needs: its head and every definition the body
    names, directly or through another kept definition, in the library's order.

    A script runs its whole text on every call, so each ``local function`` of the
    library is a closure made per call whether used or not: on Valkey 9.1 the full
    library cost a script 11 µs a call. A definition can only use those above it (Lua
    locals), so one pass from the last definition up collects them all. A name that
    only appears in a comment or a string keeps its definition: harmless."""
    head, defs = _named(lib)
    needed = set(_WORD.findall(body))
    kept = []
    for name, text, names in reversed(defs):
        if name in needed:
            needed |= names
            kept.append(text)
    return head + "".join(reversed(kept))


@cache
def _named(lib: str) -> tuple[str, list[tuple[str, str, frozenset[str]]]]:
    """``definitions(lib)`` with the names each definition mentions: parsed once per
    process, not once per script (27 parses were 17 ms of a process's start)."""
    head, defs = definitions(lib)
    return head, [(name, text, frozenset(_WORD.findall(text))) for name, text in defs]


# --- the I/O-free core -----------------------------------------------------------------


class _Lua:
    def __init__(self, name: str) -> None:
        self.name = name

    # built at a script's first use: a process builds every script's wrapper at start
    # but calls only some of the scripts (a producer two or three)
    @cached_property
    def source(self) -> str:
        return source(self.name)

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()

    load_refused = False
    """The server refused this script's ``SCRIPT LOAD``: after NOSCRIPT, go to EVAL."""

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVALSHA arguments of one call."""
        return (self.sha, len(keys), *keys, *args)

    def eval_command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVAL arguments of one call (the full source)."""
        return (self.source, len(keys), *keys, *args)

    def refused(self, exc: redis.ResponseError) -> None:
        """``SCRIPT LOAD`` answered ``exc`` (unknown command, NOPERM): use EVAL."""
        if not isinstance(exc, NoScriptError):
            self.load_refused = True

    def _queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        calls = getattr(pipe, _CALLS, None)
        if calls is None:
            calls = []
            setattr(pipe, _CALLS, calls)
        calls.append((self, keys, args))
        pipe.execute_command("EVALSHA", *self.command(keys, args))


_Queued = tuple[_Lua, Sequence[Any], Sequence[Any]]


def _noscript_reruns(pipe: Any, results: list[Any]) -> list[tuple[int, _Lua, bool,
                                                                  Sequence[Any],
                                                                  Sequence[Any]]]:
    """The pipelined calls that hit NOSCRIPT: (position, script, load it first?, keys,
    args); each script is loaded once (on a cluster: on every primary). Clears the
    pipeline's record of queued scripts."""
    calls: list[_Queued] = getattr(pipe, _CALLS, [])
    setattr(pipe, _CALLS, [])
    out = []
    loaded: set[str] = set()
    for i, res in enumerate(results):
        if isinstance(res, NoScriptError) and i < len(calls):
            script, keys, args = calls[i]
            out.append((i, script, script.name not in loaded, keys, args))
            loaded.add(script.name)
    return out


# --- sync and async shells -------------------------------------------------------------


class SyncScript(_Lua):
    """A script bound to a synchronous client: ``script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.Redis, lane: SyncLane | None = None) -> None:
        super().__init__(name)
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
            return run("EVALSHA", *self.command(keys, args))
        except NoScriptError:
            # NOSCRIPT: the script did not run, so running it again cannot apply it twice
            pass
        if not self.load_refused:
            try:
                c.script_load(self.source)
            except redis.ResponseError as exc:
                self.refused(exc)
            else:
                try:
                    return run("EVALSHA", *self.command(keys, args))
                except NoScriptError:
                    pass
        return run("EVAL", *self.eval_command(keys, args))


class AsyncScript(_Lua):
    """A script bound to an asyncio client: ``await script(keys, args, client=None)``."""

    def __init__(self, name: str, client: redis.asyncio.Redis,
                 lane: AsyncLane | None = None) -> None:
        super().__init__(name)
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
            return await run("EVALSHA", *self.command(keys, args))
        except NoScriptError:
            pass
        if not self.load_refused:
            try:
                await c.script_load(self.source)
            except redis.ResponseError as exc:
                self.refused(exc)
            else:
                try:
                    return await run("EVALSHA", *self.command(keys, args))
                except NoScriptError:
                    pass
        return await run("EVAL", *self.eval_command(keys, args))


def _rerun(client: redis.Redis, script: _Lua, keys: Sequence[Any],
           args: Sequence[Any]) -> Any:
    """One pipelined call that hit NOSCRIPT, after its load: EVALSHA, else EVAL."""
    if not script.load_refused:
        try:
            return client.evalsha(*script.command(keys, args))
        except NoScriptError:
            pass  # loaded, yet unknown where the call runs: send the source
    return client.eval(*script.eval_command(keys, args))


async def _arerun(client: redis.asyncio.Redis, script: _Lua, keys: Sequence[Any],
                  args: Sequence[Any]) -> Any:
    """``_rerun`` for asyncio."""
    if not script.load_refused:
        try:
            return await client.evalsha(*script.command(keys, args))
        except NoScriptError:
            pass
    return await client.eval(*script.eval_command(keys, args))


def run_pipeline(pipe: SyncPipeline | SyncClusterPipeline, client: redis.Redis) -> list[Any]:
    """Execute a pipeline of queued scripts (``raise_on_error=False``); commands that
    hit NOSCRIPT are loaded and run again one by one. Other errors come back in place."""
    results: list[Any] = pipe.execute(raise_on_error=False)
    for i, script, load, keys, args in _noscript_reruns(pipe, results):
        if load and not script.load_refused:
            try:
                client.script_load(script.source)
            except redis.ResponseError as exc:
                script.refused(exc)
        try:
            results[i] = _rerun(client, script, keys, args)
        except redis.ResponseError as exc:
            results[i] = exc
    return results


async def arun_pipeline(pipe: AsyncPipeline | AsyncClusterPipeline,
                        client: redis.asyncio.Redis) -> list[Any]:
    """``run_pipeline`` for asyncio."""
    results: list[Any] = await pipe.execute(raise_on_error=False)
    for i, script, load, keys, args in _noscript_reruns(pipe, results):
        if load and not script.load_refused:
            try:
                await client.script_load(script.source)
            except redis.ResponseError as exc:
                script.refused(exc)
        try:
            results[i] = await _arerun(client, script, keys, args)
        except redis.ResponseError as exc:
            results[i] = exc
    return results


class SyncScripts:
    """Every script bound to a synchronous client; run a call built by ``calls``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        lane = sync_lane(client)
        self.by_name = {n: SyncScript(n, client, lane) for n in NAMES}

    def call(self, c: Call,
             client: redis.Redis | SyncPipeline | SyncClusterPipeline | None = None) -> Any:
        """Run a call built by ``calls`` (queued, when ``client`` is a pipeline)."""
        return self.by_name[c.script](c.keys, c.args, client=client)


class AsyncScripts:
    """Every script bound to an asyncio client; run a call built by ``calls``."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        lane = async_lane(client)
        self.by_name = {n: AsyncScript(n, client, lane) for n in NAMES}

    async def call(self, c: Call, client: redis.asyncio.Redis | AsyncPipeline
                   | AsyncClusterPipeline | None = None) -> Any:
        """Run a call built by ``calls`` (queued, when ``client`` is a pipeline)."""
        return await self.by_name[c.script](c.keys, c.args, client=client)

    async def load(self, names: Iterable[str]) -> None:
        """``SCRIPT LOAD`` the scripts ``names`` (on a Cluster, on every primary), so
        their first calls do not take the NOSCRIPT detour: a worker's pop that is sent
        again after NOSCRIPT can land behind a pop sent ahead of it, and its jobs would
        start after later ones. A refused load (``ResponseError``) marks every script
        to go through EVAL after NOSCRIPT, and is raised."""
        for name in names:
            try:
                await self.client.script_load(self.by_name[name].source)
            except redis.ResponseError as exc:
                if isinstance(exc, NoScriptError):
                    raise
                for script in self.by_name.values():
                    script.refused(exc)
                raise
