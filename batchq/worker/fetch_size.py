"""How much the fetch loop asks for, and the pops it keeps on the wire ahead of need.

``Sizing`` keeps at most ``limit()`` jobs in the process: one per runner, plus the jobs
its handlers are expected to finish within about one fetch round trip (from the
handlers' average wall time), never more than ``concurrency + 2 x`` a pop's size. Fast
handlers thus get two pops of prefetch, so the next pop is on the wire while the current
batch runs; slow ones hold about one job more than they run, so prefetch cannot defeat
priorities. While a queue is behind, a pop asks for ``BEHIND_BATCH`` times
``fetch_batch`` (``grow``).

``ReadAhead``: while a queue is behind (a pop round came back full and its oldest job had
waited ``READ_AHEAD_BEHIND_MS``: ``behind``), the next round is sent (up to
``READ_AHEAD`` on the wire) as soon as the reply is in, before its jobs wake a runner,
while the prefetch limit has room for a whole batch more (not in strict order). The
server pops the next batch while the worker runs this one; the fetch loop takes the
replies in the order sent, and a stop waits for the ones on the wire so their jobs are
given back, not stranded.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..store import codec
from ..store.scripts.replies import PopReply
from .selection import Selector
from .state import CHUNK, REDIS_ERRORS, State

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

Round = tuple[int, float]
"""A pop round's outcome: (jobs got, idle wait in s)."""


class Sizing:
    """A pop's size and the prefetch limit."""

    selector: Selector
    """The fetch's plan (``resize``): a pop's size is its ``fetch_batch`` too."""

    def __init__(self, state: State) -> None:
        self.st = state
        self.batch = state.settings.fetch_batch
        """Jobs a pop asks for (``grow``)."""
        served = {k.queue for k in state.queues}
        self.unit = max([t.config.batch_size or 1 for t in state.tasks.values()
                         if t.is_batch and t.config.queue in served], default=1)
        """Jobs one runner takes at once: the largest batch of a served queue's batch
        task, or of a batch task whose jobs were popped here (``widen``: so batch
        handlers still get full batches), else 1."""
        self.rtt_s = 0.0
        """Moving average of a fetch round's time (the pops on the wire)."""
        self._limit_key: tuple[float | None, float, int] = (-1.0, -1.0, 0)
        self._limit = 0  # limit() and what it was computed from (the key)

    def resize(self, selector: Selector) -> None:
        """A new plan over the queues (``Fetcher.resize``): pops start at ``fetch_batch``."""
        self.selector = selector
        self.batch = self.st.settings.fetch_batch

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
        key = (run_s, self.rtt_s, self.batch)
        if key == self._limit_key:
            return self._limit  # the loop wakes on every settle: mostly nothing changed
        s = self.st.settings
        cap = s.concurrency + 2 * self.batch
        limit = floor = min(cap, s.concurrency * self.unit)
        if run_s is not None:
            horizon = max(PREFETCH_HORIZON_S, 2 * self.rtt_s)
            soon = s.concurrency * horizon / max(run_s, 1e-9)
            if floor + soon >= cap:
                limit = cap
            else:
                # whole batches: a batch handler's next batch is fetched full, not a
                # job at a time as slots free up
                unit = self.unit
                limit = min(cap, floor + -(-math.ceil(soon) // unit) * unit)
        self._limit_key, self._limit = key, limit
        return limit

    def widen(self, unit: int) -> None:
        """A batch task of ``unit`` jobs a batch was popped here (routed with
        ``options(queue=...)``): from now on, runners take its full batches."""
        self.unit = unit
        self._limit_key = (-1.0, -1.0, 0)

    def note_rtt(self, rtt_s: float) -> None:
        """A fetch round took ``rtt_s``."""
        self.rtt_s += RTT_EWMA_ALPHA * (rtt_s - self.rtt_s)

    def grow(self, behind: bool, grows: bool = True) -> bool:
        """Pops ask ``BEHIND_BATCH`` x ``fetch_batch`` while ``behind`` and ``grows`` (one
        queue or its shards; several queues' rounds stay as fine as rotation needs: 3 x 20
        a queue split the first 200 jobs 78 / 122), else ``fetch_batch``; -> ``behind``."""
        fb = self.st.settings.fetch_batch
        self.batch = self.selector.fetch_batch = min(CHUNK, BEHIND_BATCH * fb) \
            if behind and grows else fb
        return behind


def behind(reply: PopReply) -> bool:
    """A pop reply's first (oldest) job had waited ``READ_AHEAD_BEHIND_MS`` or more."""
    try:
        job = codec.decode_entry(reply.jobs[0], "")
    except (IndexError, codec.DecodeError):  # no job, or one that is not
        return False
    return time.time() * 1000 - job.ready_ms >= READ_AHEAD_BEHIND_MS


class ReadAhead:
    """The pop rounds sent ahead, and the order in which pops take their jobs in."""

    def __init__(self, state: State, sizing: Sizing,
                 pop: Callable[[int], Coroutine[Any, Any, Round]]) -> None:
        self.st = state
        self.size = sizing
        self._pop = pop
        self.strict = state.settings.order == "strict"
        self.rounds: collections.deque[asyncio.Task[Round]] = collections.deque()
        """Pops sent ahead (``send``), oldest first: the fetch loop takes their
        replies' outcomes in the order they were sent."""
        self.turn: asyncio.Future[None] | None = None
        """Done once the last pop sent has taken in its jobs (``Fetcher.pop``)."""
        self.wire = self.wire_n = 0
        """Rounds sent ahead whose reply has not come, and the jobs they may bring (a
        round the loop awaits itself needs no count: no other round runs meanwhile)."""

    def mine(self) -> bool:
        """The running task is a round sent ahead."""
        return bool(self.rounds) and asyncio.current_task() in self.rounds

    async def next(self) -> Round:
        """The outcome of the oldest round sent ahead (it leaves ``rounds``)."""
        try:
            return await self.rounds[0]
        finally:
            self.rounds.popleft()

    async def collect(self) -> None:
        """Stopping with pops still on the wire: their jobs are leased already, so they
        are taken in (and given back unstarted by the drain), not left to expire."""
        while self.rounds:
            try:
                await self.next()
            except REDIS_ERRORS as exc:
                log.warning("a pop sent ahead failed while stopping (%s)", exc)

    def send(self, got: int) -> None:
        """A pop round came back full (every queue asked gave all it was asked for)
        with ``got`` jobs: more are likely waiting, so keep up to ``READ_AHEAD`` rounds
        on the wire, sent now, before those jobs wake a runner (a runner of jobs that
        never yield holds the loop until they are all run). The server then pops the
        next batch while this process runs the last one, instead of the two taking
        turns. Not in strict order, whose round asks queue after queue."""
        st, s = self.st, self.st.settings
        if st.stopping or st.paused or self.strict:
            return
        batch = self.size.batch
        free = self.size.limit() - st.in_flight - got - self.wire_n
        if s.max_jobs is not None:
            free = min(free, s.max_jobs - st.jobs_done - st.in_flight - got - self.wire_n)
        while (self.wire < READ_AHEAD and free >= s.fetch_batch
               and len(st.work) < 2 * batch):
            # one queue: up to a pop's size; several: the room shared by the rounds
            # still to send, split by each round's plan
            n = min(free, batch) if len(st.queues) == 1 else max(batch, free // (
                READ_AHEAD - self.wire))
            self.rounds.append(asyncio.create_task(self._pop(n)))
            self.wire += 1  # counted now: the task sends when the loop turns
            self.wire_n += n
            free -= n

    def landed(self, counted: int) -> None:
        """A round sent ahead (counted with its ``counted`` jobs) is off the wire."""
        if counted:
            self.wire -= 1
            self.wire_n -= counted

    async def on_wire(self, aw: Awaitable[Any], counted: int,
                      prev: asyncio.Future[None] | None) -> Any:
        """Await a pop round's reply (``counted``: its jobs, if it was sent ahead; 0 if
        not); then wait until the round sent before it has taken its jobs in, so jobs
        start in the order popped."""
        try:
            res = await aw
        finally:
            self.landed(counted)
        if prev is not None and not prev.done():
            await prev
        return res
