"""``python -m bench.tools.startpath``: where a job's enqueue-to-start time goes, at low rates.

One worker process (``batchq worker startpath_app:app -p 1``, no metrics) and one
producer process sending ``aenqueue`` calls (``--api sync``: ``enqueue`` calls from a
plain thread) one by one at each offered rate (open loop).
For every job it splits the time from just before the producer's call to the handler's
first line into: the **call** (until ``aenqueue`` returned, on the producer), **to the
worker** (until the worker process accepted the job: the hand-off's BLPOP reply or a
pop's), and **in the worker** (from there to the handler). It also reports the share of
jobs the enqueue handed straight to the blocked worker (the queue's ``handed`` and
``enqueued`` counters) and the **Redis µs per job**: the server's time in batchq's
top-level commands over the run (``INFO commandstats`` usec of ``EVALSHA``, its scripts,
and ``BLPOP``, reset after the worker's start) ÷ jobs enqueued; idle-time pops count.
Medians over ``--repeat`` runs of each run's p50 and p99.

``--trees DIR,DIR``: run the worker and the producer of each tree in turn (a checkout of
another commit, e.g. ``git archive REV | tar -x -C DIR``), alternating run by run, to
compare two versions in one run. Default: this tree.

``--floor`` adds, in the same rotation, the least a Redis list queue can do
(``bench/tools/startpath_floor.py``): a bare ``RPUSH`` per job and a worker blocked in
``BLPOP``, measured the same way; batchq's start minus the floor's is what batchq itself
adds (its script, the hand-off, the worker's dispatch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

from batchq.dev.server import EmbeddedServer
from batchq.store.keys import QueueKeys, queues_key
from bench.harness import percentile

HERE = Path(__file__).resolve().parents[1]  # bench/
QUEUE = "startpath"
"""The queue of ``startpath_app.probe``."""


def _pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (seconds) in ms."""
    return percentile(xs, q) * 1000 if xs else float("nan")


FLOOR = "floor: RPUSH → BLPOP"
"""The row of ``--floor`` (``bench/tools/startpath_floor.py``)."""


def one_run(url: str, tree: Path | None, rate: float, duration_s: float,
            api: str = "async") -> dict[str, float]:
    """One run of ``tree``'s worker and producer (``None``: the floor's) at ``rate``."""
    ns = f"sp{uuid.uuid4().hex[:8]}"
    # the tree's own app (bench/apps/ since bench/ was grouped, bench/ before) and the
    # tree's own batchq first on the path: an editable install of this checkout would
    # otherwise answer the imports an older tree does not have
    apps = HERE / "apps" if tree is None else (
        tree / "bench" / "apps" if (tree / "bench" / "apps").is_dir() else tree / "bench")
    env = {**os.environ, "BATCHQ_REDIS_URL": url, "STARTPATH_NS": ns,
           "PYTHONPATH": os.pathsep.join([str(apps)] + ([str(tree)] if tree else []))}
    r = redis.Redis.from_url(url)
    floor = [sys.executable, "-m", "bench.tools.startpath_floor"]
    if tree is None:
        cwd, commands = HERE.parent, ("rpush", "blpop")
        worker_argv, produce_argv = [*floor, "worker", ns], [
            *floor, "produce", ns, str(rate), str(duration_s), api]
    else:
        # batchq's own top-level commands: its scripts (enqueue, pop, ack; a command a
        # script runs is counted inside the script's time) and the BLPOP
        cwd, commands = tree, ("evalsha", "fcall", "blpop")
        worker_argv = [sys.executable, "-m", "batchq", "worker", "startpath_app:app",
                       "-q", QUEUE, "--no-metrics", "--log-level", "WARNING"]
        produce_argv = [sys.executable, "-m", "startpath_app", str(rate), str(duration_s),
                        api]
    worker = subprocess.Popen(worker_argv, cwd=cwd, env=env)
    try:
        deadline = time.time() + 30
        while not (r.exists(f"{ns}:ready") if tree is None
                   else r.sismember(queues_key(ns), QUEUE)):
            if time.time() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the worker of {tree or FLOOR} did not start")
            time.sleep(0.1)
        time.sleep(1.0)  # its first pop and BLPOP
        r.config_resetstat()
        out = subprocess.run(produce_argv, cwd=cwd, env=env, check=True,
                             capture_output=True, text=True)
        calls = json.loads(out.stdout)
        if tree is None:
            worker.wait(30)  # the producer's last value stops it once its rows are written
        # batchq's worker writes its rows a hundred at a time (the warm-up job's
        # included): wait for every full hundred
        full = (len(calls) + 1) // 100 * 100
        deadline = time.time() + 30
        while r.llen(f"{ns}:rows") < full and time.time() < deadline:
            time.sleep(0.1)
        cmd = r.info("commandstats")
        redis_us = sum(cmd.get(f"cmdstat_{c}", {}).get("usec", 0) for c in commands)
    finally:
        worker.terminate()
        worker.wait(30)
    rows = [tuple(map(float, x.split())) for x in r.lrange(f"{ns}:rows", 0, -1)]
    rows = rows[1:]  # the warm-up job
    raw: dict[bytes, bytes] = r.hgetall(QueueKeys(ns, QUEUE).stats)  # type: ignore[assignment]
    stats = {k.decode(): int(v) for k, v in raw.items() if v.isdigit()}
    for k in r.scan_iter(f"{ns}:*"):
        r.delete(k)
    to_worker = [got - before for before, got, _ in rows]
    in_worker = [start - got for _, got, start in rows]
    total = [start - before for before, _, start in rows]
    return {"jobs": len(rows), "sent": len(calls),
            "call_p50": _pct(calls, .5), "call_p99": _pct(calls, .99),
            "to_worker_p50": _pct(to_worker, .5), "to_worker_p99": _pct(to_worker, .99),
            "in_worker_p50": _pct(in_worker, .5), "in_worker_p99": _pct(in_worker, .99),
            "start_p50": _pct(total, .5), "start_p99": _pct(total, .99),
            "redis_us_per_job": redis_us / max(1, len(calls)),
            "handed_share": (float("nan") if tree is None else
                             stats.get("handed", 0) / max(1, stats.get("enqueued", 1)))}


def checked_trees(p: argparse.ArgumentParser, text: str) -> list[Path]:
    """``--trees``: the checkouts, each holding a ``batchq`` package (else exit 2)."""
    trees = [Path(t).resolve() for t in text.split(",")]
    for t in trees:
        if not (t / "batchq").is_dir():
            p.error(f"--trees: {t} holds no batchq package")
    return trees


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.startpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="200,1000", help="offered jobs/s (default 200,1000)")
    p.add_argument("--duration", type=float, default=4.0, help="seconds per run (default 4)")
    p.add_argument("--repeat", type=int, default=3, help="runs per rate and tree (default 3)")
    p.add_argument("--trees", default=str(HERE.parent),
                   help="checkouts whose batchq runs, alternating (default: this tree)")
    p.add_argument("--api", choices=("async", "sync"), default="async",
                   help="the producer's call: aenqueue on the asyncio open loop (default) "
                   "or enqueue on the synchronous one")
    p.add_argument("--floor", action="store_true",
                   help="also run the floor (bench/tools/startpath_floor.py: a bare RPUSH and "
                   "a worker blocked in BLPOP, one command a job) beside the trees")
    p.add_argument("--redis-url", default=None, help="default: an embedded Valkey")
    a = p.parse_args(argv)
    try:
        rates = [float(x) for x in a.rates.split(",")]
    except ValueError:
        p.error(f"--rates: not a list of numbers: {a.rates!r}")
    trees: list[Path | None] = [*checked_trees(p, a.trees), *([None] if a.floor else [])]
    server = None if a.redis_url else EmbeddedServer().start()
    url = a.redis_url or server.url  # type: ignore[union-attr]
    res: dict[tuple[Path | None, float], list[dict[str, float]]] = {}
    try:
        for rate in rates:
            for _ in range(a.repeat):
                for t in trees:
                    res.setdefault((t, rate), []).append(one_run(url, t, rate, a.duration,
                                                                  a.api))
    finally:
        if server is not None:
            server.stop()
    cols = ["start", "call", "to_worker", "in_worker"]
    print("| tree | jobs/s | " + " | ".join(f"{c.replace('_', ' ')} p50 / p99 (ms)"
                                             for c in cols)
          + " | handed | redis µs/job | start ÷ floor's p50 / p99 |")
    print("|---|---|" + "---|" * len(cols) + "---|---|---|")

    def med(runs: list[dict[str, float]], k: str) -> float:
        return float(statistics.median(r[k] for r in runs))

    for (t, rate), runs in res.items():
        cells = [f"{med(runs, c + '_p50'):.3f} / {med(runs, c + '_p99'):.3f}" for c in cols]
        handed = "—" if t is None else f"{med(runs, 'handed_share'):.0%}"
        floor = res.get((None, rate))
        ratio = "—" if not floor else (
            f"{med(runs, 'start_p50') / med(floor, 'start_p50'):.2f} / "
            f"{med(runs, 'start_p99') / med(floor, 'start_p99'):.2f}")
        print(f"| {t or FLOOR} | {rate:,.0f} | " + " | ".join(cells)
              + f" | {handed} | {med(runs, 'redis_us_per_job'):.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
