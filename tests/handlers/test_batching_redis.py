"""``batchq.BatchingRedis`` in one process, on the session's Redis: commands awaited at
once share round trips, each error reaches the call that sent its command, a lost or
silent connection raises in the calls on it (the next call connects again), a
cancelled call sends nothing, and a forked child never uses its parent's connection."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
import redis
from helpers import wait_until

import batchq

pytestmark = pytest.mark.integration


@pytest.fixture
def prefix(redis_client: redis.Redis) -> Iterator[str]:
    p = f"hr{uuid4().hex[:8]}"
    yield p
    for k in redis_client.scan_iter(f"{p}:*"):
        redis_client.delete(k)


def handler_clients(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [c for c in r.client_list() if c.get("name") == name]


def calls_of(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_concurrent_calls_share_round_trips(redis_url: str, redis_client: redis.Redis,
                                            prefix: str) -> None:
    name = f"hr-{uuid4().hex[:8]}"
    r = batchq.BatchingRedis(redis_url, client_name=name)
    before = calls_of(redis_client, "incr")

    async def main() -> tuple[list[Any], list[Any]]:
        singles = await asyncio.gather(*[r.execute("INCR", f"{prefix}:n") for _ in range(300)])
        pairs = await asyncio.gather(*[
            r.execute_many(("SET", f"{prefix}:k{i}", i), ("GET", f"{prefix}:k{i}"))
            for i in range(100)])
        assert len(handler_clients(redis_client, name)) == 1  # one connection per loop
        await r.aclose()
        return singles, pairs

    singles, pairs = asyncio.run(main())
    assert sorted(singles) == list(range(1, 301))
    assert pairs == [[b"OK", str(i).encode()] for i in range(100)]
    assert calls_of(redis_client, "incr") - before == 300
    # 400 calls (500 commands) awaited at once: one write each for the two gathers
    assert r.commands == 500
    assert r.round_trips <= 4, r.round_trips
    assert handler_clients(redis_client, name) == []  # aclose closed it


def test_batches_are_bounded(redis_url: str, prefix: str) -> None:
    r = batchq.BatchingRedis(redis_url, max_batch=10)

    async def main() -> None:
        await asyncio.gather(*[r.execute("INCR", f"{prefix}:n") for _ in range(95)])
        await asyncio.gather(*[r.execute_many(*[("INCR", f"{prefix}:m")] * 4)
                               for _ in range(10)])
        await r.aclose()

    asyncio.run(main())
    # 95 single commands in batches of at most 10, then ten groups of 4 (two a batch:
    # a job's commands are never split)
    assert r.round_trips == 10 + 5


def test_each_error_reaches_its_caller(redis_url: str, redis_client: redis.Redis,
                                       prefix: str) -> None:
    redis_client.set(f"{prefix}:text", "not a number")
    r = batchq.BatchingRedis(redis_url)

    async def main() -> list[Any]:
        out = await asyncio.gather(
            *[r.execute("INCR", f"{prefix}:text" if i % 10 == 3 else f"{prefix}:ok{i}")
              for i in range(50)],
            r.execute_many(("INCR", f"{prefix}:ok-many"), ("INCR", f"{prefix}:text"),
                           raise_on_error=False),
            r.execute_many(("INCR", f"{prefix}:ok-raise"), ("INCR", f"{prefix}:text")),
            r.execute("NOSUCHCOMMAND"),
            return_exceptions=True)
        await r.aclose()
        return out

    out = asyncio.run(main())
    singles, many, raised, unknown = out[:50], out[50], out[51], out[52]
    for i, got in enumerate(singles):
        if i % 10 == 3:
            assert isinstance(got, redis.ResponseError) and "not an integer" in str(got)
        else:
            assert got == 1
    assert many[0] == 1 and isinstance(many[1], redis.ResponseError)
    assert isinstance(raised, redis.ResponseError)
    assert int(redis_client.get(f"{prefix}:ok-raise") or 0) == 1  # sent all the same
    assert isinstance(unknown, redis.ResponseError) and "unknown command" in str(unknown)
    # a Lua script not loaded: redis-py's own error class
    async def noscript() -> None:
        await r.execute("EVALSHA", "0" * 40, 0)

    with pytest.raises(redis.exceptions.NoScriptError):
        asyncio.run(noscript())


def test_connection_killed_mid_batch(redis_url: str, redis_client: redis.Redis,
                                     prefix: str) -> None:
    """A connection lost with a batch on the wire: every call of that batch raises
    ConnectionError at once; the next call connects again."""
    name = f"hr-{uuid4().hex[:8]}"
    r = batchq.BatchingRedis(redis_url, client_name=name)

    async def main() -> None:
        await r.execute("PING")  # connected
        blocked = asyncio.gather(r.execute("BLPOP", f"{prefix}:never", 30),
                                 *[r.execute("INCR", f"{prefix}:n") for _ in range(20)],
                                 return_exceptions=True)
        t0 = time.monotonic()
        while not [c for c in handler_clients(redis_client, name) if c["cmd"] == "blpop"]:
            await asyncio.sleep(0.01)
            assert time.monotonic() - t0 < 10
        (client,) = handler_clients(redis_client, name)
        redis_client.client_kill_filter(_id=client["id"])
        out = await asyncio.wait_for(blocked, 5)
        assert all(isinstance(e, redis.ConnectionError) for e in out), out
        assert await r.execute("INCR", f"{prefix}:n") == 1  # the INCRs never ran
        (again,) = handler_clients(redis_client, name)
        assert again["id"] != client["id"]
        await r.aclose()

    asyncio.run(main())


def test_silent_connection_times_out(redis_url: str, prefix: str) -> None:
    r = batchq.BatchingRedis(redis_url, socket_timeout_s=0.3)

    async def main() -> None:
        t0 = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            await r.execute("BLPOP", f"{prefix}:never", 5)
        assert time.monotonic() - t0 < 2
        assert await r.execute("PING") == b"PONG"
        await r.aclose()

    asyncio.run(main())


def test_connect_failure_raises_then_recovers(redis_url: str) -> None:
    from helpers import free_port

    r = batchq.BatchingRedis(f"redis://127.0.0.1:{free_port()}/0", connect_timeout_s=1)

    async def main() -> None:
        with pytest.raises(redis.ConnectionError):
            await r.execute("PING")
        with pytest.raises(redis.ConnectionError):  # tried again, not stuck
            await r.execute("PING")

    asyncio.run(main())


def test_cancelled_call_sends_nothing(redis_url: str, redis_client: redis.Redis,
                                      prefix: str) -> None:
    r = batchq.BatchingRedis(redis_url)

    async def main() -> None:
        await r.execute("PING")
        call = asyncio.ensure_future(r.execute("INCR", f"{prefix}:cancelled"))
        await asyncio.sleep(0)  # the call is pending, not written
        call.cancel()
        assert await r.execute("INCR", f"{prefix}:after") == 1
        await r.aclose()

    asyncio.run(main())
    assert redis_client.get(f"{prefix}:cancelled") is None


def test_encoding_database_and_url(redis_url: str, prefix: str) -> None:
    r = batchq.BatchingRedis(redis_url, encoding="utf-8")

    async def main() -> None:
        assert await r.execute_many(("SET", f"{prefix}:s", "é"), ("GET", f"{prefix}:s"),
                                    ("CLIENT", "GETNAME")) == ["OK", "é", "batchq:handler"]
        await r.aclose()

    asyncio.run(main())
    with pytest.raises(ValueError, match="Cluster"):
        batchq.BatchingRedis("redis+cluster://127.0.0.1:7000")
    with pytest.raises(ValueError, match="max_batch"):
        batchq.BatchingRedis(redis_url, max_batch=0)
    assert "secret" not in repr(batchq.BatchingRedis("redis://:secret@127.0.0.1:1/0"))


def test_forked_child_makes_its_own_connection(redis_url: str, redis_client: redis.Redis,
                                               prefix: str) -> None:
    name = f"hr-{uuid4().hex[:8]}"
    r = batchq.BatchingRedis(redis_url, client_name=name)

    async def use() -> Any:
        return await r.execute("CLIENT", "ID")

    loop = asyncio.new_event_loop()
    try:
        parent_id = loop.run_until_complete(use())
        pid = os.fork()
        if pid == 0:  # the child: a new loop, a new connection
            code = 1
            try:
                child_id = asyncio.run(use())
                redis_client.set(f"{prefix}:child", child_id)
                code = 0 if r.round_trips == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        child_id = int(redis_client.get(f"{prefix}:child") or 0)
        assert child_id not in (0, parent_id)
        # the parent's connection was not touched by the child
        assert loop.run_until_complete(use()) == parent_id
        wait_until(lambda: len(handler_clients(redis_client, name)) == 1, timeout_s=5)
        loop.run_until_complete(r.aclose())
    finally:
        loop.close()


def test_sentinel_url_follows_a_failover() -> None:
    """``redis+sentinel://``: the primary is asked of the Sentinels on connect, and again
    after the primary died (the calls on the dead connection raise, later ones land on
    the promoted replica)."""
    from batchq.dev.sentinel import EmbeddedSentinels

    with EmbeddedSentinels() as s:
        r = batchq.BatchingRedis(s.url, socket_timeout_s=2)

        async def first() -> Any:
            return await r.execute_many(("SET", "hr:s", "1"), ("CLIENT", "ID"))

        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(first())[0] == b"OK"
            old = s.kill_primary()
            s.wait_failover(old.port)

            async def until_written() -> Any:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        return await r.execute("INCR", "hr:after")
                    except (redis.ConnectionError, redis.TimeoutError,
                            redis.exceptions.ReadOnlyError):
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.1)

            assert loop.run_until_complete(until_written()) == 1
            loop.run_until_complete(r.aclose())
        finally:
            loop.close()
