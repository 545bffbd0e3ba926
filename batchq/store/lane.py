"""A fast lane for batchq's own commands: connections of a plain client's pool, held
for the life of the client, through which a command goes straight to a connection
(pack, send, read the reply).

redis-py 8 sends each command of a client through a connection pool that takes an
``asyncio.Lock`` (or a ``threading.Lock``), records observability counters, checks the
connection, dispatches a release event and wraps the call in a retry object, about 30 µs
of Python a command on the development machine (a ``PING`` loop: 58 µs against 27 on a
held connection), and several times that in a process woken from sleep (301 µs against
201 after a 5 ms sleep): the first thing a producer sending one job at a time pays on
every call. batchq's clients never let redis-py retry (``connection.py``), so the lane
keeps every behaviour a caller sees:

* the connection is checked as the pool checks it before lending it (a connection the
  server closed, or one holding unread data, is connected again before the command);
* any error while sending or reading disconnects it, as in redis-py (the connection
  layer does this itself), and the next command connects again;
* an error reply raises as from the client (``ResponseError``, ``NoScriptError``);
* one command at a time per connection. An asyncio lane holds up to
  ``ASYNC_LANE_CONNECTIONS`` (a worker has two pops and an ack on the wire at once while
  it drains a backlog): a coroutine that finds every held one busy takes one more from
  the pool and keeps it, and past that number goes through the client as before. A
  synchronous lane holds one; a thread that finds it busy goes through the client;
* closing the client closes the lane's connection with the others (a pool disconnects
  the connections it lent too), and a forked child never uses its parent's lane.

A connection of a Sentinel-managed pool that was dropped (a ``READONLY`` reply from a
demoted primary drops it) is connected again through its ``connect()``, which asks the
Sentinels where the primary is now.

Cluster clients route each command to a node and keep their own connections per node:
they get no lane (``async_lane`` / ``sync_lane`` return None).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection as aconn
import redis.asyncio.sentinel

ASYNC_LANE_CONNECTIONS = 4
"""Connections an asyncio lane holds at most (commands it runs at once)."""


class AsyncLane:
    """The lane of one plain asyncio client (``execute`` like ``execute_command``)."""

    __slots__ = ("_client", "_free", "_held", "_pid")

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client: Any = client  # redis-py leaves execute_command untyped
        self._free: list[aconn.AbstractConnection] = []
        """Held connections with no command on the wire (the last one used at the end)."""
        self._held = 0
        self._pid = os.getpid()

    @property
    def held(self) -> int:
        """Connections taken from the pool and held by the lane."""
        return self._held

    async def execute(self, *args: Any) -> Any:
        """Run one command (its reply unparsed by response callbacks: batchq's scripts
        and the commands it sends here have none)."""
        if self._pid != os.getpid():
            return await self._client.execute_command(*args)
        free = self._free
        if free:
            conn = free.pop()
        elif self._held < ASYNC_LANE_CONNECTIONS:
            self._held += 1  # before the await: two callers never pass the cap
            try:
                conn = await self._client.connection_pool.get_connection()
            except BaseException:
                self._held -= 1
                raise
        else:
            return await self._client.execute_command(*args)
        try:
            if conn.is_connected:
                await _acheck(conn)
            if not conn.is_connected and isinstance(conn, _SENTINEL_CONNECTION):
                # connect() asks the Sentinels for the primary; the send would connect
                # to the last host again (a demoted primary: READONLY for ever)
                await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_packed_command(conn.pack_command(*args))
            return await conn.read_response()
        finally:
            free.append(conn)


class SyncLane:
    """The lane of one plain synchronous client; safe to share between threads."""

    __slots__ = ("_client", "_conn", "_lock", "_pid")

    def __init__(self, client: redis.Redis) -> None:
        self._client: Any = client  # redis-py leaves execute_command untyped
        self._conn: Any = None  # a redis.connection.Connection (untyped in redis-py)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def execute(self, *args: Any) -> Any:
        """``AsyncLane.execute`` for threads."""
        if self._pid != os.getpid() or not self._lock.acquire(blocking=False):
            return self._client.execute_command(*args)
        try:
            conn = self._conn
            if conn is None:
                conn = self._client.connection_pool.get_connection()
                self._conn = conn
            else:
                _check(conn)
                # nothing when connected; after the check dropped it, connect() (not the
                # send) so that a Sentinel connection asks where the primary is now
                conn.connect()
            conn.send_packed_command(conn.pack_command(*args))
            return conn.read_response()
        finally:
            self._lock.release()


_SENTINEL_CONNECTION = redis.asyncio.sentinel.SentinelManagedConnection

_CHECK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


async def _acheck(conn: aconn.AbstractConnection) -> None:
    """The pool's check before it lends a connection: one the server closed, or one with
    a reply left unread, is disconnected (the send connects it again)."""
    try:
        if await conn.can_read():
            await conn.disconnect()
    except _CHECK_ERRORS:
        await conn.disconnect()


def _check(conn: Any) -> None:
    """``_acheck`` for a synchronous connection."""
    try:
        if conn.can_read():
            conn.disconnect()
    except _CHECK_ERRORS:
        conn.disconnect()


def async_lane(client: redis.asyncio.Redis) -> AsyncLane | None:
    """A lane for ``client``, or None when it is not a plain pooled asyncio client."""
    if type(client) is not redis.asyncio.Redis or client.single_connection_client:
        return None
    return AsyncLane(client)


def sync_lane(client: redis.Redis) -> SyncLane | None:
    """A lane for ``client``, or None when it is not a plain pooled client."""
    if type(client) is not redis.Redis or client._single_connection_client:
        return None
    return SyncLane(client)
