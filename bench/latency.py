"""The ``latency`` scenario: open-loop load at fixed offered rates.

The producer (``batchq.loadgen.aopen_loop`` in this process, on uvloop) sends job ``i``
at its intended time ``start + i / rate``; each job carries that intended time and the
time its send call began. The handler notes its entry and exit. Per job:

* ``enqueue_to_start`` = handler entry - intended send time,
* ``enqueue_to_done``  = handler exit  - intended send time (the ack is written after
  that, batched, and is not included),
* ``send_lateness``    = actual send - intended send (how far the producer fell behind).

Measuring from the intended time means a producer that stalls (Redis slow to answer,
the machine busy) does not hide the jobs it should have sent meanwhile. Levels: an
idle rate (default 50 jobs/s, one job every 20 ms, so one job at a time) and 25 / 50 /
75 / 90 % of the maximum drain throughput, measured first with the same fleet shape
(``--max-rate`` skips that).
"""

from __future__ import annotations

import array
import os
import time
from typing import Any

from batchq.loadgen import Histogram, LoadState, aopen_loop, percentile_keys

from . import record
from .harness import Context, Fleet, Row, batchq_worker_argv, summarize
from .throughput import _run_async, drain_once

DEFAULT_LEVELS = (25, 50, 75, 90)
IDLE_RATE = 50.0
METRICS = ("enqueue_to_start", "enqueue_to_done", "send_lateness")


def figures(samples: array.array[float], state: dict[str, Any]) -> dict[str, Any]:
    """Histograms and rates of one level's samples (intended, sent, start, end, ...)."""
    h_start, h_done, h_late = Histogram(), Histogram(), Histogram()
    n = len(samples) // 4
    last_end = 0.0
    for i in range(0, n * 4, 4):
        intended, sent, start, end = samples[i : i + 4]
        h_start.record(start - intended)
        h_done.record(end - intended)
        h_late.record(sent - intended)
        last_end = max(last_end, end)
    first = min((samples[i] for i in range(0, n * 4, 4)), default=0.0)
    span = last_end - first
    return {
        "jobs": n,
        "sent": state["sent"],
        "offered_rate": state["offered_rate"],
        "achieved_send_rate": state["achieved_send_rate"],
        "completion_rate": n / span if span > 0 else 0.0,
        "send_errors": state["errors"],
        "lost": state["sent"] - n,
        "enqueue_to_start": h_start.summary_ms(),
        "enqueue_to_done": h_done.summary_ms(),
        "send_lateness": h_late.summary_ms(),
        "histograms": {"enqueue_to_start": h_start.to_dict(),
                       "enqueue_to_done": h_done.to_dict()},
    }


def add_level(row: Row, fig: dict[str, Any]) -> None:
    """Put one repeat of one level into its table row."""
    for metric, short in (("enqueue_to_start", "start"), ("enqueue_to_done", "done")):
        for k in percentile_keys():
            row.add(f"{short} {k}", fig[metric][k], "ms")
    row.add("send lateness p99", fig["send_lateness"]["p99"], "ms")
    row.add("completed/s", fig["completion_rate"], "jobs/s")


def wait_for_samples(ctx_client: Any, key: str, n: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        got = record.samples_count(ctx_client, key)
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def one_level(ctx: Context, rate: float, duration_s: float, settle_s: float) -> dict[str, Any]:
    """Run one open-loop level against the running fleet; returns its figures."""
    lat = ctx.app.tasks["lat"]

    async def send(intended: list[float], sent_at: float) -> None:
        if len(intended) == 1:
            await lat.aenqueue(intended[0], sent_at)
        else:
            await lat.aenqueue_many([(t, sent_at) for t in intended])

    async def main() -> LoadState:
        await ctx.app.async_redis().ping()  # connect outside the schedule
        try:
            return await aopen_loop(send, rate, duration_s)
        finally:
            await ctx.app.aclose()

    # one warm-up job: the fleet is up and its reporters run before the clock starts
    record.take_samples(ctx.client, ctx.key)
    lat.enqueue(time.time(), time.time())
    if wait_for_samples(ctx.client, ctx.key, 1, 30.0) < 1:
        raise RuntimeError("the worker fleet did not run the warm-up job within 30s")
    record.take_samples(ctx.client, ctx.key)
    st: LoadState = _run_async(main())
    wait_for_samples(ctx.client, ctx.key, st.sent, settle_s)
    samples = record.take_samples(ctx.client, ctx.key)
    return figures(samples, st.as_dict())


def run_latency(ctx: Context, rec: dict[str, Any], *, repeat: int, duration_s: float,
                processes: int | None, concurrency: int, max_rate: float | None,
                probe_jobs: int, idle_rate: float, levels: list[int]) -> list[Row]:
    procs = processes or os.cpu_count() or 1
    if max_rate is None:
        probes = [drain_once(ctx, "noop", probe_jobs, procs, concurrency)["jobs_per_s"]
                  for _ in range(max(1, min(repeat, 3)))]
        max_rate = summarize(probes)["median"]
        rec["parameters"]["max_rate_probes"] = probes
    rec["parameters"]["max_rate"] = max_rate
    plan = [(f"idle ({idle_rate:g} jobs/s)", idle_rate, None)] + [
        (f"{pct} % of max ({max_rate * pct / 100:,.0f} jobs/s)", max_rate * pct / 100, pct)
        for pct in levels]
    rows = [Row(name, {"offered_rate": rate, "percent_of_max": pct})
            for name, rate, pct in plan]
    ctx.reset()
    fleet = Fleet(batchq_worker_argv(procs, concurrency, burst=False), ctx.fleet_env())
    with fleet:
        fleet.start()
        for i in range(repeat):
            for row, (_, rate, _) in zip(rows, plan, strict=True):
                if not fleet.running():
                    raise RuntimeError(f"worker fleet exited\n{fleet.log_tail()}")
                fig = one_level(ctx, rate, duration_s, settle_s=max(10.0, 2 * duration_s))
                add_level(row, fig)
                rec["runs"].append({"case": row.name, "repeat": i, **fig})
                if fig["lost"]:
                    ctx.notes.append(f"{row.name}, repeat {i}: {fig['lost']} jobs not "
                                     "completed within the settle time (not sustained)")
                    ctx.reset()
    rec["notes"] = list(ctx.notes)
    return rows
