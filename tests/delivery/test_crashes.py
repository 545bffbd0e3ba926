"""Crashes and stops: kill -9, graceful SIGTERM drains, stale acks, poison jobs."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import pending_keys, running, wait_exit
from helpers import wait_until

from batchq.store import codec
from batchq.store.scripts import calls
from batchq.store.scripts.replies import PopReply, decode_pop_reply

pytestmark = pytest.mark.integration


def test_kill_9_mid_batch_loses_nothing(app, queue_name, start_worker, runs, redis_client):
    k = app.keys(queue_name)
    ids = app.tasks["nap_job"].options(queue=queue_name).enqueue_many([(0.3,)] * 400)
    args = ("-c", "50", "--fetch-batch", "20", "--lease-s", "2")

    w1 = start_worker(queue_name, *args)
    wait_until(lambda: len(runs("end")) >= 60, timeout_s=20, message=w1.read_log())
    w1.send_signal(signal.SIGKILL)
    assert w1.wait(timeout=10) == -signal.SIGKILL
    held = running(redis_client, k)
    assert held, "the killed worker held no reservations"
    assert set(held.values()) == {1}, held
    held_by_killed = set(held)

    w2 = start_worker(queue_name, *args, "--burst", wait_ready=False)
    assert wait_exit(w2, 60) == 0, w2.read_log()

    starts, ends = runs("start"), runs("end")
    assert {r.pid for r in starts} <= {w1.pid, w2.pid}
    assert {r.token for r in ends} == set(ids), "jobs were lost"
    ran = Counter(r.token for r in starts)
    twice = {t for t, n in ran.items() if n > 1}
    assert twice <= held_by_killed, twice - held_by_killed
    assert max(ran.values()) <= 2
    for r in starts:  # attempts are counted: a redelivered job runs as attempt 2
        if r.pid == w1.pid:
            assert r.attempt == 1
        else:
            assert r.attempt == (2 if r.token in held_by_killed else 1), r
    # every job the killed worker had not finished ran again
    unfinished = {r.token for r in starts if r.pid == w1.pid} - \
        {r.token for r in ends if r.pid == w1.pid}
    assert unfinished <= {r.token for r in ends if r.pid == w2.pid}
    assert pending_keys(redis_client, app, queue_name) == \
        {"ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}
    assert app.queue(queue_name).stats().dead == 0


def test_sigterm_drains_running_jobs_and_gives_back_prefetched(app, queue_name, start_worker,
                                                              runs, redis_client):
    tokens = [f"j{i}" for i in range(300)]
    app.tasks["nap"].options(queue=queue_name).enqueue_many([(t, 0.3) for t in tokens])
    shutdown_timeout = 5.0
    w1 = start_worker(queue_name, "-c", "5", "--lease-s", "30",
                      "--shutdown-timeout", str(shutdown_timeout))
    wait_until(lambda: len(runs("end")) >= 10, timeout_s=20, message=w1.read_log())

    t0 = time.monotonic()
    w1.send_signal(signal.SIGTERM)
    rc = wait_exit(w1, shutdown_timeout + 5)
    elapsed = time.monotonic() - t0
    assert rc == 0, w1.read_log()
    assert elapsed < shutdown_timeout, f"took {elapsed:.1f}s for 0.3 s jobs"

    # right after the exit: nothing reserved (a 30 s lease would otherwise hold them)
    keys = pending_keys(redis_client, app, queue_name)
    assert (keys["reserved"], keys["inflight"]) == (0, 0), keys
    started = [r.token for r in runs("start")]
    assert sorted(started) == sorted(r.token for r in runs("end")), "a running job was cut"
    assert keys["ready"] == len(tokens) - len(started)
    # given back to the head with the attempt refunded, in the original order
    entries = redis_client.lrange(app.keys(queue_name).ready_for(0), 0, -1)
    back = [codec.decode_entry(e, queue_name) for e in entries]
    assert {j.attempt for j in back} == {0}
    assert [j.args[0] for j in back] == [t for t in tokens if t not in set(started)]

    w2 = start_worker(queue_name, "-c", "50", "--burst", wait_ready=False)
    assert wait_exit(w2, 30) == 0, w2.read_log()
    assert Counter(r.token for r in runs("start")) == Counter(tokens)  # once each
    assert Counter(r.token for r in runs("end")) == Counter(tokens)
    assert app.queue(queue_name).stats().pending == 0


def test_sigterm_cancels_job_past_shutdown_timeout_and_gives_it_back(app, queue_name,
                                                                     start_worker, runs,
                                                                     redis_client):
    jid = app.tasks["nap"].options(queue=queue_name).enqueue("long", 30.0)
    w = start_worker(queue_name, "--shutdown-timeout", "1")
    wait_until(lambda: runs("start"), timeout_s=10, message=w.read_log())

    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    rc = wait_exit(w, 10)
    elapsed = time.monotonic() - t0
    assert rc == 0, w.read_log()
    assert 0.9 <= elapsed < 6, elapsed
    assert runs("end") == []  # cancelled, not finished

    keys = pending_keys(redis_client, app, queue_name)
    assert keys == {"ready": 1, "delayed": 0, "reserved": 0, "inflight": 0}, keys
    entry = redis_client.lindex(app.keys(queue_name).ready_for(0), 0)
    assert entry.startswith(b"0:0:5:%s:" % jid.encode()), entry[:40]  # attempt refunded


def _pop(app, queue_name, want: int, lease_ms: int) -> tuple[PopReply, list[bytes]]:
    res = decode_pop_reply(
        app.sync_scripts.call(calls.pop(app.keys(queue_name), want, lease_ms, 100)))
    return res, res.jobs


def _stale_count(res) -> int:
    return res if isinstance(res, int) else len(res)


def test_stale_ack_does_not_delete_the_new_reservation(app, queue_name, redis_client):
    k = app.keys(queue_name)
    jid = app.tasks["noop"].options(queue=queue_name).enqueue("s")

    _, got = _pop(app, queue_name, 1, lease_ms=50)
    assert len(got) == 1 and got[0].startswith(b"0:1:3:%s:" % jid.encode())
    time.sleep(0.15)  # the 50 ms lease expires
    head, got = _pop(app, queue_name, 1, lease_ms=30_000)
    assert head.reaped == 1, head
    # the attempt refunded (max_attempts 3 -> 4: its worker may have died before it
    # started), under a new lease name
    assert len(got) == 1 and got[0].startswith(b"0:2:4:%s:" % jid.encode())

    stale = app.sync_scripts.call(calls.ack(k, [f"{jid}:1"]))
    assert _stale_count(stale) == 1
    assert redis_client.zscore(k.reserved, f"{jid}:2") is not None
    assert redis_client.zscore(k.reserved, f"{jid}:1") is None
    assert redis_client.hget(k.inflight, jid).startswith(b"0:2:4:")

    assert _stale_count(app.sync_scripts.call(calls.ack(k, [f"{jid}:2"]))) == 0
    assert pending_keys(redis_client, app, queue_name) == \
        {"ready": 0, "delayed": 0, "reserved": 0, "inflight": 0}


def test_poison_job_is_dead_lettered_after_its_attempts(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    pid_ = app.tasks["poison"].options(queue=queue_name).enqueue("P")
    sturdy = [f"s{i}" for i in range(20)]
    app.tasks["sturdy"].options(queue=queue_name).enqueue_many(sturdy)

    codes = []
    for _ in range(10):
        if q.stats().pending == 0:
            break
        w = start_worker(queue_name, "-c", "4", "--lease-s", "1", "--burst", wait_ready=False)
        codes.append(wait_exit(w, 30))
    assert q.stats().pending == 0, codes

    # the first two crashes cannot be pinned on it (its neighbours were reserved too):
    # its attempt is refunded; held by two dead workers, it then runs alone, marked
    # started, and is charged twice (max_attempts 2)
    assert codes[:4] == [-signal.SIGKILL] * 4 and codes[-1] == 0, codes
    assert len(runs("poison")) == 4  # no crash loop
    dead = q.dead_jobs()
    assert [(d.id, d.reason, d.attempts) for d in dead] == [(pid_, "crashed_worker", 4)]
    assert "4 workers died holding it" in dead[0].error_message
    assert {r.token for r in runs("sturdy")} == set(sturdy)


def test_burst_worker_on_an_empty_queue_exits(queue_name, start_worker):
    """Regression: the worker stopped its helper loops with Task.cancel() and awaited
    them without a bound; a cancel landing in a redis-py call (its asyncio.wait_for
    swallows it on Python 3.11) while the heartbeat made its first registry publish left
    the loop running and the process hung forever (fixed in 6f9fbe8)."""
    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w, 6) == 0, w.read_log()
    assert "burst: queues are empty" in w.read_log()
