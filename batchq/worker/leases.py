"""Leases: keep the ones this process holds alive, give back the ones it will not run,
and mark a recovered job's lease as started before its handler runs.

Every ``lease_s / 3`` ``extend.lua`` pushes the deadline of every lease the process
still holds (results not written yet included). A crashed worker stops extending, and
the next pop anywhere reaps its leases (pop.lua step 2: the attempt refunded unless the
job was marked started, see the crash marks there). At a stop, ``release.lua`` gives
back the jobs that never started (and the interrupted ones): head of their ready list,
attempt refunded.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..store.codec import Job
from ..store.scripts import calls
from .state import CHUNK, REDIS_ERRORS, State

log = logging.getLogger("batchq.worker")


class Leases:
    def __init__(self, state: State) -> None:
        self.st = state

    async def extend_loop(self) -> None:
        st = self.st
        every = st.settings.lease_s / 3
        lease_ms = int(st.settings.lease_s * 1000)
        while not st.closing:
            await st.sleep_unless_closed(every)
            if st.closing:
                return
            for k in st.queues:
                # results not written yet still hold their leases
                leases = [*st.held[k.queue], *st.buf[k.queue].leases()]
                for i in range(0, len(leases), CHUNK):
                    part = leases[i : i + CHUNK]
                    t0 = time.perf_counter()
                    try:
                        lost = await st.scripts.call(calls.extend(k, lease_ms, part))
                    except REDIS_ERRORS as exc:
                        # a refusal (OOM, a migrating slot, ...) must not end this loop
                        log.warning("extending leases failed (%s)", exc)
                        break
                    if st.m is not None:
                        st.m.redis.observe(("extend",), time.perf_counter() - t0)
                    if lost:
                        st.counters.leases_lost += len(lost)
                        log.warning("%d leases in %s expired before they could be extended; "
                                    "those jobs may run twice", len(lost), k.queue)

    async def mark_started(self, jobs: list[Job]) -> bool:
        """Record in Redis that these recovered jobs' handlers start now (start.lua); if
        this process dies before their outcome is written, they are the suspects. Retries
        a failed call; False when the process stops meanwhile (run nothing then)."""
        st = self.st
        k = st.by_name[jobs[0].queue]
        pause = 0.05
        while True:
            try:
                await st.scripts.call(calls.start(k, [j.lease for j in jobs]))
                return True
            except REDIS_ERRORS as exc:
                if st.stopping:
                    return False
                log.warning("marking a recovered job as started failed (%s); retrying", exc)
                await asyncio.sleep(pause)
                pause = min(2.0, pause * 2)

    async def give_back(self) -> None:
        """Release the buffered (never started) and interrupted jobs to ready."""
        st = self.st
        back: dict[str, list[bytes]] = {k.queue: [] for k in st.queues}
        for item in st.work:
            for job in (item if isinstance(item, list) else [item]):
                back[job.queue].append(job.lease)
        for job in st.interrupted:
            back[job.queue].append(job.lease)
        st.work.clear()
        st.interrupted.clear()
        for k in st.queues:
            leases = back[k.queue]
            for i in range(0, len(leases), CHUNK):
                try:
                    n = await st.scripts.call(calls.release(k, leases[i : i + CHUNK]))
                    st.counters.released += int(n)
                except REDIS_ERRORS as exc:
                    log.error("could not give back %d jobs (%s); they return when their "
                              "leases expire", len(leases), exc)
            for lease in leases:
                st.held[k.queue].pop(lease, None)
