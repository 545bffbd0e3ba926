"""The ``batchq`` command: argument parsing and output only; returns exit codes.

Exit codes: 0 ok, 1 error, 2 usage, 3 cannot import the app, 4 cannot reach Redis.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

import redis

from .app import App

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_IMPORT, EXIT_REDIS = 0, 1, 2, 3, 4


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


def _env(name: str, default: str) -> str:
    return os.environ.get(f"BATCHQ_{name}", default)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchq", description="batchq: a Redis job queue")
    sub = p.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="run a worker process",
                       description="Run jobs. Every flag also reads BATCHQ_<FLAG> from the "
                       "environment (e.g. BATCHQ_CONCURRENCY); the flag wins.")
    w.add_argument("app", help="MODULE:APP, e.g. myproject.tasks:app")
    w.add_argument("-q", "--queues", default=_env("QUEUES", ""),
                   help="comma-separated queues to serve (default: every queue of the app)")
    w.add_argument("-c", "--concurrency", type=int, default=int(_env("CONCURRENCY", "100")),
                   help="jobs run at once per process (default 100)")
    w.add_argument("--lease-s", type=float, default=float(_env("LEASE_S", "30")),
                   help="reservation taken on each job, extended while it runs (default 30)")
    w.add_argument("--fetch-batch", type=int, default=int(_env("FETCH_BATCH", "100")),
                   help="jobs popped per Redis call (default 100)")
    w.add_argument("--shutdown-timeout", type=float,
                   default=float(_env("SHUTDOWN_TIMEOUT", "30")),
                   help="seconds running jobs get to finish on SIGTERM (default 30)")
    w.add_argument("--burst", action="store_true",
                   default=_env("BURST", "") not in ("", "0", "false"),
                   help="exit 0 once the queues have nothing ready, delayed or reserved")
    w.add_argument("--redis-url", default=None, help="overrides the app's Redis URL")
    w.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"))

    s = sub.add_parser("server", help="run an embedded Valkey server in the foreground")
    s.add_argument("--port", type=int, default=6399)
    s.add_argument("--host", default="127.0.0.1")
    return p


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_worker(args: argparse.Namespace) -> int:
    from .connection import RedisSettings
    from .worker import WorkerSettings, run_worker

    _setup_logging(args.log_level)
    try:
        app = load_app(args.app)
    except AppImportError as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_IMPORT
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
        )
    except ValueError as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run_worker(app, settings)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        from .connection import redact

        print(f"batchq: cannot reach Redis at {redact(app.redis_url)}: {exc}", file=sys.stderr)
        return EXIT_REDIS


def cmd_server(args: argparse.Namespace) -> int:
    from .embedded import serve_forever

    return serve_forever(port=args.port, host=args.host)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"worker": cmd_worker, "server": cmd_server}[args.command]
    return handler(args)
