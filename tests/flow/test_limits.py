"""Rate and concurrency limits, quotas and RateLimited holds, with real workers and the
handlers' own clocks; a worker SIGKILLed while it holds concurrency slots leaks none."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from fixtures.flow import *  # noqa: F403
from fixtures.runs import wait_exit
from helpers import wait_until

import batchq
from batchq.flow.limits import group_hex

pytestmark = pytest.mark.integration


def _max_in_window(starts: list[float], window_s: float = 1.0) -> int:
    """The most starts in any sliding window of ``window_s`` seconds."""
    starts = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def test_queue_rate_limit_holds_across_processes(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    q.limit(rate_per_s=40, burst=4)
    app.tasks["work"].options(queue=queue_name).enqueue_many([(i,) for i in range(100)])
    t0 = time.time()
    a = start_worker(queue_name, "--burst", "-c", "20")
    b = start_worker(queue_name, "--burst", "-c", "20")
    assert wait_exit(a, 30) == 0 and wait_exit(b, 30) == 0, a.read_log() + b.read_log()
    got = runs()
    assert len(got) == 100 and len({r.pid for r in got}) >= 1
    assert _max_in_window([r.start for r in got]) <= 40 + 4
    assert time.time() - t0 >= (100 - 4) / 40 - 0.2  # nothing ran ahead of the bucket


def test_group_rate_limit_leaves_other_groups_alone(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    q.limit(group="slow", rate_per_s=5, burst=1)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="slow").enqueue_many([(f"s{i}",) for i in range(10)])
    work.options(group="fast").enqueue_many([(f"f{i}",) for i in range(200)])
    proc = start_worker(queue_name, "--burst", "-c", "10")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    got = runs()
    slow = [r.start for r in got if r.token.startswith("s")]
    fast = [r.end for r in got if r.token.startswith("f")]
    assert len(slow) == 10 and len(fast) == 200
    assert _max_in_window(slow) <= 5 + 1
    assert max(fast) < min(slow) + 1.5  # the fast group did not wait for the slow one
    assert max(slow) - min(slow) >= (10 - 1) / 5 - 0.2


def test_concurrency_limits_count_leased_jobs_across_the_fleet(app, queue_name,
                                                               start_worker, runs):
    q = app.queue(queue_name)
    q.limit(group="g", concurrency=2)
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="g").enqueue_many([(f"g{i}", 0.15) for i in range(10)])
    work.options(group="h").enqueue_many([(f"h{i}", 0.15) for i in range(10)])
    a = start_worker(queue_name, "--burst", "-c", "10")
    b = start_worker(queue_name, "--burst", "-c", "10")
    assert wait_exit(a, 30) == 0 and wait_exit(b, 30) == 0, a.read_log() + b.read_log()
    got = runs()
    g = [(r.start, r.end) for r in got if r.token.startswith("g")]
    h = [(r.start, r.end) for r in got if r.token.startswith("h")]
    assert len(g) == 10 and len(h) == 10
    assert _max_overlap(g) <= 2
    assert _max_overlap(h) > 2  # an unlimited group is not held back by it
    k = app.keys(queue_name)
    assert app.clients.redis.hget(k.gstate, f"{group_hex('g')}:run") is None


def test_queue_concurrency_limit(app, queue_name, start_worker, runs):
    app.queue(queue_name).limit(concurrency=3)
    app.tasks["work"].options(queue=queue_name).enqueue_many(
        [(i, 0.1) for i in range(15)])
    proc = start_worker(queue_name, "--burst", "-c", "10")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    assert _max_overlap([(r.start, r.end) for r in runs()]) <= 3


def test_quota_refuses_past_max_pending_and_writes_nothing(app, queue_name, start_worker,
                                                          runs):
    q = app.queue(queue_name)
    q.limit(group="acme", max_pending=5)
    acme = app.tasks["work"].options(queue=queue_name, group="acme")
    ids = acme.enqueue_many([(i,) for i in range(4)])
    acme.options(delay_s=30).enqueue("late")  # delayed jobs count too
    with pytest.raises(batchq.QuotaExceeded, match="max_pending") as info:
        acme.enqueue("one too many")
    assert info.value.group == "acme" and info.value.queue == queue_name
    with pytest.raises(batchq.QuotaExceeded):
        acme.enqueue_many([("x",), ("y",)])
    # another group, and jobs without a group, are not affected
    app.tasks["work"].options(queue=queue_name, group="other").enqueue("fine")
    assert q.stats().grouped == 5
    assert {g.group: g.pending for g in q.groups()} == {"acme": 5, "other": 1}
    assert app.cancel(ids[0])  # a waiting job cancelled ... still counts until dropped
    proc = start_worker(queue_name, "--burst")
    # the burst worker waits for the delayed job; cancel it so the run can end
    assert app.cancel(acme_delayed_id(app, queue_name))
    assert wait_exit(proc, 30) == 0, proc.read_log()
    assert sorted(r.token for r in runs()) == ["1", "2", "3", "fine"]
    acme.enqueue_many([(i,) for i in range(5)])  # the quota is free again


def acme_delayed_id(app, queue_name):
    k = app.keys(queue_name)
    (entry,) = app.clients.redis.zrange(k.delayed, 0, -1)
    return entry.split(b":", 4)[3].decode()


def test_quota_is_exact_with_racing_producers(app, queue_name, redis_url, namespace):
    q = app.queue(queue_name)
    q.limit(group="race", max_pending=100)
    written: list[int] = []
    refused: list[int] = []
    lock = threading.Lock()

    def produce() -> None:
        a = batchq.App(redis_url, namespace=namespace)
        t = a.task(name="work")(lambda *args: None).options(queue=queue_name, group="race")
        ok = bad = 0
        for i in range(40):
            try:
                if i % 4 == 0:
                    t.enqueue_many([(i,), (i + 1,), (i + 2,)])
                    ok += 3
                else:
                    t.enqueue(i)
                    ok += 1
            except batchq.QuotaExceeded:
                bad += 1
        a.close()
        with lock:
            written.append(ok)
            refused.append(bad)

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(written) <= 100 and sum(written) >= 98  # full but for a refused 3-chunk
    assert q.stats().grouped == sum(written)
    assert sum(refused) > 0


def test_rate_limited_holds_its_group_and_refunds_the_attempt(app, queue_name,
                                                              start_worker, runs):
    t = app.tasks["throttled"].options(queue=queue_name)
    t.options(group="prov").enqueue("p0", 1.0, True)  # max_attempts=1: refunded, not dead
    t.options(group="prov").enqueue_many([(f"p{i}", 0, False) for i in range(1, 4)])
    t.options(group="other").enqueue_many([(f"o{i}", 0, False) for i in range(3)])
    proc = start_worker(queue_name, "--burst", "-c", "1")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    got = runs()
    (limited,) = [r for r in got if r.kind == "limited"]
    done = {r.token: r for r in got if r.kind == "work"}
    assert sorted(done) == ["o0", "o1", "o2", "p0", "p1", "p2", "p3"]
    assert done["p0"].attempt == 1  # the attempt was given back
    for tok in ("p0", "p1", "p2", "p3"):
        assert done[tok].start >= limited.start + 0.9, (tok, done[tok], limited)
    assert max(done[f"o{i}"].start for i in range(3)) < limited.start + 0.9
    assert app.queue(queue_name).stats().dead == 0


def test_rate_limited_without_a_group_holds_the_queue(app, queue_name, start_worker, runs):
    t = app.tasks["throttled"].options(queue=queue_name)
    t.enqueue("q0", 0.8, True)
    t.enqueue_many([(f"q{i}", 0, False) for i in range(1, 4)])
    proc = start_worker(queue_name, "--burst", "-c", "1")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    got = runs()
    (limited,) = [r for r in got if r.kind == "limited"]
    later = [r for r in got if r.kind == "work" and r.start > limited.start]
    assert len(later) >= 3
    assert all(r.start >= limited.start + 0.7 for r in later)


def test_a_killed_worker_leaks_no_concurrency_slot(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    q.limit(group="g", concurrency=2)
    app.tasks["work"].options(queue=queue_name, group="g").enqueue_many(
        [(f"g{i}", 0.3) for i in range(6)])
    k = app.keys(queue_name)
    r = app.clients.redis
    first = start_worker(queue_name, "-c", "5", "--lease-s", "1.5")
    wait_until(lambda: r.hget(k.gstate, f"{group_hex('g')}:run") == b"2", timeout_s=10)
    first.send_signal(signal.SIGKILL)
    first.wait(5)
    second = start_worker(queue_name, "--burst", "-c", "5", "--lease-s", "1.5")
    assert wait_exit(second, 30) == 0, second.read_log()
    tokens = [x.token for x in runs()]
    assert set(tokens) == {f"g{i}" for i in range(6)}
    assert r.hget(k.gstate, f"{group_hex('g')}:run") is None  # every slot came back
    assert r.zcard(k.reserved) == 0 and q.stats().pending == 0
    assert _max_overlap([(x.start, x.end) for x in runs() if x.pid == second.pid]) <= 2


def test_a_hostile_rate_limited_cannot_break_the_worker(app, queue_name, start_worker,
                                                       runs):
    """retry_after_s changed to nan after construction: the job is held 1 s and runs."""
    app.tasks["hostile_limit"].options(queue=queue_name, group="h").enqueue("x")
    with pytest.raises(ValueError, match="retry_after_s"):
        batchq.RateLimited(float("inf"))
    proc = start_worker(queue_name, "--burst")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    (limited,) = [r for r in runs() if r.kind == "limited"]
    (done,) = [r for r in runs() if r.kind == "work"]
    assert done.start >= limited.start + 0.9 and done.attempt == 1
