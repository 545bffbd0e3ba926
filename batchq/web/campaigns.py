"""Campaigns for the console: the list with progress, rate and ETA, one campaign with
its queues and the groups on them, and cancel. The counts are ``batchq campaign``'s
(``batchq.produce.campaign.stats`` / ``list_stats``: exact, one script call per queue).

Rate and ETA are there from the first look: the rate is the campaign's jobs finished per
second over the last minute when this console has looked at it before (its samples, in
the console's ``RateTracker``), else the average since it was created; the ETA is what
is pending at that rate. A finished campaign shows its average rate and no ETA.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..produce import campaign as campaigns
from ..produce.campaign import CampaignStats
from ..store.scripts import calls
from .rates import RateTracker

if TYPE_CHECKING:
    from ..tasks.app import App

LIST_MAX = 200
GROUPS_PER_QUEUE = 10
"""Groups with ready jobs shown per queue on a campaign's page."""


def _key(cid: str) -> str:
    return "campaign\0" + cid  # never a queue name (no NUL in one)


def progress(st: CampaignStats, tracker: RateTracker, now: float | None = None
             ) -> dict[str, Any]:
    """``st`` as a row: counts, ``finished`` (= total - pending), ``rate_per_s``
    (``rate_source``: ``"1m"`` or ``"average"``) and ``eta_s``."""
    t = time.time() if now is None else now
    finished = st.total - st.pending
    tracker.record(_key(st.id), finished, finished)
    recent = tracker.rates(_key(st.id), 60.0)
    if st.finished_at is not None or recent is None:
        end = st.finished_at if st.finished_at is not None else t
        elapsed = max(end - st.created_at, 1e-3)
        rate, source = finished / elapsed, "average"
    else:
        rate, source = recent[1], "1m"
    running = st.state in ("open", "sealed") and st.pending > 0
    eta = st.pending / rate if running and rate > 0 else None
    row = st.as_dict()
    row.update(finished=finished, rate_per_s=round(rate, 2), rate_source=source,
               eta_s=None if eta is None else round(eta, 1))
    return row


def listing(app: App, tracker: RateTracker, limit: int) -> dict[str, Any]:
    rows = [progress(st, tracker) for st in campaigns.list_stats(app.clients, limit)]
    return {"campaigns": rows, "limit": limit}


def detail(app: App, tracker: RateTracker, cid: str) -> dict[str, Any]:
    """One campaign: its row, its counts on each queue (while it runs: a finished
    campaign keeps only its totals) and the groups with ready jobs on those queues."""
    c = app.clients
    st = campaigns.stats(c, cid)
    row = progress(st, tracker)
    per_queue = []
    for name in st.queues:
        entry: dict[str, Any] = {"queue": name}
        if st.finished_at is None:
            reply = c.sync_scripts.call(calls.campaign_queue(c.keys(name), cid, "read"))
            flag = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0] or "")
            t, p, s, d, x = (int(v) for v in reply[1:6])
            expired = int(reply[7]) if len(reply) > 7 else 0  # after "leased"
            entry.update(flag=flag, total=t, pending=p, succeeded=s, dead=d, cancelled=x,
                         expired=expired)
        q = app.queue(name)
        entry["groups"] = [{"group": g.group, "pending": g.pending, "running": g.running,
                            "state": g.state, "until_s": round(g.until_s, 3)}
                           for g in q.groups(GROUPS_PER_QUEUE)]
        per_queue.append(entry)
    row["per_queue"] = per_queue
    return row


def cancel(app: App, cid: str) -> dict[str, Any]:
    """Cancel campaign ``cid`` (``Campaign.cancel``): its jobs not started never run."""
    n = campaigns.Campaign(app.clients, cid).cancel()
    return {"id": cid, "not_started": n, "state": campaigns.stats(app.clients, cid).state}
