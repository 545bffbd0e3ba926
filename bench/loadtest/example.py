"""The worked example of ``batchq bench load``: find the knee of a local HTTP target.

Starts an embedded Valkey, the HTTP target (20 ms per request, 10 slots: its knee is at
500 requests/s), one worker process serving ``bench.loadtest.app``, then drives the
target in steps until the run time p99 passes 100 ms::

    python -m bench.loadtest.example --out docs/load-example.png

and prints the report (the plot goes to ``--out``, .png or .html).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from batchq.dev.server import EmbeddedServer

REPO = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="load-example.png")
    p.add_argument("--steps", default="100,200,300,400,500,600,800")
    p.add_argument("--step-s", default="5")
    p.add_argument("--abort-on", default="p99>100ms")
    a = p.parse_args(argv)
    with EmbeddedServer() as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
        env.update(BATCHQ_REDIS_URL=server.url, LOADTEST_NS="example",
                   PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
        target = subprocess.Popen(
            [sys.executable, "-m", "bench.loadtest.target", "--latency-ms", "20",
             "--capacity", "10"], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        assert target.stdout is not None
        url = target.stdout.readline().split()[-1]
        worker = subprocess.Popen(
            [sys.executable, "-m", "batchq", "worker", "bench.loadtest.app:app", "-c", "200",
             "--no-metrics", "--log-level", "WARNING"], cwd=REPO, env=env)
        try:
            time.sleep(1.0)
            cmd = [sys.executable, "-m", "batchq", "bench", "load", "bench.loadtest.app:app",
                   "hit", "--args", f'["{url}/"]', "--steps", a.steps, "--step-s",
                   a.step_s, "--abort-on", a.abort_on, "--out", a.out]
            print("$ batchq bench load " + " ".join(cmd[5:]), flush=True)
            return subprocess.run(cmd, cwd=REPO, env=env).returncode
        finally:
            for proc in (worker, target):
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
