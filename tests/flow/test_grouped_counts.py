"""Grouped ready jobs (they wait in ``gready``, not in the ready lists) are counted
everywhere ready jobs are: ready by priority and the oldest ready age in ``QueueStats``,
``batchq info --json`` / ``overview`` (what the console shows) and the oldest-age gauge
on ``/metrics``; read per group, never per job, and past ``GROUPS_READ`` groups
shared out so that the counts still add up."""

from __future__ import annotations

import json
import time

import pytest
from fixtures.flow import *  # noqa: F403
from helpers import run_cli, wait_until
from prometheus_client.core import CollectorRegistry
from workers import worker_env

import batchq
from batchq.ops import overview, stats
from batchq.ops.metrics import QueueCollector

pytestmark = pytest.mark.integration


def _gauge(app: batchq.App, name: str, queue: str) -> float:
    reg = CollectorRegistry()
    reg.register(QueueCollector(app))
    value = reg.get_sample_value(name, {"queue": queue})
    assert value is not None
    return value


def test_grouped_jobs_in_ready_by_priority(app: batchq.App, queue_name: str) -> None:
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="a").enqueue_many([(f"a{i}",) for i in range(5)])
    work.options(group="a", priority=7).enqueue_many([(f"a7{i}",) for i in range(2)])
    work.options(group="b", priority=7).enqueue_many([(f"b{i}",) for i in range(3)])
    work.options(group="c", priority=2).enqueue("c2")
    work.options(group="c", priority=9).enqueue("c9")
    work.enqueue_many([(f"p{i}",) for i in range(4)])  # plain jobs, priority 0
    work.options(priority=7).enqueue("p7")
    st = app.queue(queue_name).stats()
    assert st.grouped == 12 and st.ready == 17
    want = {0: 5 + 4, 7: 2 + 3 + 1, 2: 1, 9: 1}
    assert st.ready_by_priority == want
    assert sum(st.ready_by_priority.values()) == st.ready

    view = overview.read_queues(app, [queue_name])[queue_name].as_dict()
    assert view["ready_by_priority"] == {str(p): n for p, n in
                                         sorted(want.items(), reverse=True)}


def test_grouped_only_queue_has_an_oldest_age(app: batchq.App, queue_name: str,
                                              redis_url: str, namespace: str) -> None:
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="old").enqueue("first")
    time.sleep(1.2)
    work.options(group="new").enqueue_many([(f"n{i}",) for i in range(3)])
    st = app.queue(queue_name).stats()
    assert st.ready == st.grouped == 4
    assert st.oldest_age_s >= 1.0  # the job of group "old", not the newer ones
    assert _gauge(app, "batchq_queue_oldest_job_age_seconds", queue_name) >= 1.0
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": namespace,
                      "BATCHQ_TEST_NS": namespace})
    res = run_cli(["info", "apps.flow_app:app", "--json"], env=env, timeout_s=30)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)["queues"][queue_name]
    assert info["oldest_age_s"] >= 1.0 and info["ready"] == 4


def test_given_back_grouped_job_counts_by_its_priority(app: batchq.App, queue_name: str,
                                                       start_worker, runs) -> None:
    """A job handed back to the head of its group (a RateLimited hold) is counted under
    its priority and is the one first in line."""
    t = app.tasks["throttled"].options(queue=queue_name, group="prov", priority=3)
    t.enqueue("x", 600, True)
    start_worker(queue_name, "-c", "1")
    q = app.queue(queue_name)
    wait_until(lambda: any(r.kind == "limited" for r in runs()), timeout_s=20)
    wait_until(lambda: q.stats().grouped == 1, timeout_s=10)
    st = q.stats()
    assert st.ready_by_priority == {3: 1} and st.oldest_age_s > 0


def test_past_the_groups_read_counts_still_add_up(app: batchq.App, queue_name: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    work = app.tasks["work"].options(queue=queue_name)
    for i in range(6):
        work.options(group=f"g{i}", priority=2).enqueue_many([(f"{i}-{j}",)
                                                              for j in range(2)])
    monkeypatch.setattr(stats, "GROUPS_READ", 2)
    st = app.queue(queue_name).stats()
    assert st.ready_by_priority == {2: 12}
