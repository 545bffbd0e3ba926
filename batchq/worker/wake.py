"""The idle wait: block on the queues' wake lists until a token, a handed-off job, a
due time or a stop; withdraw the hand-off registrations on a pause or a stop.

A worker whose pops found nothing blocks (``BLPOP`` on its own connection) on the wake
lists of the queues it serves until an enqueue wakes it, the next delayed job is due, a
lease expires, ``max_block_s`` passes, or a stop. A token that arrives while the worker
is busy is passed on to another idle worker. A handed-off job (``enqueue.lua`` pushes
the leased entry itself on the wake list) is accepted even if the worker got busy
meanwhile; a paused or stopping worker gives it back to the head of its ready list
(``release.lua``, attempt refunded). On Redis Cluster, where one BLPOP cannot span
slots, there is one blocking wait per wake list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ..store.keys import QueueKeys
from ..store.scripts import calls
from .state import REDIS_ERRORS, State

log = logging.getLogger("batchq.worker")


class Waiter:
    def __init__(self, state: State, accept: Callable[[str, list[bytes]], Any]) -> None:
        self.st = state
        self._accept = accept
        self.registered = True
        """False from a fetch pause until the next pop (which registers again)."""
        self._idle = False
        self._blpop: asyncio.Task[bool] | None = None
        self._wake_tasks: dict[str, asyncio.Task[bool]] = {}
        """Cluster mode: one blocking wait per wake list, kept across idle waits."""
        self._by_wake: dict[str, QueueKeys] = {}
        self.resize()

    def resize(self) -> None:
        """Follow ``state.queues`` (at start, and when a queue gained shards)."""
        self._by_wake = {k.wake: k for k in self.st.queues}

    async def wait(self, wait_s: float, *, settled: bool = False) -> None:
        """Block until a wake token, ``wait_s`` elapses, or a stop; with ``settled``,
        also until every job in this process has settled.

        The blocking wait outlives an idle wait (the next one picks it up), so it can end
        on the server's timeout in the middle of one, just after the pop that started
        it: then it is sent again for the rest of ``wait_s``, with no pop in between (that
        pop has just looked). An idle worker thus sends one pop and one BLPOP per
        ``max_block_s``, not two pops."""
        if wait_s <= 0:
            return
        st = self.st
        loop = asyncio.get_running_loop()
        end = loop.time() + wait_s
        others: list[asyncio.Future[Any]] = [asyncio.ensure_future(st.stop_event.wait())]
        if settled:
            others.append(asyncio.ensure_future(self._all_settled()))
        self._idle = True
        try:
            while True:
                if self._blpop is None or self._blpop.done():
                    keys = [k.wake for k in st.queues]
                    self._blpop = asyncio.create_task(self._blpop_once(keys))
                left = end - loop.time()
                if left <= 0:
                    return
                blpop = self._blpop
                done, _ = await asyncio.wait([blpop, *others], timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                if blpop not in done or len(done) > 1 or _woke(blpop):
                    return
        finally:
            self._idle = False
            for w in others:
                w.cancel()

    async def _all_settled(self) -> None:
        """Return once nothing is in flight (``room`` is set at every settle)."""
        st = self.st
        while st.in_flight:
            st.room.clear()
            await st.room.wait()

    async def _blpop_once(self, keys: list[str]) -> bool:
        """One blocking wait on ``keys``: True when it ended on something (a token, a
        handed-off job, a failure), False on the server's timeout."""
        st = self.st
        if len(keys) > 1 and isinstance(st.bredis, AsyncRedisCluster):
            return await self._blpop_each(keys)
        try:
            if st.blane is not None:  # the reply a list: [key, value] or None
                res = await st.blane.execute("BLPOP", *keys, st.settings.max_block_s)
            else:
                res = await st.bredis.blpop(keys, timeout=st.settings.max_block_s)
        except Exception as exc:
            # any failure (a lost connection, NOPERM, a slot moving; or redis-py's
            # cluster client racing on a connection it is resetting, which raised an
            # AttributeError once) ends this wait after a pause: never a tight loop,
            # never an unretrieved task exception
            log.warning("blocking wait failed (%s: %s)", type(exc).__name__, exc)
            await asyncio.sleep(0.5)
            return True
        if res is None:
            return False
        key, value = res
        if value != b"1" and isinstance(value, bytes):
            # a job handed off by enqueue.lua, leased already: run it, even if busy now
            # (it was meant for an idle worker); a paused or stopping worker gives it
            # back to the head of its ready list (release.lua, attempt refunded)
            k = self._by_wake[key.decode() if isinstance(key, bytes) else key]
            if st.paused or st.stopping:
                _, attempt, _, jid, _ = value.split(b":", 4)
                try:
                    await st.scripts.call(calls.release(k, [jid + b":" + attempt]))
                except REDIS_ERRORS as exc:
                    log.warning("giving back a handed-off job failed (%s); its lease "
                                "will expire", exc)
                return True
            self._accept(k.queue, [value])
            return True
        if not self._idle or st.paused or st.stopping:
            # the token arrived while this worker was busy, paused or stopping: pass it on
            # to an idle one
            with contextlib.suppress(*REDIS_ERRORS):
                await st.redis.rpush(key, "1")
        return True

    async def _blpop_each(self, keys: list[str]) -> bool:
        """Cluster mode: a BLPOP over keys of different slots is a CROSSSLOT error, so
        block on each wake list on its own (one task per queue, each passing on a token
        that arrives while this worker is busy, as above); return when the first one
        does (True when one of those that ended took something). The others keep
        blocking, ready for the next idle wait."""
        tasks = self._wake_tasks
        for key in keys:
            t = tasks.get(key)
            if t is None or t.done():
                tasks[key] = asyncio.create_task(self._blpop_once([key]))
        try:
            done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for t in tasks.values():
                t.cancel()
            raise
        return any(_woke(t) for t in done)

    async def withdraw(self) -> None:
        """Remove this worker's hand-off registrations (a pause, a stop)."""
        self.registered = False
        st = self.st
        lease_ms = int(st.settings.lease_s * 1000)
        try:
            pipe = st.redis.pipeline(transaction=False)
            for k in st.queues:
                pipe.zrem(k.idle, calls.idle_member(lease_ms, st.worker_id))
            await asyncio.wait_for(pipe.execute(), 2.0)
        except (TimeoutError, *REDIS_ERRORS) as exc:
            # they lapse by themselves within max_block_s; a job handed off meanwhile
            # is claimed by the next pop of its queue
            log.debug("withdrawing the idle registrations failed (%s)", exc)

    async def close(self) -> None:
        """Withdraw the hand-off registrations, then cancel the blocking waits."""
        await self.withdraw()
        if self._blpop is not None:
            self._blpop.cancel()
            with contextlib.suppress(BaseException):
                await self._blpop
        for t in self._wake_tasks.values():
            t.cancel()
        await asyncio.gather(*self._wake_tasks.values(), return_exceptions=True)


def _woke(task: asyncio.Task[bool]) -> bool:
    """Whether a finished blocking wait ended on something rather than on its timeout
    (a cancelled one counts as something: the caller looks again)."""
    return task.cancelled() or task.result()
