"""Figures for results / status / cancel: ``python -m bench.tools.results_figures``.

* drain of no-op jobs with ``result_ttl_s`` set against without, alternating in one run
  (one ``--burst`` worker process each; wall time from its start to its exit, startup
  included in both), medians of ``--repeat``;
* ``result()`` round trip (``aenqueue`` -> handler -> ``aresult`` back in the caller),
  open loop at ``--rate`` jobs/s for ``--seconds``, p50 / p99;
* Redis memory per stored result (``INFO memory`` used_memory before / after draining
  ``--memory-jobs`` jobs whose result is a small dict).

Prints a markdown table. An embedded Valkey unless ``--redis-url``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import redis

from batchq.dev.server import EmbeddedServer
from bench.apps import NAMESPACE_ENV, QUEUE, make_app


def _worker(url: str, ns: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
    env.update({"BATCHQ_REDIS_URL": url, NAMESPACE_ENV: ns})
    return subprocess.Popen([sys.executable, "-m", "batchq", "worker", "bench.apps:app",
                             "-q", QUEUE, "-p", "1", "--log-level", "warning", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drain(url: str, task: str, jobs: int) -> float:
    ns = f"bq{uuid.uuid4().hex[:8]}"
    app = make_app(url, ns)
    app.tasks[task].enqueue_many((i,) for i in range(jobs))
    t0 = time.perf_counter()
    p = _worker(url, ns, "--burst")
    p.wait(600)
    wall = time.perf_counter() - t0
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{ns}*", count=10000))
    for i in range(0, len(keys), 1000):
        r.delete(*keys[i : i + 1000])
    app.close()
    return jobs / wall


async def _round_trips(url: str, ns: str, rate: float, seconds: float) -> list[float]:
    app = make_app(url, ns)
    task = app.tasks["noop_result"]
    out: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        jid = await task.aenqueue(i)
        assert await app.aresult(jid, timeout_s=30) == i
        out.append(time.perf_counter() - t0)

    pending = []
    start = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(i)))
    await asyncio.gather(*pending)
    await app.aclose()
    return out


def round_trip(url: str, rate: float, seconds: float) -> tuple[float, float]:
    ns = f"bq{uuid.uuid4().hex[:8]}"
    p = _worker(url, ns)
    try:
        time.sleep(2.0)  # the worker serves
        asyncio.run(_round_trips(url, ns, rate, 1.0))  # warm-up
        samples = sorted(asyncio.run(_round_trips(url, ns, rate, seconds)))
    finally:
        p.terminate()
        p.wait(30)
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def memory_per_result(url: str, jobs: int) -> float:
    ns = f"bq{uuid.uuid4().hex[:8]}"
    app = make_app(url, ns)
    r = redis.Redis.from_url(url)
    app.tasks["noop_result"].enqueue_many(({"id": i, "status": "sent"},) for i in range(jobs))
    # the drained queue without results as the baseline: drain plain jobs the same way
    _worker(url, ns, "--burst").wait(600)
    k = app.keys(QUEUE)
    used_with = int(r.info("memory")["used_memory"])
    n = 0
    for key in r.scan_iter(match=f"{k.prefix}:result:*", count=10000):
        r.delete(key)
        n += 1
    used_without = int(r.info("memory")["used_memory"])
    app.close()
    return (used_with - used_without) / max(1, n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url")
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--memory-jobs", type=int, default=20_000)
    a = ap.parse_args(argv)
    server = None if a.redis_url else EmbeddedServer()
    url = a.redis_url or server.__enter__().url  # type: ignore[union-attr]
    try:
        plain: list[float] = []
        kept: list[float] = []
        for _ in range(a.repeat):
            plain.append(drain(url, "noop", a.jobs))
            kept.append(drain(url, "noop_result", a.jobs))
        p50, p99 = round_trip(url, a.rate, a.seconds)
        mem = memory_per_result(url, a.memory_jobs)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    mp, mk = statistics.median(plain), statistics.median(kept)
    rows: list[tuple[str, Any]] = [
        (f"drain, no-op, 1 process, {a.jobs:,} jobs (median of {a.repeat})",
         f"{mp:,.0f} jobs/s"),
        ("drain, no-op with result_ttl_s", f"{mk:,.0f} jobs/s ({100 * mk / mp:.0f} %)"),
        (f"result() round trip at {a.rate:g} jobs/s, p50 / p99",
         f"{p50 * 1000:.1f} ms / {p99 * 1000:.1f} ms"),
        ("Redis memory per stored result (small dict)", f"{mem:.0f} bytes"),
    ]
    print("| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\nruns: plain {[round(x) for x in plain]}, with results {[round(x) for x in kept]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
