"""The ``cancel-drop`` scenario: how fast one worker drops cancelled jobs, against how
fast it drains the same jobs when they are not cancelled, in the same run.

Each case: ``--jobs`` no-op jobs are enqueued onto the paused bench queue (not timed);
for the drop cases they are then cancelled (not timed): as a campaign
(``Campaign.cancel``: each job dropped by the flag of its campaign), one by one by id
(``App.cancel``, pipelined: each job dropped by its tombstone), or as a campaign whose
jobs sit in one group limited to ``--group-rate`` jobs/s (a cancelled job is never
charged a rate token). One worker process (``batchq worker bench.apps:app -c C
--no-metrics``, not burst) is started and waits, blocked, on the paused queue; the
clock starts when the queue is resumed (which wakes it) and stops when the queue's
``stats`` counter in Redis (``cancelled``, or ``succeeded`` for the plain drain) reaches
the jobs, polled every millisecond. **jobs/s = jobs / that time**, the same clock for
both, so the ratio drop / drain (per repeat) compares like with like. The cases
alternate inside every repeat.
"""

from __future__ import annotations

import time
from typing import Any

from bench.apps import QUEUE
from bench.harness import Context, Fleet, Row, batchq_worker_argv
from bench.scenarios.throughput import _items

CASES = ("plain drain", "drop: cancelled campaign", "drop: cancelled by id",
         "drop: cancelled campaign in a rate-limited group")


def _fill(ctx: Context, case: str, n: int, group_rate: float) -> str:
    """Enqueue (and cancel) the case's jobs; returns the stats counter that ends it."""
    from batchq.store.scripts import calls
    from batchq.tasks.results import CANCEL_KEEP_S, CANCEL_TRIM_CHUNK

    app = ctx.app
    task = app.tasks["noop"]
    q = app.queue(QUEUE)
    q.remove_limit(group="tenant")
    if case == "plain drain":
        task.enqueue_many(_items(n, None))
        return "succeeded"
    if case == "drop: cancelled by id":
        ids = task.enqueue_many(_items(n, None))
        k = app.keys(QUEUE)
        keep_ms = round(CANCEL_KEEP_S * 1000)
        if not app.cancel(ids[0]):  # (loads the script for the pipelines)
            raise RuntimeError("a cancel by id found its job not waiting")
        for i in range(1, n, 1000):
            pipe = app.redis.pipeline(transaction=False)
            for jid in ids[i : i + 1000]:
                app.sync_scripts.call(calls.cancel(k, jid, keep_ms, CANCEL_TRIM_CHUNK),
                                      client=pipe)
            if sum(int(x) for x in pipe.execute()) != len(ids[i : i + 1000]):
                raise RuntimeError("a cancel by id found its job not waiting")
        return "cancelled"
    c = app.campaign()
    if case.endswith("group"):
        q.limit(group="tenant", rate_per_s=group_rate)
        task.options(group="tenant", campaign=c).enqueue_many(_items(n, None))
    else:
        task.options(campaign=c).enqueue_many(_items(n, None))
    if c.cancel() != n:
        raise RuntimeError(f"the campaign's cancel did not cover its {n} jobs")
    return "cancelled"


def _once(ctx: Context, case: str, n: int, concurrency: int, group_rate: float) -> float:
    """One case, one worker process: jobs per second from the resume to the counter."""
    ctx.reset()
    q = ctx.app.queue(QUEUE)
    q.pause()
    counter = _fill(ctx, case, n, group_rate)
    stats = ctx.app.keys(QUEUE).stats
    fleet = Fleet(batchq_worker_argv(None, concurrency, burst=False,
                                     extra=("--log-level", "INFO")), ctx.fleet_env())
    with fleet:
        fleet.start()
        deadline = time.monotonic() + 30
        while " serving " not in fleet.log_tail(50):
            if not fleet.running() or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start\n{fleet.log_tail()}")
            time.sleep(0.01)
        time.sleep(0.2)  # blocked on the paused queue's wake list
        t0 = time.perf_counter()
        q.resume()
        deadline = time.monotonic() + 60 + n / 1000
        while int(ctx.client.hget(stats, counter) or 0) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case}: {ctx.client.hget(stats, counter)} of {n} "
                                   f"{counter} in time\n{fleet.log_tail()}")
            time.sleep(0.001)
        took = time.perf_counter() - t0
    if ctx.app.queue(QUEUE).stats().pending:
        raise RuntimeError(f"{case}: jobs left after the run")
    return n / max(took, 1e-6)


def run_cancel_drop(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
                    concurrency: int, group_rate: float) -> list[Row]:
    rows = {c: Row(f"{c}, 1 process", {"jobs": jobs}) for c in CASES}
    ratios = {c: Row(f"{c} / plain drain (same run)", {}) for c in CASES[1:]}
    rows[CASES[3]].params["group_rate_per_s"] = group_rate
    for i in range(repeat):
        order = CASES if i % 2 == 0 else tuple(reversed(CASES))
        got = {c: _once(ctx, c, jobs, concurrency, group_rate) for c in order}
        for c in CASES:
            rows[c].add("jobs/s", got[c], "jobs/s")
        for c in CASES[1:]:
            ratios[c].add("ratio", got[c] / got[CASES[0]], "")
    return [*rows.values(), *ratios.values()]
