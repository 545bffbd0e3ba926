"""What ``App(min_replicas=1)`` costs: ``enqueue_many`` and a drain with and without it,
in the same run, against an embedded Valkey primary with one replica (both on this
machine: the replica's round trip is loopback, so this is the floor of the cost; a
replica across a network adds its round trip once per window of 8 chunks).

    python -m bench.tools.replicas [--jobs 20000] [--repeat 5]

Each repeat runs both settings one after the other (interleaved, so drift in the
machine's load hits both); the medians and the min-max are printed. The drain is a
``--burst`` worker run in this process (``run_worker``), concurrency 100, no-op jobs:
it waits for the replica once per flush of acks.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

import batchq
from batchq.dev.server import EmbeddedServer
from batchq.worker import WorkerSettings, run_worker


def _pair() -> tuple[EmbeddedServer, EmbeddedServer]:
    primary = EmbeddedServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
    replica = EmbeddedServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    r = redis.Redis(port=primary.port)
    pipe = r.pipeline(transaction=False)
    pipe.set("bench:sync", 1)
    pipe.execute_command("WAIT", 1, 30_000)
    deadline = time.monotonic() + 30
    while pipe.execute()[-1] != 1:  # the replica's first acknowledgement takes a second
        assert time.monotonic() < deadline, "replica not in sync"
        pipe.set("bench:sync", 1)
        pipe.execute_command("WAIT", 1, 30_000)
    r.delete("bench:sync")
    return primary, replica


def _once(url: str, n_replicas: int, jobs: int) -> tuple[float, float]:
    app = batchq.App(url, namespace=f"br{uuid.uuid4().hex[:8]}", min_replicas=n_replicas)

    @app.task(name="noop")
    async def noop(x: int) -> None:
        pass

    t0 = time.perf_counter()
    noop.enqueue_many(range(jobs))
    enqueue_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    code = run_worker(app, WorkerSettings(queues=("default",), burst=True, concurrency=100,
                                          metrics=False))
    drain_s = time.perf_counter() - t0
    assert code == 0 and app.queue("default").stats().pending == 0
    app.close()
    return enqueue_s, drain_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    primary, replica = _pair()
    try:
        got: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
        for _ in range(args.repeat):
            for n in (0, 1):
                got[n].append(_once(primary.url, n, args.jobs))
    finally:
        replica.stop()
        primary.stop()
    print(f"{args.jobs} no-op jobs, {args.repeat} repeats, primary + 1 replica on loopback")
    print("| min_replicas | enqueue_many jobs/s (median, min-max) | drain jobs/s |")
    print("|---|---|---|")
    for n, rows in got.items():
        enq = [args.jobs / e for e, _ in rows]
        dr = [args.jobs / d for _, d in rows]
        print(f"| {n} | {statistics.median(enq):,.0f} ({min(enq):,.0f}-{max(enq):,.0f}) | "
              f"{statistics.median(dr):,.0f} ({min(dr):,.0f}-{max(dr):,.0f}) |")


if __name__ == "__main__":
    main()
