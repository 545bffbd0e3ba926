"""Fetching: the loop that pops jobs into the process and waits idle without polling.

The loop keeps at most ``Sizing.limit()`` jobs in the process and reads ahead while a
queue is behind (``fetch_size``); what a reply brings is taken in by ``intake``. One
``pop.lua`` call per queue per round (pipelined across queues, the order rotating and the
free slots split evenly or by weight; or queue after queue in strict order:
``selection``) pops and reserves jobs, promotes due delayed jobs and reaps expired
leases; its reply is read by ``scripts.replies.decode_pop_reply``. A failed pop backs off
from 0.1 s to 5 s and never crashes the worker.

When no queue has work the fetcher waits idle (``wake.Waiter``: a BLPOP on the queues'
wake lists) until an enqueue wakes it, the next delayed job is due, a lease expires,
``max_block_s`` passes, or a stop.

Hand-off: a pop that finds nothing also registers the worker as idle on that queue
(``pop.lua``), and an enqueue that finds registrations leases its first jobs to them and
pushes the leased entries themselves on the wake list (``enqueue.lua``). The BLPOP that
wakes the worker then carries its job: no pop round trip between enqueue and start.

In burst mode the loop ends once nothing is in flight and every served queue is empty
(exit 0), or when the only jobs left sit in paused queues (``EXIT_STALLED``: waiting
would never end).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..store.keys import QueueKeys
from ..store.scripts import arun_pipeline, calls
from ..store.scripts.replies import PopReply, decode_pop_reply
from .burst import burst_done
from .fetch_size import ReadAhead, Round, Sizing, behind
from .intake import Intake
from .outcomes import Outcomes
from .phase import StopReason
from .selection import Selector
from .state import BURST_POLL_S, PROMOTE_CHUNK, REDIS_ERRORS, State
from .wake import Waiter

log = logging.getLogger("batchq.worker")


class Fetcher:
    """The fetch loop of one worker process, and its pop rounds."""

    def __init__(self, state: State, outcomes: Outcomes) -> None:
        self.st = state
        self.out = outcomes
        s = state.settings
        self.waiter = Waiter(state, self.accept)
        self.size = Sizing(state)
        self.ahead = ReadAhead(state, self.size, self.pop)
        self.intake = Intake(state, outcomes, self.size)
        self.resize()
        self._wait_ms = 0.0
        """The idle wait those pops' replies allow (the earliest due job or deadline)."""
        self._idle_ms = int((s.max_block_s + 1) * 1000)
        """A registration lapses this long after the empty pop that made it: a little
        after the blocking wait that follows it ends."""

    def resize(self) -> None:
        """(Re)plan over ``state.queues``: at start, and when a queue gained shards."""
        st, s = self.st, self.st.settings
        self.selector = Selector(len(st.names), s.order, s.weights, s.fetch_batch, st.shards)
        self.size.resize(self.selector)
        self._index = {k.queue: i for i, k in enumerate(st.queues)}
        self.waiter.resize()
        self._tried: set[int] = set()
        """Queues asked for jobs (and found empty) since the last pop that got some: the
        loop idles only once every queue was asked."""

    def accept(self, queue: str, entries: list[bytes], marks: list[int] | None = None,
               bundle: list[Any] | None = None) -> int:
        """Where every job enters the process, from a pop reply or the hand-off's BLPOP
        (``Intake.accept``)."""
        return self.intake.accept(queue, entries, marks, bundle)

    async def fetch_loop(self) -> None:
        try:
            await self._fetch_loop()
        finally:
            await self.ahead.collect()

    async def _fetch_loop(self) -> None:
        st = self.st
        s = st.settings
        size, ahead = self.size, self.ahead
        pause = 0.0
        while not st.stopping:
            if st.paused and not ahead.rounds:
                if self.waiter.registered:
                    # a paused worker takes nothing: no job may be handed to it
                    await self.waiter.withdraw()
                    log.info("fetching paused")
                st.room.clear()
                await st.room.wait()
                continue
            free = size.limit() - st.in_flight - ahead.wire_n
            if s.max_jobs is not None:
                free = min(free, s.max_jobs - st.jobs_done - st.in_flight - ahead.wire_n)
                if free <= 0 and st.in_flight == 0 and not ahead.rounds:
                    log.info("max jobs (%d) reached: recycling", s.max_jobs)
                    st.stop(StopReason.RECYCLED)
                    break
            unit = size.unit
            if unit > 1 and st.in_flight and free < unit <= size.limit():
                free = 0  # batch handlers: wait until a whole batch can be fetched
            elif unit > 1 and free > unit:
                free -= free % unit
            if not ahead.rounds and (free <= 0 or len(st.work) >= 2 * size.batch):
                st.room.clear()
                await st.room.wait()
                continue
            try:
                if ahead.rounds:
                    got, wait_s = await ahead.next()
                else:
                    got, wait_s = await self.pop(free)
                pause = 0.0
            except REDIS_ERRORS as exc:
                # a lost connection, or a server refusing (out of memory, read-only
                # replica after a failover): back off and try again, never crash
                pause = min(5.0, max(0.1, pause * 2))
                log.warning("fetch failed (%s); retrying in %.1fs", exc, pause)
                await st.sleep_unless_stopped(pause)
                continue
            if got or len(self._tried) < len(st.queues) or ahead.rounds:
                # jobs came, a queue was not asked this time (its share was 0, or
                # rotation), or a pop is still on the wire: ask (or hear) the others
                # before idling
                continue
            self._tried.clear()
            if s.burst:
                if st.in_flight:
                    # this process's last jobs are running: pop again as soon as they
                    # have all settled (they may have made retries due), not a poll later
                    await self.waiter.wait(min(wait_s, BURST_POLL_S), settled=True)
                    continue
                try:
                    # our own acks first, so the check below does not see our leases
                    await self.out.flush()
                    done = await burst_done(st)
                except REDIS_ERRORS as exc:
                    log.warning("burst check failed (%s); retrying", exc)
                    done = False
                if done:
                    break
                # others' reservations or delayed jobs remain: look again soon
                wait_s = min(wait_s, BURST_POLL_S)
            await self.waiter.wait(wait_s)

    async def pop(self, free: int) -> Round:
        """Pop from the served queues (``selection``: rotating, weighted or strict);
        returns (jobs got, idle wait). With pops on the wire at once (read-ahead), each
        takes its jobs in only after the one sent before it has: their replies may be
        read in another order (two connections), but jobs start in the order popped."""
        ahead = self.ahead
        prev, mine = ahead.turn, asyncio.get_running_loop().create_future()
        ahead.turn = mine
        try:
            return await self._pop(free, prev)
        finally:
            mine.set_result(None)

    async def _pop(self, free: int, prev: asyncio.Future[None] | None) -> Round:
        st = self.st
        s = st.settings
        qs = st.queues
        size, ahead = self.size, self.ahead
        lease_ms = int(s.lease_s * 1000)
        t0 = time.perf_counter()
        asked: list[tuple[QueueKeys, int, PopReply | BaseException]] = []
        sent_ahead = ahead.mine()
        counted = free if sent_ahead else 0  # a round sent ahead was counted with its room
        if sent_ahead and (st.stopping or st.paused):
            ahead.landed(counted)  # sent ahead, but no longer wanted
            return 0, 0.0
        if len(qs) == 1:
            want = min(free, size.batch)
            rep = decode_pop_reply(
                await ahead.on_wire(self._call(qs[0], want, lease_ms), counted, prev))
            if size.grow(len(rep.jobs) >= want and behind(rep)):
                ahead.send(len(rep.jobs))
            asked.append((qs[0], want, rep))
        elif self.selector.strict:
            # the first queue first; only what it could not fill goes to the next
            for k in [qs[i] for i in self.selector.strict_order()]:
                want = self.selector.strict_want(free)
                res = await self._call(k, want, lease_ms)
                one = res if isinstance(res, BaseException) else decode_pop_reply(res)
                asked.append((k, want, one))
                if not isinstance(one, BaseException):
                    free -= len(one.jobs)
                    if free <= 0 or len(one.jobs) >= want:
                        break
        else:
            among = [i for i in range(len(qs)) if i not in self._tried] or None
            if among is None:
                self._tried.clear()  # every queue was asked (a failed round): start over
            plan = self.selector.plan(free, among)
            pipe = st.redis.pipeline(transaction=False)
            for i, want in plan:
                await st.scripts.call(self._pop_call(qs[i], want, lease_ms), client=pipe)
            results = await ahead.on_wire(arun_pipeline(pipe, st.redis), counted, prev)
            asked = [(qs[i], want, r if isinstance(r, BaseException) else decode_pop_reply(r))
                     for (i, want), r in zip(plan, results, strict=True)]
            full = bool(plan) and all(not isinstance(r, BaseException) and len(r.jobs) >= w
                                      for _, w, r in asked)
            first = asked[0][2] if asked else None
            if size.grow(full and isinstance(first, PopReply) and behind(first),
                         len(st.names) == 1):
                ahead.send(sum(len(r.jobs) for _, _, r in asked
                               if isinstance(r, PopReply)))
        failed = [r for _, _, r in asked if isinstance(r, BaseException)]
        if len(failed) == len(asked):
            raise failed[0]
        rtt = time.perf_counter() - t0
        size.note_rtt(rtt)
        m = st.m
        if m is not None:
            m.redis.observe(("pop",), rtt)
        got = 0
        wait_ms = s.max_block_s * 1000 if not self._tried else self._wait_ms
        for k, want, r in asked:
            if want > 0:
                self._tried.add(self._index[k.queue])
            if isinstance(r, BaseException):
                # another queue's pop did run (on a cluster: another node): take its
                # jobs rather than strand them until their leases expire
                continue
            self.selector.came_back(self._index[k.queue], want, len(r.jobs))
            wait_ms = self.intake.account(k.queue, r, wait_ms)
            if r.jobs:
                n = self.accept(k.queue, r.jobs, r.recovered, r.bundle)
                got += n
                if m is not None:
                    m.batch.observe((k.queue,), n)
        if got:
            self._tried.clear()
        self._wait_ms = wait_ms
        if failed:
            if not got:
                raise failed[0]
            log.warning("fetch from some queues failed (%s); retrying", failed[0])
        return got, max(0.0, wait_ms / 1000)

    async def _call(self, k: QueueKeys, want: int, lease_ms: int) -> Any:
        """One pop.lua call; a failure is returned, not raised (strict order goes on to
        the next queue, as a pipeline does)."""
        if len(self.st.queues) == 1:
            return await self.st.scripts.call(self._pop_call(k, want, lease_ms))
        try:
            return await self.st.scripts.call(self._pop_call(k, want, lease_ms))
        except REDIS_ERRORS as exc:
            return exc

    def _pop_call(self, k: QueueKeys, want: int, lease_ms: int) -> calls.Call:
        self.waiter.registered = True
        return calls.pop(k, want, lease_ms, PROMOTE_CHUNK, self.st.worker_id, self._idle_ms,
                         bundle=True)
