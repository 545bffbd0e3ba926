"""Operator commands of the ``batchq`` CLI: info, dead, enqueue, pause, resume, check.

Every command reaches Redis either through an app (``MODULE:APP``) or through
``--redis-url`` / ``--namespace``. The URL is resolved as ``--redis-url`` > the app's URL >
``$BATCHQ_REDIS_URL`` > ``redis://127.0.0.1:6379/0``; the namespace as ``--namespace`` >
the app's > ``$BATCHQ_NAMESPACE`` > ``batchq``. A password is never printed: URLs are
shown redacted, and any text written goes through a last scrub of the known passwords.

Exit codes (as in ``cli``): 0 ok, 1 error, 2 usage, 3 cannot import the app, 4 cannot reach
Redis (``batchq check`` reports every failure, unreachable included, with 1).
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import IO, Any
from urllib.parse import unquote, urlsplit

import redis

from . import cli, codec, exitcodes
from .app import App, Task
from .connection import RedisSettings, redact, resolve_url
from .errors import EnqueueError
from .keys import queues_key, worker_info_key, workers_key
from .producer import Call
from .queue import DeadJob, Queue

Handler = Callable[[argparse.Namespace], int]

DEFAULT_NAMESPACE = "batchq"
NAMESPACE_ENV = "BATCHQ_NAMESPACE"
WORKER_TTL_S = 30.0
"""A registry entry whose heartbeat is older than this is a dead worker."""
STATE_SUFFIX = ".batchq-progress"
PROGRESS_EVERY_S = 0.2
"""Progress line refresh period on a terminal (5 per second at most)."""
PROGRESS_EVERY_PLAIN_S = 1.0
"""Progress line period when forced on a non-terminal (one line each)."""
MAX_BAD_REPORTS = 100
"""Bad lines reported one by one; the rest are only counted."""
DEAD_LIST_LIMIT = 100
CLEAR_SCREEN = "\x1b[H\x1b[2J"

_INT_FIELDS = frozenset({"pid", "concurrency", "succeeded", "failed", "in_flight"})
_FLOAT_FIELDS = frozenset({"started_at", "heartbeat_at"})
_BOOL_FIELDS = frozenset({"paused"})


# --- output and errors -------------------------------------------------------------------

_secrets: set[str] = set()


def _remember_url(url: str | None) -> None:
    """Note the password of ``url`` so that no output ever shows it."""
    if not url:
        return
    with contextlib.suppress(ValueError):
        pw = urlsplit(url).password
        if pw:
            _secrets.update(s for s in (pw, unquote(pw)) if len(s) >= 3)


def _scrub(text: str) -> str:
    for s in sorted(_secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def _out(text: str = "", *, end: str = "\n") -> None:
    sys.stdout.write(_scrub(text) + end)
    sys.stdout.flush()


def _err(text: str, *, end: str = "\n") -> None:
    sys.stderr.write(_scrub(text) + end)
    sys.stderr.flush()


class _Fail(Exception):
    """Stop the command: print ``message`` on stderr and exit with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _usage(message: str) -> _Fail:
    return _Fail(exitcodes.EXIT_USAGE, message)


def _unreachable(url: str | None, exc: BaseException) -> str:
    where = redact(url) if url else "the configured URL"
    return f"cannot reach Redis at {where}: {type(exc).__name__}: {exc}"


def _guarded(name: str, fn: Handler) -> Handler:
    """Run a command: map failures to exit codes and messages (passwords scrubbed)."""

    def handler(args: argparse.Namespace) -> int:
        _remember_url(os.environ.get("BATCHQ_REDIS_URL"))
        _remember_url(getattr(args, "redis_url", None))
        try:
            return fn(args)
        except _Fail as exc:
            _err(f"batchq {name}: {exc}")
            return exc.code
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            _err(f"batchq {name}: {_unreachable(getattr(args, 'resolved_url', None), exc)}")
            return exitcodes.EXIT_REDIS
        except redis.RedisError as exc:
            _err(f"batchq {name}: Redis error: {type(exc).__name__}: {exc}")
            return exitcodes.EXIT_ERROR
        except KeyboardInterrupt:
            _err(f"batchq {name}: interrupted")
            return exitcodes.EXIT_ERROR
        except BrokenPipeError:
            # output piped into `head` and the like: stop quietly
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            return exitcodes.EXIT_ERROR

    return handler


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


def _dumps(obj: Any, *, indent: int | None = None) -> str:
    return json.dumps(obj, default=_json_default, indent=indent, ensure_ascii=False)


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _duration(s: float) -> str:
    """A short human duration: ``0s``, ``4.2s``, ``5m02s``, ``3h07m``, ``2d04h``."""
    if s < 10:
        return f"{s:.1f}s" if s else "0s"
    n = int(s)
    if n < 60:
        return f"{n}s"
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s"
    if n < 86400:
        return f"{n // 3600}h{n % 3600 // 60:02d}m"
    return f"{n // 86400}d{n % 86400 // 3600:02d}h"


def _table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns padded to their widest cell; ``right``: column indexes aligned right."""
    right = right or set()
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


# --- reaching the queues -----------------------------------------------------------------


@dataclass
class _Target:
    """Where a command works: ``app`` reaches the queues; ``loaded`` is the user's app."""

    app: App
    loaded: App | None
    url: str
    app_queues: list[str] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.app.namespace

    def where(self) -> str:
        return f"namespace {self.namespace} at {redact(self.url)}"

    def queue(self, name: str) -> Queue:
        try:
            self.app.keys(name)
        except ValueError as exc:
            raise _usage(str(exc)) from None
        return self.app.queue(name)


def _load(ref: str) -> App:
    if "://" in ref:
        _remember_url(ref)
        raise _usage(f"{redact(ref)!r} looks like a URL, not MODULE:APP; pass a Redis URL "
                     "with --redis-url")
    try:
        return cli.load_app(ref)
    except cli.AppImportError as exc:
        raise _Fail(exitcodes.EXIT_IMPORT, str(exc)) from None


def _target(args: argparse.Namespace) -> _Target:
    """Resolve the app, URL and namespace of a command (see the module docstring)."""
    ref: str | None = getattr(args, "app", None)
    loaded = _load(ref) if ref else None
    if loaded is not None:
        _remember_url(loaded.redis_url)
    url: str = args.redis_url or (loaded.redis_url if loaded else resolve_url(None))
    _remember_url(url)
    args.resolved_url = url
    ns_flag: str | None = getattr(args, "namespace", None)
    ns = ns_flag or (loaded.namespace if loaded else None) \
        or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    if loaded is not None and ns == loaded.namespace:
        if url != loaded.redis_url:
            loaded.redis_settings = RedisSettings(url)
        return _Target(loaded, loaded, url, loaded.queues())
    try:
        app = App(url, ns)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    return _Target(app, loaded, url, loaded.queues() if loaded else [])


def _add_common(p: argparse.ArgumentParser, *, app: str | None = "optional",
                namespace: bool = True) -> None:
    """The app reference and the Redis options every command shares."""
    if app == "optional":
        p.add_argument("app", nargs="?", default=None, metavar="MODULE:APP",
                       help="the app (its Redis URL, namespace and queues); optional")
    cli.add_redis_url(p)
    if namespace:
        p.add_argument("--namespace", default=None,
                       help=f"key namespace [default the app's, else ${NAMESPACE_ENV}, "
                       f"else {DEFAULT_NAMESPACE}]")


# --- info --------------------------------------------------------------------------------


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _parse_worker(fields: dict[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        key, val = _text(k), _text(v)
        parsed: Any = val
        try:
            if key in _INT_FIELDS:
                parsed = int(val)
            elif key in _FLOAT_FIELDS:
                parsed = float(val)
            elif key in _BOOL_FIELDS:
                parsed = val not in ("", "0", "false")
        except ValueError:
            parsed = val
        out[key] = parsed
    return out


def live_workers(app: App) -> list[dict[str, Any]]:
    """Registry entries whose heartbeat is at most ``WORKER_TTL_S`` old (server clock);
    stale ids are pruned from the registry zset."""
    r = app.redis
    key = workers_key(app.namespace)
    cutoff = _server_ms(r) - int(WORKER_TTL_S * 1000)
    pipe = r.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", f"({cutoff}")
    pipe.zrangebyscore(key, cutoff, "+inf", withscores=True)
    _, entries = pipe.execute()
    if not entries:
        return []
    ids = [_text(m) for m, _ in entries]
    pipe = r.pipeline(transaction=False)
    for wid in ids:
        pipe.hgetall(worker_info_key(app.namespace, wid))
    workers: list[dict[str, Any]] = []
    for wid, (_, score), fields in zip(ids, entries, pipe.execute(), strict=True):
        w: dict[str, Any] = _parse_worker(fields) if fields else {"id": wid}
        w.setdefault("id", wid)
        w.setdefault("heartbeat_at", float(score) / 1000)
        workers.append(w)
    workers.sort(key=lambda w: str(w["id"]))
    return workers


def snapshot(t: _Target) -> dict[str, Any]:
    """What ``batchq info --json`` prints: queue counts and live workers."""
    r = t.app.redis
    names = {_text(m) for m in r.smembers(queues_key(t.namespace))} | set(t.app_queues)
    queues: dict[str, Any] = {}
    for name in sorted(names):
        try:
            q = t.app.queue(name)
        except ValueError:
            continue  # a name batchq itself would never register
        st = q.stats()
        queues[name] = {
            "ready": st.ready,
            "delayed": st.delayed,
            "reserved": st.reserved,
            "dead": st.dead,
            "paused": st.paused,
            "oldest_age_s": round(st.oldest_age_s, 3),
        }
    return {"queues": queues, "workers": live_workers(t.app)}


def render_info(t: _Target, snap: dict[str, Any]) -> str:
    now = time.time()
    lines = [f"batchq {t.where()}  ({datetime.now().astimezone():%Y-%m-%d %H:%M:%S %Z})", ""]
    qs: dict[str, dict[str, Any]] = snap["queues"]
    if qs:
        rows = [[name, str(q["ready"]), str(q["delayed"]), str(q["reserved"]), str(q["dead"]),
                 "yes" if q["paused"] else "no",
                 _duration(q["oldest_age_s"]) if q["ready"] else "-"]
                for name, q in qs.items()]
        lines.append(_table(["QUEUE", "READY", "DELAYED", "RESERVED", "DEAD", "PAUSED",
                             "OLDEST"], rows, right={1, 2, 3, 4, 6}))
    else:
        lines.append("no queues")
    lines.append("")
    ws: list[dict[str, Any]] = snap["workers"]
    lines.append(f"workers: {len(ws)} live")
    if ws:
        rows = []
        for w in ws:
            started, beat = w.get("started_at"), w.get("heartbeat_at")
            rows.append([
                str(w.get("id", "")), str(w.get("host", "")), str(w.get("pid", "")),
                str(w.get("queues", "")), str(w.get("concurrency", "")),
                str(w.get("in_flight", "")), str(w.get("succeeded", "")),
                str(w.get("failed", "")),
                _duration(max(0.0, now - started)) if isinstance(started, float) else "-",
                _duration(max(0.0, now - beat)) + " ago" if isinstance(beat, float) else "-",
                "yes" if w.get("paused") else "no",
            ])
        lines.append(_table(["ID", "HOST", "PID", "QUEUES", "CONC", "IN-FLIGHT", "OK",
                             "FAILED", "UP", "SEEN", "PAUSED"], rows,
                            right={2, 4, 5, 6, 7, 8, 9}))
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    t = _target(args)
    if args.interval is None:
        snap = snapshot(t)
        _out(_dumps(snap) if args.json else render_info(t, snap))
        return exitcodes.EXIT_OK
    if args.interval <= 0:
        raise _usage("-i/--interval must be positive")
    try:
        while True:
            try:
                snap = snapshot(t)
                text = _dumps(snap) if args.json else render_info(t, snap)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                text = f"{_unreachable(t.url, exc)} (retrying every {args.interval:g}s)"
                if args.json:
                    _err(text)
                    text = ""
            if args.json:
                if text:
                    _out(text)
            else:
                _out(CLEAR_SCREEN + text + "\n\n(Ctrl-C to stop)", end="")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if not args.json:
            _out()
        return exitcodes.EXIT_OK


# --- dead --------------------------------------------------------------------------------


def _dead_summary(j: DeadJob) -> dict[str, Any]:
    return {
        "id": j.id,
        "task": j.task,
        "reason": j.reason,
        "error_type": j.error_type,
        "error_message": j.error_message,
        "attempts": j.attempts,
        "died_at": _iso(j.died_at),
    }


def _dead_full(j: DeadJob) -> dict[str, Any]:
    return {**_dead_summary(j), "queue": j.queue, "args": j.args, "kwargs": j.kwargs,
            "traceback": j.traceback}


def _error_text(j: DeadJob, width: int | None = 60) -> str:
    msg = j.error_message.strip().splitlines()[0] if j.error_message.strip() else ""
    text = f"{j.error_type}: {msg}" if j.error_type else msg
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text or "-"


def cmd_dead(args: argparse.Namespace) -> int:
    action: str = args.action
    if args.ids and args.all:
        raise _usage("give --id or --all, not both")
    if action in ("retry", "purge", "show") and not args.ids and not args.all:
        raise _usage(f"{action} needs --id ID (repeatable) or --all")
    if args.limit is not None and args.limit < 1:
        raise _usage("--limit must be at least 1")
    t = _target(args)
    q = t.queue(args.queue)
    ids: list[str] | None = list(dict.fromkeys(args.ids)) if args.ids else None
    if action == "retry":
        n = q.retry_dead(ids)
        _report_count(args, "retried", n, ids, q, "back to ready")
        return exitcodes.EXIT_OK
    if action == "purge":
        n = q.purge_dead(ids)
        _report_count(args, "purged", n, ids, q, "deleted")
        return exitcodes.EXIT_OK
    total = int(t.app.redis.zcard(q.keys.dead))
    limit: int | None = args.limit
    if limit is None and ids is None and not args.all and action == "list":
        limit = DEAD_LIST_LIMIT
    jobs = q.dead_jobs(ids, limit=limit)
    missing = [i for i in ids if i not in {j.id for j in jobs}] if ids else []
    for i in missing:
        _err(f"batchq dead {action}: no dead job {i!r} in queue {q.name}")
    if action == "list":
        _dead_list(args, q, jobs, total)
    else:
        _dead_show(args, q, jobs)
    return exitcodes.EXIT_ERROR if missing else exitcodes.EXIT_OK


def _report_count(args: argparse.Namespace, verb: str, n: int, ids: list[str] | None,
                  q: Queue, what: str) -> None:
    if args.json:
        _out(_dumps({"queue": q.name, verb: n}))
        return
    extra = ""
    if ids is not None and n < len(ids):
        extra = f" ({len(ids) - n} of the {len(ids)} ids not found"
        extra += " or not retryable)" if verb == "retried" else ")"
    _out(f"{verb} {n} dead job{'s' if n != 1 else ''} of queue {q.name} ({what}){extra}")


def _dead_list(args: argparse.Namespace, q: Queue, jobs: list[DeadJob], total: int) -> None:
    if args.json:
        _out(_dumps({"queue": q.name, "total": total,
                     "jobs": [_dead_summary(j) for j in jobs]}))
        return
    if not jobs:
        _out(f"no dead jobs in queue {q.name}" if total == 0 else "no matching dead jobs")
        return
    rows = [[j.id, j.task or "?", j.reason, _error_text(j), str(j.attempts), _iso(j.died_at)]
            for j in jobs]
    _out(_table(["ID", "TASK", "REASON", "ERROR", "ATTEMPTS", "DIED AT"], rows, right={4}))
    if not args.ids and len(jobs) < total:
        _out(f"({len(jobs)} of {total} dead jobs shown, oldest first; --limit N or --all "
             "for more)")
    else:
        _out(f"({len(jobs)} dead job{'s' if len(jobs) != 1 else ''})")


def _dead_show(args: argparse.Namespace, q: Queue, jobs: list[DeadJob]) -> None:
    if args.json:
        _out(_dumps({"queue": q.name, "jobs": [_dead_full(j) for j in jobs]}))
        return
    for n, j in enumerate(jobs):
        if n:
            _out("")
        _out(f"id:         {j.id}")
        _out(f"queue:      {j.queue}")
        _out(f"task:       {j.task or '?'}")
        _out(f"attempts:   {j.attempts}")
        _out(f"reason:     {j.reason}")
        _out(f"died at:    {_iso(j.died_at)}")
        _out(f"error:      {_error_text(j, None)}")
        rest = j.error_message.strip().splitlines()[1:]
        for line in rest:
            _out(f"            {line}")
        _out(f"args:       {_dumps(j.args)}")
        _out(f"kwargs:     {_dumps(j.kwargs)}")
        if j.traceback.strip():
            _out("traceback:")
            for line in j.traceback.rstrip().splitlines():
                _out(f"  {line}")
        else:
            _out("traceback:  -")


# --- pause / resume ----------------------------------------------------------------------


def _pause_cmd(paused: bool) -> Handler:
    def cmd(args: argparse.Namespace) -> int:
        t = _target(args)
        q = t.queue(args.queue)
        known = {_text(m) for m in t.app.redis.smembers(queues_key(t.namespace))}
        if q.name not in known and q.name not in t.app_queues:
            _err(f"batchq: note: queue {q.name!r} has not been used yet in {t.where()}")
        q.pause() if paused else q.resume()
        st = q.stats()
        if args.json:
            _out(_dumps({"queue": q.name, "paused": st.paused, "ready": st.ready}))
        else:
            state = ("paused: workers take no new jobs from it" if st.paused
                     else "running: workers take jobs from it")
            _out(f"queue {q.name} ({t.where()}) is {state} ({st.ready} ready)")
        return exitcodes.EXIT_OK

    return cmd


# --- check -------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from .health import check

    t = _target(args)
    h = check(RedisSettings(t.url))
    if h.ok:
        _out(f"ok: {h.reason}")
        return exitcodes.EXIT_OK
    _err(f"batchq check: {h.reason}")
    return exitcodes.EXIT_ERROR


# --- enqueue -----------------------------------------------------------------------------


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
            eta = _duration((self.total - pos) * elapsed / done)
        elif self.total <= pos:
            eta = "0s"
        pct = f"{100 * pos / self.total:5.1f}%" if self.total else "  ---"
        text = (f"line {line:,}  {enqueued:,} enqueued  {skipped:,} skipped  "
                f"{rate:,.0f} jobs/s  {pct}  ETA {eta}")
        if self.tty:
            _err(f"\r{text}\x1b[K", end="")
            self.shown = True
        else:
            _err(text)

    def clear(self) -> None:
        """Erase the line before other stderr output (terminal only)."""
        if self.shown:
            _err("\r\x1b[K", end="")
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
        raise _Fail(exitcodes.EXIT_ERROR, f"cannot use the progress file {path}: {exc}; delete it "
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
        except TypeError as exc:
            return None, str(exc)
        size = self.overhead + len(body)
        if size > self.limit:
            return None, (f"encoded job is about {size} bytes, above the app's limit of "
                          f"{self.limit} (max_payload_bytes)")
        return Call(*args, **kwargs), None


def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """``(line number from 1, line, byte offset after it)``, streamed."""
    pos = 0
    for n, raw in enumerate(f, 1):
        pos += len(raw)
        yield n, raw, pos


def cmd_enqueue(args: argparse.Namespace) -> int:
    t = _target(args)
    app = t.loaded
    assert app is not None  # the positional is required
    task = app.tasks.get(args.task)
    if task is None:
        names = ", ".join(sorted(app.tasks)) or "(none)"
        raise _usage(f"{args.app} has no task {args.task!r}; its tasks: {names}")
    if args.chunk < 1:
        raise _usage("--chunk must be at least 1")
    if args.start_line is not None and args.start_line < 1:
        raise _usage("--start-line must be at least 1")
    path: str = args.from_file
    state_path = path + STATE_SUFFIX
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after a long loop
    except OSError as exc:
        raise _Fail(exitcodes.EXIT_ERROR, f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        app.redis.ping()  # fail fast (exit 4) before reading a line
        size = os.fstat(f.fileno()).st_size
        start = 1
        if args.start_line is not None:
            start = args.start_line
        elif os.path.exists(state_path):
            state = _read_state(state_path)
            if state.get("task", task.name) != task.name:
                raise _Fail(exitcodes.EXIT_ERROR, f"the progress file {state_path} belongs to task "
                            f"{state['task']!r}, not {task.name!r}; delete it or pass "
                            "--start-line N")
            start = state["next_line"]
            _err(f"batchq enqueue: resuming from line {start} (progress file {state_path}; "
                 "--start-line 1 starts over)")
        return _enqueue_stream(args, task, f, size, start, state_path)


def _enqueue_stream(args: argparse.Namespace, task: Task[..., Any], f: IO[bytes], size: int,
                    start: int, state_path: str) -> int:
    path: str = args.from_file
    tty = sys.stderr.isatty()
    progress = _Progress(tty if args.progress is None else args.progress, tty, size)
    checker = _LineChecker(task)
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

    def save(next_line: int) -> None:
        nonlocal state_ok
        if not state_ok:
            return
        try:
            _write_state(state_path, {"next_line": next_line, "task": task.name,
                                      "file": os.path.abspath(path), "enqueued": enqueued})
        except OSError as exc:
            state_ok = False
            progress.clear()
            _err(f"batchq enqueue: cannot write the progress file {state_path} ({exc}); "
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
            _err(f"batchq enqueue: {path}:{n}: {problem}")
            if reported == MAX_BAD_REPORTS and not abort:
                _err("batchq enqueue: further bad lines are counted, not shown")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        started = False
        for n, raw, pos in _lines(f):
            if n < start:
                continue
            if not started:
                started = True
                progress.start(pos - len(raw))
            line = n
            in_chunk += 1
            item, problem = checker.parse(raw)
            if problem is not None:
                bad(n, problem)
                if abort:
                    flush(n)
                    progress.clear()
                    _err(f"batchq enqueue: aborted at line {n}: {enqueued} enqueued before "
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
                _err(f"batchq enqueue: stopped by {signal.Signals(stop_signal[0]).name} after "
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
        _err(f"batchq enqueue: {exc}. {enqueued} enqueued in all; run again to resume from "
             f"line {stop.resume_at}{doubt}")
        return code
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        progress.clear()
        _err(f"batchq enqueue: {_unreachable(args.resolved_url, exc)}. {enqueued} enqueued; "
             f"run again to resume from line {_resume_line(state_path, start)}")
        return exitcodes.EXIT_REDIS
    except (TypeError, ValueError) as exc:  # a job the line check let through
        progress.clear()
        _err(f"batchq enqueue: near line {line}: {exc}. {enqueued} enqueued; run again to "
             f"resume from line {_resume_line(state_path, start)}")
        return exitcodes.EXIT_ERROR
    except KeyboardInterrupt:
        progress.clear()
        _err(f"batchq enqueue: interrupted: {enqueued} enqueued; run again to resume from "
             f"line {_resume_line(state_path, start)} (jobs sent just before may be sent "
             "again)")
        return exitcodes.EXIT_ERROR
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not tty:  # a terminal's line is about to be replaced by the summary
        progress.update(line, enqueued, skipped, pos or size, force=True)
    progress.clear()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path)
    elapsed = time.monotonic() - t0
    rate = enqueued / elapsed if elapsed > 0 else 0.0
    _out(f"{enqueued} enqueued, {skipped} skipped in {elapsed:.2f}s ({rate:,.0f} jobs/s) "
         f"to queue {task.queue} of {_task_where(task)}")
    return exitcodes.EXIT_OK


def _task_where(task: Task[..., Any]) -> str:
    return f"namespace {task.app.namespace} at {redact(task.app.redis_url)}"


def _resume_line(state_path: str, default: int) -> int:
    try:
        return int(_read_state(state_path)["next_line"])
    except _Fail:
        return default


class _Stop(Exception):
    def __init__(self, error: EnqueueError, resume_at: int, unknown: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.resume_at = resume_at
        self.unknown = unknown


# --- parsers -----------------------------------------------------------------------------


def add_commands(sub: Any) -> None:
    """Add the operator subcommands; each sets ``handler`` (args -> exit code)."""
    p = sub.add_parser(
        "info", help="queue counts and live workers",
        description="Per queue: ready, delayed, reserved and dead jobs, whether it is "
        "paused and the age of its oldest ready job; then the live workers.")
    _add_common(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {queues: {...}, workers: [...]}")
    p.add_argument("-i", "--interval", type=float, default=None, metavar="SECONDS",
                   help="refresh every SECONDS until Ctrl-C (with --json: one object per "
                   "line each time)")
    p.set_defaults(handler=_guarded("info", cmd_info))

    p = sub.add_parser(
        "dead", help="list, show, retry or purge dead-lettered jobs",
        description="Dead-lettered jobs of one queue. retry and purge need --id or --all.")
    p.add_argument("action", choices=("list", "show", "retry", "purge"))
    p.add_argument("queue", metavar="QUEUE")
    _add_common(p)
    p.add_argument("--id", dest="ids", action="append", default=[], metavar="ID",
                   help="a dead job id (repeatable)")
    p.add_argument("--all", action="store_true", help="every dead job of the queue")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help=f"list/show at most N jobs, oldest first (list default "
                   f"{DEAD_LIST_LIMIT})")
    p.set_defaults(handler=_guarded("dead", cmd_dead))

    p = sub.add_parser(
        "enqueue", help="enqueue jobs from a JSON-lines file",
        description='Each line is {"args": [...], "kwargs": {...}} (either key optional) '
        "or a JSON array of positional arguments. The file is streamed and written in "
        f"chunks; progress is kept in FILE{STATE_SUFFIX} so an interrupted run resumes.")
    p.add_argument("app", metavar="MODULE:APP", help="the app defining the task")
    p.add_argument("task", metavar="TASK", help="task name")
    p.add_argument("--from", dest="from_file", required=True, metavar="FILE.jsonl")
    p.add_argument("--chunk", type=int, default=1000, metavar="N",
                   help="lines per enqueue_many call (default 1000)")
    p.add_argument("--start-line", type=int, default=None, metavar="N",
                   help="start at line N (1-based), ignoring a progress file")
    p.add_argument("--on-error", choices=("skip", "abort"), default="skip",
                   help="bad line: skip and count it (default), or stop there")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr (default: when stderr is a terminal)")
    _add_common(p, app=None, namespace=False)
    p.set_defaults(handler=_guarded("enqueue", cmd_enqueue))

    for name, paused in (("pause", True), ("resume", False)):
        p = sub.add_parser(
            name, help=f"{name} a queue" + (" (workers stop taking its jobs)" if paused
                                           else ""))
        p.add_argument("queue", metavar="QUEUE")
        _add_common(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(handler=_guarded(name, _pause_cmd(paused)))

    p = sub.add_parser(
        "check", help="is Redis reachable and safe (maxmemory-policy noeviction)?",
        description="Exit 0 if Redis is reachable and its eviction policy is noeviction, "
        "else 1 with the reason.")
    _add_common(p, namespace=False)
    p.set_defaults(handler=_guarded("check", cmd_check))
