"""``make demo``: enqueue fake emails, drain them with one burst worker, check the result.

``python -m batchq.dev.demo [--jobs N]``. Without ``$BATCHQ_REDIS_URL`` an embedded Valkey is
started for the run. Jobs are written with ``enqueue_many``; a real ``batchq worker``
subprocess (``--burst``: it exits once the queue is empty) runs them while this process
shows progress from ``Queue.stats()``. Exit code 0 only if the worker exited 0 and every
job was acknowledged: nothing ready, delayed, reserved or dead.

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
from typing import IO

import redis

from .. import App, QueueStats
from ..connection import redact
from ..keys import queues_key
from ..producer import CHUNK, WINDOW
from .server import EmbeddedServer

NAMESPACE_ENV = "BATCHQ_DEMO_NAMESPACE"
DEFAULT_NAMESPACE = "batchq-demo"
QUEUE = "emails"
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


def make_app(redis_url: str | None = None, namespace: str | None = None) -> App:
    """The demo app: ``send_email`` on the ``emails`` queue.

    ``None`` reads the environment (``$BATCHQ_REDIS_URL``, ``$BATCHQ_DEMO_NAMESPACE``),
    which is how the worker subprocess gets this run's server and namespace.
    """
    demo = App(redis_url, namespace or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE)
    demo.task(queue=QUEUE)(send_email)
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


def _emails(n: int) -> Iterator[tuple[str, str]]:
    for i in range(n):
        yield f"user{i}@example.com", f"Your weekly digest #{i}"


def enqueue(demo: App, n: int, line: Line) -> bool:
    """Write ``n`` jobs with ``enqueue_many`` (in slices, to show progress)."""
    task = demo.tasks["send_email"]
    step = CHUNK * WINDOW  # one pipelined round trip of enqueue_many
    written = 0
    start = time.perf_counter()
    items = _emails(n)
    while written < n:
        part = min(step, n - written)
        ids = task.enqueue_many(next(items) for _ in range(part))
        written += len(ids)
        elapsed = time.perf_counter() - start
        line.update(f"enqueue  {written:,} / {n:,}  {_rate(written, elapsed)}")
    elapsed = time.perf_counter() - start
    line.done(f"enqueue  {n:,} jobs in {elapsed:.2f} s = {_rate(n, elapsed)} "
              f"(enqueue_many, {CHUNK:,} jobs per script call)")
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


def drain(demo: App, n: int, line: Line, log: IO[bytes]) -> tuple[int | None, QueueStats]:
    """Run one burst worker to the end, showing progress. Returns its exit code (None if
    it had to be stopped) and the queue's final counts."""
    queue = demo.queue(QUEUE)
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
            done = n - st.pending
            if done > 0 and first is None:
                first = (now, done)
            rate = (done - prev_done) / (now - prev_t)
            speed = rate if speed < 0 else 0.5 * speed + 0.5 * rate  # smoothed a little
            prev_t, prev_done = now, done
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
        elapsed = time.perf_counter() - start
        st = queue.stats()
        done = n - st.pending
        steady = ""
        if first is not None and done > first[1] and elapsed - (first[0] - start) > 0:
            steady = f", {_rate(done - first[1], elapsed - (first[0] - start))} once running"
        line.done(f"drain    {done:,} / {n:,} jobs done in {elapsed:.2f} s = "
                  f"{_rate(done, elapsed)} (worker start to exit{steady})")
        return code, st
    finally:
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


def run(redis_url: str, n: int) -> int:
    """The demo against ``redis_url`` in a namespace of its own; returns the exit code."""
    namespace = f"demo{uuid.uuid4().hex[:8]}"
    demo = make_app(redis_url, namespace)
    line = Line(sys.stdout)
    ok = False
    try:
        print(f"queue    {QUEUE!r} in namespace {namespace!r}; task send_email(to, subject): "
              "simulated, no network")
        if not enqueue(demo, n, line):
            print("FAILED: enqueue_many returned fewer ids than items", file=sys.stderr)
            return 1
        print("worker   batchq worker batchq.dev.demo:app --burst  (1 process, "
              f"concurrency {os.environ.get('BATCHQ_CONCURRENCY', '100')})")
        with tempfile.TemporaryFile() as log:
            code, st = drain(demo, n, line, log)
            problems = []
            if code != 0:
                problems.append("worker did not finish" if code is None
                                else f"worker exited {code}")
            if st.pending or st.dead:
                problems.append(f"jobs left: {_counts(st)}")
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
        if ok:  # leave nothing behind in a shared Redis
            demo.queue(QUEUE).clear()
            demo.redis.delete(queues_key(namespace))
        demo.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m batchq.dev.demo",
        description="Enqueue fake emails and drain them with one batchq burst worker. "
        "Uses $BATCHQ_REDIS_URL, or an embedded Valkey when it is unset.")
    p.add_argument("--jobs", type=int, default=100_000, metavar="N",
                   help="how many jobs to enqueue and run (default 100,000)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1:
        print("--jobs must be at least 1", file=sys.stderr)
        return 2
    print(f"batchq demo: {args.jobs:,} fake emails through one burst worker")
    url = os.environ.get("BATCHQ_REDIS_URL")
    try:
        if url:
            print(f"redis    {redact(url)} (from $BATCHQ_REDIS_URL)")
            return run(url, args.jobs)
        with EmbeddedServer() as server:
            print(f"redis    embedded Valkey at {server.url} ($BATCHQ_REDIS_URL is unset; "
                  "stopped at the end)")
            return run(server.url, args.jobs)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"\nFAILED: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
