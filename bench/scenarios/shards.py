"""``python -m bench shards``: one hot queue on the embedded 3-master cluster, drained
with 1 shard and with N (default 8), the same no-op jobs, side by side in one run.

Per case and repeat: a fresh namespace; the jobs are enqueued (``enqueue_many``: with
shards, its chunks go to the shards in turn); then, between two reads of every node's
``INFO cpu`` and ``INFO commandstats``, a ``batchq worker --burst`` fleet (``-p``
processes, ``-c`` concurrency, default flags otherwise) drains the queue. Reported:
jobs/s (fleet start to exit), each node's share of the Redis CPU (used_cpu_sys +
used_cpu_user) and of the script time (``cmdstat_evalsha`` usec: pop, ack and the rest),
the largest deviation of a node's share from an even split, and the total Redis script
time and CPU per job over all nodes. The queue's name is chosen so its shards spread over the
nodes as evenly as their number allows (8 shards on 3 nodes: 3, 3, 2); with 1 shard one
node serves it all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

import batchq
from batchq.dev.cluster import EmbeddedCluster
from batchq.store.keys import shard_name
from bench.harness import REPO_ROOT, RESULTS_DIR, Row, finish_record, markdown, new_record

QUEUE_PREFIX = "hot"


class _Ctx:
    """What ``harness.new_record`` reads of a context."""

    def __init__(self, server: dict[str, Any]) -> None:
        self.server = server
        self.embedded = True
        self.notes: list[str] = []


def _node_figures(clients: list[redis.Redis]) -> list[tuple[float, float, float, float]]:
    """Per node: (CPU seconds used, µs in scripts, script calls, other commands: the
    ones run inside scripts, and the few sent outside) so far. Script time
    (``cmdstat_evalsha`` and ``cmdstat_eval``) holds the commands run inside the scripts,
    which commandstats also lists on their own: summing every command would count them
    twice. Outside scripts the fleet sends only BLPOP, SADD, ZMSCORE and the registry's
    few commands."""
    out = []
    for c in clients:
        cpu = c.info("cpu")
        stats = c.info("commandstats")
        usec = calls = inner = 0.0
        for k, v in stats.items():
            if not isinstance(v, dict) or k == "cmdstat_info":
                continue
            if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"):
                usec += float(v.get("usec", 0))
                calls += float(v.get("calls", 0))
            else:
                inner += float(v.get("calls", 0))
        out.append((float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), usec, calls,
                    inner))
    return out


def _spread_name(cluster: EmbeddedCluster, namespace: str, shards: int) -> str:
    """A queue name whose shards are spread as evenly as possible over the nodes."""
    best, best_gap = QUEUE_PREFIX, 10**9
    n = len(cluster.nodes)
    owners = [cluster.slot_owner(slot) for slot in range(16384)]
    for i in range(2000):
        name = f"{QUEUE_PREFIX}{i}"
        counts = [0] * n
        for k in range(shards):
            tag = f"{{{namespace}:{shard_name(name, k)}}}".encode()
            counts[owners[int(key_slot(tag))]] += 1
        gap = max(counts) - min(counts)
        if gap < best_gap:
            best, best_gap = name, gap
        if gap <= (1 if shards % n else 0):
            break
    return best


def _drain(cluster: EmbeddedCluster, clients: list[redis.Redis], shards: int, jobs: int,
           processes: int, concurrency: int) -> dict[str, Any]:
    ns = f"bsh{uuid.uuid4().hex[:8]}"
    name = _spread_name(cluster, ns, shards)
    app = batchq.App(cluster.url, namespace=ns)
    try:
        app.queue(name, shards=shards)
        noop = app.task(name="noop", queue=name)(lambda *a: None)
        noop.enqueue_many(range(jobs))
        placement = [0] * len(clients)
        for q in app.queue(name).shards():
            tag = f"{{{ns}:{q.name}}}".encode()
            placement[cluster.slot_owner(int(key_slot(tag)))] += q.stats().ready
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCHQ_", "BENCH_"))}
        env.update(BATCHQ_REDIS_URL=cluster.url, BENCH_NAMESPACE=ns, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        argv = [sys.executable, "-m", "batchq", "worker", "bench.apps.shardapp:app", "-q", name,
                "-c", str(concurrency), "--no-metrics", "--log-level", "WARNING", "--burst"]
        if processes > 1:
            argv += ["-p", str(processes)]
        before = _node_figures(clients)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=600, check=False)
        wall = time.perf_counter() - t0
        after = _node_figures(clients)
        if proc.returncode != 0:
            raise RuntimeError(f"worker fleet exited {proc.returncode}\n{proc.stderr[-2000:]}")
        st = app.queue(name).stats()
        if st.pending:
            raise RuntimeError(f"{st.pending} jobs left after the drain")
        cpu = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
        usec = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
        calls = [a[2] - b[2] for a, b in zip(after, before, strict=True)]
        inner = [a[3] - b[3] for a, b in zip(after, before, strict=True)]
        app.queue(name).clear()
        return {"shards": shards, "queue": name, "jobs": jobs, "wall_s": wall,
                "placement": placement, "cpu_s": cpu, "usec": usec, "script_calls": calls,
                "commands": inner}
    finally:
        app.close()


def _max_dev(parts: list[float]) -> float:
    """The largest deviation of a node's share from an even split, in % of even."""
    total = sum(parts)
    if total <= 0:
        return 0.0
    even = total / len(parts)
    return max(abs(p - even) for p in parts) / even * 100


def run(args: Any) -> int:
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    jobs = args.jobs or (5_000 if quick else 200_000)
    processes = args.processes or os.cpu_count() or 1
    counts = [int(x) for x in args.shards.split(",") if x.strip()]
    masters = args.masters
    if args.redis_url:
        raise ValueError("shards runs on an embedded cluster (--masters); --redis-url is not "
                         "used")
    with EmbeddedCluster(masters) as cluster:
        clients = [redis.Redis.from_url(cluster.node_url(i)) for i in range(len(cluster.nodes))]
        try:
            ctx = _Ctx(clients[0].info("server"))
            params = {"jobs": jobs, "repeat": repeat, "processes": processes,
                      "concurrency": args.concurrency, "shards": counts, "masters": masters}
            rec = new_record(ctx, "shards", params)
            rows = {n: Row(f"{n} shard{'s' if n > 1 else ''}, {masters} node"
                           f"{'s' if masters > 1 else ''}, -p {processes}",
                           {"shards": n, "jobs": jobs, "masters": masters}) for n in counts}
            for i in range(repeat):
                for n in counts:  # side by side, alternating
                    r = _drain(cluster, clients, n, jobs, processes, args.concurrency)
                    row = rows[n]
                    row.add("jobs/s", jobs / r["wall_s"], "jobs/s")
                    row.add("script µs/job", sum(r["usec"]) / jobs, "µs")
                    row.add("jobs/script call", jobs / max(sum(r["script_calls"]), 1), "")
                    row.add("commands/job", sum(r["commands"]) / jobs, "")
                    row.add("redis cpu µs/job", sum(r["cpu_s"]) * 1e6 / jobs, "µs")
                    for j, (c, u) in enumerate(zip(r["cpu_s"], r["usec"], strict=True)):
                        row.add(f"node{j} cpu %", 100 * c / max(sum(r["cpu_s"]), 1e-9), "%")
                        row.add(f"node{j} script %", 100 * u / max(sum(r["usec"]), 1e-9),
                                "%")
                    row.add("cpu max dev from even %", _max_dev(r["cpu_s"]), "%")
                    row.add("script max dev from even %", _max_dev(r["usec"]), "%")
                    rec["runs"].append({"repeat": i, **r})
                    print(f"shards={n} repeat {i}: {jobs / r['wall_s']:,.0f} jobs/s, "
                          f"{sum(r['usec']) / jobs:.2f} µs/job, placement {r['placement']}, "
                          f"cpu {[round(c, 2) for c in r['cpu_s']]}", flush=True)
            if masters == 3 and 8 in counts:
                ctx.notes.append("per-node shares are of the Redis figures summed over the three "
                             "nodes; 8 shards on 3 nodes place 3, 3 and 2 shards (the best "
                                 "possible split), so the node with 2 carries 25 % less than "
                                 "even")
            out_dir: Path = args.out_dir or RESULTS_DIR
            path = finish_record(rec, out_dir, list(rows.values()), ctx)  # type: ignore[arg-type]
        finally:
            for c in clients:
                c.close()
    print(markdown(rec))
    print(f"\nrecord: {path}")
    return 0
