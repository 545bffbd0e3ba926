"""Intake: what a pop reply (or a handed-off job) brings into the process.

``Intake.account`` counts what the pop did besides popping (promoted, reaped, dead-lettered
jobs, campaigns that became due) and the idle wait its reply allows; ``Intake.accept``
decodes the popped entries into ``State.work`` and ``State.held`` (batch tasks' jobs
grouped into batches, a recovered job on its own, to be run alone, a bundle's jobs given
their leases) and wakes a runner.
"""

from __future__ import annotations

from typing import Any

from ..ops.metrics import bump
from ..store import codec
from ..store.codec import Job
from ..store.scripts.replies import PopReply
from .fetch_size import Sizing
from .outcomes import Outcomes
from .state import CHUNK, State

_POSITIONS = [i.to_bytes(2, "big") for i in range(CHUNK + 1)]
"""A bundle job's position as its lease ends (``<bundle><position>``: two bytes,
big-endian, ``_lib.lua`` "Bundles"), made once."""


class Intake:
    def __init__(self, state: State, outcomes: Outcomes, sizing: Sizing) -> None:
        self.st = state
        self.out = outcomes
        self.size = sizing

    def account(self, queue: str, reply: PopReply, wait_ms: float) -> float:
        """Count what one pop did besides popping; returns the idle wait (ms) its reply
        allows, at most ``wait_ms``."""
        st = self.st
        m = st.m
        c = st.counters
        if reply.due_campaigns:
            st.due_campaigns.update(x.decode() for x in reply.due_campaigns)
            st.due_event.set()
        reaped, expired, malformed, crashed = \
            reply.reaped, reply.expired, reply.malformed, reply.crashed
        c.promoted += reply.promoted
        c.reaped += reaped
        if expired or malformed or reaped or crashed:
            for reason, count in (("lease_expired", expired), ("decode_error", malformed),
                                  ("crashed_worker", crashed)):
                if count:
                    self.out.count_dead(reason, count)
            if m is not None:
                bump(m.redelivered, queue, reaped)
                bump(m.dead, (queue, "", "lease_expired"), expired)
                bump(m.dead, (queue, "", "decode_error"), malformed)
                bump(m.dead, (queue, "", "crashed_worker"), crashed)
        now = reply.now
        for due in (reply.next_due, reply.next_deadline):
            if due >= 0:
                wait_ms = min(wait_ms, due - now + 2)
        return wait_ms

    def accept(self, queue: str, entries: list[bytes], marks: list[int] | None = None,
               bundle: list[Any] | None = None) -> int:
        """Decode popped entries into ``work`` (batch tasks grouped; a recovered job on
        its own, to be run alone). ``marks``: 1-based positions of recovered jobs;
        ``bundle``: ``[name, n]`` when the last ``n`` entries are a bundle's (leased
        together, their attempt not counted yet: ``pop.lua``)."""
        st = self.st
        held = st.held[queue]
        tasks = st.tasks
        work = st.work
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
                work.append([job] if t is not None and t.is_batch else job)
            elif t is not None and t.is_batch:
                g = groups.get(job.task)
                if g is None:
                    g = groups[job.task] = []
                    work.append(g)
                    if (t.config.batch_size or 1) > self.size.unit:
                        # a batch task routed here with options(queue=...)
                        self.size.widen(t.config.batch_size or 1)
                g.append(job)
                if len(g) >= (t.config.batch_size or 1):
                    del groups[job.task]
            else:
                work.append(job)
        st.in_flight += n
        st.counters.fetched += n
        if n and not st.waking:
            st.wake_runners(1)
        return n
