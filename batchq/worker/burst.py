"""The end of a burst run (``batchq worker --burst``): are the served queues done?

Done means no job left that this process could run, including the ``on_complete`` jobs
of campaigns its own work finishes: a campaign its pop, ack or nack settled is tried
first (``campaigns.FollowUp``), and the safety net looks once at campaigns nobody
completed, so a callback they enqueue on a served queue is run by this run, not left
behind. A callback on a queue it does not serve is left ready for that queue's workers.
"""

from __future__ import annotations

import asyncio
import logging

from ..produce import campaign
from .campaigns import SAFETY_NET_LIMIT
from .exitcodes import EXIT_STALLED
from .state import REDIS_ERRORS, State

log = logging.getLogger("batchq.worker")


async def burst_done(st: State) -> bool:
    """Burst mode, nothing in flight and the last pop empty: True when the run is
    over, with ``state.exit_code`` set (0: the queues are empty; EXIT_STALLED:
    jobs are left only in paused queues)."""
    if st.due_campaigns or st.completing:
        # the follow-up has yet to try a campaign this process settled: its on_complete
        # job may be about to land on a served queue
        return False
    pipe = st.redis.pipeline(transaction=False)
    for k in st.queues:
        for r in k.ready:
            pipe.llen(r)
        pipe.zcard(k.gready)  # ready jobs of groups (flow control)
        pipe.zcard(k.delayed)
        pipe.zcard(k.reserved)
        pipe.zcard(k.bundles)
        pipe.exists(k.paused)
    res = await pipe.execute()
    per = len(st.queues[0].ready) + 5
    stuck: list[str] = []
    for i, k in enumerate(st.queues):
        counts = [int(x) for x in res[i * per : (i + 1) * per]]
        waiting, paused = sum(counts[:-3]), bool(counts[-1])
        reserved = counts[-3] + counts[-2]  # leases of their own, and bundles
        if (waiting and not paused) or (reserved and not waiting):
            # work some worker can do, or leases that will settle (or expire and be
            # reaped, which a pop does even on a paused queue): keep looking
            return False
        if waiting:
            stuck.append(f"{k.queue} ({waiting} jobs)")
    # the look the stop would take (``FollowUp.finish``), taken while this run can still
    # serve what it enqueues: a campaign it completes goes round once more
    try:
        completed = await asyncio.to_thread(campaign.check_open, st.app.clients,
                                            SAFETY_NET_LIMIT)
    except REDIS_ERRORS:
        raise  # the fetch loop looks again a moment later
    except Exception as exc:  # e.g. a record expiring mid-way: the stop's look retries
        log.warning("campaign safety net failed: %s", exc)
        completed = 0
    if completed:
        return False
    if not stuck:
        log.info("burst: queues are empty, stopping")
        return True
    log.warning("burst: cannot make progress: jobs are left only in paused queues: %s; "
                "stopping with exit code %d", ", ".join(stuck), EXIT_STALLED)
    st.exit_code = EXIT_STALLED
    return True
