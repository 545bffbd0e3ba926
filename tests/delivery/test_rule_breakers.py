"""Fault 7 (part 1): jobs that break the rules.

* a poison job that SIGKILLs its own process, under ``-p 1``: dead-lettered as
  ``crashed_worker`` once its attempts are used up, no crash loop, the other jobs done;
* a handler that swallows every cancellation: the fleet still stops (the supervisor
  SIGKILLs the child after the grace at the latest) and the job comes back;
* a 10 MB payload: ``PayloadTooLarge`` at enqueue, nothing written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet, alive

import batchq

pytestmark = pytest.mark.fault


def test_a_poison_job_is_dead_lettered_and_the_fleet_keeps_running(fleet: Fleet) -> None:
    work = fleet.app.tasks["work"]
    others = [f"o{i}" for i in range(300)]
    work.enqueue_many([(t, 0.02) for t in others[:150]])
    poison = work.options(max_attempts=2).enqueue("poison", 0.0, "poison")
    work.enqueue_many([(t, 0.02) for t in others[150:]])
    sup = fleet.start("-p", "1", "-c", "10", "--fetch-batch", "10", "--lease-s", "1")
    fleet.wait_children(sup, 1)

    q = fleet.app.queue("default")
    fleet.until(lambda: q.dead_ids() == [poison], 30, "the poison job dead-lettered")
    fleet.wait_completed(others, 30)
    fleet.settle()
    (dead,) = q.dead_jobs()
    # the first two deaths cannot be pinned on it (its attempt is refunded: max_attempts
    # 2 -> 4); held by two dead workers, it then runs alone, marked started, and is
    # charged twice
    assert (dead.reason, dead.attempts) == ("crashed_worker", 4), dead
    poison_runs = [r for r in fleet.runs() if r.token == "poison"]
    assert [r.attempt for r in poison_runs] == [1, 2, 3, 4], poison_runs
    died = {r.pid for r in poison_runs}
    time.sleep(1.5)  # time enough for a crash loop to show
    log = sup.read_log()
    assert log.count("died (signal SIGKILL)") == 4, log[-3000:]
    assert sup.poll() is None
    assert len(fleet.workers(sup)) == 1 and not fleet.workers(sup) & died
    report = fleet.check([*others, "poison"], killed_pids=died)
    print(f"\nchecker: {report.summary()}; poison ran on pids {sorted(died)}")
    assert report.valid, report.details()
    assert report.dead == 1 and "poison" not in report.lost
    assert fleet.leftovers() == []


def test_a_handler_that_ignores_cancellation_cannot_hold_the_fleet(fleet: Fleet) -> None:
    work = fleet.app.tasks["work"]
    sup = fleet.start("-p", "1", "-c", "10", "--shutdown-timeout", "1", "--lease-s", "2")
    (child,) = fleet.wait_children(sup, 1)
    work.enqueue("stubborn", 0.0, "stubborn")
    others = [f"n{i}" for i in range(30)]
    work.enqueue_many([(t, 0.05) for t in others])
    fleet.wait_completed(others, 15)
    fleet.until(lambda: any(r.token == "stubborn" for r in fleet.runs()), 10, "stubborn runs")

    t0 = time.monotonic()
    os.kill(sup.pid, signal.SIGTERM)
    try:
        code = sup.wait(1 + 5 + 3)  # the supervisor's grace: shutdown timeout + 5 s
    except subprocess.TimeoutExpired:
        pytest.fail(f"the fleet did not stop\n{sup.read_log()[-3000:]}")
    took = time.monotonic() - t0
    log = sup.read_log()
    killed = "after the shutdown timeout: SIGKILL" in log
    print(f"\nthe fleet stopped {took:.1f}s after SIGTERM (exit {code}); the child was "
          f"{'SIGKILLed by the supervisor' if killed else 'not killed: it exited'}")
    assert not alive(child)
    if killed:
        fleet.killed.add(child)
    (stuck,) = [r for r in fleet.runs() if r.token == "stubborn"]
    assert not stuck.completed and stuck.cancels_ignored >= 1, stuck

    fleet.drain("-c", "10", "--lease-s", "2")  # the job came back (given back, or its
    # lease expired)
    runs = [r for r in fleet.runs() if r.token == "stubborn"]
    assert [r.completed for r in runs] == [False, True], runs
    report = fleet.check(["stubborn", *others])
    print(f"checker: {report.summary()}")
    assert report.valid, report.details()
    assert fleet.leftovers() == []


def test_a_single_worker_with_a_handler_that_ignores_cancellation_still_exits(
        fleet: Fleet) -> None:
    """Fixed: without a supervisor nothing bounds the stop. ``Worker._drain`` cancels the
    runners still busy at ``--shutdown-timeout`` and then awaits them with no time
    limit (``asyncio.gather(*pending)``); a handler that swallows ``CancelledError``
    keeps the process alive for ever, a second SIGTERM (fast stop) only cancels it
    again, and the job (with the prefetched ones given back only after the wait) stays
    reserved by a live process. README: jobs still running at the deadline are
    cancelled ... then the worker exits 0."""
    work = fleet.app.tasks["work"]
    w = fleet.start("-c", "10", "--shutdown-timeout", "1", "--lease-s", "30")
    work.enqueue("stubborn", 0.0, "stubborn")
    fleet.until(lambda: any(r.token == "stubborn" for r in fleet.runs()), 10, "stubborn runs")
    w.send_signal(signal.SIGTERM)
    time.sleep(1.3)
    w.send_signal(signal.SIGTERM)  # the fast stop
    # bound: the shutdown timeout plus the supervisor's own grace (5 s) and some slack
    try:
        code: int | None = w.wait(1 + 5 + 1 - 1.3)
    except subprocess.TimeoutExpired:
        code = None
    if code is None:
        ignored = sum(r.cancels_ignored for r in fleet.runs())
        fleet.kill(w.pid)
        pytest.fail(f"the worker still runs 7 s after SIGTERM (shutdown timeout 1 s), 5.7 s "
                    f"after a second one; its handler swallowed {ignored} cancellations\n"
                    f"{w.read_log()[-1500:]}")
    assert code == 0, w.read_log()
    # the job is given back at once, not left to a 30 s lease
    st = fleet.stats()
    assert (st.ready, st.reserved) == (1, 0), st


def test_a_10_mb_payload_is_refused_at_enqueue_and_nothing_is_written(fleet: Fleet) -> None:
    work = fleet.app.tasks["work"]
    big = "x" * (10 << 20)
    with pytest.raises(batchq.PayloadTooLarge, match=r"above the limit of 1048576") as err:
        work.enqueue("big", 0.0, "", big)
    assert isinstance(err.value, ValueError)
    with pytest.raises(batchq.PayloadTooLarge):
        work.options(delay_s=5).enqueue("big-later", 0.0, "", big)
    with pytest.raises(batchq.PayloadTooLarge):
        work.enqueue_many([("small",), ("big", 0.0, "", big), ("after",)])
    # no job, no state: only the queue's job-number counter may exist, reserved by
    # enqueue_many for the small item before the big one stopped the chunk (a number
    # is not a job; see README "Results, status, cancel")
    left = list(fleet.r.scan_iter(match=f"{fleet.ns}:*"))
    assert left in ([], [fleet.app.keys("default").seq.encode()]), left
    print(f"\n{err.value}")


def test_enqueue_many_that_meets_a_too_large_payload_says_what_it_wrote(
        fleet: Fleet) -> None:
    """Fixed: ``enqueue_many`` streams its items and writes 8 chunks of 1,000 per round
    trip; an item above ``max_payload_bytes`` after the first 8,000 raises a bare
    ``PayloadTooLarge`` from the generator, while the 8,000 before it are already in
    Redis. The error says nothing about them (no ``written``/``ids``, unlike
    ``EnqueueError``), so the caller cannot tell what to enqueue again: retrying all
    doubles 8,000 jobs, retrying none loses the rest. The same holds for a value msgpack
    cannot encode (``TypeError``) mid-stream."""
    work = fleet.app.tasks["work"]
    big = "x" * (2 << 20)
    items = [(f"m{i}",) for i in range(9000)] + [("big", 0.0, "", big)]
    with pytest.raises(batchq.PayloadTooLarge) as err:
        work.enqueue_many(items)
    in_redis = sum(int(fleet.r.llen(k)) for k in fleet.app.keys("default").ready)
    reported = getattr(err.value, "written", None)
    print(f"\n{in_redis} jobs in Redis; the error reports written={reported}")
    assert in_redis == 0 or reported == in_redis, (
        f"{in_redis} jobs were written before the PayloadTooLarge, which reports "
        f"written={reported}: {err.value}")
