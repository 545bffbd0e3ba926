"""``python -m bench.script_cost BEFORE [AFTER] [--jobs N] [--rounds R]``: the server's
time in ``pop.lua`` and ``ack.lua`` per job, for two source trees side by side.

No workers: ``bench.flow_cost.once`` fills the queue with plain no-op jobs, pops them all
(100 a call) with one tree's ``pop.lua``, then acks every lease with its ``ack.lua``,
reading ``INFO commandstats`` (the script calls' own usec: a command a script runs is
counted inside its time as well as under its own name, so only evalsha is summed) around
each phase. The trees alternate in every round on one embedded Valkey; medians are
printed. Every lease is held until the acks, so the reservation set is as large as the
run (a worker's stays small): the figures are an upper bound for a drain and mean most
as a ratio. ``AFTER`` defaults to this checkout.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
from pathlib import Path

from . import flow_cost
from .harness import REPO_ROOT, Context


@functools.cache
def script_source(tree: Path, name: str) -> str:
    """The text ``tree`` sends for script ``name``: from its own ``batchq.scripts.source``
    (which, since 0.4.1, prepends only the library definitions the script uses)."""
    code = "import sys; from batchq.scripts import source; sys.stdout.write(source(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code, name], cwd=tree, env=env, check=True,
                          capture_output=True, text=True).stdout


def _script_usec(ctx: Context) -> int:
    stats = ctx.client.info("commandstats")
    return sum(int(v["usec"]) for name, v in stats.items()
               if name.removeprefix("cmdstat_") in ("evalsha", "eval"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.script_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path, nargs="?", default=REPO_ROOT)
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    trees = [a.before.resolve(), a.after.resolve()]
    got: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    flow_cost._server_usec = _script_usec  # evalsha only (see above)
    with Context(None) as ctx:
        for i in range(a.rounds):
            for t in trees if i % 2 == 0 else trees[::-1]:
                got[t].append(flow_cost.once(ctx, a.jobs, 0, script_source(t, "pop"),
                                             script_source(t, "ack"), 100))
    print(f"server time in the scripts per job, {a.jobs:,} jobs, pop batch 100, "
          f"median of {a.rounds}")
    print("| tree | pop (µs/job) | ack (µs/job) | pop + ack (µs/job) | ceiling of one queue |")
    print("|---|---|---|---|---|")
    for t, vals in got.items():
        pop = statistics.median(v[0] for v in vals)
        ack = statistics.median(v[1] for v in vals)
        tot = statistics.median(v[0] + v[1] for v in vals)
        print(f"| {t} | {pop:.2f} | {ack:.2f} | {tot:.2f} | {1e6 / tot:,.0f} jobs/s |")


if __name__ == "__main__":
    main()
