"""``python -m bench.tools.flow_cost``: where a grouped drain's time goes on the server.

No workers: this process pops (``pop.lua``, ``--batch`` jobs per call) until the queue
is empty, then acks every lease (``ack.lua``, one call per popped batch), and reads the
server's own time for each phase (``INFO commandstats`` usec, reset before each).
Cases: plain jobs; plain jobs under a queue-wide rate limit of 1,000,000/s; the same
jobs in ``--groups`` groups with the shipped scripts; and grouped again with pop.lua's
turn quantum (jobs a group starts per turn, 10 as shipped) set to each of ``--quanta``
(a copy built in memory and loaded with SCRIPT LOAD; ``batchq/scripts`` is not
touched). Quantum 1 is how groups were served before turns of up to 10 jobs: every
group taken costs a lex range read, a virtual-time update and its share of the acks'
group bookkeeping, so the server time per grouped job falls with the quantum.

Prints microseconds of server time per job (pop, ack, total), medians over
``--repeat``. An embedded Valkey unless ``--redis-url``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from batchq.store.scripts import calls, source
from bench.apps import QUEUE
from bench.harness import Context
from bench.scenarios.flow import fill

QUANTUM = "local QUANTUM = "


def pop_quantum(src: str, q: int) -> str:
    """pop.lua with its turn quantum (jobs a group of weight 1 starts per turn) set to
    ``q``; 1 is how groups were served before turns of up to 10 jobs."""
    at = src.find(QUANTUM)
    if at < 0:
        raise RuntimeError("pop.lua has no QUANTUM: update bench/tools/flow_cost.py")
    eol = src.index("--", at)
    return src[:at] + f"{QUANTUM}{q}  " + src[eol:]


def _server_usec(ctx: Context) -> int:
    return sum(int(v["usec"]) for v in ctx.client.info("commandstats").values())


def loaded(r: Any, text: str) -> Callable[..., Any]:
    """Load a script's ``text`` and return its caller ``(keys, args)``: a function library
    (``#!lua name=...``, a tree that calls its scripts as functions) by FUNCTION LOAD and
    FCALL, else SCRIPT LOAD and EVALSHA."""
    if text.startswith("#!lua name="):
        name = text.split("\n", 1)[0].removeprefix("#!lua name=")
        r.function_load(text, replace=True)
        return lambda keys, args: r.fcall(name, len(keys), *keys, *args)
    sha = r.script_load(text)
    return lambda keys, args: r.evalsha(sha, len(keys), *keys, *args)


def once(ctx: Context, jobs: int, groups: int, pop_src: str, ack_src: str,
         batch: int, queue_rate: float | None = None) -> tuple[float, float]:
    fill(ctx, jobs, groups, queue_rate)
    q = ctx.app.queue(QUEUE)
    k = ctx.app.keys(QUEUE)
    r: Any = ctx.client
    pop, ack = loaded(r, pop_src), loaded(r, ack_src)
    batches = []
    r.config_resetstat()
    while True:
        c = calls.pop(k, batch, 600_000, 100, bundle=True)
        res = pop(c.keys, c.args)
        # since 0.5 the reply's 11th item is the bundle, {name, n} or {}; before, the
        # jobs began there (a tree without bundles ignores the flag)
        head = 11 if len(res) > 10 and isinstance(res[10], list) else 10
        got = res[head:]
        if not got:
            break
        n = int(res[10][1]) if head == 11 and res[10] else 0
        single = got[: len(got) - n]
        batches.append([j.split(b":", 4)[3] + b":" + j.split(b":", 4)[1] for j in single]
                       + [res[10][0] + p.to_bytes(2, "big") for p in range(1, n + 1)])
    pop_us = _server_usec(ctx)
    r.config_resetstat()
    # a bundle's leases go as one argument (calls.ack); an older ack.lua
    # takes one argument per lease
    grouped = "<bundle>#<position>" in ack_src
    for leases in batches:
        c = calls.ack(k, leases)
        ack(c.keys, c.args if grouped else leases)
    ack_us = _server_usec(ctx)
    left = r.zcard(k.reserved) + r.zcard(k.bundles)
    if left:
        raise RuntimeError(f"{left} leases were not acked")
    q.remove_limit()
    n = sum(map(len, batches))
    if n != jobs:
        raise RuntimeError(f"popped {n} of {jobs} jobs")
    return pop_us / n, ack_us / n


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.flow_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis-url", default=None)
    p.add_argument("--jobs", type=int, default=50_000)
    p.add_argument("--groups", type=int, default=500)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--quanta", default="1",
                   help="pop.lua turn quanta to compare with the shipped one (default 1)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    pop, ack = source("pop"), source("ack")
    cases: list[tuple[str, int, str, str, float | None]] = [
        ("plain jobs", 0, pop, ack, None),
        ("plain jobs, queue limit 1,000,000/s", 0, pop, ack, 1e6),
        (f"{a.groups} groups, shipped scripts", a.groups, pop, ack, None)]
    for q in (int(x) for x in a.quanta.split(",") if x.strip()):
        cases.append((f"{a.groups} groups, pop quantum {q}", a.groups, pop_quantum(pop, q),
                      ack, None))
    got: dict[str, list[tuple[float, float]]] = {c[0]: [] for c in cases}
    with Context(a.redis_url) as ctx:
        for _ in range(a.repeat):
            for name, groups, ps, acs, rate in cases:
                got[name].append(once(ctx, a.jobs, groups, ps, acs, a.batch, rate))
    print(f"server time per job, {a.jobs:,} jobs, pop batch {a.batch}, median of {a.repeat}")
    print("| case | pop (us/job) | ack (us/job) | total (us/job) | vs plain |")
    print("|---|---|---|---|---|")
    base = 0.0
    for name, vals in got.items():
        pu = statistics.median(v[0] for v in vals)
        au = statistics.median(v[1] for v in vals)
        tot = statistics.median(v[0] + v[1] for v in vals)
        base = base or tot
        print(f"| {name} | {pu:.2f} | {au:.2f} | {tot:.2f} | {tot / base:.2f}x |")


if __name__ == "__main__":
    main()
