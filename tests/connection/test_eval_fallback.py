"""The scripts' way past a missing script when loading does not help: a NOSCRIPT that
outlives a successful ``SCRIPT LOAD``, or a ``Function not found`` that outlives a
successful ``FUNCTION LOAD`` (a proxy that sends each command to another node; here: the
wrapper's SHA or function name made wrong, so the loaded script is never the one asked
for) ends in one ``EVAL`` with the full source, for direct calls, pipelines and asyncio
alike. Real server; the refused ``SCRIPT LOAD`` itself is covered by
``security/test_managed.py``, functions by ``test_functions.py``."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from fixtures.scripts import *  # noqa: F403

import batchq
from batchq.store.scripts import (
    AsyncScripts,
    SyncScripts,
    _Lua,
    arun_pipeline,
    calls,
    run_pipeline,
)

pytestmark = pytest.mark.script

WRONG_SHA = "0" * 40


def _count(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def _evals(r: redis.Redis) -> int:
    return _count(r, "eval")


def _break(script: _Lua, functions: bool) -> None:
    """Make every call of ``script`` miss, loaded or not: FCALL a name the library does
    not register, or EVALSHA a SHA the loaded source does not have."""
    script.mode.functions = functions
    if functions:
        assert script.library  # built now: it registers the real name
        script.fname = "batchq_reserve_" + WRONG_SHA
    else:
        script.sha = WRONG_SHA


@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
def test_persistent_miss_falls_back_to_eval(redis_url: str, redis_client: redis.Redis,
                                            namespace: str, functions: bool) -> None:
    app = batchq.App(redis_url, namespace=namespace)
    try:
        k = app.keys("evalq")
        s = SyncScripts(app.redis)
        script = s.by_name["reserve"]
        _break(script, functions)
        before = _evals(redis_client)
        first = s.call(calls.reserve(k, 5))
        assert s.call(calls.reserve(k, 5)) == first + 5
        assert _evals(redis_client) == before + 2
        assert not script.load_refused  # the load worked; the call still needed EVAL

        pipe = app.redis.pipeline(transaction=False)
        s.call(calls.reserve(k, 1), client=pipe)
        s.call(calls.reserve(k, 1), client=pipe)
        assert run_pipeline(pipe, app.redis) == [first + 10, first + 11]

        async def aio() -> list[int]:
            client = redis.asyncio.Redis.from_url(redis_url)
            try:
                a = AsyncScripts(client)
                _break(a.by_name["reserve"], functions)
                one = await a.call(calls.reserve(k, 1))
                apipe = client.pipeline(transaction=False)
                await a.call(calls.reserve(k, 1), client=apipe)
                return [one, *await arun_pipeline(apipe, client)]
            finally:
                await client.aclose()

        assert asyncio.run(aio()) == [first + 12, first + 13]
        assert _evals(redis_client) == before + 6
    finally:
        app.close()


def test_a_refused_load_is_remembered(redis_url: str, redis_client: redis.Redis,
                                      namespace: str) -> None:
    """After a refused ``SCRIPT LOAD`` a script goes straight to EVAL on NOSCRIPT."""
    app = batchq.App(redis_url, namespace=namespace)
    try:
        k = app.keys("evalq2")
        s = SyncScripts(app.redis)
        s.mode.functions = False  # the EVALSHA way
        script = s.by_name["reserve"]
        script.refused(redis.ResponseError("unknown command 'SCRIPT'"))
        script.sha = WRONG_SHA
        loads = _count(redis_client, "script|load")
        assert s.call(calls.reserve(k, 3)) + 3 == s.call(calls.reserve(k, 1))
        assert _count(redis_client, "script|load") == loads  # not tried again
        script.refused(redis.exceptions.NoScriptError("NOSCRIPT"))  # not a refusal
        assert script.load_refused
    finally:
        app.close()
