"""Campaign follow-up: the worker's part in completing campaigns exactly once.

The pop, ack and nack scripts report campaigns whose last pending job on a queue this
process just settled (``State.due_campaigns``); this stage tries to complete them at
once (``campaign.try_complete``, in a thread: a few small round trips on the sync
client). Now and then (every ``SAFETY_NET_S``, jittered) it also runs the safety net,
``campaign.check_open``, for a worker SIGKILLed between its last ack and the follow-up.
Completion itself is guarded in Redis, so many workers trying at once is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from ..produce import campaign
from .state import State

log = logging.getLogger("batchq.worker")

SAFETY_NET_S = 15.0
"""Mean pause between two looks at sealed campaigns still open (bounded per look)."""

SAFETY_NET_LIMIT = 10
"""Campaigns looked at per safety-net pass."""

FINISH_S = 5.0
"""The longest a stopping worker waits for its last look at campaigns."""


class FollowUp:
    def __init__(self, state: State) -> None:
        self.st = state

    async def complete_due(self) -> None:
        """Try each reported campaign once; a failure leaves it for the safety net."""
        st = self.st
        while st.due_campaigns:
            cid = st.due_campaigns.pop()
            st.completing += 1
            try:
                await asyncio.to_thread(campaign.try_complete, st.app.clients, cid)
            except asyncio.CancelledError:
                # a stop cancelled the loop mid-try: the final complete_due tries again
                st.due_campaigns.add(cid)
                raise
            except Exception as exc:  # the safety net retries it
                log.warning("completing campaign %s failed: %s", cid, exc)
            finally:
                st.completing -= 1

    async def finish(self, redis_ok: bool) -> None:
        """At stop, after the last flush: the campaigns it reported, then (when the last
        flush reached Redis) one look of the safety net, at most ``FINISH_S``: a reply
        lost to a broken connection loses its report, and a burst worker stopping now
        would otherwise leave the campaign to another worker."""
        if not redis_ok:
            return
        await self.complete_due()
        try:
            await asyncio.wait_for(asyncio.to_thread(
                campaign.check_open, self.st.app.clients, SAFETY_NET_LIMIT), FINISH_S)
        except Exception as exc:
            log.warning("campaign safety net failed: %s", exc)

    async def loop(self) -> None:
        st = self.st
        next_net = asyncio.get_running_loop().time() + random.uniform(1, SAFETY_NET_S)
        while True:
            timeout = max(0.0, next_net - asyncio.get_running_loop().time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(st.due_event.wait(), timeout)
            st.due_event.clear()
            await self.complete_due()
            if asyncio.get_running_loop().time() >= next_net:
                next_net = asyncio.get_running_loop().time() + \
                    random.uniform(SAFETY_NET_S / 2, SAFETY_NET_S * 1.5)
                try:
                    await asyncio.to_thread(campaign.check_open, st.app.clients,
                                            SAFETY_NET_LIMIT)
                except Exception as exc:
                    log.warning("campaign safety net failed: %s", exc)
