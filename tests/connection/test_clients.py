"""batchq.store.clients: the per-process client cache, outside ``App``; and the import graph of
app, producer, queue and clients (no circle, read with ``ast``)."""

from __future__ import annotations

import ast
import asyncio
import os
from pathlib import Path
from types import ModuleType

import pytest
import redis
import redis.asyncio.connection

import batchq
from batchq.ops import metrics, metrics_http, queue, stats
from batchq.produce import producer
from batchq.store import clients, connection
from batchq.store.clients import Clients
from batchq.store.connection import RedisSettings

pytestmark = pytest.mark.integration


def _imports(module: ModuleType) -> set[str]:
    """The last names of the batchq modules ``module`` imports, and the names it imports
    from them (any level, TYPE_CHECKING blocks too)."""
    tree = ast.parse(Path(str(module.__file__)).read_text())
    package = module.__name__.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            full = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            if full.split(".")[0] != "batchq":
                continue
            names = {a.name for a in node.names}
            if full != "batchq" or "__version__" in names:  # the package root itself
                out.add(full.rsplit(".", 1)[-1])
            out.update(names)
    return out


def test_producer_queue_clients_never_import_app() -> None:
    for module in (producer, queue, clients, stats, metrics, metrics_http):
        assert "app" not in _imports(module), module
    assert "producer" not in _imports(clients) and "queue" not in _imports(clients)
    assert "metrics_http" not in _imports(metrics)
    assert "batchq" not in _imports(metrics)  # the version comes from importlib.metadata


def test_clients_are_lazy_cached_and_rebuilt_after_fork_or_new_settings(
        redis_url: str) -> None:
    c = Clients(RedisSettings(redis_url), "ns")
    assert c._sync is None  # nothing built until asked
    r = c.redis
    assert c.redis is r and c.sync_scripts is c.sync_scripts
    assert c.sync_scripts.client is r
    assert r.ping()

    c._pid = -1  # as a forked child sees it
    assert c.redis is not r
    r2 = c.redis
    c.settings = RedisSettings(redis_url, socket_timeout_s=3.0)
    assert c.redis is not r2
    assert c.redis.connection_pool.connection_kwargs["socket_timeout"] == 3.0
    c.close()
    r.close()
    r2.close()


def test_fork_child_gets_its_own_client(redis_url: str) -> None:
    c = Clients(RedisSettings(redis_url), "ns")
    parent = c.redis
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: a new client, and it works
        ok = c.redis is not parent and c.redis.ping()
        os.write(wr, b"1" if ok else b"0")
        os._exit(0)
    os.close(wr)
    assert os.read(rd, 1) == b"1"
    os.waitpid(pid, 0)
    c.close()


def test_one_async_client_and_coalescer_per_loop(redis_url: str) -> None:
    c = Clients(RedisSettings(redis_url), "ns")

    async def main() -> tuple[object, object]:
        a, co = c.async_redis(), producer.coalescer(c)
        assert c.async_redis() is a and producer.coalescer(c) is co
        assert c.async_scripts().client is a
        await c.aregister_queue("q1")
        await c.aclose()
        return a, co

    first = asyncio.run(main())
    second = asyncio.run(main())
    assert first[0] is not second[0] and first[1] is not second[1]
    r = redis.Redis.from_url(redis_url)
    assert r.sismember("ns:queues", "q1")
    r.delete("ns:queues")
    r.close()


def test_app_delegates_to_its_clients(redis_url: str, namespace: str) -> None:
    app = batchq.App(redis_url, namespace=namespace)
    assert app.redis is app.clients.redis
    assert app.sync_scripts is app.clients.sync_scripts
    assert app.keys("q") is app.clients.keys("q")
    app.redis_settings = RedisSettings(redis_url, socket_timeout_s=2.0)
    assert app.clients.settings.socket_timeout_s == 2.0
    assert app.redis.connection_pool.connection_kwargs["socket_timeout"] == 2.0
    app.max_payload_bytes = 10
    with pytest.raises(batchq.PayloadTooLarge):
        app.task(lambda: None).enqueue()
    app.close()


def test_register_queue_is_once_per_process(redis_url: str, namespace: str) -> None:
    c = Clients(RedisSettings(redis_url), namespace)
    c.register_queue("a")
    c.redis.delete(f"{namespace}:queues")
    c.register_queue("a")  # remembered: no second SADD
    assert not c.redis.exists(f"{namespace}:queues")
    c.close()


PACKED = [
    ("EVALSHA", "a" * 40, 2, "k1", b"k2", 0, -5, 2**70, 1.5, 1e20, -0.0, "é", b"\x00\xff\r\n", ""),
    ("CONFIG GET", "maxmemory"),  # a command name with a literal argument is split
    (b"CLIENT LIST",),
    ("SET", "k", memoryview(b"a view")),  # hiredis does not take views: redis-py packs it
    ("RPUSH", "k", *[b"x" * 7000] * 3),  # above redis-py's buffer cutoff: chunked there
]


def test_async_clients_pack_commands_with_hiredis(redis_url: str, namespace: str) -> None:
    """Every asyncio client batchq builds packs with hiredis (C), bytes for bytes what
    redis-py's Python packer sends, and still answers real commands and pipelines."""
    plain = redis.asyncio.connection.Connection(encoder_class=redis.asyncio.connection.Encoder)
    for url, base in ((redis_url, redis.asyncio.connection.Connection),
                      ("unix:///tmp/no.sock", redis.asyncio.connection.UnixDomainSocketConnection),
                      ("rediss://127.0.0.1:1/0", redis.asyncio.connection.SSLConnection)):
        cls = RedisSettings(url).async_client().connection_pool.connection_class
        assert issubclass(cls, base) and issubclass(cls, connection._HiredisPacking), url
        assert cls is connection.packing(base) and connection.packing(cls) is cls
    fast = connection.packing(redis.asyncio.connection.Connection)()
    for cmd in PACKED:
        assert b"".join(fast.pack_command(*cmd)) == b"".join(plain.pack_command(*cmd)), cmd
    with pytest.raises(redis.DataError):  # refused as redis-py refuses it
        fast.pack_command("SET", "k", True)

    async def roundtrip() -> None:
        client = RedisSettings(redis_url).async_client()
        key = f"{namespace}:packed"
        try:
            assert await client.rpush(key, "é", b"\x00\xff\r\n", 7, 1.5) == 4
            pipe = client.pipeline(transaction=False)
            pipe.lrange(key, 0, -1)
            pipe.execute_command("CONFIG GET", "maxmemory")
            values, config = await pipe.execute()
            assert values == ["é".encode(), b"\x00\xff\r\n", b"7", b"1.5"]
            assert "maxmemory" in config  # redis-py parses CONFIG GET into a dict
            conn = await client.connection_pool.get_connection()
            assert isinstance(conn, connection._HiredisPacking)
            await client.connection_pool.release(conn)
        finally:
            await client.delete(key)
            await client.aclose()

    asyncio.run(roundtrip())


def test_sync_clients_pack_commands_with_hiredis(redis_url: str, namespace: str) -> None:
    """The synchronous clients pack the same way (redis-py's own sync packer copies the
    arguments in a Python loop before hiredis packs them): the same bytes, the same
    refusals, and real commands and pipelines still answered."""
    plain = redis.connection.Connection()
    for url, base in ((redis_url, redis.connection.Connection),
                      ("unix:///tmp/no.sock", redis.connection.UnixDomainSocketConnection),
                      ("rediss://127.0.0.1:1/0", redis.connection.SSLConnection)):
        cls = RedisSettings(url).sync_client().connection_pool.connection_class
        assert issubclass(cls, base) and issubclass(cls, connection._HiredisPacking), url
        assert cls is connection.packing(base)
    fast = connection.packing(redis.connection.Connection)()
    for cmd in PACKED:
        assert b"".join(fast.pack_command(*cmd)) == b"".join(plain.pack_command(*cmd)), cmd
    with pytest.raises(redis.DataError):
        fast.pack_command("SET", "k", True)

    client = RedisSettings(redis_url).sync_client()
    key = f"{namespace}:packed"
    try:
        assert client.rpush(key, "é", b"\x00\xff\r\n", 7, 1.5) == 4
        pipe = client.pipeline(transaction=False)
        pipe.lrange(key, 0, -1)
        pipe.execute_command("CONFIG GET", "maxmemory")
        values, config = pipe.execute()
        assert values == ["é".encode(), b"\x00\xff\r\n", b"7", b"1.5"]
        assert "maxmemory" in config
        conn = client.connection_pool.get_connection()
        assert isinstance(conn, connection._HiredisPacking)
        client.connection_pool.release(conn)
    finally:
        client.delete(key)
        client.close()
