"""The worker's side of circuit breakers (``batchq.flow.breaker``): a job of a task bound to
an open breaker is not run. It goes back to the delayed set, due when the breaker
half-opens, or, when its task names a fallback, back to the head of its ready list as
the fallback's job (same id, arguments, campaign, group and dedup key). Either way its
attempt is refunded and its lease settled in the same script (``reroute.lua``), so
exactly one of primary and fallback ever runs it.

The gate runs before a bound task's handler (``Runners._run_one``) and reads the
breaker as this process last saw it (a closed one again at most every
``breaker.CLOSED_CACHE_S``); a ``BreakerOpen`` raised by any handler (a half-open
breaker whose probe places are taken, or one that opened meanwhile) takes the same way
(``Outcomes.fail``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from ..flow.breaker import BreakerOpen, retask
from ..store.codec import Job
from ..store.scripts import calls
from .state import REDIS_ERRORS, State

if TYPE_CHECKING:
    from ..tasks.task import Task

log = logging.getLogger("batchq.worker")

MIN_HOLD_MS = 50
"""The shortest hold of a job whose breaker is open (it half-opens about then)."""


class Settles(Protocol):
    """What the gate needs of ``Outcomes``: a job's lease leaves this process."""

    def settle(self, job: Job) -> Any: ...


class Gate:
    def __init__(self, state: State, outcomes: Settles) -> None:
        self.st = state
        self.out = outcomes
        self._pending: set[asyncio.Task[None]] = set()

    def clear(self, task: Task[..., Any]) -> bool:
        """True when ``task``'s breaker is known closed (no await on the hot path)."""
        b = getattr(self.st.app, "breakers", {}).get(task.config.breaker)
        return b is None or b.known_closed()

    async def check(self, job: Job, task: Task[..., Any]) -> bool:
        """True when ``job`` must not run now: it was held or re-routed."""
        breakers = getattr(self.st.app, "breakers", {})
        b = breakers.get(task.config.breaker)
        if b is None:
            return False
        try:
            left_s = await b.aopen_left_s()
        except REDIS_ERRORS as exc:  # the breaker cannot be read: the handler decides
            log.warning("cannot read circuit breaker %r: %s", b.name, exc)
            return False
        if left_s <= 0:
            return False
        await self.take(job, task, left_s)
        return True

    def refused(self, job: Job, task: Task[..., Any], exc: BreakerOpen) -> None:
        """A handler raised ``BreakerOpen``: the job is held or re-routed (written in
        the background; a write that fails leaves the lease to expire, refunded)."""
        self.out.settle(job)
        t = asyncio.ensure_future(self.take(job, task, exc.retry_after_s, settled=True))
        self._pending.add(t)
        t.add_done_callback(self._pending.discard)

    async def take(self, job: Job, task: Task[..., Any], hold_s: float,
                   settled: bool = False) -> None:
        st = self.st
        fallback = task.config.fallback
        body = retask(job.raw, fallback) if fallback else b""
        hold_ms = max(MIN_HOLD_MS, round(hold_s * 1000))
        if not settled:
            self.out.settle(job)  # out of held (no lease extension), slot given back
        try:
            held, moved = await st.scripts.call(calls.reroute(
                st.by_name[job.queue], hold_ms, [(job.lease, job.task, body)]))
        except REDIS_ERRORS as exc:
            log.warning("cannot give back job %s (%s) of an open circuit breaker: %s; its "
                        "lease will expire and it runs again", job.id, job.task, exc)
            return
        c = st.counters
        if moved:
            log.info("job %s (%s) re-routed to %s: circuit breaker %r is open", job.id,
                     job.task, fallback, task.config.breaker)
        elif held:
            c.held += 1
            log.info("job %s (%s) held %.1fs: circuit breaker %r is open", job.id,
                     job.task, hold_ms / 1000, task.config.breaker)
