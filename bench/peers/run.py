"""``python -m bench peers``: batchq and other Redis queues, same Redis, same run.

``--setup`` creates one virtualenv per peer under ``bench/.peers-venv`` and pip-installs
it. A comparison then runs, for batchq and each peer in turn, on its own database of
the same server (flushed before every run):

* drain: N jobs (``--job``: no-op, or ``io``, one Redis round trip on the handler's own
  client, ``bench.peers.iojob``) are enqueued (not timed), the worker fleet is started, and the
  figure is ``N / (last handler exit - first handler entry)`` from the handlers' own
  clocks (``bench.record``), exactly as for batchq; then the fleet is stopped.
* latency: a fresh fleet, then, for each offered rate in ascending order (``--rates``,
  then with ``--climb`` that rate times ``--climb-factor`` again and again up to
  ``--max-rate``), ``--repeat`` runs of: one warm-up job, then open-loop load for
  ``--duration`` seconds from the system's own client (``bench.peers.driver``, the same
  ``batchq.load.schedule`` schedule); enqueue-to-start and enqueue-to-done are measured from
  each job's intended send time, as in the ``latency`` scenario. A rate is sustained
  when most of its runs are; the first rate that is not ends the system's climb (a
  queue that falls behind at one rate does not catch up at a higher one), so each
  system is measured up to where it falls over. The bare ``RPUSH`` -> ``BLPOP`` floor
  (``bench.peers.floor_app``) runs in the same rotation (``--no-floor`` leaves it out),
  and every start p50 / p99 is also given as a multiple of the floor's at that rate.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from bench.scenarios.latency import SUSTAINED_SHARE, figures, sustained, wait_for_samples

from .. import harness, record
from ..harness import Context, Fleet, Row, batchq_worker_argv, wait_for_totals
from . import FLOOR, PEERS, Peer, install_argv
from .iojob import KINDS

STALL_S = 20.0
"""A drain whose job count has not grown for this long is taken as finished; the jobs
that never ran are reported."""


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--setup", action="store_true",
                   help="create bench/.peers-venv/<peer> and pip install the peers, then exit")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated subset (default {','.join(PEERS)})")
    p.add_argument("--no-batchq", action="store_true", help="leave batchq out")
    p.add_argument("--no-floor", action="store_true",
                   help="leave the bare RPUSH -> BLPOP floor out of the latency rotation")
    p.add_argument("--job", choices=("noop", "io"), default="noop",
                   help="the drain's job: a no-op (default) or io, one pipelined Redis "
                   "round trip on the handler's own client (bench/peers/iojob.py)")
    p.add_argument("--io-client", default="shared",
                   help="how an asyncio io handler makes its client: "
                   f"{', '.join(KINDS)} (default shared: one redis.asyncio client per "
                   "process); a comma-separated list adds a batchq drain per further kind "
                   "(system 'batchq+<kind>'), the peers keep the first; batchq: "
                   "batchq.BatchingRedis, batchq's own drains only")
    p.add_argument("--batchq-api", choices=("async", "sync", "both"), default="both",
                   help="batchq's producer in the latency runs: aenqueue on the asyncio "
                   "open loop (system 'batchq'), enqueue on the synchronous one, as the "
                   "sync peers send (system 'batchq-sync'), or both (default)")
    p.add_argument("--redis-url", default=None,
                   help="Redis to use (default: an embedded Valkey). Databases "
                   "--db-base.. are FLUSHED: needs --allow-flush")
    p.add_argument("--allow-flush", action="store_true",
                   help="allow flushing databases of a --redis-url server")
    p.add_argument("--db-base", type=int, default=1,
                   help="first database for the peers; batchq uses the URL's (default 1)")
    p.add_argument("--jobs", type=int, default=None,
                   help="jobs per drain run (default 20,000, --quick 500)")
    p.add_argument("--rates", default="200,1000,3000",
                   help="offered rates for latency, jobs/s, comma-separated (default "
                   "200,1000,3000); a system's first rate not sustained ends its list")
    p.add_argument("--climb", action="store_true",
                   help="after the last --rates rate, multiply the rate by --climb-factor "
                   "until a rate is not sustained or the next would pass --max-rate")
    p.add_argument("--climb-factor", type=float, default=2.0,
                   help="rate step of --climb (default 2: 3,000, 6,000, 12,000, ...)")
    p.add_argument("--max-rate", type=float, default=100_000.0,
                   help="the highest rate --climb offers, jobs/s (default 100,000)")
    p.add_argument("--no-drain", action="store_true",
                   help="latency only: skip the drain runs")
    p.add_argument("--no-latency", action="store_true",
                   help="drain only: skip the latency runs")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of load per rate (default 10, --quick 1)")
    p.add_argument("-p", "--processes", type=int, default=None,
                   help="worker processes for every system (default os.cpu_count())")
    p.add_argument("-c", "--concurrency", type=int, default=100,
                   help="batchq's -c (default 100)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per case (default 3, --quick 1)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("--namespace", default=None)
    p.add_argument("--note", action="append", default=[],
                   help="a remark to keep in the record (repeatable)")


def setup(peers: list[Peer]) -> int:
    for peer in peers:
        print(f"== {peer.name}: {peer.venv}", flush=True)
        for argv in install_argv(peer):
            if argv[2] == "venv" and peer.python.exists():
                continue
            res = subprocess.run(argv, check=False)
            if res.returncode != 0:
                print(f"setup of {peer.name} failed: {' '.join(argv)}", file=sys.stderr)
                return 1
        print(f"   {peer.dist} {peer_version(peer)}", flush=True)
    return 0


def peer_version(peer: Peer) -> str:
    res = subprocess.run(
        [str(peer.python), "-c", "import importlib.metadata as m, sys; "
         "print(m.version(sys.argv[1]), '(redis-py', m.version('redis') + ')')", peer.dist],
        capture_output=True, text=True, check=False)
    return res.stdout.strip() if res.returncode == 0 else "?"


def db_url(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


class System:
    """batchq or one peer: how to fill its queue, start its fleet, offer it load."""

    def __init__(self, ctx: Context, name: str, url: str, peer: Peer | None,
                 processes: int, concurrency: int, api: str = "async", job: str = "noop",
                 io_client: str = "shared") -> None:
        self.ctx = ctx
        self.job = job
        self.io_client = io_client
        self.name = name
        self.api = api
        """batchq's producer call: ``aenqueue`` ("async") or ``enqueue`` ("sync")."""
        self.url = url
        self.peer = peer
        self.processes = processes
        self.concurrency = concurrency
        self.client = redis.Redis.from_url(url)
        self.key = ctx.key if peer is None else "bench:rec"

    def env(self) -> dict[str, str]:
        return self.ctx.fleet_env(BENCH_REDIS_URL=self.url, BENCH_KEY=self.key,
                                  BENCH_IO_CLIENT=self.io_client)

    def flush(self) -> None:
        if self.peer is None:
            self.ctx.reset()
        else:
            self.client.flushdb()

    def fleet(self) -> Fleet:
        if self.peer is None:
            argv = batchq_worker_argv(self.processes, self.concurrency, burst=False)
            argv[argv.index("bench.apps:app")] = "bench.peers.batchq_app:app"
        else:
            argv = self.peer.worker_argv(self.processes, self.url)
        return Fleet(argv, self.env())

    def _driver(self, *args: str, timeout_s: float = 600) -> str:
        assert self.peer is not None
        res = subprocess.run(self.peer.driver_argv(*args), cwd=harness.REPO_ROOT,
                             env=self.env(), capture_output=True, text=True,
                             timeout=timeout_s, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{self.name} driver {args[0]} failed:\n{res.stderr[-3000:]}")
        return res.stdout

    def fill(self, n: int) -> float:
        if self.peer is None:
            from bench.scenarios.throughput import fill

            if self.job not in self.ctx.app.tasks:
                from .batchq_app import add_io

                add_io(self.ctx.app)
            return fill(self.ctx, self.job, n)
        return float(json.loads(self._driver("enqueue", str(n), self.job))["enqueue_s"])

    def warm(self) -> None:
        if self.peer is None:
            self.ctx.app.tasks["lat"].enqueue(time.time(), time.time())
        else:
            self._driver("warm")

    def load(self, rate: float, duration_s: float) -> dict[str, Any]:
        if self.peer is None:
            from batchq.load.schedule import aopen_loop
            from bench.scenarios.throughput import _run_async

            lat = self.ctx.app.tasks["lat"]
            if self.api == "sync":
                from batchq.load.schedule import open_loop

                def send_sync(intended: list[float], sent_at: float) -> None:
                    # one enqueue per job, as a web app's request handlers send
                    for t in intended:
                        lat.enqueue(t, sent_at)

                try:
                    self.ctx.app.redis.ping()
                    return open_loop(send_sync, rate, duration_s).as_dict()
                finally:
                    self.ctx.app.close()

            async def send(intended: list[float], sent_at: float) -> None:
                if len(intended) == 1:
                    await lat.aenqueue(intended[0], sent_at)
                else:
                    await lat.aenqueue_many([(t, sent_at) for t in intended])

            async def main() -> dict[str, Any]:
                await self.ctx.app.async_redis().ping()
                try:
                    return (await aopen_loop(send, rate, duration_s)).as_dict()
                finally:
                    await self.ctx.app.aclose()

            out: dict[str, Any] = _run_async(main())
            return out
        state: dict[str, Any] = json.loads(self._driver("load", str(rate), str(duration_s),
                                                        timeout_s=duration_s + 300))
        return state


def drain(sys_: System, n: int) -> dict[str, Any]:
    sys_.flush()
    enqueue_s = sys_.fill(n)
    with sys_.fleet() as fleet:
        fleet.start()
        jobs, first, last, procs = wait_for_totals(sys_.client, sys_.key, n,
                                                   timeout_s=120 + n / 100, fleet=fleet,
                                                   stall_s=STALL_S)
        startup_s = first - fleet.started_wall
        fleet.stop(signal.SIGTERM, timeout_s=15)
    span = max(last - first, 1e-6)
    if jobs < n:
        sys_.ctx.notes.append(f"{sys_.name}: {n - jobs:,} of {n:,} drain jobs never ran "
                              f"(no progress for {STALL_S:g}s); jobs/s counts those that ran")
    elif jobs > n:
        sys_.ctx.notes.append(f"{sys_.name}: its handlers ran {jobs - n:,} more times than "
                              f"the {n:,} jobs enqueued (duplicate deliveries)")
    return {"jobs": n, "ran": jobs, "enqueue_s": enqueue_s, "drain_s": span,
            "jobs_per_s": jobs / span,
            "first_job_after_start_s": startup_s, "reporting_processes": procs}


def rate_plan(rates: Sequence[float], climb_factor: float | None,
              max_rate: float) -> Iterator[float]:
    """The offered rates in the order they are tried: ``rates`` ascending, then (with a
    ``climb_factor``) the highest of them times the factor, again and again, as long as
    the rate stays within ``max_rate``. The caller stops at the first rate its system
    does not sustain."""
    base = sorted(set(rates))
    yield from base
    if climb_factor is None or not base:
        return
    if climb_factor <= 1:
        raise ValueError(f"--climb-factor must be above 1, not {climb_factor:g}")
    rate = base[-1] * climb_factor
    while rate <= max_rate * (1 + 1e-9):
        yield rate
        rate *= climb_factor


def runs_needed(repeat: int) -> int:
    """Sustained runs a rate needs to count as sustained: a majority of ``repeat``."""
    return repeat // 2 + 1


def _since(samples: array.array[float], t0: float) -> tuple[array.array[float], int]:
    """The samples of jobs intended at ``t0`` or later, and how many were older (jobs of
    an earlier run that were still running when its queue was flushed)."""
    out = array.array("d")
    stale = 0
    for i in range(0, len(samples) - 3, 4):
        if samples[i] >= t0:
            out.extend(samples[i : i + 4])
        else:
            stale += 1
    return out, stale


def one_rate(sys_: System, rate: float, duration_s: float) -> dict[str, Any]:
    """One run at one offered rate against the running fleet: its figures."""
    record.take_samples(sys_.client, sys_.key)
    sys_.warm()
    if wait_for_samples(sys_.client, sys_.key, 1, 90.0) < 1:
        raise RuntimeError(f"{sys_.name}: the warm-up job did not run within 90s")
    record.take_samples(sys_.client, sys_.key)
    t0 = time.time()
    state = sys_.load(rate, duration_s)
    wait_for_samples(sys_.client, sys_.key, state["sent"], max(15.0, duration_s))
    samples, stale = _since(record.take_samples(sys_.client, sys_.key), t0)
    fig = figures(samples, state)
    fig["stale_samples"] = stale
    fig["sustained"] = sustained(fig, rate)
    if fig["lost"]:
        sys_.flush()  # the backlog would spill into the next run
    return fig


def climb(rates: Iterable[float], repeat: int,
          measure: Callable[[float], dict[str, Any]]) -> list[tuple[float, list[dict[str, Any]]]]:
    """``measure(rate)`` up to ``repeat`` times at each rate, in order, until a rate is
    not sustained by a majority of ``repeat`` runs; that rate is the last one measured.
    The runs of a rate stop as soon as that majority is out of reach."""
    need = runs_needed(repeat)
    out: list[tuple[float, list[dict[str, Any]]]] = []
    for rate in rates:
        runs: list[dict[str, Any]] = []
        while len(runs) < repeat and sum(not r["sustained"] for r in runs) <= repeat - need:
            runs.append(measure(rate))
        out.append((rate, runs))
        if sum(1 for r in runs if r["sustained"]) < need:
            break
    return out


def latency(sys_: System, rates: Iterable[float], duration_s: float,
            repeat: int) -> list[tuple[float, list[dict[str, Any]]]]:
    """``climb`` over ``rates`` on one fleet of the system."""
    sys_.flush()
    with sys_.fleet() as fleet:
        fleet.start()

        def measure(rate: float) -> dict[str, Any]:
            if not fleet.running():
                raise RuntimeError(f"{sys_.name}: the worker fleet exited at {rate:g} "
                                   f"jobs/s\n{fleet.log_tail()}")
            fig = one_rate(sys_, rate, duration_s)
            s = fig["enqueue_to_start"]
            print(f"   {sys_.name} @ {rate:,.0f}/s: start p50 {_fmt_ms(s['p50'])} p99 "
                  f"{_fmt_ms(s['p99'])} ms, sent {fig['achieved_send_rate']:,.0f}/s, "
                  f"done {fig['completion_rate']:,.0f}/s"
                  + ("" if fig["sustained"] else f", NOT sustained (lost {fig['lost']})"),
                  file=sys.stderr, flush=True)
            return fig

        out = climb(rates, repeat, measure)
        fleet.stop(signal.SIGTERM, timeout_s=15)
    return out


def _fmt_ms(v: float) -> str:
    return harness.fmt(v, "ms")


def rate_summary(rate: float, runs: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    """One rate over its runs: the median of each figure; sustained by a majority."""
    ok = sum(1 for r in runs if r["sustained"])

    def med(values: list[float]) -> float:
        return float(harness.summarize(values)["median"])

    out: dict[str, Any] = {
        "offered_rate": rate, "runs": len(runs), "sustained_runs": ok,
        "sustained": ok >= runs_needed(repeat),
        "completion_rate": med([r["completion_rate"] for r in runs]),
        "achieved_send_rate": med([r["achieved_send_rate"] for r in runs]),
        "lost": sum(r["lost"] for r in runs), "send_errors": sum(r["send_errors"] for r in runs),
    }
    for m in ("enqueue_to_start", "enqueue_to_done", "send_lateness", "sent_to_start"):
        out[m] = {k: med([r[m][k] for r in runs]) for k in runs[0][m]}
    return out


def reach(levels: list[dict[str, Any]], climbed_to: float | None) -> str:
    """Where a system stops keeping up, in words for the table."""
    ok = [lv["offered_rate"] for lv in levels if lv["sustained"]]
    bad = [lv["offered_rate"] for lv in levels if not lv["sustained"]]
    if bad:
        return (f"{ok[-1]:,.0f} / {bad[0]:,.0f}" if ok else f"- / {bad[0]:,.0f}")
    if not ok:
        return "-"
    top = f"{ok[-1]:,.0f}"
    return f"{top} / none up to the cap" if climbed_to is not None else f"{top} / not climbed"


def comparison_table(rec: dict[str, Any]) -> str:
    """Two markdown tables: per system (drain, where it stops keeping up), then per
    system and offered rate (start latency, sustained or not)."""
    res: dict[str, Any] = rec["results"]
    params = rec["parameters"]
    cap = params["max_rate"] if params.get("climb") else None
    bq = res.get("batchq")
    bq_drain = bq["drain"]["jobs_per_s"]["median"] if bq and bq["drain"] else None
    head = ["system", "version", "drain jobs/s", "batchq ÷ system (drain)",
            "highest rate sustained / first not (jobs/s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in res.items():
        d = r["drain"]
        if d is None:
            drain_cell, ratio = "-", "-"
        else:
            lost = d.get("never_ran", 0)
            drain_cell = harness.cell({**d["jobs_per_s"], "unit": "jobs/s"}) + (
                f" ({lost:,} jobs never ran)" if lost > 0 else
                f" ({-lost:,} more runs than jobs: duplicates)" if lost < 0 else "")
            ratio = ("1" if name == "batchq" else "-" if bq_drain is None
                     else f"{bq_drain / d['jobs_per_s']['median']:.1f}")
        lines.append(f"| {name} | {r['version']} | {drain_cell} | {ratio} | "
                     f"{reach(r['latency'], cap)} |")
    best = best_peer(res)
    if best is not None:
        lines += [""] + [
            f"- {name} ÷ best peer ({best[0]}), drain: "
            f"**{r['drain']['jobs_per_s']['median'] / best[1]:.2f}**"
            for name, r in res.items() if name.startswith("batchq") and r["drain"]]
    bq_p99 = {lv["offered_rate"]: lv["enqueue_to_start"]["p99"]
              for lv in (bq["latency"] if bq else []) if lv["sustained"]}
    fl = res.get(FLOOR.name)
    floor = {lv["offered_rate"]: lv["enqueue_to_start"]
             for lv in (fl["latency"] if fl else []) if lv["sustained"]}
    head = ["system", "offered jobs/s", "sustained (runs)", "start p50 / p99 / p99.9 / max (ms)",
            "sent → start p50 / p99 (ms)", "done p99 (ms)", "sent / done jobs/s",
            "p99 ÷ batchq's", "p50 / p99 ÷ floor's"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in res.items():
        for lv in r["latency"]:
            rate = lv["offered_rate"]
            s = lv["enqueue_to_start"]
            ok = (f"{'yes' if lv['sustained'] else '**no**'} "
                  f"({lv['sustained_runs']} of {lv['runs']})")
            if lv["lost"]:
                ok += f", {lv['lost']:,} jobs not done in time"
            mine = bq_p99.get(rate)
            ratio = ("-" if not (mine and lv["sustained"]) else
                     "1" if name == "batchq" else f"{s['p99'] / mine:.1f}")
            lines.append(
                f"| {name} | {rate:,.0f} | {ok} | "
                + " / ".join(_fmt_ms(s[k]) for k in ("p50", "p99", "p99.9", "max"))
                + f" | {_fmt_ms(lv['sent_to_start']['p50'])} / "
                f"{_fmt_ms(lv['sent_to_start']['p99'])}"
                + f" | {_fmt_ms(lv['enqueue_to_done']['p99'])} | "
                f"{lv['achieved_send_rate']:,.0f} / {lv['completion_rate']:,.0f} | {ratio} | "
                f"{floor_ratio(s, floor.get(rate)) if lv['sustained'] else '-'} |")
    return "\n".join(lines)


def best_peer(res: dict[str, Any]) -> tuple[str, float] | None:
    """The peer with the highest median drain (batchq and the floor left out)."""
    drains = [(name, r["drain"]["jobs_per_s"]["median"]) for name, r in res.items()
              if r["drain"] and not name.startswith("batchq") and name != FLOOR.name]
    return max(drains, key=lambda d: d[1]) if drains else None


def floor_ratio(start: dict[str, float], floor: dict[str, float] | None) -> str:
    """``p50 ÷ floor's p50 / p99 ÷ floor's p99`` at one rate, or ``-``."""
    if not floor or floor["p50"] <= 0 or floor["p99"] <= 0:
        return "-"
    return f"{start['p50'] / floor['p50']:.2f} / {start['p99'] / floor['p99']:.2f}"


def main(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        print(f"unknown peers: {', '.join(unknown)} (known: {', '.join(PEERS)})",
              file=sys.stderr)
        return 2
    peers = [PEERS[n] for n in names]
    if args.setup:
        return setup(peers)
    missing = [p.name for p in peers if not p.python.exists()]
    if args.no_drain and args.no_latency:
        print("--no-drain and --no-latency leave nothing to run", file=sys.stderr)
        return 2
    io_clients = [k.strip() for k in args.io_client.split(",") if k.strip()]
    if not io_clients or any(k not in KINDS for k in io_clients):
        print(f"--io-client: one or more of {', '.join(KINDS)}", file=sys.stderr)
        return 2
    if io_clients[0] == "batchq" and peers:
        print("--io-client: the peers run the first kind and have no batchq: list batchq "
              "after it (shared,batchq)", file=sys.stderr)
        return 2
    if args.job == "io" and args.no_drain:
        print("--job io is a drain's job: drop --no-drain", file=sys.stderr)
        return 2
    if missing:
        print(f"no virtualenv for {', '.join(missing)}: run `python -m bench peers --setup`",
              file=sys.stderr)
        return 2
    if args.redis_url and not args.allow_flush:
        print("--redis-url: the peers' databases are flushed between runs; pass "
              "--allow-flush if that is fine for this server", file=sys.stderr)
        return 2
    if args.climb and args.climb_factor <= 1:
        print("--climb-factor must be above 1", file=sys.stderr)
        return 2
    quick = args.quick
    repeat = args.repeat or (1 if quick else 3)
    jobs = args.jobs or (500 if quick else 20_000)
    duration = args.duration or (1.0 if quick else 10.0)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not rates or min(rates) <= 0:
        print("--rates: give one or more positive rates", file=sys.stderr)
        return 2
    climb = args.climb_factor if args.climb else None
    procs = args.processes or os.cpu_count() or 1
    params: dict[str, Any] = {"peers": names, "batchq": not args.no_batchq,
                              "batchq_api": args.batchq_api,
                              "jobs": None if args.no_drain else jobs,
                              "rates": sorted(set(rates)), "climb": args.climb,
                              "climb_factor": climb, "max_rate": args.max_rate,
                              "sustained_share": SUSTAINED_SHARE,
                              "runs_needed": runs_needed(repeat),
                              "duration_s": duration, "processes": procs,
                              "concurrency": args.concurrency, "repeat": repeat,
                              "job": args.job, "io_clients": io_clients,
                              "floor": not args.no_floor,
                              "db_base": args.db_base}
    with Context(args.redis_url, args.namespace, args.out_dir, quick) as ctx:
        ctx.notes.extend(args.note)
        rec = harness.new_record(ctx, "peers", params)
        rec["results"] = {}
        rec["configs"] = {p.name: p.config for p in peers}
        apis = {"both": ["async", "sync"]}.get(args.batchq_api, [args.batchq_api])
        systems = [] if args.no_batchq else [
            System(ctx, "batchq" if api == "async" else "batchq-sync", ctx.url, None, procs,
                   args.concurrency, api, args.job, io_clients[0]) for api in apis]
        if not args.no_batchq and args.job == "io":
            # drains of batchq with the other ways to touch Redis (no latency runs)
            systems += [System(ctx, f"batchq+{k}", ctx.url, None, procs, args.concurrency,
                               "async", args.job, k) for k in io_clients[1:]]
        systems += [System(ctx, p.name, db_url(ctx.url, args.db_base + i), p, procs,
                           args.concurrency, job=args.job, io_client=io_clients[0])
                    for i, p in enumerate(peers)]
        if not (args.no_floor or args.no_latency):
            systems.append(System(ctx, FLOOR.name, db_url(ctx.url, args.db_base + len(peers)),
                                  FLOOR, procs, args.concurrency))
        rows: list[Row] = []
        for s in systems:
            print(f"== {s.name}", file=sys.stderr, flush=True)
            version = (rec["versions"]["batchq"] if s.peer is None
                       else peer_version(s.peer))
            d_row = Row(f"{s.name} drain", {"system": s.name, "version": version})
            runs: dict[str, Any] = {"drain": [], "latency": []}
            try:
                # the producer's API changes nothing in a drain (its jobs are written
                # before the fleet starts): batchq drains once
                drains = 0 if args.no_drain or s.peer is FLOOR or (
                    s.peer is None and s.api == "sync" and "async" in apis) else repeat
                for _ in range(drains):
                    d = drain(s, jobs)
                    runs["drain"].append(d)
                    d_row.add("jobs/s", d["jobs_per_s"], "jobs/s")
                extra = s.name.startswith("batchq+")
                levels = [] if args.no_latency or extra else latency(
                    s, rate_plan(rates, climb, args.max_rate), duration, repeat)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"{s.name} failed: {exc}", file=sys.stderr)
                ctx.notes.append(f"{s.name}: failed: {str(exc).splitlines()[0]}")
                rec["runs"].append({"system": s.name, **runs, "error": str(exc)})
                continue
            finally:
                s.flush()
                s.client.close()
            if runs["drain"]:
                rows.append(d_row)
            for rate, lvs in levels:
                runs["latency"] += [{k: v for k, v in lv.items() if k != "histograms"}
                                    for lv in lvs]
                row = Row(f"{s.name} @ {rate:g} jobs/s",
                          {"system": s.name, "offered_rate": rate,
                           "sustained_runs": sum(1 for lv in lvs if lv["sustained"]),
                           "runs": len(lvs)})
                for lv in lvs:
                    for k, v in lv["enqueue_to_start"].items():
                        row.add(f"start {k}", v, "ms")
                    for k, v in lv["enqueue_to_done"].items():
                        row.add(f"done {k}", v, "ms")
                    row.add("completed/s", lv["completion_rate"], "jobs/s")
                rows.append(row)
            rec["results"][s.name] = {
                "version": version,
                "config": f"batchq worker -p {procs} -c {args.concurrency}"
                if s.peer is None else s.peer.config,
                "drain": None if not runs["drain"] else {
                    "jobs_per_s": harness.summarize([d["jobs_per_s"] for d in runs["drain"]]),
                    "never_ran": sum(d["jobs"] - d["ran"] for d in runs["drain"])},
                "latency": [rate_summary(rate, lvs, repeat) for rate, lvs in levels],
            }
            rec["runs"].append({"system": s.name, **runs})
        path = harness.finish_record(rec, ctx.out_dir, rows, ctx)
    print(f"### peers — {rec['timestamp']}\n")
    print(comparison_table(rec))
    drained = "no drain runs" if args.no_drain else f"{jobs:,} jobs per drain run"
    print(f"\n{drained}; latency: {duration:g} s of open-loop load per run, from the "
          f"intended send time; rates {', '.join(f'{r:,.0f}' for r in sorted(set(rates)))}"
          + (f", then times {climb:g} up to {args.max_rate:,.0f}" if climb else "")
          + f"; {repeat} run(s) per rate, median; sustained = every job done, sent and done "
          f"at ≥ {SUSTAINED_SHARE:.0%} of the rate, in {runs_needed(repeat)} of {repeat} "
          "runs; a system's first rate not sustained is its last")
    for note in rec["notes"]:
        print(f"- {note}")
    print(f"\nrecord: {path}")
    return 0
