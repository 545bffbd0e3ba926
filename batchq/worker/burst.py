"""The end of a burst run (``batchq worker --burst``): are the served queues done?"""

from __future__ import annotations

import logging

from ..exitcodes import EXIT_STALLED
from .state import State

log = logging.getLogger("batchq.worker")


async def burst_done(st: State) -> bool:
    """Burst mode, nothing in flight and the last pop empty: True when the run is
    over, with ``state.exit_code`` set (0: the queues are empty; EXIT_STALLED:
    jobs are left only in paused queues)."""
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
    if not stuck:
        log.info("burst: queues are empty, stopping")
        return True
    log.warning("burst: cannot make progress: jobs are left only in paused queues: %s; "
                "stopping with exit code %d", ", ".join(stuck), EXIT_STALLED)
    st.exit_code = EXIT_STALLED
    return True
