"""``python -m bench.peers.iocpu``: CPU time a batchq worker spends per job of
``bench peers --job io``, for each way of touching Redis (``--kinds``, the kinds of
``bench.peers.iojob``), and the Redis server's CPU per job beside it.

A figure that a loaded machine does not move much (CPU time, not wall time): for each
kind, ``N`` and then ``2N`` io jobs are enqueued and drained by a ``--burst`` worker
(one process, ``-c``), whose CPU (user + system, from ``getrusage`` of the waited
child) is read; the difference of the two runs divided by ``N`` is the CPU of one job,
the worker's start-up and exit cancelled out. The kinds alternate within each repeat;
medians over ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from typing import Any

from bench.harness import Context, batchq_worker_argv
from bench.scenarios.throughput import fill

from .batchq_app import add_io
from .iojob import CLIENT_ENV, KINDS


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _server_cpu(ctx: Context) -> float:
    info: dict[str, Any] = ctx.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def burst_cpu(ctx: Context, kind: str, n: int, concurrency: int) -> tuple[float, float]:
    """CPU seconds of one burst worker draining ``n`` io jobs, and of the server."""
    ctx.reset()
    fill(ctx, "io", n)
    argv = batchq_worker_argv(None, concurrency, burst=True)
    argv[argv.index("bench.apps:app")] = "bench.peers.batchq_app:app"
    c0, s0 = _children_cpu(), _server_cpu(ctx)
    subprocess.run(argv, env=ctx.fleet_env(**{CLIENT_ENV: kind}), check=True,
                   timeout=600)
    c1, s1 = _children_cpu(), _server_cpu(ctx)
    left = ctx.app.queue("bench").stats()
    if left.pending or left.dead:
        raise RuntimeError(f"{kind}: queue not drained: {left}")
    return c1 - c0, s1 - s0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.iocpu", description=__doc__)
    p.add_argument("--kinds", default="shared,batched,batchq",
                   help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("--jobs", type=int, default=20_000, help="N (the runs drain N and 2N)")
    p.add_argument("-c", "--concurrency", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--redis-url", default=None,
                   help="default: an embedded Valkey of its own")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        print(f"--kinds: one or more of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    n = args.jobs
    worker: dict[str, list[float]] = {k: [] for k in kinds}
    server: dict[str, list[float]] = {k: [] for k in kinds}
    with Context(args.redis_url, None, None, False) as ctx:
        add_io(ctx.app)
        for _ in range(args.repeat):
            for kind in kinds:
                w1, s1 = burst_cpu(ctx, kind, n, args.concurrency)
                w2, s2 = burst_cpu(ctx, kind, 2 * n, args.concurrency)
                worker[kind].append((w2 - w1) / n * 1e6)
                server[kind].append((s2 - s1) / n * 1e6)
        ctx.reset()
    load = os.getloadavg()
    print(f"### worker CPU per io job, one process, -c {args.concurrency}, "
          f"{n:,} / {2 * n:,} jobs, medians of {args.repeat}\n")
    print("| kind | worker µs / job | Redis µs / job | worker ÷ batchq's |")
    print("|---|---|---|---|")
    base = statistics.median(worker["batchq"]) if "batchq" in worker else None
    for kind in kinds:
        w = statistics.median(worker[kind])
        ratio = f"{w / base:.1f}x" if base else "-"
        spread = f" ({min(worker[kind]):.1f}-{max(worker[kind]):.1f})"
        print(f"| {kind} | {w:.1f}{spread} | {statistics.median(server[kind]):.1f} | "
              f"{ratio} |")
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
