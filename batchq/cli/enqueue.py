"""``batchq enqueue APP TASK --from FILE.jsonl``: stream a JSON-lines file into a task.

Each line is ``{"args": [...], "kwargs": {...}}`` (either key optional) or a JSON array of
positional arguments. Lines are checked (JSON, shape, the task's signature, encodability,
size) and sent in chunks with ``enqueue_many``. Progress is kept in
``FILE.batchq-progress`` (atomically replaced after each chunk), so an interrupted run
resumes where it stopped; when a run finishes, the file records that, and a rerun of the
same file says so and enqueues nothing unless ``--again`` is given. A line that cannot be
read for any reason (nested too deeply, not encodable) is a bad line like any other.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from types import FrameType
from typing import IO, Any

import redis

from ..produce.producer import Call
from ..store import codec
from ..store.connection import redact
from ..tasks.errors import EnqueueError
from ..tasks.task import Task
from ..worker import exitcodes
from .common import (
    Fail,
    add_common,
    app_and,
    duration,
    err,
    guarded,
    out,
    target,
    unreachable,
    usage,
)
from .flags import int_at_least

STATE_SUFFIX = ".batchq-progress"
PROGRESS_EVERY_S = 0.2
"""Progress line refresh period on a terminal (5 per second at most)."""
PROGRESS_EVERY_PLAIN_S = 1.0
"""Progress line period when forced on a non-terminal (one line each)."""
MAX_BAD_REPORTS = 100
"""Bad lines reported one by one; the rest are only counted."""
MIN_MAX_LINE_BYTES = 1 << 20
"""The least default of ``--max-line-bytes`` (the default is twice the app's
``max_payload_bytes``: a JSON line is longer than the job it encodes)."""
MAX_CHUNK = 100_000
"""``--chunk``: lines held before one ``enqueue_many``."""
MAX_START_LINE = 10**12
MAX_LINE_BYTES = 1 << 30
"""``--max-line-bytes``: at most a GiB, held in memory at once."""
SKIP_CHUNK_BYTES = 1 << 16
"""How much of a line over the limit is read at a time while it is skipped."""

class _Progress:
    """One progress line on stderr, refreshed at most every ``every`` seconds."""

    def __init__(self, enabled: bool, tty: bool, total_bytes: int) -> None:
        self.enabled = enabled
        self.tty = tty
        self.total = total_bytes
        self.every = PROGRESS_EVERY_S if tty else PROGRESS_EVERY_PLAIN_S
        self.t0 = time.monotonic()
        self.b0: int | None = None
        self.last = 0.0
        self.shown = False

    def start(self, pos: int) -> None:
        """Rates count from here (lines before a resume point are not work done)."""
        self.t0 = time.monotonic()
        self.b0 = pos

    def update(self, line: int, enqueued: int, skipped: int, pos: int,
               force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        rate = enqueued / elapsed
        b0 = self.b0 if self.b0 is not None else pos
        done = pos - b0
        eta = "-"
        if done > 0 and self.total > pos:
            eta = duration((self.total - pos) * elapsed / done)
        elif self.total <= pos:
            eta = "0s"
        pct = f"{100 * pos / self.total:5.1f}%" if self.total else "  ---"
        text = (f"line {line:,}  {enqueued:,} enqueued  {skipped:,} skipped  "
                f"{rate:,.0f} jobs/s  {pct}  ETA {eta}")
        if self.tty:
            err(f"\r{text}\x1b[K", end="")
            self.shown = True
        else:
            err(text)

    def clear(self) -> None:
        """Erase the line before other stderr output (terminal only)."""
        if self.shown:
            err("\r\x1b[K", end="")
            self.shown = False


def _write_state(path: str, state: dict[str, Any]) -> None:
    """Atomically replace the state file (temp file in the same directory + rename)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_state(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if isinstance(raw, int):
            raw = {"next_line": raw}
        if not isinstance(raw, dict) or not isinstance(raw.get("next_line"), int) \
                or raw["next_line"] < 1:
            raise ValueError("no valid next_line")
        return raw
    except (OSError, ValueError) as exc:
        raise Fail(exitcodes.EXIT_ERROR, f"cannot use the progress file {path}: {exc}; delete it "
                    "or pass --start-line N") from None


class _LineChecker:
    """Turns one line of the input file into the arguments of one job, or a problem."""

    def __init__(self, task: Task[..., Any]) -> None:
        self.task = task
        self.sig: inspect.Signature | None = None
        if not task.is_batch:
            with contextlib.suppress(TypeError, ValueError):
                sig = inspect.signature(task.fn)
                empty = inspect.Parameter.empty
                # shown in messages: names and defaults, not annotations
                self.sig = sig.replace(
                    parameters=[p.replace(annotation=empty) for p in sig.parameters.values()],
                    return_annotation=inspect.Signature.empty)
        c = task.config
        # an encoded job is "<header><id>:<body>"; ids may grow by a character or two
        self.overhead = len(codec.header(c.priority, c.max_attempts)) \
            + len(codec.new_id()) + 3
        self.limit = task.app.max_payload_bytes

    def parse(self, raw: bytes) -> tuple[Call | None, str | None]:
        """``(call, None)``, ``(None, problem)``, or ``(None, None)`` for a blank line."""
        if not raw.strip():
            return None, None
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            return None, f"invalid JSON: {exc}"
        except RecursionError:
            return None, "JSON nested too deeply to read"
        if isinstance(obj, list):
            args, kwargs = obj, {}
        elif isinstance(obj, dict):
            extra = sorted(set(obj) - {"args", "kwargs"})
            if extra:
                return None, (f"unknown key{'s' if len(extra) > 1 else ''} "
                              f"{', '.join(map(repr, extra))}: expected "
                              '{"args": [...], "kwargs": {...}}')
            args, kwargs = obj.get("args", []), obj.get("kwargs", {})
            if not isinstance(args, list):
                return None, f'"args" must be a JSON array, got {type(args).__name__}'
            if not isinstance(kwargs, dict):
                return None, f'"kwargs" must be a JSON object, got {type(kwargs).__name__}'
        else:
            return None, (f"expected a JSON object or array, got {type(obj).__name__}: "
                          '{"args": [...], "kwargs": {...}} or [arg, ...]')
        if self.sig is not None:
            try:
                self.sig.bind(*args, **kwargs)
            except TypeError as exc:
                return None, f"arguments do not match {self.task.name}{self.sig}: {exc}"
        try:
            body = codec.encode_body(self.task.name, args, kwargs, int(time.time() * 1000))
        except (TypeError, ValueError) as exc:
            return None, str(exc)
        except RecursionError:
            return None, "arguments nested too deeply to encode"
        size = self.overhead + len(body)
        if size > self.limit:
            return None, (f"encoded job is about {size} bytes, above the app's limit of "
                          f"{self.limit} (max_payload_bytes)")
        return Call(*args, **kwargs), None


def _lines(f: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None, int, int]]:
    """``(line number from 1, line, byte offset after it, its length without the
    newline)``, streamed. A line longer than ``max_bytes`` comes as ``None``: it is read
    past in chunks, never held whole."""
    pos = 0
    n = 0
    while True:
        raw = f.readline(max_bytes + 1)
        if not raw:
            return
        n += 1
        size = len(raw)
        if size > max_bytes and not raw.endswith(b"\n"):
            tail = raw
            while tail and not tail.endswith(b"\n"):
                tail = f.readline(SKIP_CHUNK_BYTES)
                size += len(tail)
            pos += size
            yield n, None, pos, size - tail.endswith(b"\n")
            continue
        pos += size
        yield n, raw, pos, size - raw.endswith(b"\n")


def cmd_enqueue(args: argparse.Namespace) -> int:
    args.app, loaded, task_name = app_and([args.app, args.task], "TASK")
    if loaded is None:
        raise usage(f"enqueue needs MODULE:APP and a TASK, got {args.app!r} and "
                    f"{task_name!r}")
    t = target(args, loaded)
    task = t.app.tasks.get(task_name)
    if task is None:
        names = ", ".join(sorted(t.app.tasks)) or "(none)"
        raise usage(f"{args.app} has no task {task_name!r}; its tasks: {names}")
    path: str = args.from_file
    state_path = path + STATE_SUFFIX
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after a long loop
    except OSError as exc:
        raise Fail(exitcodes.EXIT_ERROR, f"cannot read {path}: {exc.strerror or exc}") \
            from None
    with f:
        t.app.redis.ping()  # fail fast (exit 4) before reading a line
        size = os.fstat(f.fileno()).st_size
        start = 1
        if args.start_line is not None:
            start = args.start_line
        elif os.path.exists(state_path) and not args.again:
            state = _read_state(state_path)
            for what, mine in (("task", task.name), ("namespace", t.namespace)):
                if state.get(what, mine) != mine:
                    raise Fail(exitcodes.EXIT_ERROR, f"the progress file {state_path} "
                               f"belongs to {what} {state[what]!r}, not {mine!r}; delete "
                               "it, or pass --again (start over) or --start-line N")
            if state.get("finished"):
                err(f"batchq enqueue: {path} was already enqueued completely "
                    f"({state.get('enqueued', '?')} jobs to task {task.name} in namespace "
                    f"{t.namespace}; progress file {state_path}); nothing to do. "
                    "--again enqueues the whole file again")
                return exitcodes.EXIT_OK
            start = state["next_line"]
            err(f"batchq enqueue: resuming from line {start} (progress file {state_path}; "
                "--again starts over)")
        return _enqueue_stream(args, task, f, size, start, state_path)


def _enqueue_stream(args: argparse.Namespace, task: Task[..., Any], f: IO[bytes], size: int,
                    start: int, state_path: str) -> int:
    path: str = args.from_file
    tty = sys.stderr.isatty()
    progress = _Progress(tty if args.progress is None else args.progress, tty, size)
    checker = _LineChecker(task)
    max_line: int = args.max_line_bytes or max(MIN_MAX_LINE_BYTES,
                                                2 * task.app.max_payload_bytes)
    abort = args.on_error == "abort"
    enqueued = skipped = reported = 0
    calls: list[Call] = []
    call_lines: list[int] = []
    in_chunk = 0
    line = start - 1
    pos = 0
    state_ok = True
    t0 = time.monotonic()
    stop_signal: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # the first Ctrl-C (or SIGTERM) stops cleanly after the line being read, so the
        # progress file matches what Redis has; a second one interrupts at once
        if stop_signal:
            raise KeyboardInterrupt
        stop_signal.append(signum)

    def save(next_line: int, finished: bool = False) -> None:
        nonlocal state_ok
        if not state_ok:
            return
        try:
            _write_state(state_path, {"next_line": next_line, "task": task.name,
                                      "namespace": task.app.namespace,
                                      "file": os.path.abspath(path), "enqueued": enqueued,
                                      "finished": finished})
        except OSError as exc:
            state_ok = False
            progress.clear()
            err(f"batchq enqueue: cannot write the progress file {state_path} ({exc}); "
                 "continuing without resume support")

    def flush(next_line: int) -> None:
        nonlocal enqueued
        if calls:
            try:
                task.enqueue_many(calls)
            except EnqueueError as exc:
                enqueued += exc.written
                resume_at = call_lines[exc.written] if exc.written < len(calls) else next_line
                save(resume_at)
                raise _Stop(exc, resume_at, exc.unknown) from exc
            enqueued += len(calls)
            calls.clear()
            call_lines.clear()
        save(next_line)

    def bad(n: int, problem: str) -> None:
        nonlocal reported
        reported += 1
        if reported <= MAX_BAD_REPORTS:
            progress.clear()
            err(f"batchq enqueue: {path}:{n}: {problem}")
            if reported == MAX_BAD_REPORTS and not abort:
                err("batchq enqueue: further bad lines are counted, not shown")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        started = False
        line_start = 0
        for n, raw, pos, nbytes in _lines(f, max_line):
            if n < start:
                line_start = pos
                continue
            if not started:
                started = True
                progress.start(line_start)
            line = n
            in_chunk += 1
            item, problem = checker.parse(raw) if raw is not None else (
                None, f"line of {nbytes:,} bytes, above the limit of {max_line:,} "
                "(--max-line-bytes): not read")
            if problem is not None:
                bad(n, problem)
                if abort:
                    flush(n)
                    progress.clear()
                    err(f"batchq enqueue: aborted at line {n}: {enqueued} enqueued before "
                         f"it; fix the line and run again to resume from line {n} "
                         f"(progress file {state_path})")
                    return exitcodes.EXIT_ERROR
                skipped += 1
            elif item is not None:
                calls.append(item)
                call_lines.append(n)
            if in_chunk >= args.chunk:
                flush(n + 1)
                in_chunk = 0
                progress.update(n, enqueued, skipped, pos)
            elif n & 0xFF == 0:
                progress.update(n, enqueued, skipped, pos)
            if stop_signal:
                flush(n + 1)
                progress.clear()
                err(f"batchq enqueue: stopped by {signal.Signals(stop_signal[0]).name} after "
                     f"line {n}: {enqueued} enqueued; run again to resume from line {n + 1} "
                     f"(progress file {state_path})")
                return exitcodes.EXIT_ERROR
        flush(line + 1)
    except _Stop as stop:
        progress.clear()
        exc = stop.error
        code = exitcodes.EXIT_REDIS if isinstance(exc.__cause__, redis.ConnectionError
                                            | redis.TimeoutError) else exitcodes.EXIT_ERROR
        doubt = (f"; {stop.unknown} jobs may or may not have been written and may be sent "
                 "twice on resume" if stop.unknown else "")
        err(f"batchq enqueue: {exc}. {enqueued} enqueued in all; run again to resume from "
             f"line {stop.resume_at}{doubt}")
        return code
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        progress.clear()
        err(f"batchq enqueue: {unreachable(args.resolved_url, exc)}. {enqueued} enqueued; "
             f"run again to resume from line {_resume_line(state_path, start)}")
        return exitcodes.EXIT_REDIS
    except (TypeError, ValueError) as exc:  # a job the line check let through
        progress.clear()
        err(f"batchq enqueue: near line {line}: {exc}. {enqueued} enqueued; run again to "
             f"resume from line {_resume_line(state_path, start)}")
        return exitcodes.EXIT_ERROR
    except KeyboardInterrupt:
        progress.clear()
        err(f"batchq enqueue: interrupted: {enqueued} enqueued; run again to resume from "
             f"line {_resume_line(state_path, start)} (jobs sent just before may be sent "
             "again)")
        return exitcodes.EXIT_ERROR
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not tty:  # a terminal's line is about to be replaced by the summary
        progress.update(line, enqueued, skipped, pos or size, force=True)
    progress.clear()
    # kept, marked finished: a rerun of the same file then enqueues nothing by mistake
    save(line + 1, finished=True)
    elapsed = time.monotonic() - t0
    rate = enqueued / elapsed if elapsed > 0 else 0.0
    out(f"{enqueued} enqueued, {skipped} skipped in {elapsed:.2f}s ({rate:,.0f} jobs/s) "
         f"to queue {task.queue} of {_task_where(task)}")
    return exitcodes.EXIT_OK


def _task_where(task: Task[..., Any]) -> str:
    return f"namespace {task.app.namespace} at {redact(task.app.redis_url)}"


def _resume_line(state_path: str, default: int) -> int:
    try:
        return int(_read_state(state_path)["next_line"])
    except Fail:
        return default


class _Stop(Exception):
    def __init__(self, error: EnqueueError, resume_at: int, unknown: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.resume_at = resume_at
        self.unknown = unknown




def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "enqueue", help="enqueue jobs from a JSON-lines file",
        description='Each line is {"args": [...], "kwargs": {...}} (either key optional) '
        "or a JSON array of positional arguments. The file is streamed and written in "
        f"chunks; progress is kept in FILE{STATE_SUFFIX} so an interrupted run resumes, "
        "and a rerun of a file that finished enqueues nothing unless --again is given.")
    p.add_argument("app", metavar="MODULE:APP", help="the app defining the task")
    p.add_argument("task", metavar="TASK", help="task name")
    p.add_argument("--from", dest="from_file", required=True, metavar="FILE.jsonl",
                   help="the JSON-lines file, one job per line")
    p.add_argument("--chunk", type=int_at_least(1, MAX_CHUNK), default=1000, metavar="N",
                   help="lines per enqueue_many call (default 1000)")
    p.add_argument("--start-line", type=int_at_least(1, MAX_START_LINE), default=None,
                   metavar="N",
                   help="start at line N (1-based), ignoring a progress file")
    p.add_argument("--max-line-bytes", type=int_at_least(1, MAX_LINE_BYTES), default=None,
                   metavar="N", help="a longer line is a bad line, skipped without being "
                   "read whole [default twice the app's max_payload_bytes, at least "
                   f"{MIN_MAX_LINE_BYTES:,}]")
    p.add_argument("--again", action="store_true",
                   help="start over at line 1 even if the progress file says the file was "
                   "enqueued completely (or partly)")
    p.add_argument("--on-error", choices=("skip", "abort"), default="skip",
                   help="bad line: skip and count it (default), or stop there")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    add_common(p, app=False)
    p.set_defaults(handler=guarded("enqueue", cmd_enqueue))
