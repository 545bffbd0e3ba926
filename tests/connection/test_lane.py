"""batchq.store.lane: the connection a plain client's scripts go through without redis-py's
per-command machinery, on a real server: the same replies and errors as the client, a
connection the server closed is replaced before the command, a cancelled command never
leaves its reply for the next one, one command at a time per held connection (a few held
by an asyncio lane, the rest through the pool),
threads, a forked child, closing, and which clients get a lane."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from helpers import forget_scripts
from redis.exceptions import NoScriptError, ResponseError

from batchq.store import lane
from batchq.store.clients import Clients
from batchq.store.connection import RedisSettings
from batchq.store.keys import QueueKeys
from batchq.store.scripts import AsyncScripts, SyncScripts, calls

pytestmark = pytest.mark.integration


def _key() -> str:
    return f"lane:{uuid.uuid4().hex}"


@pytest.fixture
def sync_lane(redis_url: str, redis_client: redis.Redis
              ) -> Iterator[tuple[lane.SyncLane, redis.Redis, str]]:
    """A lane of a fresh plain client, the client, and a key of its own (deleted after)."""
    client = redis.Redis.from_url(redis_url)
    k = _key()
    try:
        yield lane.SyncLane(client), client, k
    finally:
        redis_client.delete(k, f"{k}:n")
        client.close()


def test_only_plain_pooled_clients_get_a_lane(redis_url: str) -> None:
    plain = redis.Redis.from_url(redis_url)
    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        assert isinstance(lane.sync_lane(plain), lane.SyncLane)
        assert lane.sync_lane(single) is None
        assert SyncScripts(plain).by_name["enqueue"].lane is not None
        assert SyncScripts(single).by_name["enqueue"].lane is None
    finally:
        plain.close()
        single.close()
    # nothing dials: the asyncio clients are lazy
    assert isinstance(lane.async_lane(redis.asyncio.Redis.from_url(redis_url)), lane.AsyncLane)
    assert lane.async_lane(redis.asyncio.Redis.from_url(
        redis_url, single_connection_client=True)) is None
    cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=1)
    assert lane.async_lane(cluster) is None  # type: ignore[arg-type]
    # one lane shared by every script of a client
    scripts = AsyncScripts(redis.asyncio.Redis.from_url(redis_url))
    assert len({id(s.lane) for s in scripts.by_name.values()}) == 1


def test_sync_lane_replies_errors_and_a_connection_the_server_closed(
        sync_lane: tuple[lane.SyncLane, redis.Redis, str], redis_client: redis.Redis) -> None:
    ln, client, k = sync_lane
    assert ln.execute("SET", k, "é") == b"OK"  # raw replies: no response callbacks
    assert ln.execute("GET", k) == "é".encode()
    assert ln.execute("INCRBY", f"{k}:n", 5) == 5
    with pytest.raises(NoScriptError):
        ln.execute("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        ln.execute("LPUSH", k, "x")  # the error reply leaves the connection usable
    cid = ln.execute("CLIENT", "ID")
    assert ln.execute("CLIENT", "ID") == cid  # one connection, held
    assert ln._conn in client.connection_pool._in_use_connections  # type: ignore[attr-defined]

    # the server closes it: checked before the next command, which still succeeds
    assert redis_client.client_kill_filter(_id=cid) == 1
    assert ln.execute("GET", k) == "é".encode()
    assert ln.execute("CLIENT", "ID") != cid
    # a memoryview (hiredis refuses it) goes through redis-py's packer
    assert ln.execute("SET", k, memoryview(b"mv")) == b"OK"
    assert ln.execute("GET", k) == b"mv"
    client.close()
    assert ln._conn is not None and ln._conn._sock is None  # closed with its client


def test_sync_lane_is_shared_by_threads_one_command_at_a_time(
        sync_lane: tuple[lane.SyncLane, redis.Redis, str], redis_client: redis.Redis) -> None:
    ln, _, k = sync_lane
    got: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [ln.execute("INCR", k) for _ in range(200)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(1, 1601))  # every reply to its own command
    assert int(redis_client.get(k) or 0) == 1600


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_its_parents_lane(
        sync_lane: tuple[lane.SyncLane, redis.Redis, str], redis_client: redis.Redis) -> None:
    ln, _, k = sync_lane
    cid = ln.execute("CLIENT", "ID")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            mine = ln.execute("CLIENT", "ID")
            ln.execute("SET", k, str(mine))
            code = 0 if mine != cid else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int(redis_client.get(k) or 0) not in (0, cid)
    assert ln.execute("CLIENT", "ID") == cid  # the parent's connection untouched


def test_async_lane_cancel_busy_closed_by_server_and_aclose(
        redis_url: str, redis_client: redis.Redis) -> None:
    k = _key()

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        ln = lane.AsyncLane(client)
        cid = await ln.execute("CLIENT", "ID")
        assert await ln.execute("CLIENT", "ID") == cid
        with pytest.raises(NoScriptError):
            await ln.execute("EVALSHA", "0" * 40, 0)

        # a command on the wire holds its connection: the next one takes another from
        # the pool, which the lane keeps (up to ASYNC_LANE_CONNECTIONS); past that,
        # commands go through the client
        blocked = asyncio.ensure_future(ln.execute("BLPOP", k, 5))
        await asyncio.sleep(0.1)
        other = await asyncio.wait_for(ln.execute("CLIENT", "ID"), 2)
        assert other != cid and ln.held == 2
        assert await ln.execute("CLIENT", "ID") == other  # kept: a held one, not the pool's
        more = [asyncio.ensure_future(ln.execute("BLPOP", f"{k}:{i}", 5))
                for i in range(lane.ASYNC_LANE_CONNECTIONS - 1)]
        await asyncio.sleep(0.1)
        assert ln.held == lane.ASYNC_LANE_CONNECTIONS
        past = await asyncio.wait_for(ln.execute("CLIENT", "ID"), 2)
        assert past not in (cid, other) and ln.held == lane.ASYNC_LANE_CONNECTIONS
        for f in more:
            f.cancel()
        await asyncio.gather(*more, return_exceptions=True)
        # cancelled while its reply is outstanding: the connection is dropped (its
        # BLPOP with it), so no later command reads that reply
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await asyncio.sleep(0.1)
        redis_client.rpush(k, "x")
        assert await ln.execute("LLEN", k) == 1  # nobody popped it
        # the held connections whose commands were cancelled are dropped and connect
        # again when used; the last one used is used first
        cid2 = await ln.execute("CLIENT", "ID")
        assert cid2 not in (cid, other)

        # the server closes the lane's connection: found before the next command
        assert redis_client.client_kill_filter(_id=cid2) == 1
        await asyncio.sleep(0.1)  # the loop sees the end of the stream
        assert await ln.execute("LPOP", k) == b"x"
        assert await ln.execute("CLIENT", "ID") not in (cid, cid2)

        conns = list(ln._free)
        assert len(conns) == ln.held == lane.ASYNC_LANE_CONNECTIONS
        assert any(c.is_connected for c in conns)
        await client.aclose()
        assert not any(c.is_connected for c in conns)  # closed with their client

    try:
        asyncio.run(main())
    finally:
        redis_client.delete(k)


def test_scripts_go_through_the_lane_and_reload_after_a_flush(
        redis_url: str, redis_client: redis.Redis, namespace: str) -> None:
    k = QueueKeys(namespace, "lanes")
    c = Clients(RedisSettings(redis_url), namespace)
    try:
        first = int(c.sync_scripts.call(calls.reserve(k, 10)))
        forget_scripts(redis_client)  # a restarted server: missed, loaded, run once
        assert int(c.sync_scripts.call(calls.reserve(k, 10))) == first + 10
        sync_lane = c.sync_scripts.by_name["reserve"].lane
        assert sync_lane is not None and sync_lane._conn is not None

        async def main() -> None:
            scripts = c.async_scripts()
            forget_scripts(redis_client)
            assert int(await scripts.call(calls.reserve(k, 10))) == first + 20
            # many at once: a few on the lane's connections, the others through the pool
            got = await asyncio.gather(*(scripts.call(calls.reserve(k, 1))
                                         for _ in range(50)))
            assert sorted(int(x) for x in got) == list(range(first + 30, first + 80))
            assert scripts.by_name["reserve"].lane.held >= 1  # type: ignore[union-attr]
            await c.aclose()

        asyncio.run(main())
    finally:
        c.close()
        for key in redis_client.scan_iter(f"{namespace}:*"):
            redis_client.delete(key)
