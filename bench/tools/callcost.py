"""``python -m bench.tools.callcost``: what one ``enqueue`` / ``aenqueue`` call costs the
producer, the way a producer sending jobs one at a time pays it.

Per tree (``--trees``, as in ``bench.tools.startpath``), API and round, a fresh producer
process (``startpath_app``, the tree's ``batchq``; no worker runs, so no job is handed
off) makes 100 warm-up calls, then ``--calls`` calls back to back (**tight µs/call**: the
mean; **redis µs/call**: the server's time in the enqueue script over them, ``INFO
commandstats``), then ``--idle-calls`` calls each made after ``--sleep-ms`` of sleep
(**after-sleep µs/call**: the median; a producer at 200 jobs/s wakes from such a sleep
before every job). Trees and APIs alternate inside every round; medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import redis

from batchq.dev.server import EmbeddedServer
from bench.tools.startpath import HERE, checked_trees


def one_run(url: str, tree: Path, api: str, calls: int, idle_calls: int,
            sleep_ms: float) -> dict[str, float]:
    ns = f"cc{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "BATCHQ_REDIS_URL": url, "STARTPATH_NS": ns,
           "PYTHONPATH": str(HERE / "apps")}
    try:
        out = subprocess.run([sys.executable, "-m", "startpath_app", "calls", api,
                              str(calls), str(idle_calls), str(sleep_ms)],
                             cwd=tree, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"the producer of {tree} failed:\n{out.stderr[-2000:]}")
    finally:
        r = redis.Redis.from_url(url)
        for k in r.scan_iter(f"{ns}:*"):
            r.delete(k)
        r.close()
    res: dict[str, float] = json.loads(out.stdout)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.callcost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=3000, help="back-to-back calls (3000)")
    p.add_argument("--idle-calls", type=int, default=600,
                   help="calls after a sleep each (600)")
    p.add_argument("--sleep-ms", type=float, default=5.0, help="the sleep (5 ms)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    p.add_argument("--api", default="sync,async", help="sync, async or both (default)")
    p.add_argument("--trees", default=str(HERE.parent),
                   help="checkouts whose batchq runs, alternating (default: this tree)")
    p.add_argument("--redis-url", default=None, help="default: an embedded Valkey")
    a = p.parse_args(argv)
    apis = a.api.split(",")
    if not apis or any(x not in ("sync", "async") for x in apis):
        p.error(f"--api: sync, async or sync,async, not {a.api!r}")
    if min(a.calls, a.idle_calls, a.rounds) < 1 or a.sleep_ms < 0:
        p.error("--calls, --idle-calls and --rounds must be positive, --sleep-ms not negative")
    trees = checked_trees(p, a.trees)
    server = None if a.redis_url else EmbeddedServer().start()
    url = a.redis_url or server.url  # type: ignore[union-attr]
    res: dict[tuple[Path, str], list[dict[str, float]]] = {}
    try:
        for _ in range(a.rounds):
            for api in apis:
                for t in trees:
                    res.setdefault((t, api), []).append(
                        one_run(url, t, api, a.calls, a.idle_calls, a.sleep_ms))
    finally:
        if server is not None:
            server.stop()
    print("| tree | api | tight µs/call | after-sleep µs/call | redis µs/call |")
    print("|---|---|---|---|---|")
    for (t, api), runs in res.items():
        def med(k: str, runs: list[dict[str, float]] = runs) -> float:
            return float(statistics.median(r[k] for r in runs))
        print(f"| {t} | {api} | {med('tight_us'):.1f} | {med('idle_us'):.1f} "
              f"| {med('redis_us'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
