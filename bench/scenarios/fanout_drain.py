"""The ``fanout-drain`` scenario: what the features of a bulk send cost, one at a time
and together, each against the plain drain of the same jobs in the same run.

Every case enqueues ``--jobs`` rows ``(i, "user<i>@example.com")`` of the no-op task
(``bench.apps``), timed (the enqueue side), then starts ``batchq worker bench.apps:app
-p 1 --burst`` as a subprocess and times it from spawn to exit (``bench.scenarios.allin``:
start-up, the drain and the exit all count), reading the worker's CPU time from its
``wait4`` rusage (the supervisor and its child) and the server's from ``INFO CPU``
(``used_cpu_user + used_cpu_sys`` before the spawn and after the exit). Cases:

* plain: one ``enqueue_many``;
* groups: the same rows over ``--groups`` groups (one ``enqueue_many`` with
  ``group_fn``; a tree without ``group_fn``, ``--before``, makes one call per group);
* groups + a ``limit(group="*", rate_per_s=1_000_000)`` that never binds;
* campaign + a dedup key per job (``key_fn``: the email), no groups;
* the fan-out: groups, the ``"*"`` limit, the campaign and the keys together;
* beside them, the fan-out's enqueue alone as written before ``group_fn``, one
  ``options(group=g).enqueue_many`` per group (timed, not drained; its figures in each
  repeat's floor record, ``fanout_loop``), so the gain of one call is visible.

The cases take turns inside each repeat (the order turns each repeat, so a drift in
the machine's load favours none); every ratio is taken within one repeat, then the
median over the repeats. Beside them, the floor on the same server: the rows pushed as
msgpack values, ``RPUSH`` of 1,000 values per command, then read back with ``LPOP key
1000`` and decoded, in this process.

``--before DIR`` runs every case a second time from another checkout (e.g. ``git
archive <commit> | tar -x -C DIR``), right after this one's in every turn: its worker
and its enqueue (each case's fill runs in a child process on the tree's own ``batchq``,
for both trees, timed inside it), so a before/after table comes from one run on one
server; ``÷ before`` divides each case's figure by the before tree's in the same turn.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bench import record
from bench.apps import QUEUE
from bench.harness import REPO_ROOT, Context, Row, timed
from bench.scenarios.allin import timed_burst, worker_env
from bench.scenarios.flow import _server_cpu_s

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
    loop: bool = False
    """One ``enqueue_many`` per group (not ``group_fn``); its jobs are not drained."""


CASES = (
    Case("plain enqueue_many rows (i, email), no-op async handler"),
    Case("over {groups:,} groups", groups=True),
    Case("over {groups:,} groups + limit(group=\"*\", rate_per_s=1,000,000)", groups=True,
         limit=True),
    Case("campaign + a dedup key per job, no groups", campaign=True, keys=True),
    Case("the fan-out: groups + \"*\" limit + campaign + keys", groups=True, limit=True,
         campaign=True, keys=True),
)

LOOP = Case("fan-out enqueue, one call per group (enqueue only, not drained)", groups=True,
            limit=True, campaign=True, keys=True, loop=True)
"""The fan-out's fill as written before ``group_fn``: an extra row beside the cases."""


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
        if case.groups and case.loop:
            for g in range(groups):
                noop.options(group=f"g{g}", **opts).enqueue_many(
                    items[g * per:(g + 1) * per], key_fn=key_fn)
        elif case.groups:
            noop.options(**opts).enqueue_many(items, key_fn=key_fn,
                                              group_fn=lambda row: f"g{row[0] // per}")
        else:
            noop.options(**opts).enqueue_many(items, key_fn=key_fn)
    if camp is not None:
        camp.seal()
    if case.limit:
        q.limit("*", rate_per_s=LIMIT_RATE)
    return el[0], camp


FILL_CODE = """
import inspect, json, sys, time, uuid
from bench.apps import QUEUE, make_app
url, ns, n, groups, flags, rate = sys.argv[1:7]
n, groups, rate = int(n), int(groups), float(rate)
grouped, limit, campaign, keys, loop = (f == "1" for f in flags)
app = make_app(url, ns)
q = app.queue(QUEUE)
q.remove_limit("*")
noop = app.tasks["noop"]
items = [(i, f"user{i}@example.com") for i in range(n)]
camp = app.campaign() if campaign else None
opts = {"campaign": camp} if camp is not None else {}
tag = uuid.uuid4().hex[:8]
key_fn = (lambda row: f"{tag}:{row[1]}") if keys else None
per = -(-n // groups)
# a tree without group_fn (before it was added) makes one call per group
loop = loop or "group_fn" not in inspect.signature(noop.enqueue_many).parameters
t0 = time.perf_counter()
if grouped and not loop:
    noop.options(**opts).enqueue_many(items, key_fn=key_fn,
                                      group_fn=lambda row: f"g{row[0] // per}")
elif grouped:
    for g in range(groups):
        noop.options(group=f"g{g}", **opts).enqueue_many(items[g * per:(g + 1) * per],
                                                        key_fn=key_fn)
else:
    noop.options(**opts).enqueue_many(items, key_fn=key_fn)
took = time.perf_counter() - t0
if camp is not None:
    camp.seal()
if limit:
    q.limit("*", rate_per_s=rate)
app.close()
print(json.dumps({"enqueue_s": took, "campaign": camp.id if camp is not None else None}))
"""
"""A case's fill in a child process on a tree's own ``batchq`` (``--before``): the same
steps as ``fill``, its enqueue timed inside the child (start-up not counted)."""


def fill_in(ctx: Context, tree: Path, case: Case, n: int, groups: int) -> tuple[float, Any]:
    """``fill`` run by ``tree``'s code in a child process: (enqueue seconds, the sealed
    campaign or None)."""
    ctx.reset()
    flags = "".join("1" if f else "0" for f in (case.groups, case.limit, case.campaign,
                                                 case.keys, case.loop))
    out = subprocess.run([sys.executable, "-c", FILL_CODE, ctx.url, ctx.namespace, str(n),
                          str(groups), flags, str(LIMIT_RATE)], cwd=tree,
                         env=worker_env(ctx, tree), check=True, capture_output=True,
                         text=True, timeout=120 + n / 1000).stdout
    got = json.loads(out.strip().splitlines()[-1])
    from batchq.produce.campaign import Campaign

    camp = Campaign(ctx.app.clients, got["campaign"]) if got["campaign"] else None
    return float(got["enqueue_s"]), camp


def drain_once(ctx: Context, case: Case, n: int, groups: int,
               tree: Path | None = None) -> dict[str, Any]:
    """Fill, then one timed ``-p 1 --burst`` worker; checks every job ran once. ``tree``:
    the fill and the worker run from that checkout (``fill_in``), else the fill runs in
    this process."""
    if tree is None:
        enqueue_s, camp = fill(ctx, case, n, groups)
    else:
        enqueue_s, camp = fill_in(ctx, tree, case, n, groups)
    if case.loop:  # the enqueue alone: its jobs are dropped with the next reset
        ctx.app.queue(QUEUE).remove_limit("*")
        return {"jobs": n, "enqueue_s": enqueue_s, "enqueue_jobs_per_s": n / enqueue_s}
    ctx.client.config_resetstat()
    cpu0 = _server_cpu_s(ctx)
    try:
        wall, cpu, tail = timed_burst(ctx, tree or REPO_ROOT, WORKER_FLAGS, 30 + n / 500)
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


BEFORE_FIGURES = (("all_in_jobs_per_s", "÷ before"),
                  ("redis_cpu_us_per_job", "Redis µs ÷ before's"),
                  ("enqueue_jobs_per_s", "enqueue ÷ before"))
"""(key of a run's figures, ratio column) of a case against the same case of the
``--before`` tree."""


def run_fanout_drain(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
                     groups: int, before: Path | None = None) -> list[Row]:
    names = [c.name.format(groups=groups) for c in CASES]
    trees: list[tuple[str, Path | None]] = [("", None)]
    if before is not None:  # both trees fill in a child process on their own code
        trees = [("before: ", before.resolve()), ("", REPO_ROOT)]
    out = {(label, k): Row(f"{label}{name}",
                           {"jobs": jobs, "groups": groups if c.groups else 0,
                            "limit_rate_per_s": LIMIT_RATE if c.limit else None,
                            "campaign": c.campaign, "keys": c.keys,
                            "tree": str(tree or REPO_ROOT),
                            "worker": ["batchq", "worker", "bench.apps:app", "--burst",
                                       *WORKER_FLAGS]})
           for label, tree in trees for k, (name, c) in enumerate(zip(names, CASES,
                                                                        strict=True))}
    loops = {label: Row(f"{label}{LOOP.name}", {"jobs": jobs, "groups": groups,
                                               "tree": str(tree or REPO_ROOT)})
             for label, tree in trees}
    push = Row(f"floor: RPUSH {FLOOR_CHUNK:,} msgpack values per command", {"jobs": jobs})
    pop = Row(f"floor: LPOP {FLOOR_CHUNK:,} + msgpack decode, in Python", {"jobs": jobs})
    for _, tree in trees:  # untimed: bytecode and page caches
        timed_burst(ctx, tree or REPO_ROOT, WORKER_FLAGS, 60)
    for i in range(repeat):
        got: dict[tuple[str, int], dict[str, Any]] = {}
        for j in range(len(CASES)):
            k = (i + j) % len(CASES)
            # the trees alternate inside each turn, the first one turning each repeat
            for label, tree in (trees if (i + j) % 2 == 0 else trees[::-1]):
                got[label, k] = drain_once(ctx, CASES[k], jobs, groups, tree)
                rec["runs"].append({"case": f"{label}{names[k]}", "repeat": i, "turn": j,
                                    **got[label, k]})
        for (label, k), row in out.items():
            add_figures(row, got[label, k], got[label, 0])
            if label == "" and before is not None:
                for key, ratio in BEFORE_FIGURES:
                    if key in got[label, k]:
                        row.add(ratio, got[label, k][key] / got["before: ", k][key])
        loop = {label: drain_once(ctx, LOOP, jobs, groups, tree) for label, tree in trees}
        for label, row in loops.items():
            add_figures(row, loop[label], got[label, 0])
            fan = got[label, len(CASES) - 1]["enqueue_jobs_per_s"]
            row.add("fan-out enqueue ÷ this", fan / loop[label]["enqueue_jobs_per_s"])
        f = floor_once(ctx, jobs)
        rec["runs"].append({"case": "floor", "repeat": i, **f, "fanout_loop": loop})
        add_figures(push, f["rpush"], got["", 0])
        add_figures(pop, f["lpop"], got["", 0])
    ctx.client.delete(f"{ctx.namespace}:floor")
    record.reset(ctx.client, ctx.key)
    ctx.notes.append("all-in: `batchq worker bench.apps:app -p 1 --burst` timed from spawn "
                     "to exit; worker CPU from its rusage, Redis CPU from INFO CPU over its "
                     "life; ÷ plain: within each repeat, then the median. Floor rows: "
                     "the same rows as bare msgpack values in one list (the LPOP row's "
                     "worker CPU is this process's).")
    if before is not None:
        ctx.notes.append(f"before: rows run from {before} (fill and worker), alternating "
                         "with this checkout inside each turn; ÷ before: within each "
                         "repeat, then the median.")
    return [*out.values(), *loops.values(), push, pop]
