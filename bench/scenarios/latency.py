"""The ``latency`` scenario: open-loop load at fixed offered rates.

The producer (``batchq.load.schedule.aopen_loop`` in this process, on uvloop) sends job ``i``
at its intended time ``start + i / rate``; each job carries that intended time and the
time its send call began. The handler notes its entry and exit. Per job:

* ``enqueue_to_start`` = handler entry - intended send time,
* ``enqueue_to_done``  = handler exit  - intended send time (the ack is written after
  that, batched, and is not included),
* ``send_lateness``    = actual send - intended send (how far the producer fell behind),
* ``sent_to_start``    = handler entry - actual send (the queue's own share: the
  enqueue call, the pop and the worker, without the producer's lateness).

Measuring from the intended time means a producer that stalls (Redis slow to answer,
the machine busy) does not hide the jobs it should have sent meanwhile. Levels: an
idle rate (default 50 jobs/s, one job every 20 ms, so one job at a time) and 25 / 50 /
75 / 90 % of the maximum rate, found first with the same fleet shape (``--max-rate``
skips that) in one of two ways (``--max-from``):

* ``sustained`` (default): the highest offered rate this fleet keeps up with while the
  harness's producer runs beside it, found by bisection (``sustained_max``) between
  ``PROBE_FLOOR`` of the drain maximum and the drain maximum itself. A rate is sustained
  when every job completed and jobs were sent and completed at no less than
  ``SUSTAINED_SHARE`` of it (the rule of ``bench peers``). This is the rate a load test
  on this machine can reach: the producer's CPU comes out of the same cores.
* ``drain``: the drain throughput of a queue filled beforehand (``drain_once``, no
  producer running). On a machine whose cores the producer shares, its upper levels
  offer more than producer and fleet can handle together.
"""

from __future__ import annotations

import array
import os
import time
from collections.abc import Callable
from typing import Any

from batchq.load.schedule import Histogram, LoadState, aopen_loop, percentile_keys
from bench import record
from bench.harness import Context, Fleet, Row, batchq_worker_argv, summarize
from bench.scenarios.throughput import _run_async, drain_once

DEFAULT_LEVELS = (25, 50, 75, 90)
IDLE_RATE = 50.0
METRICS = ("enqueue_to_start", "enqueue_to_done", "send_lateness", "sent_to_start")
SUSTAINED_SHARE = 0.95
"""A rate counts as sustained when every job completed and the jobs completed (and
were sent) at no less than this share of the offered rate."""
PROBE_FLOOR = 0.3
"""The sustained-rate bisection starts between this share of the drain maximum and
the drain maximum."""
PROBE_STEPS = 5
"""Bisection steps after the drain maximum itself was tried: the answer is within
(1 - PROBE_FLOOR) / 2**PROBE_STEPS (2.2 %) of the drain maximum."""
PROBE_MAX_S = 4.0
"""Seconds of load per probe (at most; ``--duration`` if shorter)."""


def figures(samples: array.array[float], state: dict[str, Any]) -> dict[str, Any]:
    """Histograms and rates of one level's samples (intended, sent, start, end, ...)."""
    h_start, h_done, h_late, h_queue = Histogram(), Histogram(), Histogram(), Histogram()
    n = len(samples) // 4
    last_end = 0.0
    for i in range(0, n * 4, 4):
        intended, sent, start, end = samples[i : i + 4]
        h_start.record(start - intended)
        h_done.record(end - intended)
        h_late.record(sent - intended)
        h_queue.record(start - sent)
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
        "sent_to_start": h_queue.summary_ms(),
        "histograms": {"enqueue_to_start": h_start.to_dict(),
                       "enqueue_to_done": h_done.to_dict()},
    }


def add_level(row: Row, fig: dict[str, Any]) -> None:
    """Put one repeat of one level into its table row."""
    for metric, short in (("enqueue_to_start", "start"), ("enqueue_to_done", "done")):
        for k in percentile_keys():
            row.add(f"{short} {k}", fig[metric][k], "ms")
    row.add("send lateness p99", fig["send_lateness"]["p99"], "ms")
    row.add("sent-to-start p50", fig["sent_to_start"]["p50"], "ms")
    row.add("sent-to-start p99", fig["sent_to_start"]["p99"], "ms")
    row.add("completed/s", fig["completion_rate"], "jobs/s")


def wait_for_samples(ctx_client: Any, key: str, n: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        got = record.samples_count(ctx_client, key)
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def sustained(fig: dict[str, Any], rate: float) -> bool:
    """Whether a run at ``rate`` kept up (``SUSTAINED_SHARE``); ``fig`` from ``figures``."""
    return bool(fig["lost"] == 0 and fig["send_errors"] == 0
                and fig["completion_rate"] >= SUSTAINED_SHARE * rate
                and fig["achieved_send_rate"] >= SUSTAINED_SHARE * rate)


def sustained_max(measure: Callable[[float], bool], drain_max: float,
                  steps: int = PROBE_STEPS) -> tuple[float, list[tuple[float, bool]]]:
    """The highest rate ``measure`` finds sustained: ``drain_max`` if it is, else a
    bisection of ``steps`` probes between ``PROBE_FLOOR x drain_max`` (taken as
    sustained) and ``drain_max``; returns it and every ``(rate, sustained)`` probed. A
    floor that turns out not sustained moves down by half (at most ``steps`` times)."""
    probes: list[tuple[float, bool]] = []

    def probe(rate: float) -> bool:
        ok = measure(rate)
        probes.append((rate, ok))
        return ok

    if probe(drain_max):
        return drain_max, probes
    lo, hi = PROBE_FLOOR * drain_max, drain_max
    for _ in range(steps):
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    tries = 0
    while not any(ok and r <= lo for r, ok in probes) and tries < steps:
        # no probe at or below the floor was sustained: check it (and halve it if not)
        if probe(lo):
            break
        lo, tries = lo / 2, tries + 1
    return lo, probes


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
                probe_jobs: int, idle_rate: float, levels: list[int],
                max_from: str = "sustained") -> list[Row]:
    """Find the maximum rate (``max_from``: see the module's text; a given ``max_rate``
    skips the search), then run every level ``repeat`` times against one fleet."""
    procs = processes or os.cpu_count() or 1
    params = rec["parameters"]
    params["max_from"] = "given" if max_rate is not None else max_from
    if max_rate is None:
        drains = [drain_once(ctx, "noop", probe_jobs, procs, concurrency)["jobs_per_s"]
                  for _ in range(max(1, min(repeat, 3)))]
        max_rate = params["drain_max_rate"] = summarize(drains)["median"]
        params["max_rate_probes"] = drains
    ctx.reset()
    fleet = Fleet(batchq_worker_argv(procs, concurrency, burst=False), ctx.fleet_env())
    with fleet:
        fleet.start()
        if params["max_from"] == "sustained":
            max_rate = _find_sustained(ctx, fleet, rec, max_rate, min(duration_s, PROBE_MAX_S))
        params["max_rate"] = max_rate
        plan = [(f"idle ({idle_rate:g} jobs/s)", idle_rate, None)] + [
            (f"{pct} % of max ({max_rate * pct / 100:,.0f} jobs/s)", max_rate * pct / 100,
             pct) for pct in levels]
        rows = [Row(name, {"offered_rate": rate, "percent_of_max": pct})
                for name, rate, pct in plan]
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


def _find_sustained(ctx: Context, fleet: Fleet, rec: dict[str, Any], drain_max: float,
                    probe_s: float) -> float:
    """``sustained_max`` against the running fleet; the probes go into the record."""

    def measure(rate: float) -> bool:
        if not fleet.running():
            raise RuntimeError(f"worker fleet exited\n{fleet.log_tail()}")
        fig = one_level(ctx, rate, probe_s, settle_s=max(10.0, 2 * probe_s))
        ok = sustained(fig, rate)
        rec["parameters"]["sustained_probes"].append({
            "offered_rate": rate, "sustained": ok, "completion_rate": fig["completion_rate"],
            "achieved_send_rate": fig["achieved_send_rate"], "lost": fig["lost"],
            "start_p99_ms": fig["enqueue_to_start"]["p99"]})
        if fig["lost"]:
            ctx.reset()  # the backlog would spill into the next probe
        return ok

    rec["parameters"]["sustained_probes"] = []
    found, probes = sustained_max(measure, drain_max)
    ctx.notes.append(
        f"max = {found:,.0f} jobs/s: the highest rate sustained with the producer beside "
        f"the fleet ({len(probes)} probes of {probe_s:g} s, from a drain maximum of "
        f"{drain_max:,.0f}; sustained = every job done, sent and done at >= "
        f"{SUSTAINED_SHARE:.0%} of the rate)")
    return found
