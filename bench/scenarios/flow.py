"""Issue 11's figures (flow control): ``fanout``, ``groups`` and ``ratecheck``.

* ``fanout``: a mock provider (``bench/apps/mockprovider.py``, its own process on loopback:
  50 ms per answer, a token bucket per sender, 429 + Retry-After past it) and ``--jobs``
  messages over ``--groups`` senders whose limits sum to ``--rate-sum``; the queue has
  the same per-group limits as the provider. A non-burst fleet of
  ``bench.apps.flowapp:app`` sends them (one real HTTP request per job, RateLimited on a
  429). Everything is read at the provider: achieved rate, 429s, per-group finish
  times, every id accepted exactly once.
* ``groups``: no-op drain (``bench.apps``, burst fleet, handler clocks as ``drain``)
  of ``--jobs`` jobs plain, in ``--groups`` groups, and plain under a queue-wide rate
  limit far above the drain rate, alternating in one run; ratios per repeat.
* ``ratecheck``: two supervisors (``-p`` processes each) of ``bench.apps.flowapp:app`` run
  ``tick`` jobs under a queue-wide limit and a group limit; every handler writes its
  start time to one file; the most starts in any sliding 1 s window, against
  rate + burst.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import record
from bench.apps import QUEUE
from bench.apps.flowapp import FANOUT, LOG_ENV, RATECHECK, URL_ENV, make_app
from bench.harness import Context, Fleet, Row, batchq_worker_argv, run_burst, timed
from bench.scenarios.throughput import _items

LIMITED = "limited"


# --- helpers ---------------------------------------------------------------------------


def start_provider(ctx: Context, rate: float, burst: float, latency_ms: float,
                   clock: str = "sent") -> tuple[Fleet, str]:
    """The mock provider as a subprocess; returns it and its URL."""
    prov = Fleet([sys.executable, "-m", "bench.apps.mockprovider", "--rate", repr(rate),
                  "--burst", repr(burst), "--latency-ms", repr(latency_ms),
                  "--clock", clock], ctx.fleet_env())
    prov.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = re.search(r"listening on (http://\S+)", prov.log_tail())
        if m:
            return prov, m.group(1)
        if not prov.running():
            break
        time.sleep(0.05)
    prov.close()
    raise RuntimeError(f"mock provider did not start\n{prov.log_tail()}")


def provider_call(url: str, path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(url + path, method=method, data=b"" if method == "POST"
                                 else None)
    with urllib.request.urlopen(req, timeout=10) as resp:
        data = resp.read()
    return json.loads(data) if path == "/stats" else data


def flow_argv(queue: str, processes: int | None, concurrency: int) -> list[str]:
    argv = [sys.executable, "-m", "batchq", "worker", "bench.apps.flowapp:app", "-q", queue,
            "-c", str(concurrency), "--no-metrics", "--log-level", "WARNING"]
    if processes:
        argv += ["-p", str(processes)]
    return argv


def max_window(times: list[float], width: float = 1.0) -> int:
    """The most times in any window ``[t, t + width)`` (times sorted)."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - width:
            j += 1
        best = max(best, i - j + 1)
    return best


def windows_over(times: list[float], bound: float, width: float = 1.0,
                 most: int = 20) -> list[tuple[float, int]]:
    """Windows ``(t - width, t]`` holding more than ``bound`` times: (t, count), the
    first ``most`` of them (t as given; times sorted)."""
    out, j = [], 0
    for i, t in enumerate(times):
        while times[j] <= t - width:
            j += 1
        if i - j + 1 > bound and len(out) < most:
            out.append((t, i - j + 1))
    return out


def group_names(n: int) -> list[str]:
    return [f"sender{i:04d}" for i in range(n)]


# --- fanout ----------------------------------------------------------------------------


def fanout_once(ctx: Context, app: Any, url: str, *, jobs: int, groups: int,
                rate_sum: float, burst: int, processes: int | None, concurrency: int,
                timeout_s: float) -> dict[str, Any]:
    q = app.queue(FANOUT)
    q.clear()
    names = group_names(groups)
    rate = rate_sum / groups
    for g in names:
        q.limit(group=g, rate_per_s=rate, burst=burst)
    provider_call(url, "/reset", "POST")
    send = app.tasks["send"]
    per = [jobs // groups + (1 if i < jobs % groups else 0) for i in range(groups)]
    mid = 0
    with timed() as enq:
        for g, n in zip(names, per, strict=True):
            send.options(group=g).enqueue_many([(g, mid + j) for j in range(n)])
            mid += n
    fleet = Fleet(flow_argv(FANOUT, processes, concurrency), ctx.fleet_env(**{URL_ENV: url}))
    st: dict[str, Any] = {}
    with fleet:
        fleet.start()
        deadline = time.monotonic() + timeout_s
        while True:
            time.sleep(0.25)
            st = provider_call(url, "/stats")
            if st["distinct"] >= jobs:
                qs = q.stats()
                if not (qs.ready or qs.reserved or qs.delayed):
                    break
            if not fleet.running():
                raise RuntimeError(f"fanout fleet exited\n{fleet.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fanout: {st['distinct']} of {jobs} messages accepted "
                                   f"within {timeout_s:.0f}s; queue {q.stats()}\n"
                                   f"{fleet.log_tail()}")
        time.sleep(0.5)  # anything sent twice would arrive now
        fleet.stop(signal.SIGTERM)
    st = provider_call(url, "/stats")
    qs = q.stats()
    first = st["first_request"]
    senders = st["senders"]
    finish = {g: senders[g]["last"] - first for g in names if g in senders}
    span = max(finish.values())
    latest, earliest = max(finish.values()), min(finish.values())
    return {
        "jobs": jobs, "groups": groups, "rate_sum": rate_sum, "group_rate": rate,
        "group_burst": burst, "processes": processes or 1, "concurrency": concurrency,
        "enqueue_s": enq[0], "requests": st["requests"], "accepted": st["accepted"],
        "limited": st["limited"], "clock": st["clock"],
        "limited_other_clock": st["limited_other_clock"],
        "limited_other_fraction": st["limited_other_clock"] / max(st["requests"], 1),
        "distinct": st["distinct"], "lost": jobs - st["distinct"],
        "doubles": st["doubles"], "double_ids": st["double_ids"],
        "dead": qs.dead, "span_s": span, "achieved_per_s": st["accepted"] / span,
        "rate_vs_limit": st["accepted"] / span / rate_sum,
        "limited_fraction": st["limited"] / max(st["requests"], 1),
        "finish_s": finish, "finish_earliest_s": earliest, "finish_latest_s": latest,
        "finish_spread": (latest - earliest) / latest,
        "per_group_accepted": {g: senders[g]["accepted"] for g in finish},
        "per_group_limited": {g: senders[g]["limited"] for g in finish},
        # each 429: sender, arrival (s from the first request), tokens, arrival - sent
        "limited_at_s": [(g, round(t - first, 4), round(tok, 3), round(t - sent, 4))
                         for g, t, tok, sent in st["limited_at"]],
        "provider_stalls": [(round(t - first, 4), round(d, 4)) for t, d in st["stalls"]
                            if t >= first],
        "groups_finished": sum(1 for g in names
                               if senders.get(g, {}).get("accepted", 0) == per[names.index(g)]),
    }


def run_fanout(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int, groups: int,
               rate_sum: float, burst: int | None, latency_ms: float,
               processes: int | None, concurrency: int, clock: str = "sent",
               provider_burst: float | None = None) -> list[Row]:
    rate = rate_sum / groups
    b = burst or max(1, round(rate / 10))
    pb = provider_burst or b
    procs = processes or os.cpu_count() or 1
    app = make_app(ctx.url, ctx.namespace)
    prov, url = start_provider(ctx, rate, pb, latency_ms, clock)
    cfg = (f"{jobs:,} messages, {groups} groups x {rate:g}/s burst {b} (sum {rate_sum:g}/s), "
           f"provider {latency_ms:g} ms burst {pb:g}, {clock} clock, -p {procs} "
           f"-c {concurrency}")
    row = Row(f"fanout: {cfg}", {"jobs": jobs, "groups": groups, "rate_sum": rate_sum,
                                 "group_rate": rate, "group_burst": b,
                                 "latency_ms": latency_ms, "processes": procs,
                                 "concurrency": concurrency, "clock": clock,
                                 "provider_burst": pb})
    try:
        for i in range(repeat):
            r = fanout_once(ctx, app, url, jobs=jobs, groups=groups, rate_sum=rate_sum,
                            burst=b, processes=procs, concurrency=concurrency,
                            timeout_s=60 + 3 * jobs / rate_sum)
            row.add("achieved/s", r["achieved_per_s"], "msg/s")
            row.add("achieved / limit sum", r["rate_vs_limit"])
            row.add("429s", 100 * r["limited_fraction"], "% of requests")
            other = "arrival" if clock == "sent" else "sent"
            row.add(f"429s on the {other} clock", 100 * r["limited_other_fraction"],
                    "% of requests")
            row.add("finish spread", 100 * r["finish_spread"], "% of latest")
            row.add("lost", r["lost"], "msgs")
            row.add("doubled", r["doubles"], "msgs")
            rec["runs"].append({"case": "fanout", "repeat": i, **r})
    finally:
        prov.close()
        app.queue(FANOUT).clear()
        for g in group_names(groups):
            app.queue(FANOUT).remove_limit(group=g)
        app.close()
    return [row]


# --- groups ----------------------------------------------------------------------------


def _server_cpu_s(ctx: Context) -> float:
    info = ctx.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def fill(ctx: Context, jobs: int, groups: int, queue_rate: float | None) -> None:
    """A fresh queue of ``jobs`` no-op jobs, in ``groups`` groups (0: none), under a
    queue-wide rate limit when ``queue_rate``."""
    ctx.reset()
    q = ctx.app.queue(QUEUE)
    q.remove_limit()
    noop = ctx.app.tasks["noop"]
    if groups:
        per = [jobs // groups + (1 if i < jobs % groups else 0) for i in range(groups)]
        for g, n in enumerate(per):
            noop.options(group=f"g{g}").enqueue_many(_items(n, None))
    else:
        noop.enqueue_many(_items(jobs, None))
    if queue_rate:
        q.limit(rate_per_s=queue_rate)


def _drain(ctx: Context, jobs: int, groups: int, queue_rate: float | None,
           processes: int | None, concurrency: int) -> tuple[float, float]:
    """(jobs/s from the handlers' clocks, the server's CPU µs per job over the fleet's
    life: start-up, drain, exit)."""
    fill(ctx, jobs, groups, queue_rate)
    q = ctx.app.queue(QUEUE)
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=True), ctx.fleet_env())
    cpu0 = _server_cpu_s(ctx)
    try:
        with fleet:
            (n, first, last, _), wall = run_burst(fleet, ctx.client, ctx.key, jobs,
                                                  timeout_s=120 + jobs / 500)
        cpu = _server_cpu_s(ctx) - cpu0
    finally:
        q.remove_limit()
    if wall is None:
        ctx.note_hang()
    st = q.stats()
    if st.pending or st.dead:
        raise RuntimeError(f"queue not drained: {st}")
    return n / max(last - first, 1e-6), cpu * 1e6 / jobs


def run_groups(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int, groups: int,
               queue_rate: float, processes: int | None, concurrency: int) -> list[Row]:
    procs = processes or os.cpu_count() or 1
    per = jobs // max(groups, 1)
    plain = Row(f"no-op drain, plain, -p {procs}", {"jobs": jobs, "processes": procs})
    grouped = Row(f"no-op drain, {groups:,} groups of {per:,}, -p {procs}",
                  {"jobs": jobs, "groups": groups, "processes": procs})
    limited = Row(f"no-op drain, plain, queue limit {queue_rate:,.0f}/s, -p {procs}",
                  {"jobs": jobs, "queue_rate": queue_rate, "processes": procs})
    r_groups = Row("groups / plain (same repeat)", {})
    r_limit = Row("queue rate limit / plain (same repeat)", {})
    cases = [(0, None), (groups, None), (0, queue_rate)]
    for i in range(repeat):
        # the order turns each repeat, so a drift in the machine's load favours no case
        got: dict[int, tuple[float, float]] = {}
        for j in range(3):
            k = (i + j) % 3
            got[k] = _drain(ctx, jobs, cases[k][0], cases[k][1], procs, concurrency)
        (a, ca), (b, cb), (c, cc) = got[0], got[1], got[2]
        for row, (rate, cpu) in zip((plain, grouped, limited), (got[0], got[1], got[2]),
                                    strict=True):
            row.add("jobs/s", rate, "jobs/s")
            row.add("server CPU", cpu, "µs/job")
        r_groups.add("ratio", b / a)
        r_groups.add("server CPU ratio", cb / ca)
        r_limit.add("ratio", c / a)
        r_limit.add("server CPU ratio", cc / ca)
        rec["runs"].append({"repeat": i, "order": [(i + j) % 3 for j in range(3)],
                            "plain_jobs_per_s": a, "grouped_jobs_per_s": b,
                            "queue_limited_jobs_per_s": c, "plain_server_us_per_job": ca,
                            "grouped_server_us_per_job": cb,
                            "queue_limited_server_us_per_job": cc})
    record.reset(ctx.client, ctx.key)
    return [plain, grouped, limited, r_groups, r_limit]


# --- ratecheck -------------------------------------------------------------------------


def read_ticks(path: Path) -> list[tuple[str, float]]:
    out = []
    for line in path.read_text().splitlines():
        tag, t = line.split(" ")
        out.append((tag, float(t)))
    return out


def ratecheck_once(ctx: Context, app: Any, *, duration_s: float, rate: float, burst: int,
                   group_rate: float, group_burst: int, processes: int, concurrency: int,
                   others: int) -> dict[str, Any]:
    q = app.queue(RATECHECK)
    q.clear()
    q.limit(rate_per_s=rate, burst=burst)
    q.limit(group=LIMITED, rate_per_s=group_rate, burst=group_burst)
    fd, name = tempfile.mkstemp(prefix="bench-ratecheck-", suffix=".log")
    os.close(fd)
    log = Path(name)
    env = ctx.fleet_env(**{LOG_ENV: str(log)})
    n_limited = round(group_rate * duration_s)
    n_rest = max(others + 1, round((rate - group_rate) * duration_s))
    # the rest: ``others`` unlimited groups and plain jobs, shared evenly
    lanes = [f"free{i}" for i in range(others)] + [None]
    share = [n_rest // len(lanes) + (1 if i < n_rest % len(lanes) else 0)
             for i in range(len(lanes))]
    total = n_limited + n_rest
    tick = app.tasks["tick"]
    fleets = [Fleet(flow_argv(RATECHECK, processes, concurrency), env),
              Fleet(flow_argv(RATECHECK, processes, concurrency), env)]
    try:
        for f in fleets:
            f.start()
        time.sleep(2.0)  # both supervisors up and idle
        tick.options(group=LIMITED).enqueue_many([(f"{LIMITED}:{j}",) for j in
                                                  range(n_limited)])
        for lane, n in zip(lanes, share, strict=True):
            t = tick.options(group=lane) if lane else tick
            t.enqueue_many([(f"{lane or 'plain'}:{j}",) for j in range(n)])
        deadline = time.monotonic() + 60 + 3 * total / min(rate, group_rate * 2)
        while True:
            time.sleep(0.25)
            lines = log.read_text().count("\n")
            if lines >= total:
                break
            for f in fleets:
                if not f.running():
                    raise RuntimeError(f"ratecheck fleet exited\n{f.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ratecheck: {lines} of {total} jobs started; "
                                   f"queue {q.stats()}\n{fleets[0].log_tail()}")
        time.sleep(0.5)
    finally:
        for f in fleets:
            f.close()
    ticks = read_ticks(log)
    log.unlink()
    q.remove_limit()
    q.remove_limit(group=LIMITED)
    runs = collections.Counter(tag for tag, _ in ticks)
    times = sorted(t for _, t in ticks)
    gtimes = sorted(t for tag, t in ticks if tag.startswith(LIMITED + ":"))
    return {
        "duration_s": duration_s, "rate": rate, "burst": burst, "group_rate": group_rate,
        "group_burst": group_burst, "processes_per_supervisor": processes,
        "supervisors": 2, "concurrency": concurrency, "jobs": total,
        "limited_jobs": n_limited, "started": len(ticks), "distinct": len(runs),
        "lost": total - len(runs), "doubles": sum(1 for n in runs.values() if n > 1),
        "max_window": max_window(times), "bound": rate + burst,
        "windows_over": [(round(t - times[0], 4), n)
                         for t, n in windows_over(times, rate + burst)],
        "group_windows_over": [(round(t - times[0], 4), n)
                               for t, n in windows_over(gtimes, group_rate + group_burst)],
        "group_max_window": max_window(gtimes), "group_bound": group_rate + group_burst,
        "mean_rate": (len(times) - 1) / max(times[-1] - times[0], 1e-9),
        # starts in each whole second from the first start, all and the limited group's
        "per_second": list(collections.Counter(int(t - times[0]) for t in times).values()),
        "group_per_second": list(collections.Counter(int(t - times[0])
                                                     for t in gtimes).values()),
        "group_mean_rate": (len(gtimes) - 1) / max(gtimes[-1] - gtimes[0], 1e-9),
        "groups_finished": len({tag.split(":")[0] for tag in runs}),
    }


def run_ratecheck(ctx: Context, rec: dict[str, Any], *, repeat: int, duration_s: float,
                  rate: float, burst: int, group_rate: float, group_burst: int,
                  processes: int | None, concurrency: int) -> list[Row]:
    procs = processes or os.cpu_count() or 1
    app = make_app(ctx.url, ctx.namespace)
    qrow = Row(f"queue limit {rate:g}/s burst {burst}: starts in any 1 s window "
               f"(bound {rate + burst:g})", {"rate": rate, "burst": burst})
    grow = Row(f"group limit {group_rate:g}/s burst {group_burst}: starts in any 1 s window "
               f"(bound {group_rate + group_burst:g})",
               {"group_rate": group_rate, "group_burst": group_burst})
    try:
        for i in range(repeat):
            r = ratecheck_once(ctx, app, duration_s=duration_s, rate=rate, burst=burst,
                               group_rate=group_rate, group_burst=group_burst,
                               processes=procs, concurrency=concurrency, others=3)
            qrow.add("max starts/1 s", r["max_window"], "starts")
            qrow.add("mean starts/s", r["mean_rate"], "starts/s")
            qrow.add("lost", r["lost"], "jobs")
            qrow.add("doubled", r["doubles"], "jobs")
            grow.add("max starts/1 s", r["group_max_window"], "starts")
            grow.add("mean starts/s", r["group_mean_rate"], "starts/s")
            rec["runs"].append({"case": "ratecheck", "repeat": i, **r})
    finally:
        app.queue(RATECHECK).clear()
        app.close()
    ctx.notes.append(f"ratecheck: two supervisors of -p {procs} -c {concurrency} "
                     "(bench.apps.flowapp:app -q ratecheck); starts from the handlers' clocks")
    return [qrow, grow]
