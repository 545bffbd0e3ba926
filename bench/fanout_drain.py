"""The ``fanout-drain`` scenario: what the features of a bulk send cost, one at a time
and together, each against the plain drain of the same jobs in the same run.

Every case enqueues ``--jobs`` rows ``(i, "user<i>@example.com")`` of the no-op task
(``bench.apps``), timed (the enqueue side), then starts ``batchq worker bench.apps:app
-p 1 --burst`` as a subprocess and times it from spawn to exit (``bench.allin``:
start-up, the drain and the exit all count), reading the worker's CPU time from its
``wait4`` rusage (the supervisor and its child) and the server's from ``INFO CPU``
(``used_cpu_user + used_cpu_sys`` before the spawn and after the exit). Cases:

* plain: one ``enqueue_many``;
* groups: the same rows over ``--groups`` groups (one ``enqueue_many`` per group);
* groups + a ``limit(group="*", rate_per_s=1_000_000)`` that never binds;
* campaign + a dedup key per job (``key_fn``: the email), no groups;
* the fan-out: groups, the ``"*"`` limit, the campaign and the keys together.

The cases take turns inside each repeat (the order turns each repeat, so a drift in
the machine's load favours none); every ratio is taken within one repeat, then the
median over the repeats. Beside them, the floor on the same server: the rows pushed as
msgpack values, ``RPUSH`` of 1,000 values per command, then read back with ``LPOP key
1000`` and decoded, in this process.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from . import record
from .allin import timed_burst
from .apps import QUEUE
from .flow import _server_cpu_s
from .harness import REPO_ROOT, Context, Row, timed

LIMIT_RATE = 1_000_000.0
"""The ``"*"`` limit of the limited cases: far above any drain rate, so it never binds
and what it costs is the bookkeeping."""
FLOOR_CHUNK = 1000
"""Values per ``RPUSH`` and per ``LPOP`` of the floor."""
WORKER_FLAGS = ("-p", "1")
"""What the issue measured: one worker process under a supervisor, default flags."""


@dataclass(frozen=True)
class Case:
    name: str
    groups: bool = False
    limit: bool = False
    campaign: bool = False
    keys: bool = False


CASES = (
    Case("plain enqueue_many rows (i, email), no-op async handler"),
    Case("over {groups:,} groups", groups=True),
    Case("over {groups:,} groups + limit(group=\"*\", rate_per_s=1,000,000)", groups=True,
         limit=True),
    Case("campaign + a dedup key per job, no groups", campaign=True, keys=True),
    Case("the fan-out: groups + \"*\" limit + campaign + keys", groups=True, limit=True,
         campaign=True, keys=True),
)


def rows(n: int) -> list[tuple[int, str]]:
    return [(i, f"user{i}@example.com") for i in range(n)]


def fill(ctx: Context, case: Case, n: int, groups: int) -> tuple[float, Any]:
    """A fresh queue with the case's ``n`` jobs: (seconds the enqueue took, the sealed
    campaign or None). Building the rows is not timed; the limit is set after."""
    ctx.reset()
    q = ctx.app.queue(QUEUE)
    q.remove_limit("*")
    noop = ctx.app.tasks["noop"]
    items = rows(n)
    camp = ctx.app.campaign() if case.campaign else None
    opts: dict[str, Any] = {"campaign": camp} if camp is not None else {}
    tag = uuid.uuid4().hex[:8]  # every run's keys are new: none is held from the last
    key_fn: Callable[[Any], str] | None = ((lambda row: f"{tag}:{row[1]}") if case.keys
                                           else None)
    per = -(-n // groups)
    with timed() as el:
        if case.groups:
            for g in range(groups):
                noop.options(group=f"g{g}", **opts).enqueue_many(
                    items[g * per:(g + 1) * per], key_fn=key_fn)
        else:
            noop.options(**opts).enqueue_many(items, key_fn=key_fn)
    if camp is not None:
        camp.seal()
    if case.limit:
        q.limit("*", rate_per_s=LIMIT_RATE)
    return el[0], camp


def drain_once(ctx: Context, case: Case, n: int, groups: int) -> dict[str, Any]:
    """Fill, then one timed ``-p 1 --burst`` worker; checks every job ran once."""
    enqueue_s, camp = fill(ctx, case, n, groups)
    ctx.client.config_resetstat()
    cpu0 = _server_cpu_s(ctx)
    try:
        wall, cpu, tail = timed_burst(ctx, REPO_ROOT, WORKER_FLAGS, 30 + n / 500)
        server_s = _server_cpu_s(ctx) - cpu0
        cmd_us = sum(int(v["usec"]) for v in ctx.client.info("commandstats").values())
    finally:
        ctx.app.queue(QUEUE).remove_limit("*")
    got = record.read_totals(ctx.client, ctx.key)[0]
    st = ctx.app.queue(QUEUE).stats()
    if got != n or st.pending or st.dead:
        raise RuntimeError(f"{case.name}: handlers reported {got} of {n} jobs; queue {st}"
                           f"\n{tail}")
    if camp is not None and not camp.stats().done:
        raise RuntimeError(f"{case.name}: campaign not complete after the drain: "
                           f"{camp.stats()}\n{tail}")
    return {"jobs": n, "enqueue_s": enqueue_s, "enqueue_jobs_per_s": n / enqueue_s,
            "wall_s": wall, "all_in_jobs_per_s": n / wall,
            "worker_cpu_us_per_job": cpu / n * 1e6,
            "redis_cpu_us_per_job": server_s / n * 1e6,
            "redis_command_us_per_job": cmd_us / n}


def floor_once(ctx: Context, n: int) -> dict[str, Any]:
    """The same rows through a bare list: RPUSH then LPOP + decode, 1,000 a command."""
    key = f"{ctx.namespace}:floor"
    r = ctx.client
    r.delete(key)
    packed = [msgpack.packb(row) for row in rows(n)]
    cpu0 = _server_cpu_s(ctx)
    with timed() as push:
        for i in range(0, n, FLOOR_CHUNK):
            r.rpush(key, *packed[i:i + FLOOR_CHUNK])
    cpu1 = _server_cpu_s(ctx)
    got = 0
    client0 = time.process_time()
    with timed() as pop:
        while chunk := r.lpop(key, FLOOR_CHUNK):
            got += len([msgpack.unpackb(v) for v in chunk])
    client_s = time.process_time() - client0
    cpu2 = _server_cpu_s(ctx)
    if got != n:
        raise RuntimeError(f"floor: read {got} of {n} values back")
    return {"rpush": {"jobs": n, "enqueue_jobs_per_s": n / push[0],
                      "push_redis_cpu_us_per_job": (cpu1 - cpu0) / n * 1e6},
            "lpop": {"jobs": n, "all_in_jobs_per_s": n / pop[0],
                     "worker_cpu_us_per_job": client_s / n * 1e6,
                     "redis_cpu_us_per_job": (cpu2 - cpu1) / n * 1e6}}


FIGURES = (("all-in jobs/s", "all_in_jobs_per_s", "jobs/s", "÷ plain"),
           ("worker CPU µs/job", "worker_cpu_us_per_job", "µs", ""),
           ("Redis CPU µs/job", "redis_cpu_us_per_job", "µs", "Redis µs ÷ plain's"),
           ("Redis CPU µs/job", "push_redis_cpu_us_per_job", "µs", ""),
           ("enqueue jobs/s", "enqueue_jobs_per_s", "jobs/s", "enqueue ÷ plain"))
"""(column, key of a run's figures, unit, column of its ratio to plain's or "")"""


def add_figures(row: Row, got: dict[str, Any], plain: dict[str, Any]) -> None:
    """One repeat's figures of a case (or of the floor) and their ratios to plain's."""
    for name, key, unit, ratio in FIGURES:
        if key in got:
            row.add(name, got[key], unit)
            if ratio:
                row.add(ratio, got[key] / plain[key])


def run_fanout_drain(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
                     groups: int) -> list[Row]:
    names = [c.name.format(groups=groups) for c in CASES]
    out = [Row(name, {"jobs": jobs, "groups": groups if c.groups else 0,
                      "limit_rate_per_s": LIMIT_RATE if c.limit else None,
                      "campaign": c.campaign, "keys": c.keys,
                      "worker": ["batchq", "worker", "bench.apps:app", "--burst",
                                 *WORKER_FLAGS]})
           for name, c in zip(names, CASES, strict=True)]
    push = Row(f"floor: RPUSH {FLOOR_CHUNK:,} msgpack values per command", {"jobs": jobs})
    pop = Row(f"floor: LPOP {FLOOR_CHUNK:,} + msgpack decode, in Python", {"jobs": jobs})
    timed_burst(ctx, REPO_ROOT, WORKER_FLAGS, 60)  # untimed: bytecode and page caches
    for i in range(repeat):
        got: dict[int, dict[str, Any]] = {}
        for j in range(len(CASES)):
            k = (i + j) % len(CASES)
            got[k] = drain_once(ctx, CASES[k], jobs, groups)
            rec["runs"].append({"case": names[k], "repeat": i, "turn": j, **got[k]})
        for k, row in enumerate(out):
            add_figures(row, got[k], got[0])
        f = floor_once(ctx, jobs)
        rec["runs"].append({"case": "floor", "repeat": i, **f})
        add_figures(push, f["rpush"], got[0])
        add_figures(pop, f["lpop"], got[0])
    ctx.client.delete(f"{ctx.namespace}:floor")
    record.reset(ctx.client, ctx.key)
    ctx.notes.append("all-in: `batchq worker bench.apps:app -p 1 --burst` timed from spawn "
                     "to exit; worker CPU from its rusage, Redis CPU from INFO CPU over its "
                     "life; ÷ plain: within each repeat, then the median. Floor rows: "
                     "the same rows as bare msgpack values in one list (the LPOP row's "
                     "worker CPU is this process's).")
    return [*out, push, pop]
