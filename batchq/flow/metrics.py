"""Flow-control metrics read at scrape time (``metrics.QueueCollector``).

Per queue, from the one pipelined ``stats.read`` every scrape already makes:
``batchq_queue_grouped_jobs``, ``batchq_queue_groups{state="ready|waiting"}`` and
``batchq_queue_held_seconds``. Per limit, from ``flow_view.read`` (two more pipelined
round trips for all the queues, bounded): ``batchq_limit_concurrency_used_ratio``,
``batchq_limit_rate_per_second``, ``batchq_group_waiting_seconds`` and
``batchq_group_window_used{window}`` (starts counted in the current calendar period, for
limits with calendar quotas: four windows at most per group).

Cardinality stays bounded whatever the producers do: a group is a label value only when
it has a limit of its own, and at most ``flow_view.LIMITS_SHOWN`` (50) of those per
queue. The queue's own limit has ``group=""``, the default limit of every group
``group="*"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from ..ops.stats import Snapshot
from ..store.keys import QueueKeys
from . import view as flow_view
from .limits import DEFAULT_GROUP

CAP = flow_view.LIMITS_SHOWN


def queue_families(snaps: Sequence[Snapshot]) -> list[Any]:
    """The per-queue gauges, from the scrape's ``stats.read``."""
    from prometheus_client.core import GaugeMetricFamily

    grouped = GaugeMetricFamily(
        "batchq_queue_grouped_jobs", "Ready jobs of groups (flow control); part of "
        "batchq_queue_jobs{state=\"ready\"}", labels=["queue"])
    groups = GaugeMetricFamily(
        "batchq_queue_groups", "Groups with ready jobs: ready (may start jobs now) or "
        "waiting (for a rate token, a concurrency slot or the end of a hold)",
        labels=["queue", "state"])
    held = GaugeMetricFamily(
        "batchq_queue_held_seconds", "Seconds left of a hold of the whole queue "
        "(RateLimited raised by a job without a group); 0 when not held",
        labels=["queue"])
    for snap in snaps:
        st = snap.stats
        grouped.add_metric([snap.name], st.grouped)
        groups.add_metric([snap.name, "ready"], st.groups_active)
        groups.add_metric([snap.name, "waiting"], st.groups_waiting)
        held.add_metric([snap.name], st.held_s)
    return [grouped, groups, held]


def limit_families(client: redis.Redis, queues: dict[str, Sequence[QueueKeys]]
                   ) -> Iterable[Any]:
    """The per-limit gauges (see the module docstring); ``queues``: each queue's shards'
    keys (one entry for a queue that is not sharded), reported as one queue."""
    from prometheus_client.core import GaugeMetricFamily

    used = GaugeMetricFamily(
        "batchq_limit_concurrency_used_ratio", "Jobs leased now over the concurrency "
        "limit, for the queue's own limit (group=\"\") and groups with a limit of their "
        f"own (at most {CAP} groups per queue)", labels=["queue", "group"])
    rate = GaugeMetricFamily(
        "batchq_limit_rate_per_second", "The rate limit (job starts per second) of the "
        "queue (group=\"\"), of every group without its own (group=\"*\") and of groups "
        f"with a limit of their own (at most {CAP} groups per queue)",
        labels=["queue", "group"])
    waiting = GaugeMetricFamily(
        "batchq_group_waiting_seconds", "Seconds until a group with a limit of its own "
        "may start a job again (the end of a hold from RateLimited, or its next rate "
        f"token), for such groups waiting now (at most {CAP} groups per queue)",
        labels=["queue", "group"])
    window = GaugeMetricFamily(
        "batchq_group_window_used", "Job starts counted in the current calendar period "
        "(window: minute, hour, day, month) against a calendar quota (max_per_day...), "
        "for the queue (group=\"\") and groups with such a limit of their own (at most "
        f"{CAP} groups per queue)", labels=["queue", "group", "window"])
    flows = flow_view.read_shards(client, queues, groups=0, limits=CAP)
    for name, flow in flows.items():
        for u in flow.limits:
            lim = u.limit
            group = "" if lim.group is None else lim.group
            if lim.rate_per_s is not None:
                rate.add_metric([name, group], lim.rate_per_s)
            ratio = u.used_ratio
            if ratio is not None and lim.group != DEFAULT_GROUP:
                used.add_metric([name, group], ratio)
            if u.state == "waiting" and lim.group not in (None, DEFAULT_GROUP):
                waiting.add_metric([name, group], u.until_s)
            for w in u.windows:
                window.add_metric([name, group, w.window], w.used)
    return [used, rate, waiting, window]
