"""Handler-side timing: what the benchmark handlers record and how it reaches the harness.

Every benchmark handler (batchq's and each peer's) calls ``job()`` or ``sample()`` with
wall-clock times (``time.time()``) taken at handler entry and exit; that costs a lock
and a few comparisons, never a Redis call. A reporter writes the per-process totals to
Redis every ``FLUSH_EVERY_S``:

* ``<key>:procs`` hash, field ``<host>:<pid>`` = ``"<jobs> <first start> <last end>"``
  (overwritten each time, so re-sending is harmless);
* ``<key>:samples`` list of packed float64 quadruples (intended send, actual send,
  handler start, handler end), and ``<key>:n`` the number of samples pushed (both in
  one MULTI).

The reporter is a daemon thread (``start_thread``: peers, whatever their concurrency
model) or an asyncio task in the worker's loop (``ensure_task``: batchq). The task
writes a last report when it is cancelled, which ``asyncio.Runner`` does to every
remaining task when ``batchq.run_worker`` returns, so a ``--burst`` worker that exits
on its own still reports its last jobs.

Only the standard library and redis-py are imported: peers' virtualenvs load this too.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import threading
import time
from typing import Any

import redis

FLUSH_EVERY_S = 0.05
KEY_ENV = "BENCH_KEY"
URL_ENV = "BENCH_REDIS_URL"


class Recorder:
    """Per-process accumulator of job timings (thread-safe)."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key
        self.field = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self.jobs = 0
        self.first_start = 0.0
        self.last_end = 0.0
        self._samples = array.array("d")
        self._dirty = False
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        # a forked child (a batchq or celery prefork child) starts from zero
        self._pid = os.getpid()
        self.field = f"{socket.gethostname()}:{self._pid}"
        self._lock = threading.Lock()
        self.jobs = 0
        self.first_start = self.last_end = 0.0
        self._samples = array.array("d")
        self._dirty = False
        self._thread = None
        self._task = None

    def job(self, start: float, end: float, n: int = 1) -> None:
        """``n`` jobs ran between ``start`` and ``end`` (a batch counts each of its jobs)."""
        with self._lock:
            if self.jobs == 0 or start < self.first_start:
                self.first_start = start
            if end > self.last_end:
                self.last_end = end
            self.jobs += n
            self._dirty = True

    def sample(self, intended: float, sent: float, start: float, end: float) -> None:
        """One latency job: its intended and actual send times, handler start and end."""
        with self._lock:
            if self.jobs == 0 or start < self.first_start:
                self.first_start = start
            if end > self.last_end:
                self.last_end = end
            self.jobs += 1
            self._samples.extend((intended, sent, start, end))
            self._dirty = True

    def _take(self) -> tuple[str, bytes] | None:
        with self._lock:
            if not self._dirty:
                return None
            self._dirty = False
            totals = f"{self.jobs} {self.first_start:.6f} {self.last_end:.6f}"
            packed = self._samples.tobytes()
            self._samples = array.array("d")
        return totals, packed

    def _put_back(self, packed: bytes) -> None:
        with self._lock:
            back = array.array("d")
            back.frombytes(packed)
            back.extend(self._samples)
            self._samples = back
            self._dirty = True

    def _fill(self, pipe: Any, totals: str, packed: bytes) -> None:
        pipe.hset(f"{self.key}:procs", self.field, totals)
        if packed:
            pipe.rpush(f"{self.key}:samples", packed)
            pipe.incrby(f"{self.key}:n", len(packed) // 32)

    # --- a reporter thread (any process model) -------------------------------------

    def start_thread(self) -> None:
        """Start the reporter thread of this process, once."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._thread_main, name="bench-reporter",
                                            daemon=True)
            self._thread.start()

    def _thread_main(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        while True:
            time.sleep(FLUSH_EVERY_S)
            got = self._take()
            if got is None:
                continue
            try:
                pipe = client.pipeline(transaction=True)
                self._fill(pipe, *got)
                pipe.execute()
            except redis.RedisError:
                self._put_back(got[1])

    # --- a reporter task (asyncio workers) ----------------------------------------

    def ensure_task(self) -> None:
        """Start the reporter task in the running loop, once per loop."""
        t = self._task
        if t is None or t.done():
            self._task = asyncio.get_running_loop().create_task(self._task_main(),
                                                                  name="bench-reporter")

    async def _task_main(self) -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(self.redis_url)
        me = asyncio.current_task()
        try:
            while me is None or not me.cancelling():
                # redis-py may complete a command and swallow a cancellation that
                # arrived meanwhile: hence the cancelling() check, not just the except
                try:
                    await asyncio.sleep(FLUSH_EVERY_S)
                    await self._aflush(client)
                except asyncio.CancelledError:
                    break
                except (redis.RedisError, OSError):
                    pass
            # the worker is exiting: report what the last jobs did
            with contextlib.suppress(redis.RedisError, OSError, asyncio.CancelledError):
                await self._aflush(client)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _aflush(self, client: Any) -> None:
        got = self._take()
        if got is None:
            return
        try:
            pipe = client.pipeline(transaction=True)
            self._fill(pipe, *got)
            await pipe.execute()
        except BaseException:
            self._put_back(got[1])
            raise


# --- the harness side ----------------------------------------------------------------


def read_totals(client: redis.Redis, key: str) -> tuple[int, float, float, int]:
    """``(jobs, first start, last end, processes)`` summed over every reporting process."""
    raw = client.hgetall(f"{key}:procs")
    jobs, first, last = 0, 0.0, 0.0
    for value in raw.values():
        n_s, start_s, end_s = value.split()
        n, start, end = int(n_s), float(start_s), float(end_s)
        if n == 0:
            continue
        first = start if jobs == 0 else min(first, start)
        last = max(last, end)
        jobs += n
    return jobs, first, last, len(raw)


def samples_count(client: redis.Redis, key: str) -> int:
    return int(client.get(f"{key}:n") or 0)


def take_samples(client: redis.Redis, key: str) -> array.array[float]:
    """Every sample pushed so far, flat (intended, sent, start, end, ...); clears them."""
    pipe = client.pipeline(transaction=True)
    pipe.lrange(f"{key}:samples", 0, -1)
    pipe.delete(f"{key}:samples", f"{key}:n")
    chunks, _ = pipe.execute()
    out = array.array("d")
    for c in chunks:
        out.frombytes(c)
    return out


def reset(client: redis.Redis, key: str) -> None:
    client.delete(f"{key}:procs", f"{key}:samples", f"{key}:n")


_recorder: Recorder | None = None


def recorder() -> Recorder:
    """This process's recorder, configured from ``$BENCH_REDIS_URL`` and ``$BENCH_KEY``."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/0"),
                             os.environ.get(KEY_ENV, "bench:rec"))
    return _recorder
