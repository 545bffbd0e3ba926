"""The worker's registry stage as ``batchq info`` reads it, and burst on a paused queue.

* ``live_workers`` reports each worker's heartbeat age and the jobs it runs now (the
  details are published within a heartbeat of a change, not every 5 s);
* a SIGKILLed worker drops out once its heartbeat is ``STALE_AFTER_S`` old;
* while a stopped worker lets its running jobs finish, it keeps heart-beating once a
  second and sits idle (its heartbeat loop used to spin once the stop event was set);
* ``--burst`` on a paused queue with ready jobs exits ``EXIT_STALLED`` with a message
  (it used to wait for ever).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from fixtures.basic import *  # noqa: F403
from helpers import wait_until

from batchq.worker import live_workers
from batchq.worker.exitcodes import EXIT_STALLED
from batchq.worker.registry import STALE_AFTER_S

pytestmark = pytest.mark.integration


def test_live_workers_show_jobs_in_flight_and_heartbeat_age(app, queue_name, start_worker,
                                                             redis_client, namespace):
    w = start_worker(queue_name, "-c", "4")
    app.tasks["nap"].options(queue=queue_name).enqueue_many([(f"n{i}", 30.0)
                                                             for i in range(4)])

    def busy() -> list[dict]:
        ws = live_workers(redis_client, namespace)
        return ws if ws and ws[0].get("in_flight") == 4 else []

    (me,) = wait_until(busy, 10)
    assert me["pid"] == w.pid
    assert 0 <= me["heartbeat_age_s"] < STALE_AFTER_S

    os.kill(w.pid, signal.SIGKILL)
    w.wait(10)
    # gone once its heartbeat is stale (a fake "now" would need the server clock: ask
    # for a tighter staleness instead of waiting STALE_AFTER_S)
    wait_until(lambda: live_workers(redis_client, namespace, stale_after_s=2.5) == [], 10)


def test_burst_on_a_paused_queue_with_ready_jobs_exits_stalled(app, queue_name,
                                                               start_worker):
    q = app.queue(queue_name)
    app.tasks["noop"].options(queue=queue_name).enqueue("x")
    q.pause()
    w = start_worker(queue_name, "--burst", wait_ready=False)
    assert w.wait(20) == EXIT_STALLED, w.read_log()
    assert "jobs are left only in paused queues" in w.read_log()
    assert q.stats().ready == 1


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of ``pid`` so far, in clock ticks (/proc/<pid>/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def test_a_draining_worker_keeps_beating_without_spinning(app, queue_name, start_worker,
                                                          redis_client, namespace, runs):
    w = start_worker(queue_name)
    app.tasks["nap"].options(queue=queue_name).enqueue("slow", 4.0)
    wait_until(lambda: runs("start"), 10)
    w.send_signal(signal.SIGTERM)  # graceful: the nap may finish
    wait_until(lambda: "stopping: no new jobs" in w.read_log(), 5)
    before = _cpu_ticks(w.pid)
    time.sleep(2.0)
    spent_s = (_cpu_ticks(w.pid) - before) / os.sysconf("SC_CLK_TCK")
    # a spinning loop takes most of a core for the 2 s; an idle one a few ms
    assert spent_s < 0.5, f"the draining worker used {spent_s:.2f}s of CPU in 2s"
    (me,) = live_workers(redis_client, namespace)
    assert me["in_flight"] == 1 and me["heartbeat_age_s"] < 2.5, me
    assert w.wait(15) == 0, w.read_log()
    assert [r.token for r in runs("end")] == ["slow"]
