"""Fetching: pop jobs into the process, accept them, and wait idle without polling.

The fetch loop keeps at most ``Fetcher.limit()`` jobs in the process: one per runner,
plus the jobs its handlers are expected to finish within about one fetch round trip
(from the handlers' average wall time), never more than ``concurrency + 2 x`` a pop's
size (``BEHIND_BATCH``). Fast handlers thus get two pops of prefetch, so the next pop is
on the wire while the current batch runs; slow ones hold about one job more than they run, so
prefetch cannot defeat priorities. One ``pop.lua`` call per queue per round (pipelined
across queues, the order rotating and the free slots split evenly or by weight; or
queue after queue in strict order: ``selection``) pops and reserves jobs, promotes due
delayed jobs and reaps expired leases. A failed pop backs off from 0.1 s to 5 s and
never crashes the worker.

Read-ahead: while a queue is behind (a pop round came back full and its oldest job had
waited ``READ_AHEAD_BEHIND_MS``), the next round is sent (up to ``READ_AHEAD`` on the
wire) as soon as the reply is in, before its jobs wake a runner, while the prefetch
limit has room for a whole batch more (not in strict order). The server pops the
next batch while the worker runs this one; the loop takes the replies in the order sent,
and a stop waits for the ones on the wire so their jobs are given back, not stranded.

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
import collections
import logging
import math
import time
from collections.abc import Awaitable
from typing import Any

from .. import codec
from ..codec import Job
from ..keys import QueueKeys
from ..metrics import bump
from ..scripts import arun_pipeline, calls
from .burst import burst_done
from .outcomes import Outcomes
from .selection import Selector
from .state import BURST_POLL_S, CHUNK, PROMOTE_CHUNK, REDIS_ERRORS, State
from .wake import Waiter

log = logging.getLogger("batchq.worker")

PREFETCH_HORIZON_S = 0.005
"""The prefetch covers the jobs expected to finish within this long (or two fetch round
trips, whichever is longer): enough to keep the runners busy while the next pop is on
the wire, little enough that a higher-priority job is not stuck behind it."""

READ_AHEAD = 2
"""Pop rounds a worker keeps on the wire while its queues have a backlog: one in the
server's hands while the reply of the other is run. With one, the server and the worker
took turns (a drain of no-op jobs left the worker idle a third of the time)."""

READ_AHEAD_BEHIND_MS = 10
"""Read ahead only while the queue is behind: the oldest job of a full pop had waited at
least this long (since it was enqueued or became due). A worker keeping up with its
producers gains nothing from a second pop on the wire, and holding its jobs here would
keep them from an idle neighbour (at 60,000 jobs/s on two processes, p99 6.8 → 10 ms)."""

BEHIND_BATCH = 3
"""While its queue is behind (as read-ahead decides), a pop asks for up to this many
times ``fetch_batch`` (at most ``CHUNK``; a round over a sharded queue's shards plans
with it in place of ``fetch_batch``) and the prefetch cap grows alike: a script call
costs the server about what 100 jobs in it do, so a backlog drains with a third of the
calls. A worker keeping up pops ``fetch_batch``."""

RTT_EWMA_ALPHA = 0.2

_HEAD = 11
"""pop.lua's reply: {now, next_due, next_deadline, promoted, reaped, expired, malformed,
crashed, recovered positions, due campaigns, {bundle, n} or {}, jobs...}"""

_POSITIONS = [i.to_bytes(2, "big") for i in range(CHUNK + 1)]
"""A bundle job's position as its lease ends (``<bundle><position>``: two bytes,
big-endian, ``_lib.lua`` "Bundles"), made once."""


class Fetcher:
    def __init__(self, state: State, outcomes: Outcomes) -> None:
        self.st = state
        self.out = outcomes
        s = state.settings
        self.waiter = Waiter(state, self.accept)
        self.resize()
        self._tried: set[int] = set()
        """Queues asked for jobs (and found empty) since the last pop that got some: the
        loop idles only once every queue was asked."""
        self._wait_ms = 0.0
        """The idle wait those pops' replies allow (the earliest due job or deadline)."""
        self._rtt_s = 0.0
        """Moving average of a fetch round's time (the pops on the wire)."""
        served = set(self._index)
        self._unit = max([t.config.batch_size or 1 for t in state.tasks.values()
                          if t.is_batch and t.config.queue in served], default=1)
        """Jobs one runner takes at once: the largest batch of a served queue's batch
        task, or of a batch task whose jobs were popped here (so batch handlers still get
        full batches), else 1."""
        self._limit_key: tuple[float | None, float, int] = (-1.0, -1.0, 0)
        self._limit = 0  # limit() and what it was computed from (the key)
        self._ahead: collections.deque[asyncio.Task[tuple[int, float]]] = collections.deque()
        """Pops sent ahead (``_send_ahead``), oldest first: the fetch loop takes their
        replies' outcomes in the order they were sent."""
        self._turn: asyncio.Future[None] | None = None
        """Done once the last pop sent has taken in its jobs (``pop``)."""
        self._wire = self._wire_n = 0
        """Rounds sent ahead whose reply has not come, and the jobs they may bring (a
        round the loop awaits itself needs no count: no other round runs meanwhile)."""
        self._idle_ms = int((s.max_block_s + 1) * 1000)
        """A registration lapses this long after the empty pop that made it: a little
        after the blocking wait that follows it ends."""

    def resize(self) -> None:
        """(Re)plan over ``state.queues``: at start, and when a queue gained shards."""
        st, s = self.st, self.st.settings
        self._batch = s.fetch_batch  # jobs a pop asks for (``_grow``)
        self.selector = Selector(len(st.names), s.order, s.weights, s.fetch_batch, st.shards)
        self._index = {k.queue: i for i, k in enumerate(st.queues)}
        self.waiter.resize()
        self._tried = set()

    def limit(self) -> int:
        """How many jobs this process may hold (running, and fetched not started).

        At least one per runner (a full batch each when a served queue has batch tasks),
        plus the jobs expected to finish within about one fetch round trip (``run_s``,
        the handlers' average wall time, against ``PREFETCH_HORIZON_S`` or two round
        trips), at most ``concurrency + 2 x`` a pop's size. Fast handlers therefore keep
        the full prefetch (the next pop is on the wire while the current batch runs),
        while slow ones hold only about one job more than they run, so a higher-priority
        job enqueued meanwhile starts within about one job's run time. Until a first
        handler finished, only the runners' own share is taken."""
        run_s = self.st.run_s
        key = (run_s, self._rtt_s, self._batch)
        if key == self._limit_key:
            return self._limit  # the loop wakes on every settle: mostly nothing changed
        s = self.st.settings
        cap = s.concurrency + 2 * self._batch
        limit = floor = min(cap, s.concurrency * self._unit)
        if run_s is not None:
            horizon = max(PREFETCH_HORIZON_S, 2 * self._rtt_s)
            soon = s.concurrency * horizon / max(run_s, 1e-9)
            if floor + soon >= cap:
                limit = cap
            else:
                # whole batches: a batch handler's next batch is fetched full, not a
                # job at a time as slots free up
                unit = self._unit
                limit = min(cap, floor + -(-math.ceil(soon) // unit) * unit)
        self._limit_key, self._limit = key, limit
        return limit

    async def fetch_loop(self) -> None:
        try:
            await self._fetch_loop()
        finally:
            await self._collect_ahead()

    async def _collect_ahead(self) -> None:
        """Stopping with pops still on the wire: their jobs are leased already, so they
        are taken in (and given back unstarted by the drain), not left to expire."""
        while self._ahead:
            try:
                await self._next_ahead()
            except REDIS_ERRORS as exc:
                log.warning("a pop sent ahead failed while stopping (%s)", exc)

    async def _next_ahead(self) -> tuple[int, float]:
        """The outcome of the oldest round sent ahead (it leaves ``_ahead``)."""
        try:
            return await self._ahead[0]
        finally:
            self._ahead.popleft()

    def _send_ahead(self, got: int) -> None:
        """A pop round came back full (every queue asked gave all it was asked for)
        with ``got`` jobs: more are likely waiting, so keep up to ``READ_AHEAD`` rounds
        on the wire, sent now, before those jobs wake a runner (a runner of jobs that
        never yield holds the loop until they are all run). The server then pops the
        next batch while this process runs the last one, instead of the two taking
        turns. Not in strict order, whose round asks queue after queue."""
        st, s = self.st, self.st.settings
        if st.stopping or st.fetch_paused or self.selector.strict:
            return
        batch = self._batch
        free = self.limit() - st.in_flight - got - self._wire_n
        if s.max_jobs is not None:
            free = min(free, s.max_jobs - st.jobs_done - st.in_flight - got - self._wire_n)
        while (self._wire < READ_AHEAD and free >= s.fetch_batch
               and len(st.work) < 2 * batch):
            # one queue: up to a pop's size; several: the room shared by the rounds
            # still to send, split by each round's plan
            n = min(free, batch) if len(st.queues) == 1 else max(batch, free // (
                READ_AHEAD - self._wire))
            self._ahead.append(asyncio.create_task(self.pop(n)))
            self._wire += 1  # counted now: the task sends when the loop turns
            self._wire_n += n
            free -= n

    def _landed(self, counted: int) -> None:
        """A round sent ahead (counted with its ``counted`` jobs) is off the wire."""
        if counted:
            self._wire -= 1
            self._wire_n -= counted

    async def _on_wire(self, aw: Awaitable[Any], counted: int,
                       prev: asyncio.Future[None] | None) -> Any:
        """Await a pop round's reply (``counted``: its jobs, if it was sent ahead; 0 if
        not); then wait until the round sent before it has taken its jobs in, so jobs
        start in the order popped."""
        try:
            res = await aw
        finally:
            self._landed(counted)
        if prev is not None and not prev.done():
            await prev
        return res

    async def _fetch_loop(self) -> None:
        st = self.st
        s = st.settings
        pause = 0.0
        while not st.stopping:
            if st.fetch_paused and not self._ahead:
                if self.waiter.registered:
                    # a paused worker takes nothing: no job may be handed to it
                    await self.waiter.withdraw()
                    log.info("fetching paused")
                st.room.clear()
                await st.room.wait()
                continue
            free = self.limit() - st.in_flight - self._wire_n
            if s.max_jobs is not None:
                free = min(free, s.max_jobs - st.jobs_done - st.in_flight - self._wire_n)
                if free <= 0 and st.in_flight == 0 and not self._ahead:
                    log.info("max jobs (%d) reached: recycling", s.max_jobs)
                    st.recycled = True
                    st.stopping = True
                    break
            unit = self._unit
            if unit > 1 and st.in_flight and free < unit <= self.limit():
                free = 0  # batch handlers: wait until a whole batch can be fetched
            elif unit > 1 and free > unit:
                free -= free % unit
            if not self._ahead and (free <= 0 or len(st.work) >= 2 * self._batch):
                st.room.clear()
                await st.room.wait()
                continue
            try:
                if self._ahead:
                    got, wait_s = await self._next_ahead()
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
            if got or len(self._tried) < len(st.queues) or self._ahead:
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

    async def pop(self, free: int) -> tuple[int, float]:
        """Pop from the served queues (``selection``: rotating, weighted or strict);
        returns (jobs got, idle wait). With pops on the wire at once (read-ahead), each
        takes its jobs in only after the one sent before it has: their replies may be
        read in another order (two connections), but jobs start in the order popped."""
        prev, mine = self._turn, asyncio.get_running_loop().create_future()
        self._turn = mine
        try:
            return await self._pop(free, prev)
        finally:
            mine.set_result(None)

    async def _pop(self, free: int, prev: asyncio.Future[None] | None
                   ) -> tuple[int, float]:
        st = self.st
        s = st.settings
        qs = st.queues
        lease_ms = int(s.lease_s * 1000)
        t0 = time.perf_counter()
        asked: list[tuple[QueueKeys, int, Any]] = []
        ahead = bool(self._ahead) and asyncio.current_task() in self._ahead
        counted = free if ahead else 0  # a round sent ahead was counted with its room
        if ahead and (st.stopping or st.fetch_paused):
            self._landed(counted)  # sent ahead, but no longer wanted
            return 0, 0.0
        if len(qs) == 1:
            want = min(free, self._batch)
            res = await self._on_wire(self._call(qs[0], want, lease_ms), counted, prev)
            if self._grow(len(res) - _HEAD >= want and _behind(res)):
                self._send_ahead(len(res) - _HEAD)
            asked.append((qs[0], want, res))
        elif self.selector.strict:
            # the first queue first; only what it could not fill goes to the next
            for k in [qs[i] for i in self.selector.strict_order()]:
                want = self.selector.strict_want(free)
                res = await self._call(k, want, lease_ms)
                asked.append((k, want, res))
                if not isinstance(res, Exception):
                    free -= len(res) - _HEAD
                    if free <= 0 or len(res) - _HEAD >= want:
                        break
        else:
            among = [i for i in range(len(qs)) if i not in self._tried] or None
            if among is None:
                self._tried.clear()  # every queue was asked (a failed round): start over
            plan = self.selector.plan(free, among)
            pipe = st.redis.pipeline(transaction=False)
            for i, want in plan:
                await st.scripts.call(self._pop_call(qs[i], want, lease_ms), client=pipe)
            results = await self._on_wire(arun_pipeline(pipe, st.redis), counted, prev)
            asked = [(qs[i], want, r) for (i, want), r in zip(plan, results, strict=True)]
            behind = bool(plan) and all(not isinstance(r, Exception) and len(r) - _HEAD >= w
                                        for _, w, r in asked) and _behind(asked[0][2])
            if self._grow(behind, len(st.names) == 1):
                self._send_ahead(sum(len(r) - _HEAD for _, _, r in asked))
        failed = [r for _, _, r in asked if isinstance(r, Exception)]
        if len(failed) == len(asked):
            raise failed[0]
        rtt = time.perf_counter() - t0
        self._rtt_s += RTT_EWMA_ALPHA * (rtt - self._rtt_s)
        m = st.m
        if m is not None:
            m.redis.observe(("pop",), rtt)
        got = 0
        wait_ms = s.max_block_s * 1000 if not self._tried else self._wait_ms
        for k, want, res in asked:
            if want > 0:
                self._tried.add(self._index[k.queue])
            if isinstance(res, Exception):
                # another queue's pop did run (on a cluster: another node): take its
                # jobs rather than strand them until their leases expire
                continue
            self.selector.came_back(self._index[k.queue], want, len(res) - _HEAD)
            got_here, wait_ms = self._take(k, res, wait_ms)
            got += got_here
        if got:
            self._tried.clear()
        self._wait_ms = wait_ms
        if failed:
            if not got:
                raise failed[0]
            log.warning("fetch from some queues failed (%s); retrying", failed[0])
        return got, max(0.0, wait_ms / 1000)

    def _grow(self, behind: bool, grows: bool = True) -> bool:
        """Pops ask ``BEHIND_BATCH`` x ``fetch_batch`` while ``behind`` and ``grows`` (one
        queue or its shards; several queues' rounds stay as fine as rotation needs: 3 x 20
        a queue split the first 200 jobs 78 / 122), else ``fetch_batch``; -> ``behind``."""
        fb = self.st.settings.fetch_batch
        self._batch = self.selector.fetch_batch = min(CHUNK, BEHIND_BATCH * fb) \
            if behind and grows else fb
        return behind

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

    def _take(self, k: QueueKeys, res: list[Any], wait_ms: float) -> tuple[int, float]:
        """Account for one pop reply and accept its jobs: (jobs got, idle wait in ms)."""
        st = self.st
        m = st.m
        c = st.counters
        now, next_due, next_deadline, promoted, reaped, expired, malformed, crashed, \
            marks, due_campaigns, bundle = res[:_HEAD]
        if due_campaigns:
            st.due_campaigns.update(x.decode() for x in due_campaigns)
            st.due_event.set()
        c.promoted += promoted
        c.reaped += reaped
        if expired or malformed or reaped or crashed:
            for reason, count in (("lease_expired", expired), ("decode_error", malformed),
                                  ("crashed_worker", crashed)):
                if count:
                    self.out.count_dead(reason, count)
            if m is not None:
                bump(m.redelivered, k.queue, reaped)
                bump(m.dead, (k.queue, "", "lease_expired"), expired)
                bump(m.dead, (k.queue, "", "decode_error"), malformed)
                bump(m.dead, (k.queue, "", "crashed_worker"), crashed)
        for due in (next_due, next_deadline):
            if due >= 0:
                wait_ms = min(wait_ms, due - now + 2)
        got = self.accept(k.queue, res[_HEAD:], marks, bundle) if len(res) > _HEAD else 0
        if m is not None and len(res) > _HEAD:
            m.batch.observe((k.queue,), got)
        return got, wait_ms

    def accept(self, queue: str, entries: list[bytes], marks: list[int] | None = None,
               bundle: list[Any] | None = None) -> int:
        """Decode popped entries into ``work`` (batch tasks grouped; a recovered job on
        its own, to be run alone). ``marks``: 1-based positions of recovered jobs;
        ``bundle``: ``[name, n]`` when the last ``n`` entries are a bundle's (leased
        together, their attempt not counted yet: ``pop.lua``)."""
        st = self.st
        held = st.held[queue]
        tasks = st.tasks
        groups: dict[str, list[Job]] = {}
        recovered = set(marks) if marks else ()
        n = 0
        first = len(entries) + 1  # the position of the bundle's first job
        prefix = b""
        if bundle:
            first -= int(bundle[1])
            prefix = bundle[0]
        for pos, raw in enumerate(entries, 1):
            lease = prefix + _POSITIONS[pos - first + 1] if pos >= first else None
            try:
                job = codec.decode_entry(raw, queue)
            except codec.DecodeError as exc:
                self.out.bury_raw(queue, raw, "decode_error", exc, lease)
                continue
            if lease is not None:
                job.attempt += 1
                job.lease = lease
            held[job.lease] = job
            n += 1
            t = tasks.get(job.task)
            if pos in recovered:
                job.recovered = True
                st.counters.recovered += 1
                self.st.work.append([job] if t is not None and t.is_batch else job)
            elif t is not None and t.is_batch:
                g = groups.get(job.task)
                if g is None:
                    g = groups[job.task] = []
                    st.work.append(g)
                    if (t.config.batch_size or 1) > self._unit:
                        # a batch task routed here with options(queue=...): from now
                        # on, runners take its full batches
                        self._unit = t.config.batch_size or 1
                        self._limit_key = (-1.0, -1.0, 0)
                g.append(job)
                if len(g) >= (t.config.batch_size or 1):
                    del groups[job.task]
            else:
                st.work.append(job)
        st.in_flight += n
        st.counters.fetched += n
        if n and not st.waking:
            st.wake_runners(1)
        return n


def _behind(res: list[Any]) -> bool:
    """A pop reply's first (oldest) job had waited ``READ_AHEAD_BEHIND_MS`` or more."""
    try:
        job = codec.decode_entry(res[_HEAD], "")
    except (IndexError, codec.DecodeError):  # no job, or one that is not
        return False
    return time.time() * 1000 - job.ready_ms >= READ_AHEAD_BEHIND_MS
