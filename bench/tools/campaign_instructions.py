"""Redis instructions per job (valgrind callgrind) of the campaign cases, for source trees.

``python -m bench.tools.campaign_instructions TREE [TREE ...] [--jobs N] [--rounds R]``

Wall-clock figures on a shared 2-core box swing with whatever else runs; the server's
instruction count does not (it still varies a little with batch sizes, which follow
timing). One valkey-server runs under ``valgrind --tool=callgrind``; for each tree in
turn (``PYTHONPATH`` and working directory are the tree) a subprocess enqueues ``--jobs``
jobs with a fresh dedup key each, then drains ``--jobs`` plain no-op jobs and
``--jobs`` no-op jobs of a sealed campaign with a 1-process ``--burst`` worker, zeroing
and dumping the counters around each case (``callgrind_control``). Prints instructions
per job per case and the campaign drain's instructions over the plain drain's. Needs
valgrind; the server runs about 50 times slower, so keep ``--jobs`` small (10,000).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.tools.script_instructions import callgrind_server

_ONE = """
import glob, os, re, subprocess, sys, time, uuid
from bench.apps import make_app
from bench.harness import batchq_worker_argv
try:
    from bench.scenarios.throughput import _items
except ImportError:  # a tree from before bench/ was grouped
    from bench.throughput import _items
url, n, pid, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def counted():
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    time.sleep(0.3)
    last = max(glob.glob(os.path.join(out, "cg.out.*")), key=os.path.getmtime)
    return int(re.search(r"^(?:summary|totals):\\s+(\\d+)", open(last).read(), re.M).group(1))

def zero():
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)

ns = "cg" + uuid.uuid4().hex[:8]
app = make_app(url, ns)
task = app.tasks["noop"]
task.enqueue_many([])
env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCHQ_", "BENCH_"))}
env.update(BATCHQ_REDIS_URL=url, BENCH_KEY=ns + ":rec", BENCH_NAMESPACE=ns)
res = {}
zero()
task.enqueue_many(range(n), key_fn=lambda i: f"bench:user{i}@example.com")
res["keyed_enqueue"] = counted() / n
app.queue("bench").clear()
for camp in (False, True):
    if camp:
        c = app.campaign()
        task.options(campaign=c).enqueue_many(_items(n, None))
        c.seal()
    else:
        task.enqueue_many(_items(n, None))
    zero()
    subprocess.run(batchq_worker_argv(1, 100, burst=True), env=env, check=True)
    res["campaign_drain" if camp else "plain_drain"] = counted() / n
    app.queue("bench").clear()
print(res["keyed_enqueue"], res["plain_drain"], res["campaign_drain"])
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.campaign_instructions",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs="+", type=Path)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("needs valgrind (callgrind_control)")
    with callgrind_server() as (pid, url, out):
        print("| tree | round | keyed enqueue | plain drain | campaign drain | campaign ÷ plain |")
        print("|---|---|---|---|---|---|")
        for r in range(a.rounds):
            for tree in a.trees:
                tree = tree.resolve()
                res = subprocess.run(
                    [sys.executable, "-c", _ONE, url, str(a.jobs), str(pid), out],
                    cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                    capture_output=True, text=True, check=False)
                if res.returncode:
                    raise SystemExit(f"{tree} failed:\n{res.stderr[-4000:]}")
                k, plain, camp = map(float, res.stdout.split()[-3:])
                print(f"| {tree} | {r + 1} | {k:,.0f} | {plain:,.0f} | {camp:,.0f} | "
                      f"{camp / plain:.3f} |", flush=True)


if __name__ == "__main__":
    main()
