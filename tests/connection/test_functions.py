"""The scripts as Redis Functions: each script is a function library named after its
SHA, called with FCALL; a server that lost its functions (a restart without persistence:
here ``FUNCTION FLUSH``) gets them again and every call runs once; a server without
functions (Redis 6.2, ``FCALL`` or ``FUNCTION`` renamed away, an ACL without them) turns
them off for the client, whose scripts go on by EVALSHA; an error raised inside a
running function is the caller's, not a missing function. Real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from uuid import uuid4

import pytest
import redis
import redis.asyncio
from fixtures.acl import BATCHQ_COMMANDS
from helpers import function_libraries

from batchq.dev.server import EmbeddedServer
from batchq.store.keys import QueueKeys
from batchq.store.scripts import (
    AsyncScripts,
    SyncScripts,
    arun_pipeline,
    calls,
    fcall_missed,
    run_pipeline,
)

pytestmark = pytest.mark.script


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as s:
        yield s


def _keys() -> QueueKeys:
    return QueueKeys(f"fn{uuid4().hex[:8]}", "q")


def test_scripts_are_functions_named_after_their_sha(server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        s = SyncScripts(r)
        k = _keys()
        first = s.call(calls.reserve(k, 5))
        assert s.call(calls.reserve(k, 5)) == first + 5
        script = s.by_name["reserve"]
        assert script.fname == f"batchq_reserve_{script.sha}"
        assert script.fname in function_libraries(r)
        assert _calls(r, "fcall") == 3 and _calls(r, "evalsha") == 0  # the miss, then 2
        assert _calls(r, "function|load") == 1  # loaded once, at the first call's miss
        # a second client (another process) finds the library there
        r2 = redis.Redis.from_url(server.url)
        try:
            assert SyncScripts(r2).call(calls.reserve(k, 1)) == first + 10
        finally:
            r2.close()
        assert _calls(r, "function|load") == 1
    finally:
        r.close()


def test_lost_functions_load_again_and_each_call_runs_once(server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        s = SyncScripts(r)
        k = _keys()
        first = s.call(calls.reserve(k, 1))
        r.function_flush()  # a restarted server without persistence
        assert s.call(calls.reserve(k, 1)) == first + 1
        r.function_flush()
        pipe = r.pipeline(transaction=False)
        for _ in range(3):
            s.call(calls.reserve(k, 1), client=pipe)
        assert run_pipeline(pipe, r) == [first + 2, first + 3, first + 4]
        r.function_flush()

        async def aio() -> list[int]:
            client = redis.asyncio.Redis.from_url(server.url)
            try:
                a = AsyncScripts(client)
                one = await a.call(calls.reserve(k, 1))
                await client.function_flush()
                apipe = client.pipeline(transaction=False)
                await a.call(calls.reserve(k, 1), client=apipe)
                await a.call(calls.reserve(k, 1), client=apipe)
                return [one, *await arun_pipeline(apipe, client)]
            finally:
                await client.aclose()

        assert asyncio.run(aio()) == [first + 5, first + 6, first + 7]
        assert s.mode.functions and _calls(r, "evalsha") == 0
        assert _calls(r, "function|load") == 5  # one per miss: first, direct, pipe, 2 aio
    finally:
        r.close()


@pytest.mark.parametrize("renamed", ["FCALL", "FUNCTION"])
def test_a_server_without_functions_runs_them_by_evalsha(renamed: str) -> None:
    with EmbeddedServer(extra_args=["--rename-command", renamed, ""]) as server:
        r = redis.Redis.from_url(server.url)
        try:
            s = SyncScripts(r)
            k = _keys()
            first = s.call(calls.reserve(k, 2))
            assert not s.mode.functions
            assert s.call(calls.reserve(k, 2)) == first + 2
            pipe = r.pipeline(transaction=False)
            s.call(calls.reserve(k, 1), client=pipe)
            assert run_pipeline(pipe, r) == [first + 4]
            assert _calls(r, "evalsha") == 3  # the first call's retry, the second, the pipe
            assert _calls(r, "fcall") == (0 if renamed == "FCALL" else 1)
            # a pipeline as a client's first use: every queued call that missed is run
            # again, also those read after the first one turned functions off
            fresh = SyncScripts(r)
            pipe = r.pipeline(transaction=False)
            for _ in range(3):
                fresh.call(calls.reserve(k, 1), client=pipe)
            assert run_pipeline(pipe, r) == [first + 5, first + 6, first + 7]
            assert not fresh.mode.functions
        finally:
            r.close()


def test_an_acl_without_functions_runs_them_by_evalsha(server: EmbeddedServer) -> None:
    admin = redis.Redis.from_url(server.url)
    ns = f"acl{uuid4().hex[:8]}"
    try:
        # the rules of batchq 0.7 and before: no +fcall, no +function|load
        old = [c for c in BATCHQ_COMMANDS if c not in ("+fcall", "+function|load")]
        admin.execute_command("ACL", "SETUSER", "old", "on", ">pw", f"~{ns}:*", "-@all",
                              *old)
        r = redis.Redis(host="127.0.0.1", port=server.port, username="old", password="pw")
        try:
            s = SyncScripts(r)
            k = QueueKeys(ns, "q")
            first = s.call(calls.reserve(k, 2))
            assert s.call(calls.reserve(k, 1)) == first + 2
            assert not s.mode.functions
        finally:
            r.close()
    finally:
        admin.close()


def test_an_error_inside_a_function_is_not_a_miss(server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        s = SyncScripts(r)
        k = _keys()
        s.call(calls.reserve(k, 1))
        loads = _calls(r, "function|load")
        r.delete(k.seq)
        r.sadd(k.seq, "x")  # the wrong type: INCRBY inside the function fails
        with pytest.raises(redis.ResponseError) as info:
            s.call(calls.reserve(k, 1))
        assert fcall_missed(info.value) is None, info.value
        assert s.mode.functions and _calls(r, "function|load") == loads
    finally:
        r.close()
