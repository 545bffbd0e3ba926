"""The ``campaign`` scenario: what campaigns and dedup keys cost.

* drain: no-op jobs in a sealed campaign against the same jobs without one, one process
  each, alternating in the same run (the figure is campaign / plain; the target is
  >= 90 %);
* ``enqueue_many`` with a dedup key per job (``key_fn``), a fresh key each, then the same
  rows again (every key held: nothing written);
* Redis memory per dedup key: ``used_memory`` after ``enqueue_many`` of N keyed jobs
  minus after N plain ones (the dedup hash field and the job's jobmeta entry), and per
  finished key (after the drain: the dedup hash field and its lapse time);
* completion latency: small campaigns (``--campaign-jobs`` each) run by a live fleet;
  for each, the on_complete handler's start minus the exit of the campaign's last
  handler (which the ack follows at once): p50 / p99 / max.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from batchq.store.codec import lease_of
from bench import record
from bench.apps import QUEUE
from bench.harness import Context, Fleet, Row, batchq_worker_argv, percentile, run_burst, timed
from bench.scenarios.resources import used_memory
from bench.scenarios.throughput import _items

LATENCY_KEY = "{}:campaign-latency"

POP_HEAD = 11
"""pop.lua's reply: 10 counters and lists, the bundle item ({} unless asked), then jobs."""


def _drain(ctx: Context, n: int, campaign: bool, processes: int | None,
           concurrency: int) -> float:
    ctx.reset()
    task = ctx.app.tasks["noop"]
    if campaign:
        c = ctx.app.campaign()
        task.options(campaign=c).enqueue_many(_items(n, None))
        c.seal()
    else:
        task.enqueue_many(_items(n, None))
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=True,
                                     extra=("--log-level", "INFO")), ctx.fleet_env())
    with fleet:
        (jobs, first, last, _), wall = run_burst(fleet, ctx.client, ctx.key, n,
                                                 timeout_s=120 + n / 500)
        log = fleet.log_tail(40)
    if wall is None:
        ctx.note_hang()
    if campaign and not c.stats().done:
        raise RuntimeError(f"campaign not complete after the drain (fleet stopped by the "
                           f"harness: {wall is None}): {c.stats()}\n{log}")
    return jobs / max(last - first, 1e-6)


def _keyed(ctx: Context, n: int) -> tuple[float, float, float, float]:
    """(fresh keys jobs/s, all keys held jobs/s, bytes per pending key, bytes per
    finished key)."""
    task = ctx.app.tasks["noop"]
    ctx.reset()
    task.enqueue_many([])
    base = used_memory(ctx)
    task.enqueue_many(_items(n, None))
    plain = used_memory(ctx) - base
    ctx.reset()
    task.enqueue_many([])
    base = used_memory(ctx)
    with timed() as el:
        ids = task.enqueue_many(range(n), key_fn=lambda i: f"bench:user{i}@example.com")
    keyed = used_memory(ctx) - base
    if len(set(ids)) != n:
        raise RuntimeError("keyed enqueue_many did not write one job per key")
    with timed() as again:
        task.enqueue_many(range(n), key_fn=lambda i: f"bench:user{i}@example.com")
    if ctx.app.queue(QUEUE).stats().ready != n:
        raise RuntimeError("a held key wrote a job")
    # settle them without a fleet: pop + ack in this process, through the scripts
    k = ctx.app.keys(QUEUE)
    s = ctx.app.sync_scripts
    from batchq.store.scripts import calls

    while True:
        res = s.call(calls.pop(k, 1000, 60_000, 100))
        jobs = res[POP_HEAD:]
        if not jobs:
            break
        leases = [lease_of(j)[1] for j in jobs]
        s.call(calls.ack(k, leases))
    finished = used_memory(ctx) - base
    return n / el[0], n / again[0], (keyed - plain) / n, finished / n


def _latency(ctx: Context, campaigns: int, per: int, concurrency: int) -> list[float]:
    ctx.reset()
    key = LATENCY_KEY.format(ctx.namespace)
    ctx.client.delete(key)
    fleet = Fleet(batchq_worker_argv(None, concurrency, burst=False), ctx.fleet_env())
    out: list[float] = []
    with fleet:
        fleet.start()
        time.sleep(1.5)  # up and serving
        for i in range(campaigns):
            c = ctx.app.campaign(on_complete=ctx.app.tasks["campaign_mark"])
            ctx.app.tasks["noop"].options(campaign=c).enqueue_many(_items(per, None))
            c.seal()
            deadline = time.monotonic() + 30
            while not ctx.client.hexists(key, c.id):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"on_complete of {c.id} did not run in 30 s\n"
                                       f"{fleet.log_tail()}")
                time.sleep(0.005)
            started = float(ctx.client.hget(key, c.id) or 0)
            # the handlers publish their totals now and then: wait for this campaign's;
            # the latest handler exit is then this campaign's last job
            while record.read_totals(ctx.client, ctx.key)[0] < (i + 1) * per:
                if time.monotonic() > deadline:
                    raise RuntimeError("the handlers' timings did not arrive")
                time.sleep(0.01)
            _, _, last, _ = record.read_totals(ctx.client, ctx.key)
            out.append(started - last)
    return out


def run_campaign(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
                 processes: int | None, concurrency: int, campaigns: int,
                 campaign_jobs: int) -> list[Row]:
    plain = Row("drain no-op, plain, 1 process", {"jobs": jobs})
    camp = Row("drain no-op in a campaign, 1 process", {"jobs": jobs})
    ratio = Row("campaign drain / plain drain (same run)", {})
    fresh = Row("enqueue_many with a dedup key each (fresh keys)", {"jobs": jobs})
    held = Row("enqueue_many again (every key held: nothing written)", {"jobs": jobs})
    mem = Row("Redis bytes per dedup key (pending job: key + jobmeta)", {"jobs": jobs})
    mem_done = Row("Redis bytes per dedup key (finished, held for key_ttl_s)", {"jobs": jobs})
    lat = Row("completion latency: last handler exit -> on_complete start",
              {"campaigns": campaigns, "jobs_per_campaign": campaign_jobs})
    for i in range(repeat):
        a = _drain(ctx, jobs, False, processes, concurrency)
        b = _drain(ctx, jobs, True, processes, concurrency)
        plain.add("jobs/s", a, "jobs/s")
        camp.add("jobs/s", b, "jobs/s")
        ratio.add("ratio", b / a, "")
        f, h, m, md = _keyed(ctx, jobs)
        fresh.add("jobs/s", f, "jobs/s")
        held.add("jobs/s", h, "jobs/s")
        mem.add("bytes", m, "B")
        mem_done.add("bytes", md, "B")
        lats = _latency(ctx, campaigns, campaign_jobs, concurrency)
        lat.add("p50", percentile(lats, 0.5), "s")
        lat.add("p99", percentile(lats, 0.99), "s")
        lat.add("max", max(lats), "s")
        rec["runs"].append({"repeat": i, "plain_jobs_per_s": a, "campaign_jobs_per_s": b,
                            "keyed_jobs_per_s": f, "held_jobs_per_s": h,
                            "bytes_per_key": m, "bytes_per_finished_key": md,
                            "latency_s": lats, "latency_median_s": statistics.median(lats)})
        ctx.reset()
    return [plain, camp, ratio, fresh, held, mem, mem_done, lat]
