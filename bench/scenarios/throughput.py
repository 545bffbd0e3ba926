"""Throughput scenarios: ``enqueue``, ``drain`` and ``scale``.

Drain timing: the jobs are all enqueued first (not timed), then a ``--burst`` worker
fleet is started. Each handler notes its entry and exit wall-clock time; the figure is
``jobs / (last handler exit - first handler entry)`` over every process. So it leaves
out interpreter start-up, imports and connecting (before the first job) and the last
ack write and process exit (after the last job); the fleet's whole lifetime is
reported next to it as ``fleet_wall_s``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

from bench import record
from bench.apps import QUEUE
from bench.harness import Context, Fleet, Row, add_ratios, batchq_worker_argv, run_burst, timed


def _items(n: int, payload: bytes | None) -> Iterator[tuple[Any, ...]]:
    one: tuple[Any, ...] = (payload,) if payload is not None else ()
    for _ in range(n):
        yield one


def fill(ctx: Context, task: str, n: int, payload: bytes | None = None) -> float:
    """Enqueue ``n`` jobs of ``task`` with ``enqueue_many``; returns the seconds taken."""
    t = ctx.app.tasks[task]
    with timed() as el:
        ids = t.enqueue_many(_items(n, payload))
    if len(ids) != n:
        raise RuntimeError(f"enqueue_many wrote {len(ids)} of {n} jobs")
    return el[0]


def drain_once(ctx: Context, task: str, n: int, processes: int | None, concurrency: int,
               payload: bytes | None = None) -> dict[str, Any]:
    """Enqueue ``n`` jobs, run a burst fleet until it exits, return the timings."""
    ctx.reset()
    enqueue_s = fill(ctx, task, n, payload)
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=True), ctx.fleet_env())
    with fleet:
        (jobs, first, last, procs), wall = run_burst(fleet, ctx.client, ctx.key, n,
                                                     timeout_s=120 + n / 500)
    if wall is None:
        ctx.note_hang()
    st = ctx.app.queue(QUEUE).stats()
    if st.pending or st.dead:
        raise RuntimeError(f"queue not drained: {st}")
    span = max(last - first, 1e-6)
    return {"task": task, "jobs": n, "processes": processes or 1, "concurrency": concurrency,
            "payload_bytes": len(payload) if payload is not None else 0,
            "enqueue_s": enqueue_s, "drain_s": span, "jobs_per_s": jobs / span,
            "fleet_wall_s": wall, "fleet_exited_by_itself": wall is not None,
            "reporting_processes": procs}


# --- enqueue ---------------------------------------------------------------------------


def _enqueue_single(ctx: Context, n: int, payload: bytes | None) -> float:
    t = ctx.app.tasks["noop"]
    args: tuple[Any, ...] = (payload,) if payload is not None else ()
    t.enqueue(*args)  # connect and load the script outside the timing
    ctx.reset()
    t0 = time.perf_counter()
    for _ in range(n):
        t.enqueue(*args)
    return time.perf_counter() - t0


def _enqueue_many(ctx: Context, n: int, payload: bytes | None) -> float:
    ctx.app.tasks["noop"].enqueue()
    ctx.reset()
    return fill(ctx, "noop", n, payload)


def _enqueue_async(ctx: Context, n: int, payload: bytes | None, producers: int) -> float:
    t = ctx.app.tasks["noop"]
    args: tuple[Any, ...] = (payload,) if payload is not None else ()
    share = [n // producers + (1 if i < n % producers else 0) for i in range(producers)]

    async def producer(k: int) -> None:
        for _ in range(k):
            await t.aenqueue(*args)

    async def main() -> float:
        await t.aenqueue(*args)
        await ctx.app.aregister_queue(QUEUE)
        ctx.reset()
        t0 = time.perf_counter()
        await asyncio.gather(*(producer(k) for k in share))
        elapsed = time.perf_counter() - t0
        await ctx.app.aclose()
        return elapsed

    elapsed: float = _run_async(main())
    return elapsed


def _run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)


def run_enqueue(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
                producers: int, payload_bytes: int) -> list[Row]:
    payload = b"x" * payload_bytes if payload_bytes else None
    rows = [Row("enqueue (sync, one call per job)", {"mode": "single"}),
            Row("enqueue_many (sync, streamed)", {"mode": "many"}),
            Row(f"aenqueue ({producers} concurrent async producers)",
                {"mode": "async", "producers": producers})]
    for i in range(repeat):
        times = [_enqueue_single(ctx, jobs, payload), _enqueue_many(ctx, jobs, payload),
                 _enqueue_async(ctx, jobs, payload, producers)]
        depth = ctx.app.queue(QUEUE).stats().ready
        if depth != jobs:
            raise RuntimeError(f"expected {jobs} ready jobs after the async run, found {depth}")
        for row, secs in zip(rows, times, strict=True):
            row.add("jobs/s", jobs / secs, "jobs/s")
        rec["runs"].append({"repeat": i, "seconds": dict(zip(("single", "many", "async"),
                                                             times, strict=True))})
        ctx.reset()
    add_ratios(rows, "jobs/s", "÷ one enqueue() per job")
    return rows


# --- drain and scale -------------------------------------------------------------------


def _drain_row(ctx: Context, rec: dict[str, Any], row: Row, *, task: str, jobs: int,
               repeat: int, processes: int | None, concurrency: int,
               payload_bytes: int = 0) -> None:
    payload = b"x" * payload_bytes if payload_bytes else None
    for i in range(repeat):
        r = drain_once(ctx, task, jobs, processes, concurrency, payload)
        row.add("jobs/s", r["jobs_per_s"], "jobs/s")
        row.add("drain_s", r["drain_s"], "s")
        if r["fleet_wall_s"] is not None:
            row.add("fleet_wall_s", r["fleet_wall_s"], "s")
        rec["runs"].append({"case": row.name, "repeat": i, **r})
    record.reset(ctx.client, ctx.key)


def run_drain(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
              processes: int | None, concurrency: int) -> list[Row]:
    cores = processes or os.cpu_count() or 1
    rows = []
    for task, label in (("noop", "async no-op"), ("batch_noop", "batch no-op (batch_size 100)")):
        for procs in dict.fromkeys((None, cores)):
            name = f"{label}, {'1 process' if procs is None else f'-p {procs}'}"
            row = Row(name, {"task": task, "processes": procs or 1, "concurrency": concurrency,
                             "jobs": jobs})
            _drain_row(ctx, rec, row, task=task, jobs=jobs, repeat=repeat, processes=procs,
                       concurrency=concurrency)
            rows.append(row)
    add_ratios(rows, "jobs/s", "÷ async no-op, 1 process")
    return rows


def run_scale(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
              max_processes: int | None, concurrency: int,
              payloads: list[int]) -> list[Row]:
    top = max_processes or os.cpu_count() or 1
    rows = []
    for procs in range(1, top + 1):
        row = Row(f"no-op, -p {procs}", {"processes": procs, "payload_bytes": 0, "jobs": jobs})
        _drain_row(ctx, rec, row, task="noop", jobs=jobs, repeat=repeat, processes=procs,
                   concurrency=concurrency)
        rows.append(row)
    for size in payloads:
        row = Row(f"no-op, {size:,} B payload, -p {top}",
                  {"processes": top, "payload_bytes": size, "jobs": jobs})
        _drain_row(ctx, rec, row, task="noop", jobs=jobs, repeat=repeat, processes=top,
                   concurrency=concurrency, payload_bytes=size)
        rows.append(row)
    add_ratios(rows, "jobs/s", "÷ -p 1")
    return rows
