"""``python -m bench.tools.sendtime``: what calendar quotas and send windows cost.

* **Drain**: ``--jobs`` no-op jobs in ``--groups`` groups drained by a ``--burst``
  fleet (``bench.apps``, handler clocks as ``drain``), twice per repeat in turned
  order: every group under a plain rate limit far above the drain rate (``"*"``,
  ``--rate``), and every group under the same rate *plus* a daily quota (in
  ``America/New_York``, far above the jobs) *plus* a send window open all day. The
  ratio quota-and-window / plain-rate is the cost of the calendar checks in the pop.
* **Idle pops**: a fleet (``-p`` processes) serving the queue, every group outside its
  window until it opens ``--closed-s`` seconds later (a pinned boundary list,
  ``windows.pin_list``); the script calls the server counts (``INFO commandstats``:
  evalsha, eval, fcall) from half a second after the enqueue to 0.3 s before the
  opening, and when the first job starts after the opening.

Prints a markdown table and writes ``bench/results/sendtime-<timestamp>.json``. An
embedded Valkey unless ``--redis-url``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from batchq.flow import calendars, windows
from bench import record
from bench.apps import QUEUE
from bench.harness import (
    Context,
    Fleet,
    Row,
    batchq_worker_argv,
    finish_record,
    markdown,
    new_record,
    run_burst,
    wait_for_totals,
)
from bench.scenarios.throughput import _items


def fill(ctx: Context, jobs: int, groups: int) -> None:
    ctx.reset()
    noop = ctx.app.tasks["noop"]
    per = [jobs // groups + (1 if i < jobs % groups else 0) for i in range(groups)]
    for g, n in enumerate(per):
        noop.options(group=f"g{g}").enqueue_many(_items(n, None))


def _clear(ctx: Context) -> None:
    q = ctx.app.queue(QUEUE)
    q.remove_limit("*")
    q.remove_window("*")


def drain(ctx: Context, jobs: int, groups: int, rate: float, calendar: bool,
          processes: int, concurrency: int) -> float:
    """Jobs/s (handler clocks) of one drain."""
    _clear(ctx)
    fill(ctx, jobs, groups)
    q = ctx.app.queue(QUEUE)
    if calendar:
        q.limit(group="*", rate_per_s=rate, max_per_day=10**11, tz="America/New_York")
        q.window(group="*", hours="00:00-24:00", tz="Europe/Paris")
    else:
        q.limit(group="*", rate_per_s=rate)
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=True), ctx.fleet_env())
    try:
        with fleet:
            (n, first, last, _), wall = run_burst(fleet, ctx.client, ctx.key, jobs,
                                                  timeout_s=120 + jobs / 500)
    finally:
        _clear(ctx)
    if wall is None:
        ctx.note_hang()
    st = q.stats()
    if st.pending or st.dead:
        raise RuntimeError(f"queue not drained: {st}")
    return n / max(last - first, 1e-6)


def _script_calls(ctx: Context) -> int:
    stats = ctx.client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items()
               if name in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))


def idle_pops(ctx: Context, groups: int, closed_s: float, processes: int,
              concurrency: int) -> tuple[int, float, float]:
    """(script calls while every group was outside its window, seconds watched, the
    first start's delay after the opening)."""
    _clear(ctx)
    ctx.reset()
    q = ctx.app.queue(QUEUE)
    r = ctx.client
    w = q.window(group="*", hours="22:00-06:00")
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=False), ctx.fleet_env())
    try:
        with fleet:
            fleet.start()
            time.sleep(3.0)  # the fleet is up and idle
            open_ms = windows.server_ms(r) + round(closed_s * 1000)
            windows.pin_list(r, ctx.app.keys(QUEUE), w.list_field(),
                             [open_ms, open_ms + 3_600_000, open_ms + calendars.WEEK_MS,
                              open_ms + calendars.WEEK_MS + 3_600_000], calendars.WEEK_MS)
            fill(ctx, groups * 10, groups)
            time.sleep(0.5)
            t0, before = time.monotonic(), _script_calls(ctx)
            time.sleep(max(0.0, (open_ms - windows.server_ms(r)) / 1000 - 0.3))
            watched, during = time.monotonic() - t0, _script_calls(ctx) - before
            _, first, _, _ = wait_for_totals(r, ctx.key, groups * 10, 60, fleet)
    finally:
        _clear(ctx)
    return during, watched, first - open_ms / 1000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.sendtime", description=__doc__)
    p.add_argument("--redis-url", default=None)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--rate", type=float, default=1e6,
                   help="the rate limit of every group (default far above the drain)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("-p", "--processes", type=int, default=os.cpu_count() or 1)
    p.add_argument("-c", "--concurrency", type=int, default=100)
    p.add_argument("--closed-s", type=float, default=4.5,
                   help="seconds every group waits for its window (keep under the "
                   "workers' max block, 5 s)")
    p.add_argument("--quick", action="store_true", help="2,000 jobs, one repeat")
    a = p.parse_args()
    if a.quick:
        a.jobs, a.repeat = 2_000, 1
    with Context(a.redis_url, quick=a.quick) as ctx:
        rec = new_record(ctx, "sendtime", {"jobs": a.jobs, "groups": a.groups,
                                           "rate": a.rate, "processes": a.processes})
        base = Row(f"no-op drain, {a.groups} groups, rate limit, -p {a.processes}",
                   {"jobs": a.jobs})
        cal = Row(f"the same + daily quota + send window, -p {a.processes}",
                  {"jobs": a.jobs})
        ratio = Row("quota and window / rate limit (same repeat)", {})
        for i in range(a.repeat):
            got = {}
            for case in ((False, True) if i % 2 == 0 else (True, False)):
                got[case] = drain(ctx, a.jobs, a.groups, a.rate, case, a.processes,
                                  a.concurrency)
            base.add("jobs/s", got[False], "jobs/s")
            cal.add("jobs/s", got[True], "jobs/s")
            ratio.add("ratio", got[True] / got[False])
            rec["runs"].append({"repeat": i, "rate_jobs_per_s": got[False],
                                "calendar_jobs_per_s": got[True]})
        idle = Row(f"idle, every group outside its window, -p {a.processes}", {})
        during, watched, late = idle_pops(ctx, a.groups, a.closed_s, a.processes,
                                          a.concurrency)
        idle.add("script calls", during, "calls")
        idle.add("watched", watched, "s")
        idle.add("first start after opening", late, "s")
        rows = [base, cal, ratio, idle]
        path = finish_record(rec, ctx.out_dir, rows, ctx)
        record.reset(ctx.client, ctx.key)
    print(markdown(rec))
    print(f"median ratio {statistics.median(ratio.values['ratio']):.3f}; record: {path}")


if __name__ == "__main__":
    main()
