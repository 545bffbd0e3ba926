"""Failing jobs: retries and the dead-letter store, malformed entries, unknown tasks,
timeouts, sync and batch handlers, with real worker processes."""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import wait_exit
from helpers import wait_until

from batchq.store import codec

pytestmark = pytest.mark.integration


def test_retries_then_dead_letter_then_redrive_and_purge(app, queue_name, start_worker,
                                                         runs):
    q = app.queue(queue_name)
    jid = app.tasks["failing"].options(queue=queue_name).enqueue("f1")

    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w, 30) == 0, w.read_log()
    assert [r.token for r in runs("failing")] == ["f1"] * 3

    dead = q.dead_jobs()
    assert len(dead) == 1, dead
    d = dead[0]
    assert (d.id, d.task, d.args, d.reason, d.attempts) == (jid, "failing", ["f1"], "failed", 3)
    assert (d.error_type, d.error_message) == ("ValueError", "boom f1")
    assert "Traceback" in d.traceback
    assert 'raise ValueError(f"boom {token}")' in d.traceback  # the raise line's source
    assert "basic.py" in d.traceback
    stats = q.stats()
    assert (stats.pending, stats.dead) == (0, 1)

    # redrive: back to ready with fresh attempts, runs (and fails) again
    assert q.retry_dead() == 1
    stats = q.stats()
    assert (stats.ready, stats.dead) == (1, 0)
    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w, 30) == 0, w.read_log()
    assert len(runs("failing")) == 6
    dead = q.dead_jobs()
    assert [(x.id, x.attempts, x.reason) for x in dead] == [(jid, 3, "failed")]

    assert q.purge_dead() == 1
    assert q.dead_jobs() == []
    assert q.stats().dead == 0


def _raw_push(redis_client, app, queue_name, *entries: bytes) -> None:
    redis_client.rpush(app.keys(queue_name).ready_for(0), *entries)


def test_malformed_entries_dead_lettered_rest_of_batch_runs(app, queue_name, start_worker,
                                                           runs, redis_client):
    noop = app.tasks["noop"].options(queue=queue_name)
    garbage = b"\x00\xffnot a batchq job at all"
    corrupt = b"0:0:3:corruptbody1:\xc1\xc1\xc1"  # valid header, 0xc1 is never msgpack
    noop.enqueue_many([f"a{i}" for i in range(5)])
    _raw_push(redis_client, app, queue_name, garbage, corrupt)
    noop.enqueue_many([f"b{i}" for i in range(5)])

    w = start_worker(queue_name, "--burst", wait_ready=False)  # one pop takes all 12
    assert wait_exit(w, 30) == 0, w.read_log()

    assert sorted(r.token for r in runs("noop")) == sorted(
        [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)])
    dead = {d.id: d for d in app.queue(queue_name).dead_jobs()}
    assert len(dead) == 2, dead
    assert {d.reason for d in dead.values()} == {"decode_error"}
    by_raw_garbage = [d for d in dead.values() if d.raw == garbage]
    assert len(by_raw_garbage) == 1, dead  # kept byte for byte
    c = dead["corruptbody1"]
    assert c.raw.endswith(b":corruptbody1:\xc1\xc1\xc1"), c.raw
    assert c.error_type == "DecodeError"
    stats = app.queue(queue_name).stats()
    assert (stats.pending, stats.dead) == (0, 2)


def test_unknown_task_dead_lettered_rest_of_batch_runs(app, queue_name, start_worker, runs,
                                                      redis_client):
    noop = app.tasks["noop"].options(queue=queue_name)
    jid = codec.new_id()
    body = codec.encode_body("nope", [1], {"x": 2}, int(time.time() * 1000))
    entry = codec.header(0, 3) + jid.encode() + b":" + body
    noop.enqueue_many(["a0", "a1"])
    _raw_push(redis_client, app, queue_name, entry)
    noop.enqueue_many(["b0", "b1"])

    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w, 30) == 0, w.read_log()

    assert sorted(r.token for r in runs("noop")) == ["a0", "a1", "b0", "b1"]
    dead = app.queue(queue_name).dead_jobs()
    assert len(dead) == 1
    d = dead[0]
    assert (d.id, d.task, d.reason, d.args, d.kwargs) == (jid, "nope", "unknown_task", [1],
                                                          {"x": 2})
    assert d.error_type == "LookupError" and "nope" in d.error_message
    assert d.attempts == 1  # dead at once, never retried
    assert app.queue(queue_name).stats().pending == 0


def test_timeouts_async_and_sync(app, queue_name, start_worker, runs):
    w = start_worker(queue_name, "-c", "4")
    t0 = time.time()
    async_id = app.tasks["slow_async"].options(queue=queue_name).enqueue("A", 5.0)
    sync_id = app.tasks["slow_sync"].options(queue=queue_name).enqueue("S", 1.5)
    app.tasks["noop"].options(queue=queue_name).enqueue_many(["n0", "n1", "n2"])

    q = app.queue(queue_name)
    wait_until(lambda: q.stats().dead == 2, timeout_s=10,
               message=f"timeouts not dead-lettered\n{w.read_log()}")
    dead = {d.id: d for d in q.dead_jobs()}
    for jid in (async_id, sync_id):
        d = dead[jid]
        assert d.reason == "timeout", d
        assert "0.2s" in d.error_message
        assert d.attempts == 1
        # buried at its timeout, not when the handler would have finished
        assert d.died_at - t0 < 1.2, d.died_at - t0
    assert {r.token for r in runs("noop")} == {"n0", "n1", "n2"}
    assert "A" not in {r.token for r in runs("end")}  # the coroutine was cancelled

    # the worker keeps running
    app.tasks["noop"].options(queue=queue_name).enqueue("later")
    wait_until(lambda: "later" in {r.token for r in runs("noop")}, timeout_s=10)
    assert w.poll() is None
    assert w.stop(signal.SIGTERM, timeout_s=15) == 0, w.read_log()
    assert q.stats().pending == 0


def test_sync_handlers_in_threads_and_batch_handlers(app, queue_name, start_worker, runs):
    app.tasks["sync_noop"].options(queue=queue_name).enqueue_many(["s0", "s1", "s2"])
    app.tasks["bulk"].options(queue=queue_name).enqueue_many(range(120))

    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert wait_exit(w, 30) == 0, w.read_log()

    sync_runs = runs("sync_noop")
    assert sorted(r.token for r in sync_runs) == ["s0", "s1", "s2"]
    assert all(r.thread.startswith("batchq-sync") for r in sync_runs), sync_runs

    sizes = [int(r.token) for r in runs("batch")]
    assert max(sizes) == 50 and all(1 <= n <= 50 for n in sizes), sizes
    attempts: dict[int, list[int]] = defaultdict(list)
    for r in runs("bulk"):
        attempts[int(r.token)].append(r.attempt)
    assert set(attempts) == set(range(120))
    for token, seen in attempts.items():
        assert seen == ([1, 2] if token % 10 == 0 else [1]), (token, seen)

    dead = app.queue(queue_name).dead_jobs()
    assert len(dead) == 12
    assert sorted(d.args[0] for d in dead) == list(range(0, 120, 10))
    assert {(d.reason, d.error_type, d.error_message, d.attempts) for d in dead} == \
        {("failed", "Exception", "x", 2)}
    assert app.queue(queue_name).stats().pending == 0


def test_short_retry_backoff_is_honoured_by_an_idle_worker(app, queue_name, start_worker,
                                                           runs):
    """BUG: a retry is written to the delayed set by nack.lua, which wakes nobody, and the
    worker computed its idle wait (up to max_block_s = 5 s) from a pop made before the
    retry existed: a 10 ms backoff becomes ~5 s per attempt."""
    start_worker(queue_name)
    t0 = time.time()
    app.tasks["failing_slow"].options(queue=queue_name).enqueue("r", 0.05)
    q = app.queue(queue_name)
    try:
        wait_until(lambda: q.stats().dead == 1, timeout_s=3)
    except AssertionError:
        offsets = [round(r.t - t0, 2) for r in runs("failing_slow")]
        raise AssertionError(f"3 attempts with 10-20 ms backoff not done after 3 s; "
                             f"attempts started at {offsets} s") from None
    assert Counter(r.token for r in runs("failing_slow")) == {"r": 3}
