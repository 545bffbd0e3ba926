"""``python -m bench SCENARIO [options]``: the batchq benchmark harness.

Scenarios: enqueue, drain, allin, latency, memory, idle, scale, iocurve (batchq alone),
peers (batchq side by side with other Redis queues), plot (a PNG from latency records).
Each scenario run writes one JSON record to ``bench/results/<scenario>-<timestamp>.json``
and prints a markdown table. See bench/README.md for what exactly each figure times.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SCENARIOS = ("enqueue", "drain", "allin", "latency", "memory", "idle", "scale", "campaign",
             "fanout", "groups", "ratecheck", "iocurve", "shards", "cancel-drop",
             "fanout-drain")
COMMANDS = (*SCENARIOS, "peers", "plot")

# (full, --quick) defaults of --jobs per scenario
JOBS = {"enqueue": (50_000, 2_000), "drain": (100_000, 2_000), "allin": (1_000_000, 5_000),
        "latency": (50_000, 2_000),
        "memory": (1_000_000, 2_000), "scale": (50_000, 2_000),
        "campaign": (100_000, 2_000), "fanout": (100_000, 2_000), "groups": (100_000, 2_000),
        "shards": (200_000, 5_000), "cancel-drop": (100_000, 2_000),
        "fanout-drain": (200_000, 2_000),
        "iocurve": (0, 0)}  # 0: per level, bench/scenarios/iocurve.py's default_jobs


def _common(p: argparse.ArgumentParser, scenario: str) -> None:
    p.add_argument("--redis-url", default=None,
                   help="Redis to benchmark (default: start an embedded Valkey)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per case; median and min-max are reported (default 3, "
                   "--quick 1)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and one repeat: a smoke test, not a measurement")
    if scenario in JOBS:
        full, quick = JOBS[scenario]
        what = "jobs of the max-rate probe" if scenario == "latency" else "jobs per run"
        default = f"default {full:,}, --quick {quick:,}"
        if scenario == "iocurve":
            what = "jobs per level"
            default = ("default max(20 x C, 20,000, 8 s at min(C / sleep, 20,000) jobs/s), "
                       "--quick max(5 x C, 200)")
        p.add_argument("--jobs", type=int, default=None, help=f"{what} ({default})")
    p.add_argument("-p", "--processes", type=int, default=None,
                   help="worker processes (default: os.cpu_count())")
    p.add_argument("-c", "--concurrency", type=int, default=100,
                   help="jobs run at once per worker process (default 100)")
    p.add_argument("--namespace", default=None,
                   help="batchq key namespace (default: a fresh random one)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the JSON record goes (default bench/results)")
    p.add_argument("--note", action="append", default=[],
                   help="a remark to keep in the record (repeatable)")


def add_scenario_args(p: argparse.ArgumentParser, scenario: str) -> None:
    """The options of one command (also used by ``batchq bench``)."""
    if scenario == "plot":
        p.add_argument("records", nargs="+", type=Path,
                       help="latency or peers JSON records")
        p.add_argument("-o", "--output", type=Path, default=Path("bench/latency.png"))
        return
    if scenario == "peers":
        from .peers.run import add_args

        add_args(p)
        return
    _common(p, scenario)
    if scenario in ("enqueue", "scale", "drain"):
        p.add_argument("--payload-bytes", type=int, default=0,
                       help="size of the one bytes argument of each job (default: none)")
    if scenario == "enqueue":
        p.add_argument("--producers", type=int, default=8,
                       help="concurrent async producers (default 8)")
    if scenario == "scale":
        p.add_argument("--payloads", default="100,1000,10000",
                       help="payload sizes in bytes (default 100,1000,10000)")
    if scenario == "latency":
        p.add_argument("--duration", type=float, default=None,
                       help="seconds of load per level (default 10, --quick 0.5)")
        p.add_argument("--max-rate", type=float, default=None,
                       help="skip the probe: the 100 %% rate in jobs/s")
        p.add_argument("--max-from", choices=("sustained", "drain"), default="sustained",
                       help="the 100 %% rate: the highest rate sustained with the producer "
                       "running beside the fleet (default; a bisection after the drain "
                       "probe), or the drain probe's throughput")
        p.add_argument("--idle-rate", type=float, default=50.0,
                       help="rate of the idle level (default 50 jobs/s: one every 20 ms)")
        p.add_argument("--levels", default="25,50,75,90",
                       help="percentages of the max rate (default 25,50,75,90)")
    if scenario in ("allin", "fanout-drain"):
        p.add_argument("--before", type=Path, default=None,
                       help="another checkout (e.g. `git archive COMMIT | tar -x -C DIR`) "
                       "whose worker runs every case too, alternating with this one")
    if scenario == "cancel-drop":
        p.add_argument("--group-rate", type=float, default=100.0,
                       help="the limit of the group case in jobs/s (default 100)")
    if scenario == "campaign":
        p.add_argument("--campaigns", type=int, default=None,
                       help="campaigns of the completion-latency case (default 50, --quick 5)")
        p.add_argument("--campaign-jobs", type=int, default=200,
                       help="jobs per campaign of the latency case (default 200)")
    if scenario == "fanout":
        p.add_argument("--groups", type=int, default=None,
                       help="senders (groups), equal rates (default 20, --quick 4)")
        p.add_argument("--rate-sum", type=float, default=None,
                       help="sum of the per-group limits in messages/s (default 2000, "
                       "--quick 400)")
        p.add_argument("--group-burst", type=int, default=None,
                       help="burst of each group's queue limit, and of the provider's "
                       "bucket unless --provider-burst (default: a tenth of a second's "
                       "worth)")
        p.add_argument("--latency-ms", type=float, default=50.0,
                       help="the provider's answer time (default 50 ms)")
        p.add_argument("--provider-burst", type=float, default=None,
                       help="the provider's bucket size per sender (default: the same as "
                       "the queue's group burst)")
        p.add_argument("--clock", choices=("sent", "arrival"), default="sent",
                       help="the provider judges its buckets by the handlers' send time "
                       "(default) or by when it read the request (see bench/README.md)")
    if scenario == "fanout-drain":
        p.add_argument("--groups", type=int, default=None,
                       help="groups of the grouped cases (default 1000, --quick 20)")
    if scenario == "groups":
        p.add_argument("--groups", type=int, default=None,
                       help="groups the jobs are spread over (default 1000, --quick 20)")
        p.add_argument("--queue-rate", type=float, default=1_000_000.0,
                       help="the queue-wide rate limit of the third case (default "
                       "1,000,000/s, the largest allowed)")
    if scenario == "ratecheck":
        p.add_argument("--duration", type=float, default=None,
                       help="seconds of jobs at the queue's rate (default 10, --quick 2)")
        p.add_argument("--rate", type=float, default=500.0,
                       help="queue-wide rate_per_s (default 500)")
        p.add_argument("--burst", type=int, default=50, help="queue-wide burst (default 50)")
        p.add_argument("--group-rate", type=float, default=50.0,
                       help="rate_per_s of the limited group (default 50)")
        p.add_argument("--group-burst", type=int, default=5,
                       help="burst of the limited group (default 5)")
    if scenario == "iocurve":
        p.add_argument("--levels", default="100,1000,5000",
                       help="worker concurrencies (-c) of one process, one row each "
                       "(default 100,1000,5000; -c and -p are not used)")
        p.add_argument("--sleep-ms", type=float, default=50.0,
                       help="what each handler awaits (asyncio.sleep; default 50 ms)")
    if scenario == "shards":
        p.add_argument("--shards", default="1,8",
                       help="shard counts of the hot queue, one row each (default 1,8)")
        p.add_argument("--masters", type=int, default=3,
                       help="nodes of the embedded cluster (default 3; 1: the cost of "
                       "sharding itself, every shard on the one node)")
    if scenario == "memory":
        p.add_argument("--payload-bytes", type=int, default=100,
                       help="size of each job's bytes argument (default 100)")
    if scenario == "idle":
        p.add_argument("--duration", type=float, default=None,
                       help="measured window in seconds (default 10, --quick 1)")
        p.add_argument("--warmup", type=float, default=None,
                       help="seconds before the window (default 2, --quick 0.5)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="scenario", required=True)
    helps = {"enqueue": "enqueue throughput: single, enqueue_many, async producers",
             "drain": "drain throughput of a worker fleet: no-op and batch handlers",
             "allin": "`batchq worker --burst` timed from start to exit, default flags",
             "latency": "open-loop latency at idle and at 25-90 %% of max throughput",
             "memory": "Redis bytes per queued job; worker RSS while draining",
             "idle": "CPU and Redis commands/s of an idle fleet",
             "scale": "drain throughput against processes and payload size",
             "campaign": "campaigns and dedup keys: drain cost, keyed enqueue_many, bytes "
                         "per key, completion latency",
             "fanout": "flow control: a mock provider with per-sender limits, 20 groups",
             "groups": "no-op drain: plain, in 1,000 groups, under a queue rate limit",
             "ratecheck": "starts in any 1 s window vs rate + burst, two supervisors",
             "iocurve": "one process, handlers awaiting 50 ms: jobs/s, RSS and CPU "
                        "against -c 100, 1,000, 5,000",
             "shards": "one hot queue on the embedded 3-node cluster, 1 vs 8 shards: "
                       "Redis CPU per node, Redis µs per job",
             "cancel-drop": "cancelled jobs dropped per second by one worker vs its plain "
                            "drain of the same jobs",
             "fanout-drain": "all-in -p 1 drain: plain, groups, \"*\" limit, campaign + "
                             "keys, all four; enqueue side; RPUSH/LPOP floor; ratios",
             "peers": "batchq against Celery, RQ, arq, dramatiq, saq, taskiq, huey",
             "plot": "PNG of latency percentiles against offered rate"}
    for name in COMMANDS:
        add_scenario_args(sub.add_parser(name, help=helps[name]), name)
    return p


def _run_scenario(args: argparse.Namespace) -> int:
    from bench.scenarios.allin import run_allin
    from bench.scenarios.campaigns import run_campaign
    from bench.scenarios.cancel import run_cancel_drop
    from bench.scenarios.fanout_drain import run_fanout_drain
    from bench.scenarios.flow import run_fanout, run_groups, run_ratecheck
    from bench.scenarios.iocurve import run_iocurve
    from bench.scenarios.latency import run_latency
    from bench.scenarios.resources import run_idle, run_memory
    from bench.scenarios.throughput import run_drain, run_enqueue, run_scale

    from . import harness

    s = args.scenario
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    jobs = getattr(args, "jobs", None) or (JOBS[s][1 if quick else 0] if s in JOBS else 0)
    params: dict[str, Any] = {k: (str(v) if isinstance(v, Path) else v)
                              for k, v in vars(args).items() if k not in ("redis_url",)}
    params.update(repeat=repeat, jobs=jobs)
    runners: dict[str, Callable[[harness.Context, dict[str, Any]], list[harness.Row]]] = {
        "enqueue": lambda ctx, rec: run_enqueue(
            ctx, rec, jobs=jobs, repeat=repeat, producers=args.producers,
            payload_bytes=args.payload_bytes),
        "drain": lambda ctx, rec: run_drain(
            ctx, rec, jobs=jobs, repeat=repeat, processes=args.processes,
            concurrency=args.concurrency),
        "allin": lambda ctx, rec: run_allin(
            ctx, rec, jobs=jobs, repeat=repeat, before=args.before),
        "scale": lambda ctx, rec: run_scale(
            ctx, rec, jobs=jobs, repeat=repeat, max_processes=args.processes,
            concurrency=args.concurrency,
            payloads=[int(x) for x in args.payloads.split(",") if x.strip()]),
        "latency": lambda ctx, rec: run_latency(
            ctx, rec, repeat=repeat, duration_s=args.duration or (0.5 if quick else 10.0),
            processes=args.processes, concurrency=args.concurrency, max_rate=args.max_rate,
            probe_jobs=jobs, idle_rate=args.idle_rate,
            levels=[int(x) for x in args.levels.split(",") if x.strip()],
            max_from=args.max_from),
        "memory": lambda ctx, rec: run_memory(
            ctx, rec, jobs=jobs, repeat=repeat, payload_bytes=args.payload_bytes,
            processes=args.processes, concurrency=args.concurrency),
        "campaign": lambda ctx, rec: run_campaign(
            ctx, rec, jobs=jobs, repeat=repeat, processes=None, concurrency=args.concurrency,
            campaigns=args.campaigns or (5 if quick else 50),
            campaign_jobs=args.campaign_jobs),
        "fanout": lambda ctx, rec: run_fanout(
            ctx, rec, jobs=jobs, repeat=repeat, groups=args.groups or (4 if quick else 20),
            rate_sum=args.rate_sum or (400.0 if quick else 2000.0), burst=args.group_burst,
            latency_ms=args.latency_ms, processes=args.processes,
            concurrency=args.concurrency, clock=args.clock,
            provider_burst=args.provider_burst),
        "cancel-drop": lambda ctx, rec: run_cancel_drop(
            ctx, rec, jobs=jobs, repeat=repeat, concurrency=args.concurrency,
            group_rate=args.group_rate),
        "groups": lambda ctx, rec: run_groups(
            ctx, rec, jobs=jobs, repeat=repeat, groups=args.groups or (20 if quick else 1000),
            queue_rate=args.queue_rate, processes=args.processes,
            concurrency=args.concurrency),
        "fanout-drain": lambda ctx, rec: run_fanout_drain(
            ctx, rec, jobs=jobs, repeat=repeat, groups=args.groups or (20 if quick else 1000),
            before=args.before),
        "ratecheck": lambda ctx, rec: run_ratecheck(
            ctx, rec, repeat=repeat, duration_s=args.duration or (2.0 if quick else 10.0),
            rate=args.rate, burst=args.burst, group_rate=args.group_rate,
            group_burst=args.group_burst, processes=args.processes,
            concurrency=args.concurrency),
        "iocurve": lambda ctx, rec: run_iocurve(
            ctx, rec, levels=[int(x) for x in args.levels.split(",") if x.strip()],
            jobs=jobs, repeat=repeat, sleep_ms=args.sleep_ms, quick=quick),
        "idle": lambda ctx, rec: run_idle(
            ctx, rec, repeat=repeat, processes=args.processes, concurrency=args.concurrency,
            warmup_s=args.warmup if args.warmup is not None else (0.5 if quick else 2.0),
            duration_s=args.duration or (1.0 if quick else 10.0)),
    }
    with harness.Context(args.redis_url, args.namespace, args.out_dir, quick) as ctx:
        ctx.notes.extend(args.note)
        rec = harness.new_record(ctx, s, params)
        rows = runners[s](ctx, rec)
        path = harness.finish_record(rec, ctx.out_dir, rows, ctx)
    print(harness.markdown(rec))
    print(f"\nrecord: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.scenario == "plot":
        from bench.tools.plot import plot

        out = plot(args.records, args.output)
        print(f"wrote {out}")
        return 0
    if args.scenario == "peers":
        from .peers.run import main as peers_main

        return peers_main(args)
    if args.scenario == "shards":
        from bench.scenarios.shards import run as run_shards

        try:
            return run_shards(args)
        except (RuntimeError, ValueError) as exc:
            print(f"bench shards: {exc}", file=sys.stderr)
            return 1
    try:
        return _run_scenario(args)
    except (RuntimeError, ValueError) as exc:
        print(f"bench {args.scenario}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
