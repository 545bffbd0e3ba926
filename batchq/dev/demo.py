"""``make demo``: a campaign of fake emails, drained by one burst worker, then checked.

``python -m batchq.dev.demo [--jobs N] [--campaign ID] [--namespace NS]
[--customers N] [--rate-per-customer R]``. Without ``$BATCHQ_REDIS_URL`` an embedded
Valkey is started for the run. The emails are sent for several customers: each
customer is a group of the queue, limited to ``R`` emails a second
(``Queue.limit(group="*")``), so the run shows a fan-out held to a rate limit. They are
one campaign: written with ``enqueue_many`` and a dedup key per address, then sealed; a real
``batchq worker`` subprocess (``--burst``: it exits once the queue is empty) runs them
while this process shows the campaign's progress (a live bar on a terminal). The
campaign's ``on_complete`` task prints the summary (run here, after the drain). Exit code
0 only if the worker exited 0, every job was acknowledged (nothing ready, delayed,
reserved or dead) and the campaign completed once.

Run it twice with the same ``--campaign`` (and Redis) and the second run adds nothing:
the campaign is sealed, and every address's key is held. A run with neither
``--campaign`` nor ``--namespace`` works in a namespace of its own and deletes it at the
end; otherwise the campaign is kept for the next run (and ``batchq campaign show``).

Importing this module starts nothing: it only builds ``app`` (read by the worker as
``batchq.dev.demo:app``) from ``$BATCHQ_REDIS_URL`` and ``$BATCHQ_DEMO_NAMESPACE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any

import redis

from .. import App, Campaign, QueueStats, Worker, WorkerSettings
from ..produce.producer import CHUNK, WINDOW
from ..produce.tracked import check_campaign_id
from ..store.connection import redact
from .server import EmbeddedServer

NAMESPACE_ENV = "BATCHQ_DEMO_NAMESPACE"
DEFAULT_NAMESPACE = "batchq-demo"
QUEUE = "emails"
CUSTOMERS = 5
RATE_PER_CUSTOMER = 3_000.0
CALLBACKS = "demo-callbacks"
POLL_S = 0.2
"""Progress refresh period (the queue's counts are read 5 times a second)."""
STALL_S = 60.0
"""Give up when the queue has not moved for this long while the worker runs."""
EXIT_GRACE_S = 15.0
"""How long a burst worker may keep running once the queue is empty."""
WORKER_STOP_S = 35.0
"""How long a stopping worker gets (its own --shutdown-timeout is 30 s) before SIGKILL."""


async def send_email(to: str, subject: str) -> None:
    """Pretend to send one email: no network, one turn of the event loop."""
    await asyncio.sleep(0)


def campaign_done(campaign_id: str, stats: dict[str, Any]) -> None:
    """The campaign's ``on_complete``: print the summary."""
    took = stats["finished_at"] - stats["created_at"]
    print(f"summary  campaign {campaign_id!r} complete: {stats['total']:,} emails, "
          f"{stats['succeeded']:,} sent, {stats['dead']:,} failed, {stats['cancelled']:,} "
          f"cancelled, in {took:.2f} s (on_complete ran once)", flush=True)


def make_app(redis_url: str | None = None, namespace: str | None = None) -> App:
    """The demo app: ``send_email`` on the ``emails`` queue, ``campaign_done`` on
    ``demo-callbacks``.

    ``None`` reads the environment (``$BATCHQ_REDIS_URL``, ``$BATCHQ_DEMO_NAMESPACE``),
    which is how the worker subprocess gets this run's server and namespace.
    """
    demo = App(redis_url, namespace or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE)
    demo.task(queue=QUEUE)(send_email)
    demo.task(queue=CALLBACKS)(campaign_done)
    return demo


app = make_app()


# --- output ----------------------------------------------------------------------------


class Line:
    """One status line, rewritten in place on a terminal; elsewhere (pipes, CI logs)
    intermediate states are printed at most every ``plain_every_s`` seconds."""

    def __init__(self, out: IO[str], plain_every_s: float = 2.0) -> None:
        self.out = out
        self.tty = out.isatty()
        self.plain_every_s = plain_every_s
        self._width = 0
        self._last_plain = time.monotonic()

    def update(self, text: str) -> None:
        if self.tty:
            self.out.write("\r" + text.ljust(self._width))
            self._width = len(text)
            self.out.flush()
        elif time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            print(text, file=self.out, flush=True)

    def done(self, text: str) -> None:
        """Write the final state of the line and end it."""
        if self.tty:
            self.out.write("\r" + text.ljust(self._width) + "\n")
            self._width = 0
        else:
            self.out.write(text + "\n")
        self.out.flush()


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} jobs/s" if seconds > 0 else "- jobs/s"


def _counts(st: QueueStats) -> str:
    return f"ready {st.ready:,}  delayed {st.delayed:,}  reserved {st.reserved:,}  dead {st.dead:,}"


# --- the run ---------------------------------------------------------------------------


def _emails(n: int, customer: int, customers: int) -> Iterator[tuple[str, str]]:
    for i in range(customer, n, customers):
        yield f"user{i}@example.com", f"Your weekly digest #{i}"


def limit(demo: App, customers: int, rate: float) -> None:
    """Every customer (a group of the queue) at most ``rate`` emails a second, enforced
    by the pop script across every worker (0: no limit)."""
    q = demo.queue(QUEUE)
    if rate <= 0:
        q.remove_limit(group="*")
        print(f"flow     {customers} customers, each a group of the queue (served in "
              "turn); no rate limit")
        return
    q.limit(group="*", rate_per_s=rate, burst=max(1, int(rate // 10)))
    print(f"flow     {customers} customers, each a group of the queue limited to "
          f"{rate:,.0f} emails/s (queue.limit(group=\"*\", rate_per_s={rate:g})): at most "
          f"{customers * rate:,.0f} emails/s in all")


def _key(email: tuple[str, str]) -> str:
    return f"demo:{email[0]}"


def enqueue(demo: App, c: Campaign, n: int, line: Line, customers: int = CUSTOMERS) -> bool:
    """Write ``n`` jobs into the campaign with ``enqueue_many`` and a dedup key each (in
    slices, to show progress), then seal it. A sealed campaign gets nothing."""
    before = c.stats()
    if before.state != "open":
        line.done(f"enqueue  nothing added: campaign {c.id!r} is {before.state} with "
                  f"{before.total:,} jobs (dedup keys and the seal make a rerun harmless)")
        return True
    task = demo.tasks["send_email"].options(campaign=c)
    step = CHUNK * WINDOW  # one pipelined round trip of enqueue_many
    written = 0
    start = time.perf_counter()
    for customer in range(customers):
        mine = len(range(customer, n, customers))
        items = _emails(n, customer, customers)
        sender = task.options(group=f"customer{customer}")
        done = 0
        while done < mine:
            part = min(step, mine - done)
            ids = sender.enqueue_many((next(items) for _ in range(part)), key_fn=_key)
            done += len(ids)
            written += len(ids)
            elapsed = time.perf_counter() - start
            line.update(f"enqueue  {written:,} / {n:,}  {_rate(written, elapsed)}")
    elapsed = time.perf_counter() - start
    c.seal()
    added = c.stats().total - before.total
    line.done(f"enqueue  {added:,} jobs in {elapsed:.2f} s = {_rate(n, elapsed)} "
              f"(enqueue_many with a dedup key per address; {n - added:,} already there; "
              f"campaign {c.id!r} sealed)")
    return written == n


WORKER_ENV_KEPT = ("BATCHQ_CONCURRENCY", "BATCHQ_FETCH_BATCH", "BATCHQ_LEASE_S",
                   "BATCHQ_NO_METRICS", "BATCHQ_LOG_FORMAT")
"""Worker settings a user may tune through the environment; other ``BATCHQ_*`` variables
(``BATCHQ_PROCESSES``, ``BATCHQ_MAX_JOBS_PER_CHILD``, ...) would change what is measured."""


def _worker_env(demo: App) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BATCHQ_") or k in WORKER_ENV_KEPT}
    env["BATCHQ_REDIS_URL"] = demo.redis_url
    env[NAMESPACE_ENV] = demo.namespace
    return env


def _stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = WORKER_STOP_S) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Bar:
    """The live progress bar (``rich``) on a terminal; nothing elsewhere (``Line``
    prints the numbers)."""

    def __init__(self, c: Campaign, out: IO[str]) -> None:
        self.progress: Any = None
        if out.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn(f"campaign {c.id}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]} jobs/s"), TimeRemainingColumn(),
                TextColumn("failed {task.fields[dead]}"), transient=True)
            self.task = self.progress.add_task("", total=None, rate="-", dead=0)
            self.progress.start()

    def update(self, done: int, total: int, rate: float, dead: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done, total=total or None,
                                 rate=f"{rate:,.0f}", dead=dead)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def drain(demo: App, c: Campaign, line: Line, log: IO[bytes], limit_per_s: float = 0.0,
          ) -> tuple[int | None, QueueStats]:
    """Run one burst worker to the end, showing progress. Returns its exit code (None if
    it had to be stopped) and the queue's final counts."""
    queue = demo.queue(QUEUE)
    n = c.stats().total
    bar = Bar(c, sys.stdout)
    cmd = [sys.executable, "-m", "batchq", "worker", "batchq.dev.demo:app", "--burst",
           "--queues", QUEUE, "--log-level", "WARNING"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_worker_env(demo), stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        last_pending, last_move = -1, start
        first: tuple[float, int] | None = None  # when jobs were first seen done, how many
        prev_t, prev_done, speed = start, 0, -1.0
        code: int | None = None
        while code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=POLL_S)
            now = time.perf_counter()
            if code is not None:
                break
            st = queue.stats()
            cs = c.stats()
            done = cs.total - cs.pending
            if done > 0 and first is None:
                first = (now, done)
            rate = (done - prev_done) / (now - prev_t)
            speed = rate if speed < 0 else 0.5 * speed + 0.5 * rate  # smoothed a little
            prev_t, prev_done = now, done
            bar.update(done, cs.total, max(speed, 0), cs.dead)
            if bar.progress is None:
                line.update(f"drain    {done:,} / {n:,} done  {max(speed, 0):,.0f} jobs/s  "
                            f"ready {st.ready:,}  reserved {st.reserved:,}")
            if st.pending != last_pending:
                last_pending, last_move = st.pending, now
            elif now - last_move > (EXIT_GRACE_S if st.pending == 0 else STALL_S):
                what = ("the worker did not exit although the queue is empty"
                        if st.pending == 0 else "nothing moved")
                line.done(f"drain    stalled: {what} for {now - last_move:.0f} s "
                          f"({_counts(st)}); stopping the worker")
                _stop_worker(proc, timeout_s=5.0)
                return None, queue.stats()
        bar.close()
        elapsed = time.perf_counter() - start
        st = queue.stats()
        cs = c.stats()
        done = cs.total - cs.pending
        steady = ""
        if first is not None and done > first[1] and elapsed - (first[0] - start) > 0:
            steady = f", {_rate(done - first[1], elapsed - (first[0] - start))} once running"
        line.done(f"drain    {done:,} / {n:,} jobs done in {elapsed:.2f} s = "
                  f"{_rate(done, elapsed)} (worker start to exit{steady})")
        if limit_per_s > 0 and first is not None and elapsed - (first[0] - start) > 0:
            achieved = (done - first[1]) / (elapsed - (first[0] - start))
            line.done(f"flow     limit {limit_per_s:,.0f} emails/s in all; achieved "
                      f"{achieved:,.0f} emails/s once running "
                      f"({achieved / limit_per_s:.0%} of the limit)")
        return code, st
    finally:
        bar.close()
        _stop_worker(proc)


def _show_log(log: IO[bytes], title: str) -> None:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace").strip()
    if text:
        lines = text.splitlines()
        print(f"{title} ({len(lines)} lines, last 20):", file=sys.stderr)
        for ln in lines[-20:]:
            print(f"  {ln}", file=sys.stderr)


def _callbacks(demo: App) -> None:
    """Run the campaign's on_complete here (it prints the summary)."""
    settings = WorkerSettings(queues=(CALLBACKS,), burst=True, metrics=False,
                              install_signal_handlers=False, concurrency=1)
    asyncio.run(Worker(demo, settings).run())


def run(redis_url: str, n: int, campaign_id: str | None = None,
        namespace: str | None = None, customers: int = CUSTOMERS,
        rate: float = RATE_PER_CUSTOMER) -> int:
    """The demo against ``redis_url``; returns the exit code. With neither
    ``campaign_id`` nor ``namespace`` it works in a namespace of its own, deleted at the
    end; otherwise the campaign stays (a second run adds nothing)."""
    private = campaign_id is None and namespace is None
    namespace = namespace or (f"demo{uuid.uuid4().hex[:8]}" if private else DEFAULT_NAMESPACE)
    demo = make_app(redis_url, namespace)
    line = Line(sys.stdout)
    ok = False
    try:
        c = demo.campaign(campaign_id or f"emails-{uuid.uuid4().hex[:8]}",
                          on_complete=demo.tasks["campaign_done"])
        print(f"queue    {QUEUE!r} in namespace {namespace!r}; task send_email(to, subject): "
              f"simulated, no network; campaign {c.id!r}")
        limit(demo, customers, rate)
        if not enqueue(demo, c, n, line, customers):
            print("FAILED: enqueue_many returned fewer ids than items", file=sys.stderr)
            return 1
        print("worker   batchq worker batchq.dev.demo:app --burst  (1 process, "
              f"concurrency {os.environ.get('BATCHQ_CONCURRENCY', '100')})")
        with tempfile.TemporaryFile() as log:
            code, st = drain(demo, c, line, log, customers * rate)
            problems = []
            if code != 0:
                problems.append("worker did not finish" if code is None
                                else f"worker exited {code}")
            if st.pending or st.dead:
                problems.append(f"jobs left: {_counts(st)}")
            if not problems:
                _callbacks(demo)
                cs = c.stats()
                if not cs.done or cs.pending or cs.succeeded != cs.total:
                    problems.append(f"campaign not complete: {cs}")
                elif demo.queue(CALLBACKS).stats().pending:
                    problems.append("the completion callback did not run")
            if problems:
                _show_log(log, "worker log")
                print(f"FAILED: {'; '.join(problems)} (namespace {namespace!r} kept for "
                      "inspection)", file=sys.stderr)
                return 1
            _show_log(log, "worker warnings")
        print(f"check    worker exit 0; {_counts(st)}: OK")
        ok = True
        return 0
    finally:
        if ok and private:  # leave nothing behind in a shared Redis
            keys = list(demo.redis.scan_iter(match=f"{namespace}:*", count=1000))
            for i in range(0, len(keys), 500):
                demo.redis.delete(*keys[i : i + 500])
        demo.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m batchq.dev.demo",
        description="Enqueue fake emails and drain them with one batchq burst worker. "
        "Uses $BATCHQ_REDIS_URL, or an embedded Valkey when it is unset.")
    p.add_argument("--jobs", type=int, default=100_000, metavar="N",
                   help="how many jobs to enqueue and run (default 100,000)")
    p.add_argument("--campaign", default=None, metavar="ID",
                   help="the campaign id; run again with the same id to see nothing added "
                   "(default: a new one, deleted at the end)")
    p.add_argument("--customers", type=int, default=CUSTOMERS, metavar="N",
                   help=f"customers the emails are sent for, one group each (default "
                   f"{CUSTOMERS})")
    p.add_argument("--rate-per-customer", type=float, default=RATE_PER_CUSTOMER,
                   metavar="R", help=f"emails a second per customer at most (default "
                   f"{RATE_PER_CUSTOMER:,.0f}; 0: no limit)")
    p.add_argument("--namespace", default=None, metavar="NS",
                   help=f"key namespace (default {DEFAULT_NAMESPACE} with --campaign, else a "
                   "new one, deleted at the end)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        print("--jobs must be at least 1", file=sys.stderr)
        return 2
    if not 1 <= args.customers <= 1000:
        print("--customers must be in 1..1000", file=sys.stderr)
        return 2
    if not 0 <= args.rate_per_customer <= 1_000_000 \
            or args.rate_per_customer != args.rate_per_customer:
        print("--rate-per-customer must be in 0..1,000,000", file=sys.stderr)
        return 2
    try:
        if args.campaign is not None:
            check_campaign_id(args.campaign)
        if args.namespace is not None:
            App("redis://127.0.0.1:1/0", args.namespace)
    except ValueError as exc:
        print(f"python -m batchq.dev.demo: {exc}", file=sys.stderr)
        return 2
    print(f"batchq demo: {args.jobs:,} fake emails through one burst worker")
    url = os.environ.get("BATCHQ_REDIS_URL")
    try:
        if url:
            print(f"redis    {redact(url)} (from $BATCHQ_REDIS_URL)")
            return run(url, args.jobs, args.campaign, args.namespace, args.customers,
                       args.rate_per_customer)
        with EmbeddedServer() as server:
            print(f"redis    embedded Valkey at {server.url} ($BATCHQ_REDIS_URL is unset; "
                  "stopped at the end)")
            return run(server.url, args.jobs, args.campaign, args.namespace,
                       args.customers, args.rate_per_customer)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"\nFAILED: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
