"""The hand-off with real worker processes: an idle worker is handed jobs by the enqueue
that writes them (no pop between), a worker killed holding a handed job loses nothing,
and a stopping worker withdraws its registration."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import pending_keys, wait_exit
from helpers import wait_until

pytestmark = pytest.mark.integration


def _handed(redis_client, k) -> int:
    return int(redis_client.hget(k.stats, "handed") or 0)


def test_an_idle_worker_is_handed_each_job(app, queue_name, start_worker, runs,
                                           redis_client):
    k = app.keys(queue_name)
    w = start_worker(queue_name, "-c", "4")
    wait_until(lambda: redis_client.zcard(k.idle) == 1, timeout_s=10, message=w.read_log())
    task = app.tasks["nap"].options(queue=queue_name)
    tokens = [f"j{i}" for i in range(20)]
    for t in tokens:
        task.enqueue(t, 0.0)
        # the next job is enqueued once the worker is idle again (registered)
        wait_until(lambda t=t: t in {r.token for r in runs("end")}
                   and redis_client.zcard(k.idle) == 1, timeout_s=10,
                   message=w.read_log())
    assert _handed(redis_client, k) == len(tokens)  # every one went straight to it
    assert Counter(r.token for r in runs("start")) == Counter(tokens)  # once each
    assert pending_keys(redis_client, app, queue_name) == \
        {"ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}
    assert redis_client.llen(k.wake) == 0

    # a stop withdraws the registration: nothing is handed to a worker that left
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 15) == 0, w.read_log()
    assert redis_client.zcard(k.idle) == 0
    task.enqueue("after", 0.0)
    assert _handed(redis_client, k) == len(tokens)
    assert redis_client.llen(k.ready_for(0)) == 1


def test_a_worker_killed_holding_a_handed_job_loses_nothing(app, queue_name, start_worker,
                                                            runs, redis_client):
    k = app.keys(queue_name)
    w1 = start_worker(queue_name, "--lease-s", "1")
    wait_until(lambda: redis_client.zcard(k.idle) == 1, timeout_s=10, message=w1.read_log())
    jid = app.tasks["nap"].options(queue=queue_name).enqueue("long", 3.0)
    wait_until(lambda: runs("start"), timeout_s=10, message=w1.read_log())
    assert _handed(redis_client, k) == 1
    w1.send_signal(signal.SIGKILL)
    assert w1.wait(timeout=10) == -signal.SIGKILL
    assert redis_client.zrange(k.reserved, 0, -1) == [f"{jid}:1".encode()]

    time.sleep(1.2)  # the killed worker's lease runs out
    w2 = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w2, 30) == 0, w2.read_log()
    ends = runs("end")
    assert [r.token for r in ends] == ["long"] and ends[0].pid == w2.pid
    assert pending_keys(redis_client, app, queue_name) == \
        {"ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}
    assert redis_client.llen(k.wake) == 0 or redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert app.queue(queue_name).stats().dead == 0
