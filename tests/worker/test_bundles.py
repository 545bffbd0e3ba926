"""A real worker leases the plain jobs of each fetch as one bundle (``_lib.lua``
"Bundles"): stats, status and the running count see each job; attempts, acks and the
reaper treat each job as before."""

from __future__ import annotations

import signal

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import running, wait_exit
from helpers import wait_until

pytestmark = pytest.mark.integration


def test_a_worker_leases_its_fetches_as_bundles_and_every_view_counts_jobs(
        app, queue_name, start_worker, runs, redis_client):
    k = app.keys(queue_name)
    q = app.queue(queue_name)
    ids = app.tasks["nap_job"].options(queue=queue_name).enqueue_many([(1.0,)] * 40)
    w = start_worker(queue_name, "-c", "40", "--fetch-batch", "20")
    wait_until(lambda: len(runs("start")) == 40, timeout_s=20, message=w.read_log())
    # two fetches of 20: two bundles hold forty running jobs
    assert redis_client.zcard(k.bundles) == 2 and redis_client.zcard(k.reserved) == 0
    assert set(running(redis_client, k)) == set(ids)
    assert q.stats().reserved == 40
    assert app.job_status(ids[7]) == "reserved"
    # the worker counts each bundle job's attempt as a pop of its own would
    assert {r.attempt for r in runs("start")} == {1}
    wait_until(lambda: len(runs("end")) == 40, timeout_s=20, message=w.read_log())
    wait_until(lambda: not redis_client.exists(k.bundles, k.inflight), timeout_s=10,
               message="the bundles outlived their jobs")
    st = q.stats()
    assert (st.reserved, st.pending, st.dead) == (0, 0, 0)
    assert int(redis_client.hget(k.stats, "succeeded")) == 40
    assert redis_client.hget(k.stats, "bundled") == b"0"
    assert app.job_status(ids[7]) == "unknown"  # finished, no result kept
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 20) == 0


def test_a_stopped_worker_gives_back_its_bundles_unstarted_jobs(
        app, queue_name, start_worker, runs, redis_client):
    k = app.keys(queue_name)
    ids = app.tasks["nap_job"].options(queue=queue_name).enqueue_many([(0.5,)] * 60)
    # 60 fetched in bundles, 5 running at a time: a stop gives back the other 55
    w = start_worker(queue_name, "-c", "5", "--fetch-batch", "30", "--shutdown-timeout",
                     "5")
    wait_until(lambda: len(runs("start")) >= 5, timeout_s=20, message=w.read_log())
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 20) == 0
    assert not redis_client.exists(k.reserved, k.bundles, k.inflight)
    ended = {r.token for r in runs("end")}
    back = app.queue(queue_name).stats().ready
    assert back == len(ids) - len(ended) and back > 0
    # the given-back jobs run again as attempt 1 (release refunds the attempt)
    w2 = start_worker(queue_name, "-c", "60", "--burst", wait_ready=False)
    assert wait_exit(w2, 30) == 0, w2.read_log()
    assert {r.token for r in runs("end")} == set(ids)
    assert {r.attempt for r in runs("start")} == {1}
