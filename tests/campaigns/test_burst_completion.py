"""A ``--burst`` worker and the ``on_complete`` job its own work creates.

The worker that settles a campaign's last job completes the campaign and enqueues its
``on_complete`` job. When that job lands on a queue the burst worker serves, the worker
must run it before it exits: a burst run never leaves work it created itself on its own
queues. On a queue it does not serve, the job is left ready for the workers of that
queue. The workers here are the real CLI (``python -m batchq worker ... --burst``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis
from fixtures.campaigns import *  # noqa: F403
from fixtures.campaigns import completions, make_app
from helpers import run_cli

import batchq

pytestmark = pytest.mark.integration

MODULE = "campaigns.test_burst_completion:worker_app"


def __getattr__(name: str) -> Any:
    """``worker_app`` for the worker subprocess, built from its environment (the tests'
    Redis and namespace), so a test's app and its worker's share the namespace (not
    ``app``: that name is the fixture)."""
    if name == "worker_app":
        return make_app(os.environ["BATCHQ_REDIS_URL"], os.environ["BATCHQ_TEST_NS"])
    raise AttributeError(name)


def _burst(redis_url: str, namespace: str, queues: str) -> None:
    r = run_cli(["worker", MODULE, "--burst", "-q", queues, "-c", "8"],
                env={"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace},
                timeout_s=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _ready(app: batchq.App, queue: str) -> int:
    return app.queue(queue).stats().ready


def test_burst_worker_runs_the_callback_its_last_ack_enqueued(
        app: batchq.App, redis_url: str, namespace: str, redis_client: redis.Redis) -> None:
    n = 30
    with app.campaign("burst-cb", on_complete=app.tasks["report"]) as c:
        app.tasks["send"].options(campaign=c).enqueue_many(range(n))
    _burst(redis_url, namespace, "a,cb")
    st = c.stats()
    assert st.done and (st.succeeded, st.pending) == (n, 0)
    assert _ready(app, "cb") == 0, "the burst worker exited leaving on_complete unrun"
    done = completions(redis_client, namespace)
    assert [(cid, s["succeeded"]) for cid, s in done] == [("burst-cb", n)]


def test_burst_worker_runs_the_callback_of_every_campaign_it_finished(
        app: batchq.App, redis_url: str, namespace: str, redis_client: redis.Redis) -> None:
    # several campaigns finishing in the same run, one failing job retried in each
    report, send = app.tasks["report"], app.tasks["send"]
    ids = [f"many-{i}" for i in range(4)]
    for cid in ids:
        with app.campaign(cid, on_complete=report) as c:
            send.options(campaign=c).enqueue_many([(i,) for i in range(10)] + [(99, True)])
    _burst(redis_url, namespace, "cb,a")
    assert _ready(app, "cb") == 0
    assert sorted(cid for cid, _ in completions(redis_client, namespace)) == ids


def test_burst_worker_completes_a_campaign_nobody_completed_and_runs_its_callback(
        app: batchq.App, redis_url: str, namespace: str, redis_client: redis.Redis) -> None:
    # a seal interrupted before its completion (or a worker whose report was lost): the
    # campaign is closed with nothing pending, and only the safety net completes it
    c = app.campaign("left-over", on_complete=app.tasks["report"])
    batchq.produce.campaign.close(app.clients, c.id, "seal")
    assert not c.stats().done
    _burst(redis_url, namespace, "a,cb")
    assert c.stats().done
    assert _ready(app, "cb") == 0, "the burst worker's own safety net left on_complete unrun"
    assert [cid for cid, _ in completions(redis_client, namespace)] == ["left-over"]


def test_burst_worker_leaves_a_callback_on_a_queue_it_does_not_serve(
        app: batchq.App, redis_url: str, namespace: str, redis_client: redis.Redis) -> None:
    with app.campaign("other-queue", on_complete=app.tasks["report"]) as c:
        app.tasks["send"].options(campaign=c).enqueue_many(range(10))
    _burst(redis_url, namespace, "a")
    assert c.stats().done
    assert _ready(app, "cb") == 1  # for the workers of "cb"
    assert completions(redis_client, namespace) == []
    _burst(redis_url, namespace, "cb")
    assert _ready(app, "cb") == 0
    assert [cid for cid, _ in completions(redis_client, namespace)] == ["other-queue"]
