"""``python -m bench.tools.script_cost BEFORE [AFTER] [--jobs N] [--rounds R]``: the server's
time in ``pop.lua`` and ``ack.lua`` per job, for two source trees side by side.

No workers: ``bench.tools.flow_cost.once`` fills the queue with plain no-op jobs, pops them all
(100 a call) with one tree's ``pop.lua``, then acks every lease with its ``ack.lua``,
reading ``INFO commandstats`` (the script calls' own usec: a command a script runs is
counted inside its time as well as under its own name, so only evalsha/fcall are summed) around
each phase. The trees alternate in every round on one embedded Valkey; medians are
printed. Every lease is held until the acks, so the reservation set is as large as the
run (a worker's stays small): the figures are an upper bound for a drain and mean most
as a ratio. ``AFTER`` defaults to this checkout. Each tree's scripts are called its own
way: as Redis Functions (FCALL) by a tree that loads them so, else by EVALSHA;
``--evalsha`` calls every tree's by EVALSHA.

``--handoff``: the server's time in one tree's ``enqueue.lua`` for a one-job enqueue
that hands its job to a registered idle worker (a registration is added before each
call, as a worker's empty pop adds it), for one that finds nobody registered (the
path of every enqueue to a busy queue), and in its ``pop.lua`` for the empty pop by
which an idle worker registers (between two handed jobs); ``--calls`` calls a round,
each after ``--sleep-ms`` of sleep (0: back to back; a server at 200 jobs/s is idle ~5 ms between
jobs, and runs every command several times slower then).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from batchq.store.keys import QueueKeys
from batchq.store.scripts import calls
from bench.harness import REPO_ROOT, Context
from bench.tools import flow_cost


@functools.cache
def script_source(tree: Path, name: str, functions: bool = False) -> str:
    """The text ``tree`` sends for script ``name``: from its own ``source`` in
    ``batchq.store.scripts`` (which prepends only the library definitions the script
    uses); with ``functions``, the function library it loads instead, if it has one
    (``flow_cost.loaded`` tells them apart)."""
    # by the tree's own files: an editable install of this checkout answers the imports
    # a tree lacks (``batchq.store.scripts`` for a tree before the packages by stage)
    staged = (tree / "batchq" / "store" / "scripts").is_dir()
    fn = functions and "function_library" in (
        tree / "batchq" / "store" / "scripts" / "__init__.py").read_text(encoding="utf-8") \
        if staged else False
    code = ("import sys\n"
            f"from batchq.{'store.' if staged else ''}scripts import _Lua, source\n"
            f"sys.stdout.write(_Lua(sys.argv[1]).library if {fn} else source(sys.argv[1]))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([sys.executable, "-c", code, name], cwd=tree, env=env, check=True,
                          capture_output=True, text=True).stdout


def _script_usec(ctx: Context) -> int:
    stats = ctx.client.info("commandstats")
    return sum(int(v["usec"]) for name, v in stats.items()
               if name.removeprefix("cmdstat_") in ("evalsha", "eval", "fcall"))


CASES = ("handed off", "nobody registered", "idle pop")
"""``--handoff``'s cases: a one-job enqueue handed to a registered worker, one that finds
nobody registered, and the empty pop by which an idle worker registers again."""


def handoff_once(ctx: Context, tree: Path, calls_n: int, sleep_s: float, case: str,
                 functions: bool = True) -> float:
    """µs of server time per call of ``tree``'s script for ``case`` (``CASES``)."""
    r: Any = ctx.client
    pop = case == "idle pop"
    run = flow_cost.loaded(r, script_source(tree, "pop" if pop else "enqueue", functions))
    k = QueueKeys(ctx.namespace, f"handoff{uuid.uuid4().hex[:6]}")
    first = int(r.incrby(k.seq, calls_n)) - calls_n
    r.config_resetstat()
    for i in range(calls_n):
        if sleep_s:
            time.sleep(sleep_s)
        if pop:
            c = calls.pop(k, 100, 30_000, 100, "bench", 6_000)
        else:
            if case == "handed off":
                r.zadd(k.idle, {"30000|bench": 1e15})
            jid = f"{'a' * 17}-{first + i:x}"
            c = calls.enqueue(k, 0, [f"0:0:3:{jid}:".encode() + b"\x94\xa1t\x90\x80\x00"],
                              check=False, runs=f"{first + i}:1")
        run(c.keys, c.args)
    usec = _script_usec(ctx)
    for key in r.scan_iter(f"{k.prefix}:*"):
        r.delete(key)
    return usec / calls_n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.script_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path, nargs="?", default=REPO_ROOT)
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--handoff", action="store_true",
                   help="time a one-job enqueue (handed off, or to nobody registered) and "
                   "an idle worker's pop instead of a drain's pop and ack")
    p.add_argument("--calls", type=int, default=1000, help="with --handoff: calls a round")
    p.add_argument("--evalsha", action="store_true",
                   help="call every tree's scripts by EVALSHA, even a tree that loads them "
                   "as Redis Functions (by default each tree's own way)")
    p.add_argument("--sleep-ms", type=float, default=0.0,
                   help="with --handoff: sleep before each call (default 0)")
    a = p.parse_args(argv)
    trees = [a.before.resolve(), a.after.resolve()]
    fn = not a.evalsha
    if a.handoff:
        handoff(trees, a.rounds, a.calls, a.sleep_ms / 1000, fn)
        return
    got: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    flow_cost._server_usec = _script_usec  # evalsha only (see above)
    with Context(None) as ctx:
        for i in range(a.rounds):
            for t in trees if i % 2 == 0 else trees[::-1]:
                got[t].append(flow_cost.once(ctx, a.jobs, 0, script_source(t, "pop", fn),
                                             script_source(t, "ack", fn), 100))
    print(f"server time in the scripts per job, {a.jobs:,} jobs, pop batch 100, "
          f"median of {a.rounds}")
    print("| tree | pop (µs/job) | ack (µs/job) | pop + ack (µs/job) | ceiling of one queue |")
    print("|---|---|---|---|---|")
    for t, vals in got.items():
        pop = statistics.median(v[0] for v in vals)
        ack = statistics.median(v[1] for v in vals)
        tot = statistics.median(v[0] + v[1] for v in vals)
        print(f"| {t} | {pop:.2f} | {ack:.2f} | {tot:.2f} | {1e6 / tot:,.0f} jobs/s |")


def handoff(trees: list[Path], rounds: int, calls_n: int, sleep_s: float,
            functions: bool = True) -> None:
    got: dict[tuple[Path, str], list[float]] = {}
    with Context(None) as ctx:
        for i in range(rounds):
            for t in trees if i % 2 == 0 else trees[::-1]:
                for case in CASES:
                    got.setdefault((t, case), []).append(
                        handoff_once(ctx, t, calls_n, sleep_s, case, functions))
    print(f"server time per call (µs), {calls_n:,} calls a round, {sleep_s * 1000:g} ms "
          f"sleep before each, median of {rounds}")
    print("| tree | " + " | ".join(CASES) + " |")
    print("|---|" + "---|" * len(CASES))
    for t in dict.fromkeys(trees):
        print(f"| {t} | " + " | ".join(f"{statistics.median(got[t, c]):.1f}" for c in CASES)
              + " |")


if __name__ == "__main__":
    main()
