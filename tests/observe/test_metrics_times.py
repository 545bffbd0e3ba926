"""The wait and run times a worker's metrics record (``batchq_job_wait_seconds``,
``batchq_job_run_seconds``). The runners time jobs with one clock read between two
items (the end of one is the start of the next, unless the runner awaited in between),
so these tests check the figures a real worker records: a job's wait covers its time in
the queue and not its run, and its run covers the handler and not the runner's idle
time before it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fixtures.basic import *  # noqa: F403

pytestmark = pytest.mark.integration

WORKER = """
import asyncio, sys, time
import batchq
from prometheus_client import REGISTRY

url, namespace, queue = sys.argv[1:4]
app = batchq.App(url, namespace=namespace)

@app.task(queue=queue)
async def nap(secs):
    await asyncio.sleep(secs)

@app.task(queue=queue)
async def quick():
    pass

async def main():
    w = batchq.Worker(app, batchq.WorkerSettings(queues=(queue,),
                                                 install_signal_handlers=False))
    run = asyncio.create_task(w.run())
    await asyncio.sleep(0.4)  # every runner idles: idle time is no job's run
    q = app.queue(queue)
    q.pause()
    quick.enqueue_many([()] * 50)
    await asyncio.sleep(0.3)  # the quick jobs wait at least this long
    q.resume()
    nap.enqueue_many([(0.06,)] * 5)
    r = app.redis
    k = app.keys(queue)
    while int(r.hget(k.stats, "succeeded") or 0) < 55:
        await asyncio.sleep(0.02)
    w.request_stop()
    assert await run == 0

asyncio.run(main())
for task in ("quick", "nap"):
    for name in ("wait", "run"):
        for le in ("0.025", "0.05", "0.1", "0.25", "2.5", "+Inf"):
            v = REGISTRY.get_sample_value(f"batchq_job_{name}_seconds_bucket",
                                          {"queue": queue, "task": task, "le": le})
            print(task, name, le, int(v or 0))
"""


def _buckets(redis_url: str, namespace: str, queue: str) -> dict[tuple[str, str, str], int]:
    out = subprocess.run([sys.executable, "-c", WORKER, redis_url, namespace, queue],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {}
    for line in out.stdout.split("\n"):
        if line:
            task, name, le, n = line.split()
            got[task, name, le] = int(n)
    return got


def test_wait_and_run_times_of_a_real_worker(redis_url, namespace, queue_name):
    got = _buckets(redis_url, namespace, queue_name)
    # every job once in each histogram
    for task, n in (("quick", 50), ("nap", 5)):
        for name in ("wait", "run"):
            assert got[task, name, "+Inf"] == n, (task, name, got)
    # the quick jobs waited 0.3 s or more before the worker took them, and ran in no
    # time
    assert got["quick", "wait", "0.25"] == 0, got
    assert got["quick", "wait", "2.5"] == 50, got
    assert got["quick", "run", "0.1"] == 50, got
    # a nap of 60 ms runs 60 ms: the runner's idle time before it is not counted
    assert got["nap", "run", "0.05"] == 0, got
    assert got["nap", "run", "0.25"] == 5, got
    # the naps were taken at once: their wait does not include their own run
    assert got["nap", "wait", "0.05"] == 5, got
