"""Which job a busy worker starts next (the worker side), with real worker
processes: prefetch sized from the handlers' run time, so a priority-9 job is not stuck
behind prefetched ones; several queues taken in strict order or by weight."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from fixtures.basic import *  # noqa: F403
from fixtures.runs import wait_exit
from helpers import wait_until

pytestmark = pytest.mark.integration


def test_a_priority_job_starts_within_about_one_run_time_of_a_busy_worker(
        app, queue_name, start_worker, runs):
    # scaled down from the issue (-c 10, 600 jobs of 0.5 s, priority-9 job 10.5 s late):
    # before prefetch sizing, the first pop leased all 40 jobs and the priority job
    # started after every one of them (about 4 s)
    start_worker(queue_name, "-c", "2")
    nap = app.tasks["nap"].options(queue=queue_name)
    nap.enqueue_many([(f"L{i}", 0.2) for i in range(40)])
    # busy, and a few jobs ran, so the worker knows their run time
    wait_until(lambda: len(runs("end")) >= 4, timeout_s=10, message="the jobs did not run")
    sent = time.time()
    nap.options(priority=9).enqueue("H", 0.2)
    start = wait_until(lambda: [r for r in runs("start") if r.token == "H"], timeout_s=15,
                       message="the priority job did not run")[0]
    late = start.t - sent
    print(f"priority-9 job started {late:.3f}s after its enqueue")  # the figure (-s)
    before = [r.token for r in runs("start") if sent < r.t < start.t]
    assert late < 0.5, f"the priority job started {late:.2f}s after its enqueue, " \
        f"after {len(before)} lower-priority jobs"
    assert len(before) <= 2, before
    low_left = [r for r in runs("start") if r.token.startswith("L")]
    assert len(low_left) < 40  # the backlog was still there when it started


def test_a_slow_batch_handler_still_gets_full_batches(app, start_worker, runs):
    # its own queue ("default", in this test's namespace): known to hold batches
    app.tasks["nap_batch"].enqueue_many([(f"t{i}", 0.1) for i in range(60)])
    worker = start_worker("default", "-c", "1", "--burst", wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()
    assert [r.token for r in runs("nap_batch")] == ["10"] * 6


def test_a_batch_task_routed_to_another_queue_gets_full_batches_once_seen(
        app, queue_name, start_worker, runs):
    app.tasks["nap_batch"].options(queue=queue_name).enqueue_many(
        [(f"t{i}", 0.1) for i in range(61)])
    worker = start_worker(queue_name, "-c", "1", "--burst", wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()
    sizes = [int(r.token) for r in runs("nap_batch")]
    # the first pop took one job per runner; from then on the worker knows
    assert sizes == [1] + [10] * 6, sizes


def _tokens(runs, prefix: str) -> list[str]:
    return [r.token for r in runs("noop") if r.token.startswith(prefix)]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_strict_order_drains_the_first_queue_before_the_next(app, queue_name, start_worker,
                                                             runs, how):
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    noop = app.tasks["noop"]
    noop.options(queue=qb).enqueue_many([f"b{i}" for i in range(300)])
    noop.options(queue=qa).enqueue_many([f"a{i}" for i in range(300)])
    flag = ["--order", "strict"] if how == "flag" else []
    env = {"BATCHQ_ORDER": "strict"} if how == "env" else None
    worker = start_worker([qa, qb], *flag, "-c", "4", "--fetch-batch", "20",
                          "--burst", wait_ready=False, env=env)
    assert wait_exit(worker, 30) == 0, worker.read_log()
    order = [r.token[0] for r in runs("noop")]
    assert len(order) == 600
    assert order == ["a"] * 300 + ["b"] * 300, "".join(order)


def test_strict_order_takes_the_second_queue_while_the_first_is_empty(app, queue_name,
                                                                      start_worker, runs):
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    start_worker([qa, qb], "--order", "strict")
    app.tasks["noop"].options(queue=qb).enqueue_many([f"b{i}" for i in range(50)])
    wait_until(lambda: len(runs("noop")) == 50, timeout_s=10,
               message="the second queue was not served while the first was empty")


def test_rotation_stays_the_default(app, queue_name, start_worker, runs):
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    noop = app.tasks["noop"]
    noop.options(queue=qa).enqueue_many([f"a{i}" for i in range(300)])
    noop.options(queue=qb).enqueue_many([f"b{i}" for i in range(300)])
    worker = start_worker([qa, qb], "-c", "4", "--fetch-batch", "20", "--burst",
                          wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()
    first = Counter(r.token[0] for r in runs("noop")[:200])
    assert 80 <= first["a"] <= 120, first


def test_weights_split_the_jobs_taken_in_proportion(app, queue_name, start_worker, runs):
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    noop = app.tasks["noop"]
    noop.options(queue=qa).enqueue_many([f"a{i}" for i in range(600)])
    noop.options(queue=qb).enqueue_many([f"b{i}" for i in range(600)])
    worker = start_worker([f"{qa}=3", f"{qb}=1"], "-c", "10", "--fetch-batch", "40",
                          "--burst", wait_ready=False)
    assert wait_exit(worker, 30) == 0, worker.read_log()
    order = [r.token[0] for r in runs("noop")]
    assert len(order) == 1200
    # while both are backlogged (the first 600 jobs: a has 600), a gets about 3 in 4
    first = Counter(order[:600])
    assert 0.68 <= first["a"] / 600 <= 0.82, first


def test_an_idle_heavy_queue_does_not_hold_back_a_light_one(app, queue_name, start_worker,
                                                             runs):
    qa, qb = f"{queue_name}-a", f"{queue_name}-b"
    start_worker([f"{qa}=9", f"{qb}=1"], "-c", "8")
    nap = app.tasks["nap"].options(queue=qb)
    t0 = time.time()
    nap.enqueue_many([(f"b{i}", 0.2) for i in range(48)])
    wait_until(lambda: len(runs("end")) == 48, timeout_s=15,
               message="the light queue was not drained")
    took = max(r.t for r in runs("end")) - t0
    # 48 jobs of 0.2 s on 8 slots: 1.2 s when every slot is used
    assert took < 2.4, f"took {took:.2f}s: the light queue did not get the free slots"
    # the heavy queue gets its share back as soon as it has work
    app.tasks["noop"].options(queue=qa).enqueue_many([f"a{i}" for i in range(20)])
    wait_until(lambda: len(_tokens(runs, "a")) == 20, timeout_s=10,
               message="the heavy queue was not served again")
