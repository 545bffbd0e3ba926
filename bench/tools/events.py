"""``python -m bench.tools.events``: what job events cost, measured in one run.

Two cases alternate inside every repeat: a drain with the bench queue's events off, and
the same drain with them on (``Queue.events(max_len=..., max_age_s=...)``). Each case:
``--jobs`` no-op jobs are enqueued onto the paused bench queue (not timed); one worker
process (``batchq worker bench.apps:app -c C --no-metrics``, or ``-p P`` processes) is
started and waits, blocked; the clock starts when the queue is resumed and stops when
the queue's ``succeeded`` counter reaches the jobs (polled every millisecond). **jobs/s =
jobs / that time**; the ratio on / off per repeat compares like with like. After each
"on" case, the stream's ``MEMORY USAGE`` (``SAMPLES 0``: every node counted) divided by
its length is the Redis memory per retained event.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.apps import QUEUE
from bench.harness import (
    Context,
    Fleet,
    Row,
    batchq_worker_argv,
    finish_record,
    markdown,
    new_record,
)
from bench.scenarios.throughput import _items

CASES = ("events off", "events on")


def _once(ctx: Context, case: str, n: int, processes: int | None, concurrency: int,
          max_len: int) -> tuple[float, float, int, float]:
    """One case: (jobs per second, bytes per retained event, events retained, Redis CPU
    µs per job)."""
    ctx.reset()
    app = ctx.app
    q = app.queue(QUEUE)
    k = app.keys(QUEUE)
    ctx.client.delete(k.events, k.evconf)
    if case == "events on":
        q.events(max_len=max_len, max_age_s=3600)
    q.pause()
    app.tasks["noop"].enqueue_many(_items(n, None))
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=False,
                                     extra=("--log-level", "INFO")), ctx.fleet_env())
    with fleet:
        fleet.start()
        deadline = time.monotonic() + 30
        while " serving " not in fleet.log_tail(50):
            if not fleet.running() or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start\n{fleet.log_tail()}")
            time.sleep(0.01)
        time.sleep(0.2)  # blocked on the paused queue's wake list
        cpu0 = _server_cpu_s(ctx)
        t0 = time.perf_counter()
        q.resume()
        deadline = time.monotonic() + 60 + n / 1000
        while int(ctx.client.hget(k.stats, "succeeded") or 0) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{case}: {ctx.client.hget(k.stats, 'succeeded')} of {n} "
                                   f"in time\n{fleet.log_tail()}")
            time.sleep(0.001)
        took = time.perf_counter() - t0
        cpu_us = (_server_cpu_s(ctx) - cpu0) * 1e6 / n
    kept = 0  # events (an entry holds the jobs of one kind one call changed)
    first = ctx.client.xrange(k.events, count=1)
    last = ctx.client.xrevrange(k.events, count=1)
    if first:
        from batchq.ops.events import decode

        n_first = int(decode(QUEUE, *first[0])[0].id.split("-")[1])
        kept = int(last[0][0].split(b"-")[1]) - n_first + 1
    per_event = 0.0
    if kept:
        per_event = int(ctx.client.memory_usage(k.events, samples=0) or 0) / kept
    if case == "events on" and kept < min(n, max_len):
        raise RuntimeError(f"events on: only {kept} events kept of {2 * n}")
    if case == "events off" and kept:
        raise RuntimeError("events off: the stream was written")
    q.events(False)
    ctx.client.delete(k.events, k.evconf)
    return n / max(took, 1e-6), per_event, kept, cpu_us


def _server_cpu_s(ctx: Context) -> float:
    cpu = ctx.client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def run_events(ctx: Context, *, jobs: int, repeat: int, processes: int | None,
               concurrency: int, max_len: int) -> list[Row]:
    params = {"jobs": jobs, "processes": processes or 1, "concurrency": concurrency}
    rows = {c: Row(f"drain, {c}", dict(params)) for c in CASES}
    ratio = Row("events on / events off (same run)", {})
    mem = Row("Redis memory per retained event", {"max_len": max_len})
    for i in range(repeat):
        order = CASES if i % 2 == 0 else tuple(reversed(CASES))
        got = {c: _once(ctx, c, jobs, processes, concurrency, max_len) for c in order}
        for c in CASES:
            rows[c].add("jobs/s", got[c][0], "jobs/s")
            rows[c].add("Redis CPU µs/job", got[c][3], "")
        ratio.add("ratio", got["events on"][0] / got["events off"][0], "")
        mem.add("bytes/event", got["events on"][1], "bytes")
        mem.add("events kept", got["events on"][2], "")
    return [*rows.values(), ratio, mem]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.events", description=__doc__)
    p.add_argument("--redis-url", default=None,
                   help="Redis to benchmark (default: start an embedded Valkey)")
    p.add_argument("--jobs", type=int, default=100_000, help="jobs per drain (100,000)")
    p.add_argument("--repeat", type=int, default=3, help="repeats (3)")
    p.add_argument("-p", "--processes", type=int, default=None,
                   help="worker processes (default: one)")
    p.add_argument("-c", "--concurrency", type=int, default=100)
    p.add_argument("--max-len", type=int, default=100_000,
                   help="events kept (MAXLEN ~), default 100,000")
    p.add_argument("--namespace", default=None)
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    from pathlib import Path

    out_dir = Path(args.out_dir) if args.out_dir else None
    with Context(args.redis_url, args.namespace, out_dir) as ctx:
        params: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "redis_url"}
        rec = new_record(ctx, "events", params)
        rows = run_events(ctx, jobs=args.jobs, repeat=args.repeat,
                          processes=args.processes, concurrency=args.concurrency,
                          max_len=args.max_len)
        path = finish_record(rec, ctx.out_dir, rows, ctx)
    print(markdown(rec))
    print(f"\nrecord: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
