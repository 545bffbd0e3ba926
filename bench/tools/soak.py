"""Soak: at-least-once delivery over a long run while worker processes are SIGKILLed.

``python -m bench.tools.soak --jobs 1000000 --minutes 10 --kill-every 30`` (the defaults):

1. starts an embedded Valkey (``--redis-url`` to use another server) and a
   ``batchq worker apps.fault_app:app -p 2`` fleet (``tests/apps/fault_app.py``: each
   run of a job appends one line to a file per process, outside Redis);
2. enqueues ``--jobs`` jobs spread evenly over ``--minutes`` (``--upfront``: all at once),
   recording only the tokens whose ``enqueue_many`` returned;
3. every ``--kill-every`` seconds SIGKILLs one worker process picked at random (the
   supervisor replaces it; its jobs come back when their leases expire);
4. waits until everything enqueued ran and nothing is ready, delayed, reserved or in
   flight, checks ``/metrics``, stops the fleet with SIGTERM;
5. runs the checker (``tests/checker.py``) and prints its counts (attempted, run, lost,
   duplicated, ...) as a table and as JSON (``--json PATH`` writes the JSON too).

Exit status 0 when the checker finds nothing lost, nothing unexpected and every
duplicate explained (its earlier run was on a killed process), else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = REPO_ROOT / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import checker  # noqa: E402  (tests/checker.py)
import redis  # noqa: E402
from apps import fault_app  # noqa: E402

import batchq  # noqa: E402
from batchq.dev.server import EmbeddedServer  # noqa: E402

APP = "apps.fault_app:app"
QUEUE = "default"


@dataclass
class Soak:
    args: argparse.Namespace
    url: str
    ns: str
    runs_dir: Path
    log_path: Path
    metrics_port: int
    app: batchq.App = field(init=False)
    r: redis.Redis = field(init=False)
    sup: subprocess.Popen[bytes] | None = None
    enqueued: list[str] = field(default_factory=list)
    maybe: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    attempted: int = 0
    kills: list[tuple[float, int]] = field(default_factory=list)
    producing_done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.app = fault_app.build(self.url, self.ns)
        self.r = redis.Redis.from_url(self.url)

    # --- the fleet ---------------------------------------------------------------------

    def start_fleet(self) -> None:
        a = self.args
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHQ_")}
        env.update({
            "BATCHQ_REDIS_URL": self.url, "FAULT_NS": self.ns,
            "FAULT_RUNS": str(self.runs_dir), "FAULT_RECORD_STARTS": "0",
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR),
                                           env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        })
        with open(self.log_path, "wb") as log:
            self.sup = subprocess.Popen(
                [sys.executable, "-m", "batchq", "worker", APP, "-p", str(a.processes),
                 "-c", str(a.concurrency), "--lease-s", str(a.lease_s),
                 "--metrics-port", str(self.metrics_port)],
                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while len(self.workers()) < a.processes:
            if self.sup.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the fleet did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def workers(self) -> list[int]:
        """Live worker processes of the supervisor (not its metrics server)."""
        if self.sup is None:
            return []
        serving = set()
        for line in self.log_path.read_text(errors="replace").splitlines():
            if " serving " in line and "worker " in line:
                pid = line.split(" serving ", 1)[0].rsplit(":", 1)[-1]
                if pid.isdigit():
                    serving.add(int(pid))
        return sorted(p for p in serving if _child_of(p, self.sup.pid))

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # --- threads -----------------------------------------------------------------------

    def produce(self) -> None:
        """Enqueue ``--jobs`` jobs evenly over ``--minutes`` (every 100 ms a batch)."""
        a = self.args
        work = self.app.tasks["work"]
        rng = random.Random(a.seed)
        top = 2 * a.job_ms / 1000  # uniform 0 .. 2 x job-ms: job-ms on average
        total = a.jobs
        span = 0.0 if a.upfront else a.minutes * 60
        t0 = time.monotonic()
        sent = 0
        try:
            while sent < total and not self.stop.is_set():
                due = total if span == 0 else min(
                    total, int(total * (time.monotonic() - t0) / span) + 1)
                while sent < due:
                    n = min(due - sent, 5000)
                    toks = [f"j{sent + i}" for i in range(n)]
                    sent += n
                    self.attempted += n
                    try:
                        ids = work.enqueue_many([(t, round(rng.uniform(0, top), 4))
                                                 for t in toks])
                        self.enqueued += toks[: len(ids)]
                    except batchq.EnqueueError as exc:
                        self.enqueued += toks[: exc.written]  # whole chunks, in order
                        rest = toks[exc.written:]
                        (self.maybe if exc.unknown else self.refused).extend(rest)
                        self.notes.append(f"enqueue_many: {exc}")
                if span:
                    time.sleep(0.1)
        finally:
            self.producing_done.set()

    def killer(self, rng: random.Random) -> None:
        every = self.args.kill_every
        if every <= 0:
            return
        next_at = time.monotonic() + every
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += every
            pids = self.workers()
            if not pids:
                continue
            pid = rng.choice(pids)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                self.kills.append((time.time(), pid))

    # --- waiting -----------------------------------------------------------------------

    def pending(self) -> int:
        k = self.app.keys(QUEUE)
        pipe = self.r.pipeline(transaction=False)
        for key in k.ready:
            pipe.llen(key)
        pipe.zcard(k.delayed)
        pipe.zcard(k.reserved)
        pipe.zcard(k.bundles)
        pipe.hlen(k.inflight)
        return sum(pipe.execute())

    def metrics(self) -> checker.Reconciliation | None:
        try:
            return checker.reconcile(checker.scrape(self.metrics_port), QUEUE)
        except OSError:
            return None

    def progress(self, t0: float, phase: str) -> None:
        rec = self.metrics()
        done = f"{rec.succeeded:.0f}" if rec else "?"
        print(f"[{time.monotonic() - t0:7.1f}s] {phase}: enqueued {len(self.enqueued)}, "
              f"succeeded {done}, pending {self.pending()}, kills {len(self.kills)}, "
              f"workers {self.workers()}", flush=True)


def _child_of(pid: int, parent: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[1]) == parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def run(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    url = args.redis_url
    if not url:
        server = EmbeddedServer().start()
        url = server.url
    tmp = Path(tempfile.mkdtemp(prefix="batchq-soak-"))
    runs_dir = tmp / "runs"
    runs_dir.mkdir()
    soak = Soak(args, url, f"soak{uuid.uuid4().hex[:8]}", runs_dir, tmp / "fleet.log",
                _free_port())
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    started = time.time()
    try:
        soak.start_fleet()
        producer = threading.Thread(target=soak.produce, name="producer", daemon=True)
        killer = threading.Thread(target=soak.killer, args=(rng,), name="killer",
                                  daemon=True)
        producer.start()
        killer.start()
        last = 0.0
        while not soak.producing_done.wait(1.0):
            if time.monotonic() - last >= args.progress_s:
                soak.progress(t0, "producing")
                last = time.monotonic()
        produced_s = time.monotonic() - t0
        # keep killing while the backlog drains, until it is gone
        drain_deadline = time.monotonic() + args.drain_timeout_s
        while soak.pending():
            if time.monotonic() > drain_deadline:
                soak.notes.append(f"not drained within {args.drain_timeout_s}s")
                break
            if time.monotonic() - last >= args.progress_s:
                soak.progress(t0, "draining")
                last = time.monotonic()
            time.sleep(0.5)
        soak.stop.set()
        killer.join(5)
        # the last kill's leases expire and its jobs run again
        settle_deadline = time.monotonic() + args.lease_s * 3 + 30
        while soak.pending() and time.monotonic() < settle_deadline:
            time.sleep(0.5)
        drained_s = time.monotonic() - t0
        time.sleep(1.5)  # workers publish their counts once a second
        rec = soak.metrics()
        soak.progress(t0, "drained")
        assert soak.sup is not None
        soak.sup.send_signal(signal.SIGTERM)
        try:
            code = soak.sup.wait(args.lease_s + 40)
        except subprocess.TimeoutExpired:
            soak.sup.kill()
            code = soak.sup.wait(10)
            soak.notes.append("the fleet did not stop on SIGTERM: SIGKILLed")
        killed = {pid for _, pid in soak.kills}
        runs = checker.read_runs(runs_dir)
        report = checker.check(soak.enqueued, runs, checker.dead_tokens(soak.app.queue(QUEUE)),
                               killed_pids=killed, maybe=soak.maybe,
                               attempted=soak.attempted)
        left = checker.leftovers(soak.r, soak.ns, [QUEUE])
        log = soak.log_path.read_text(errors="replace")
        result: dict[str, Any] = {
            "scenario": "soak",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "params": {k: v for k, v in vars(args).items() if k != "json"},
            "checker": report.counts(),
            "valid": report.valid,
            "duplicates_explained_by": dict(report.explained_by),
            "redelivered_runs": sum(1 for x in runs if x.attempt >= 2),
            "kills": len(soak.kills),
            "killed_pids": sorted(killed),
            "restarts_logged": log.count(" died ("),
            "tracebacks_logged": log.count("Traceback"),
            "fleet_exit": code,
            "produce_s": round(produced_s, 1),
            "drain_s": round(drained_s, 1),
            "jobs_per_s": round(report.run / drained_s, 1) if drained_s else None,
            "leftovers": left,
            "metrics": None if rec is None else {
                "enqueued": rec.enqueued, "succeeded": rec.succeeded, "dead": rec.dead,
                "queued": rec.queued, "stale_acks": rec.stale, "missing": rec.missing,
                "reconciles": rec.ok},
            "lost_sample": report.lost[:20],
            "unexplained_sample": dict(list(report.unexplained.items())[:10]),
            "notes": soak.notes,
            "fleet_log_tail": soak.log_tail(15).splitlines() if not report.valid else [],
        }
        return result
    finally:
        if soak.sup is not None and soak.sup.poll() is None:
            soak.sup.kill()
            soak.sup.wait(10)
        soak.app.close()
        soak.r.close()
        if server is not None:
            server.stop()
        if args.keep:
            print(f"run records and the fleet log kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    c = result["checker"]
    rows = [
        ("attempted", c["attempted"]), ("enqueued (returned)", c["enqueued"]),
        ("run (completed runs)", c["run"]), ("completed jobs", c["completed"]),
        ("dead-lettered", c["dead"]), ("lost", c["lost"]), ("unexpected", c["unexpected"]),
        ("duplicated", c["duplicated"]), ("  unexplained", c["unexplained"]),
        ("runs of attempt >= 2 (redelivered)", result["redelivered_runs"]),
        ("workers SIGKILLed", result["kills"]),
        ("restarts logged", result["restarts_logged"]),
        ("drain wall time (s)", result["drain_s"]), ("jobs/s", result["jobs_per_s"]),
        ("leftover keys/entries", len(result["leftovers"])),
        ("valid", result["valid"]),
    ]
    m = result["metrics"]
    if m:
        # a SIGKILLed worker loses the counts it had not yet published (once a second)
        rows.append(("metrics: enqueued - succeeded - dead - queued", m["missing"]))
        rows.append(("metrics: stale acks", m["stale_acks"]))
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'figure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.soak",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--minutes", type=float, default=10.0,
                   help="spread the enqueues over this long (default 10)")
    p.add_argument("--kill-every", type=float, default=30.0,
                   help="SIGKILL a random worker process this often, seconds (0: never)")
    p.add_argument("--upfront", action="store_true", help="enqueue every job at the start")
    p.add_argument("-p", "--processes", type=int, default=2)
    p.add_argument("-c", "--concurrency", type=int, default=100)
    p.add_argument("--lease-s", type=float, default=5.0)
    p.add_argument("--job-ms", type=float, default=20.0,
                   help="each job sleeps 0 .. 2 x this long (uniform), default 20")
    p.add_argument("--redis-url", default=None, help="default: an embedded Valkey")
    p.add_argument("--drain-timeout-s", type=float, default=900.0)
    p.add_argument("--progress-s", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the result here")
    p.add_argument("--keep", action="store_true", help="keep run records and fleet log")
    args = p.parse_args(argv)
    result = run(args)
    print()
    print(table(result))
    print()
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if result["valid"] and not result["leftovers"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
