"""The ``batchq`` command: argument parsing and output only; returns exit codes.

Settings are resolved once: a command-line flag wins over its ``BATCHQ_*`` environment
variable, which wins over the default. Exit codes: 0 ok, 1 error, 2 usage, 3 cannot
import the app, 4 cannot reach Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .app import App
from .exitcodes import EXIT_IMPORT, EXIT_OK, EXIT_RECYCLED, EXIT_REDIS, EXIT_USAGE

log = logging.getLogger("batchq.cli")


class AppImportError(Exception):
    """``MODULE:APP`` could not be imported or is not an ``App``."""


def load_app(ref: str) -> App:
    """Import ``module:attribute`` (attribute defaults to ``app``) and return the App."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppImportError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") \
            from exc
    obj = getattr(module, attr, None)
    if not isinstance(obj, App):
        raise AppImportError(f"{ref!r} is not a batchq.App (found {type(obj).__name__})")
    return obj


class UsageError(Exception):
    """A bad setting (flag or environment variable)."""


def _env_default(env: str, default: Any, kind: Callable[[str], Any]) -> Any:
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        raise UsageError(f"bad value for {env}: {raw!r} ({exc})") from None


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _opt(p: argparse.ArgumentParser, *flags: str, env: str, default: Any,
         kind: Callable[[str], Any] = str, help: str, **kw: Any) -> None:
    """A flag that falls back to ``BATCHQ_<env>`` and then to ``default``."""
    var = f"BATCHQ_{env}"
    shown = "unset" if default is None else default
    if kind is _bool:
        p.add_argument(*flags, action="store_true", default=_env_default(var, default, kind),
                       help=f"{help} [env {var}; default {shown}]", **kw)
    else:
        p.add_argument(*flags, type=kind, default=_env_default(var, default, kind),
                       help=f"{help} [env {var}; default {shown}]", **kw)


def add_redis_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", default=None,
                   help="Redis URL [env BATCHQ_REDIS_URL; default the app's, else "
                   "redis://127.0.0.1:6379/0]")


def _worker_parser(sub: Any) -> None:
    w = sub.add_parser(
        "worker", help="run worker processes",
        description="Run jobs. Without -p: one worker process in the foreground. With -p N: "
        "a supervisor that forks N worker processes, replaces dead ones and handles "
        "signals (TERM graceful, INT/QUIT fast, HUP rolling restart, TTIN/TTOU one more "
        "or less, TSTP pause fetching, CONT resume).")
    w.add_argument("app", help="MODULE:APP, e.g. myproject.tasks:app")
    _opt(w, "-p", "--processes", env="PROCESSES", default=None, kind=int,
         help="worker processes under a supervisor")
    _opt(w, "-q", "--queues", env="QUEUES", default="",
         help="comma-separated queues to serve (empty: every queue of the app's tasks)")
    _opt(w, "-c", "--concurrency", env="CONCURRENCY", default=100, kind=int,
         help="jobs run at once per process")
    _opt(w, "--lease-s", env="LEASE_S", default=30.0, kind=float,
         help="reservation taken on each job, extended while it runs")
    _opt(w, "--fetch-batch", env="FETCH_BATCH", default=100, kind=int,
         help="jobs popped per Redis call")
    _opt(w, "--shutdown-timeout", env="SHUTDOWN_TIMEOUT", default=30.0, kind=float,
         help="seconds running jobs get to finish on SIGTERM before they are cancelled")
    _opt(w, "--max-jobs-per-child", env="MAX_JOBS_PER_CHILD", default=None, kind=int,
         help="recycle a worker process after this many jobs")
    _opt(w, "--heartbeat-timeout", env="HEARTBEAT_TIMEOUT", default=30.0, kind=float,
         help="kill a worker process whose event loop has not turned for this long (-p)")
    _opt(w, "--burst", env="BURST", default=False, kind=_bool,
         help="exit 0 once the queues have nothing ready, delayed or reserved")
    _opt(w, "--metrics-port", env="METRICS_PORT", default=None, kind=int,
         help="serve /metrics, /healthz, /readyz on this port (with -p: default 9808; "
         "without -p: only when given; 0 disables)")
    _opt(w, "--metrics-addr", env="METRICS_ADDR", default="127.0.0.1",
         help="address of the metrics server (0.0.0.0 in a container)")
    _opt(w, "--no-metrics", env="NO_METRICS", default=False, kind=_bool,
         help="do not count jobs for Prometheus at all")
    add_redis_url(w)
    _opt(w, "--log-level", env="LOG_LEVEL", default="INFO", help="log level")
    _opt(w, "--log-format", env="LOG_FORMAT", default="plain", help="plain or json")


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="batchq", description="batchq: a Redis job queue")
    p.add_argument("--version", action="version", version=f"batchq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _worker_parser(sub)
    s = sub.add_parser("server", help="run an embedded Valkey server in the foreground")
    s.add_argument("--port", type=int, default=6399)
    s.add_argument("--host", default="127.0.0.1")
    from .cli_ops import add_commands

    add_commands(sub)
    from .cli_bench import add_commands as add_bench

    add_bench(sub)
    return p


def cmd_worker(args: argparse.Namespace) -> int:
    from .connection import RedisSettings
    from .health import check
    from .logs import setup_logging
    from .worker import WorkerSettings, run_worker

    try:
        setup_logging(args.log_level, args.log_format, "supervisor" if args.processes else
                      "worker")
    except ValueError as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    metrics_dir = _prepare_metrics_dir() if args.processes and not args.no_metrics else None
    before = set(sys.modules)
    try:
        app = load_app(args.app)
    except AppImportError as exc:
        log.error("%s", exc)
        return EXIT_IMPORT
    app_modules = set(sys.modules) - before
    if args.redis_url:
        app.redis_settings = RedisSettings(args.redis_url)
    queues = tuple(q for q in (x.strip() for x in args.queues.split(",")) if q)
    try:
        settings = WorkerSettings(
            queues=queues,
            concurrency=args.concurrency,
            lease_s=args.lease_s,
            fetch_batch=args.fetch_batch,
            burst=args.burst,
            shutdown_timeout_s=args.shutdown_timeout,
            max_jobs=args.max_jobs_per_child,
            metrics=not args.no_metrics,
        )
        for q in queues:
            app.keys(q)
    except ValueError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    health = check(app.redis_settings)
    if not health.reachable:
        log.error("%s", health.reason)
        return EXIT_REDIS
    if not health.ok or health.eviction_policy is None:
        log.warning("%s", health.reason)
    if not args.processes:
        if args.metrics_port and not args.no_metrics:
            from .metrics_http import serve_in_thread

            serve_in_thread(app, args.metrics_addr, args.metrics_port)
        try:
            code = run_worker(app, settings)
            return EXIT_OK if code == EXIT_RECYCLED else code
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.error("lost Redis during start-up: %s", exc)
            return EXIT_REDIS
    from .supervisor import Supervisor, SupervisorSettings

    if args.processes < 1:
        log.error("-p must be at least 1")
        return EXIT_USAGE
    sup = Supervisor(
        app,
        lambda: load_app(args.app),
        app_modules,
        SupervisorSettings(processes=args.processes, heartbeat_timeout_s=args.heartbeat_timeout,
                           log_level=args.log_level, log_format=args.log_format,
                           metrics_dir=metrics_dir, metrics_addr=args.metrics_addr,
                           metrics_port=9808 if args.metrics_port is None else args.metrics_port),
        settings,
    )
    try:
        return sup.run()
    finally:
        if metrics_dir and not os.environ.get("BATCHQ_KEEP_METRICS_DIR"):
            _clean_metrics_dir(metrics_dir, remove=metrics_dir.startswith(_TEMP_PREFIX))


_TEMP_PREFIX = os.path.join(tempfile.gettempdir(), "batchq-metrics-")


def _prepare_metrics_dir() -> str:
    """prometheus_client's multiprocess directory, set before anything imports the
    library: ``$PROMETHEUS_MULTIPROC_DIR`` wiped, or a fresh temporary one."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        _clean_metrics_dir(path, remove=False)
    else:
        path = tempfile.mkdtemp(prefix=os.path.basename(_TEMP_PREFIX))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def _clean_metrics_dir(path: str, *, remove: bool) -> None:
    if remove:
        shutil.rmtree(path, ignore_errors=True)
        return
    for name in os.listdir(path):
        if name.endswith(".db") or name.endswith(".json"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))


def cmd_server(args: argparse.Namespace) -> int:
    from .embedded import serve_forever

    return serve_forever(port=args.port, host=args.host)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler if hasattr(args, "handler") \
        else {"worker": cmd_worker, "server": cmd_server}[args.command]
    return handler(args)
