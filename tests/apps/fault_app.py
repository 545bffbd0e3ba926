"""The batchq app the fault tests and ``bench/tools/soak.py`` run (``apps.fault_app:app``).

Every handler records what it did OUTSIDE the queue under test, in a local file per
process: ``$FAULT_RUNS/runs-<pid>.log``, opened with ``O_APPEND`` and written with one
``os.write`` per line (no buffering, so a ``kill -9`` loses nothing already written, and
a Redis that is down or full cannot lose a record)::

    S <token> <job id> <attempt> <pid> <start>            a run began
    E <token> <job id> <attempt> <pid> <start> <end>      it ran to completion
    C <token> <job id> <attempt> <pid> <time>             it swallowed a cancellation

Times are ``CLOCK_REALTIME`` seconds read with ``time.clock_gettime``, never through
``time.time``, so a test that fakes the worker's ``time.time`` (clock skew) still gets
true times, comparable with the Redis server's ``TIME`` on the same host.
``$FAULT_RECORD_STARTS=0`` leaves out the ``S`` lines (the soak: one line per run).

Environment, read at import time: ``BATCHQ_REDIS_URL``, ``FAULT_NS`` (the key namespace;
the module-level ``app`` is ``None`` without it), ``FAULT_RUNS`` (the directory of the
run files; nothing is recorded without it), ``FAULT_SOCKET_TIMEOUT`` (seconds, the
client's socket timeout; default batchq's), ``FAULT_MIN_REPLICAS`` (``App(min_replicas)``).

Tasks (the first argument is always the job's token, unique per job):

* ``work(token, secs=0, mode="")`` — a batch task with ``batch_size=1``, so the handler
  sees its ``Job`` (id and attempt). ``secs`` is an ``asyncio.sleep``. ``mode``:
  ``"poison"`` SIGKILLs its own process on every attempt; ``"stubborn"`` swallows every
  cancellation on its first run and sleeps on forever (later runs, whatever their
  attempt number, finish at once: a marker file in ``$FAULT_RUNS`` remembers);
  ``"fail_once"`` raises on its first attempt; ``"block"`` blocks the event loop
  (``time.sleep``); ``"exit"`` calls ``os._exit(1)``; ``"raise:<kind>"`` raises
  ``hostile(kind)`` on its first attempt (``"raise:<kind>:always"``: on every attempt).
* ``hostile_async(token, kind, always=False)`` / ``hostile_sync(...)`` — raise
  ``hostile(kind)`` (a BaseException that is not an Exception) on their first run, or
  on every run; ``max_attempts=2``.
* ``plain(token, secs=0)`` — the same as a plain ``async def`` task (job id ``-``,
  attempt ``0`` in the records: a plain handler does not see its job).
* ``campaign_done(campaign_id, stats)`` — an ``on_complete`` task: records the token
  ``done:<id>:<total>:<succeeded>:<dead>:<cancelled>:<pending>``.
* ``bulk(jobs)`` — a batch task of up to 100 jobs that does nothing but record (one
  ``write`` per batch, ``S`` lines omitted): cheap enough for hundreds of thousands.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import batchq
from batchq.store.connection import RedisSettings

_CLOCK = time.CLOCK_REALTIME


def now() -> float:
    """True wall-clock seconds (not through ``time.time``, which a test may fake)."""
    return time.clock_gettime(_CLOCK)


class Recorder:
    """Appends run records to ``<directory>/runs-<pid>.log`` (reopened after a fork)."""

    def __init__(self, directory: str | None, starts: bool = True) -> None:
        self.directory = directory
        self.starts = starts
        self._pid = -1
        self._fd = -1

    def _file(self) -> int:
        pid = os.getpid()
        if pid != self._pid:
            assert self.directory is not None
            path = os.path.join(self.directory, f"runs-{pid}.log")
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        return self._fd

    def write(self, lines: str) -> None:
        if self.directory:
            os.write(self._file(), lines.encode())

    def start(self, token: Any, jid: str, attempt: int) -> float:
        t = now()
        if self.starts:
            self.write(f"S {token} {jid} {attempt} {os.getpid()} {t:.6f}\n")
        return t

    def end(self, token: Any, jid: str, attempt: int, t0: float) -> None:
        self.write(f"E {token} {jid} {attempt} {os.getpid()} {t0:.6f} {now():.6f}\n")

    def first_time(self, name: str) -> bool:
        """True for the first caller of ``name`` across every process (a marker file)."""
        if not self.directory:
            return True
        try:
            os.close(os.open(os.path.join(self.directory, name),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return False
        return True

    def cancelled(self, token: Any, jid: str, attempt: int) -> None:
        self.write(f"C {token} {jid} {attempt} {os.getpid()} {now():.6f}\n")


def build(redis_url: str | None, namespace: str, runs_dir: str | None = None, *,
          socket_timeout_s: float | None = None, record_starts: bool = True,
          min_replicas: int = 0) -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace, min_replicas=min_replicas)
    if socket_timeout_s is not None:
        app.redis_settings = RedisSettings(app.redis_url, socket_timeout_s=socket_timeout_s)
    rec = Recorder(runs_dir, record_starts)

    @app.task(batch_size=1, max_attempts=5, retry_backoff_s=0.05, retry_backoff_max_s=0.2)
    async def work(jobs: list[batchq.Job]) -> None:
        for job in jobs:
            token, secs, mode = [*job.args, 0.0, ""][:3]
            t0 = rec.start(token, job.id, job.attempt)
            if mode == "poison":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "exit":
                os._exit(1)
            elif str(mode).startswith("raise:") and (
                    job.attempt == 1 or str(mode).endswith(":always")):
                raise hostile(mode.split(":")[1])
            elif mode == "stubborn" and rec.first_time(f"stubborn-{token}"):
                while True:
                    try:
                        await asyncio.sleep(3600)
                    except asyncio.CancelledError:
                        rec.cancelled(token, job.id, job.attempt)
            elif mode == "fail_once" and job.attempt == 1:
                raise RuntimeError(f"{token} fails on its first attempt")
            elif mode == "block":
                time.sleep(float(secs))
            elif secs:
                await asyncio.sleep(float(secs))
            rec.end(token, job.id, job.attempt, t0)

    @app.task(max_attempts=5)
    async def plain(token: Any, secs: float = 0.0) -> None:
        t0 = rec.start(token, "-", 0)
        if secs:
            await asyncio.sleep(secs)
        rec.end(token, "-", 0, t0)

    @app.task(max_attempts=2, retry_backoff_s=0.05, retry_backoff_max_s=0.1)
    async def hostile_async(token: Any, kind: str, always: bool = False) -> None:
        """Raises ``hostile(kind)`` on its first run (on every run when ``always``)."""
        t0 = rec.start(token, "-", 0)
        if always or rec.first_time(f"hostile-{token}"):
            raise hostile(kind)
        rec.end(token, "-", 0, t0)

    @app.task(max_attempts=2, retry_backoff_s=0.05, retry_backoff_max_s=0.1)
    def hostile_sync(token: Any, kind: str, always: bool = False) -> None:
        """``hostile_async`` as a plain function (run in the thread pool)."""
        t0 = rec.start(token, "-", 0)
        if always or rec.first_time(f"hostile-{token}"):
            raise hostile(kind)
        rec.end(token, "-", 0, t0)

    @app.task(batch_size=100, max_attempts=5)
    async def bulk(jobs: list[batchq.Job]) -> None:
        t = f"{now():.6f}"
        pid = os.getpid()
        rec.write("".join(f"E {j.args[0]} {j.id} {j.attempt} {pid} {t} {t}\n" for j in jobs))

    @app.task(batch_size=1, max_attempts=5)
    async def campaign_done(jobs: list[batchq.Job]) -> None:
        """A campaign's ``on_complete``: records ``done:<id>:<total>:<succeeded>:<dead>:
        <cancelled>:<pending>`` as its token."""
        for job in jobs:
            cid, st = job.args
            token = ":".join(str(x) for x in ("done", cid, st["total"], st["succeeded"],
                                                st["dead"], st["cancelled"], st["pending"]))
            rec.end(token, job.id, job.attempt, rec.start(token, job.id, job.attempt))

    return app


class HandlerBaseException(BaseException):
    """A BaseException that is not an Exception, as a hostile handler raises it."""


def hostile(kind: str) -> BaseException:
    """What a hostile handler raises: ``generator_exit``, ``custom`` (a BaseException
    subclass), ``keyboard``, ``exit0`` (``sys.exit(0)``), ``exit3``, ``cancelled`` (a
    CancelledError nobody asked for)."""
    return {
        "generator_exit": GeneratorExit("hostile"),
        "custom": HandlerBaseException("hostile"),
        "keyboard": KeyboardInterrupt(),
        "exit0": SystemExit(0),
        "exit3": SystemExit(3),
        "cancelled": asyncio.CancelledError(),
    }[kind]


def _env_float(name: str) -> float | None:
    raw = os.environ.get(name)
    return float(raw) if raw else None


app = (
    build(os.environ.get("BATCHQ_REDIS_URL"), os.environ["FAULT_NS"],
          os.environ.get("FAULT_RUNS"), socket_timeout_s=_env_float("FAULT_SOCKET_TIMEOUT"),
          record_starts=os.environ.get("FAULT_RECORD_STARTS", "1") != "0",
          min_replicas=int(os.environ.get("FAULT_MIN_REPLICAS", "0")))
    if os.environ.get("FAULT_NS") else None
)
