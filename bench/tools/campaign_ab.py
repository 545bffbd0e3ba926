"""Issue 12's campaign figures for two source trees, side by side in one run.

``python -m bench.tools.campaign_ab --before DIR [--after DIR] [--jobs N] [--repeat R]``

One embedded Valkey serves both trees. Each round runs, for each tree in turn (the order
alternates between rounds, so neither always goes first), one subprocess from that tree
(``PYTHONPATH`` and the working directory are the tree, so its harness, producer and
worker fleet are its own) that measures what ``python -m bench campaign`` measures:
the plain and the campaign drain (``campaigns._drain``, 1 process), ``enqueue_many``
with a fresh dedup key per job and again with every key held, and Redis bytes per key
(``campaigns._keyed``). Prints each round and the medians per tree; the drain ratio is
taken per round, as in the scenario. ``DIR`` is a checkout, e.g. made with
``git worktree add`` or ``git archive REV | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from batchq.dev.server import EmbeddedServer

_ONE = """
import json, sys
from bench.scenarios.campaigns import _drain, _keyed
from bench.harness import Context
ctx = Context(sys.argv[1])
try:
    n = int(sys.argv[2])
    plain, camp = _drain(ctx, n, False, 1, 100), _drain(ctx, n, True, 1, 100)
    fresh, held, key_b, done_b = _keyed(ctx, n)
    print(json.dumps(dict(plain=plain, campaign=camp, ratio=camp / plain, keyed=fresh,
                          held=held, bytes_per_key=key_b, bytes_per_finished_key=done_b)))
finally:
    ctx.reset()
    ctx.app.close()
    ctx.client.close()
"""

FIGURES = ("plain", "campaign", "ratio", "keyed", "held", "bytes_per_key",
           "bytes_per_finished_key")


def _round(tree: Path, url: str, jobs: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _ONE, url, str(jobs)], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{tree} failed:\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.campaign_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="the tree to compare against")
    p.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[2],
                   help="the tree under test (default: this checkout)")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with EmbeddedServer() as srv:
        for r in range(a.repeat):
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                res = _round(trees[name], srv.url, a.jobs)
                runs[name].append(res)
                print(f"round {r + 1} {name:6s} " + "  ".join(
                    f"{f} {res[f]:,.3f}" if f == "ratio" else f"{f} {res[f]:,.0f}"
                    for f in FIGURES), flush=True)
    print(f"\nmedians of {a.repeat} ({a.jobs:,} jobs; jobs/s, the ratio, bytes):")
    print("| figure | " + " | ".join(trees) + " |\n|---|" + "---|" * len(trees))
    for f in FIGURES:
        cells = [statistics.median(x[f] for x in runs[name]) for name in trees]
        print(f"| {f} | " + " | ".join(f"{v:,.3f}" if f == "ratio" else f"{v:,.0f}"
                                       for v in cells) + " |")


if __name__ == "__main__":
    main()
