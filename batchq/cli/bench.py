"""``batchq bench``: load-test a task of your own, or run the benchmark harness.

``batchq bench load --rate R --duration D MODULE:APP TASK [--args JSON]`` sends jobs of
``TASK`` on an open-loop schedule (``batchq.loadgen``): job ``i`` is due at ``start +
i / R`` however long earlier sends took. Your handler is not changed, so the command
measures what it can see from outside:

* the producer side, exactly: jobs sent, send errors, the achieved send rate and the
  lateness of every send against its intended time (p50 .. max);
* the queue side, from ``Queue.stats()`` polled once a second: jobs reserved by workers
  ("running": fetched and not yet acknowledged), jobs completed (enqueued minus still
  pending minus dead-lettered since the start; counted queue-wide, so other producers
  on the same queue are included and reported), and the time the fleet needs after the
  last send to get the queue back to where it was;
* with ``--metrics-url`` (the fleet's ``/metrics``), the workers' own
  ``batchq_job_wait_seconds`` histogram for the task, scraped before and after: the
  distribution of enqueue-to-start times of the jobs that started meanwhile, as bucket
  bounds ("<= 5 ms"), timed by the workers at job start from the actual enqueue time.

``batchq bench SCENARIO ...`` runs ``python -m bench SCENARIO ...`` (enqueue, drain,
latency, memory, idle, scale, peers, plot) from a batchq source checkout: the harness
lives in the repository's top-level ``bench/`` folder, which is not installed. The
checkout is the one this batchq was imported from (an editable install or a run from the
source tree), else the current directory or one of its parents; anywhere else the
command says so and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import sys
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import exitcodes
from ..loadgen import LoadState, aopen_loop, percentile_keys
from ..loading import AppImportError, load_app
from .flags import add_redis_url, seconds

HARNESS_COMMANDS = ("enqueue", "drain", "latency", "memory", "idle", "scale", "peers", "plot")
PROGRESS_EVERY_S = 1.0
WAIT_METRIC = "batchq_job_wait_seconds"


def add_commands(sub: Any) -> None:
    """Add ``bench`` and its subcommands; each sets ``handler`` (args -> exit code)."""
    b = sub.add_parser("bench", help="load-test a task, or run the benchmark harness",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = b.add_subparsers(dest="bench_command", required=True)
    p = bsub.add_parser("load", help="open-loop load on one of your tasks",
                        description="Send jobs of TASK at a fixed rate (open loop) and "
                        "report send lateness, completions and queue depth.")
    p.add_argument("app", metavar="MODULE:APP")
    p.add_argument("task", metavar="TASK", help="task name")
    p.add_argument("--rate", type=seconds(zero_ok=False), required=True,
                   help="jobs per second")
    p.add_argument("--duration", type=seconds(zero_ok=False), required=True,
                   help="seconds of load")
    p.add_argument("--args", default="[]", metavar="JSON",
                   help='arguments of every job: a JSON array (positional), an object '
                   '(keyword) or {"args": [...], "kwargs": {...}} (default [])')
    p.add_argument("--settle", type=seconds(zero_ok=True), default=30.0, metavar="SECONDS",
                   help="after the last send, wait this long at most for the queue to "
                   "drain back (default 30)")
    p.add_argument("--metrics-url", default=None, metavar="URL",
                   help="the fleet's /metrics, for the workers' enqueue-to-start histogram")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_redis_url(p)
    p.set_defaults(handler=cmd_load)
    for name in HARNESS_COMMANDS:
        h = bsub.add_parser(name, help=f"python -m bench {name} (source checkout only)",
                            add_help=False, prefix_chars="\0")
        h.add_argument("rest", nargs=argparse.REMAINDER)
        h.set_defaults(handler=cmd_harness)


def _checkout_candidates() -> list[Path]:
    """Where a source checkout may be: the tree this batchq was imported from, then the
    current directory and its parents."""
    here = Path(__file__).resolve().parent.parent.parent
    cwd = Path.cwd().resolve()
    return [here, cwd, *cwd.parents]


def find_checkout(candidates: Iterable[Path]) -> Path | None:
    """The first candidate that is a batchq source checkout (``bench/__main__.py`` next
    to ``batchq/__init__.py``)."""
    for root in candidates:
        if (root / "bench" / "__main__.py").is_file() \
                and (root / "batchq" / "__init__.py").is_file():
            return root
    return None


def cmd_harness(args: argparse.Namespace) -> int:
    """Delegate to the ``bench`` package of a source checkout."""
    name = f"batchq bench {args.bench_command}"
    root = find_checkout(_checkout_candidates())
    if root is None:
        print(f"{name}: the benchmark harness is not installed with batchq: it lives in "
              "the top-level bench/ folder of a batchq source checkout. Run this from "
              "such a checkout (or use `python -m bench` there).", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        harness = importlib.import_module("bench.__main__")
    except ImportError as exc:
        print(f"{name}: cannot import the harness of the checkout {root}: {exc}",
              file=sys.stderr)
        return exitcodes.EXIT_USAGE
    found = Path(getattr(harness, "__file__", "") or "").resolve()
    if not found.is_relative_to(root / "bench"):
        print(f"{name}: the module bench.__main__ was found at {found}, not in the "
              f"checkout {root}; another package named bench is in the way",
              file=sys.stderr)
        return exitcodes.EXIT_USAGE
    code: int = harness.main([args.bench_command, *args.rest])
    return code


def _parse_args(raw: str) -> tuple[list[Any], dict[str, Any]]:
    value = json.loads(raw)
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        if set(value) <= {"args", "kwargs"} and value:
            return list(value.get("args", [])), dict(value.get("kwargs", {}))
        return [], value
    return [value], {}


# --- the workers' wait histogram ---------------------------------------------------------


def scrape_wait(url: str, queue: str, task: str) -> dict[float, float]:
    """Cumulative ``le -> count`` of ``batchq_job_wait_seconds`` for one queue and task."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    prefix = f"{WAIT_METRIC}_bucket{{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels_s, _, value = line[len(prefix):].rpartition("} ")
        labels = dict(part.split("=", 1) for part in labels_s.split(","))
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("queue") != queue or labels.get("task") != task:
            continue
        le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
        out[le] = out.get(le, 0.0) + float(value)
    return out


def wait_percentiles(before: dict[float, float], after: dict[float, float]
                     ) -> dict[str, float] | None:
    """Bucket upper bound (ms) at each percentile of the jobs counted in between."""
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0.0) for b in bounds]
    total = cum[-1] if cum else 0.0
    if total <= 0:
        return None
    out: dict[str, float] = {}
    for key in percentile_keys():
        p = 100.0 if key == "max" else float(key[1:])
        rank = max(1.0, math.ceil(p / 100 * total))
        bound = next(b for b, c in zip(bounds, cum, strict=True) if c >= rank)
        out[key] = bound * 1000
    out["count"] = total
    return out


# --- the load --------------------------------------------------------------------------


class _Progress:
    """Queue-side figures, sampled once a second while the load runs."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.base = self._read()
        self.last = self.base
        self.peak_pending = 0

    def _read(self) -> tuple[int, int, int, int]:
        st = self.queue.stats()
        raw = self.queue.app.redis.hget(self.queue.keys.stats, "enqueued")
        return int(raw or 0), st.pending, st.dead, st.reserved

    def sample(self) -> tuple[int, int, int]:
        """``(enqueued since start, completed since start, running now)``."""
        self.last = cur = self._read()
        self.peak_pending = max(self.peak_pending, cur[1])
        enq = cur[0] - self.base[0]
        done = enq - (cur[1] - self.base[1]) - (cur[2] - self.base[2])
        return enq, done, cur[3]


async def _run_load(args: argparse.Namespace, task: Any, job_args: list[Any],
                    job_kwargs: dict[str, Any], progress: _Progress,
                    tty: bool) -> tuple[LoadState, list[tuple[float, int, int]]]:
    state = LoadState(rate=args.rate, duration_s=args.duration)
    timeline: list[tuple[float, int, int]] = []

    async def send(intended: list[float], sent_at: float) -> None:
        if len(intended) == 1:
            await task.aenqueue(*job_args, **job_kwargs)
        else:
            from ..producer import Call

            await task.aenqueue_many([Call(*job_args, **job_kwargs)] * len(intended))

    async def report() -> None:
        last_sent, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            _, done, running = await asyncio.to_thread(progress.sample)
            now = time.monotonic()
            rate = (state.sent - last_sent) / (now - last_t)
            last_sent, last_t = state.sent, now
            timeline.append((time.time(), done, running))
            line = (f"sent {state.sent:,}  running {running:,}  done {done:,}  errors "
                    f"{state.errors:,}  rate {rate:,.0f}/s  send lateness p99 "
                    f"{state.lateness.percentile_s(99) * 1000:.2f} ms")
            print(("\r\x1b[K" if tty else "") + line, end="" if tty else "\n",
                  file=sys.stderr, flush=True)

    await task.app.async_redis().ping()
    reporter = asyncio.create_task(report())
    try:
        await aopen_loop(send, args.rate, args.duration, state=state)
    finally:
        reporter.cancel()
        await asyncio.gather(reporter, return_exceptions=True)
        await task.app.aclose()
        if tty:
            print(file=sys.stderr)
    return state, timeline


def cmd_load(args: argparse.Namespace) -> int:
    try:
        job_args, job_kwargs = _parse_args(args.args)
    except (ValueError, TypeError) as exc:
        print(f"batchq bench load: bad --args: {exc}", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    try:
        if ":" in args.task and ":" not in args.app:
            # the older order TASK MODULE:APP (task names cannot contain ':')
            args.app, args.task = args.task, args.app
        app = load_app(args.app)
    except AppImportError as exc:
        print(f"batchq bench load: {exc} (took {args.app!r} as MODULE:APP and "
              f"{args.task!r} as TASK)", file=sys.stderr)
        return exitcodes.EXIT_IMPORT
    if args.redis_url:
        from ..connection import RedisSettings

        app.redis_settings = RedisSettings(args.redis_url)
    task = app.tasks.get(args.task)
    if task is None:
        print(f"batchq bench load: no task {args.task!r} in {args.app} (tasks: "
              f"{', '.join(sorted(app.tasks)) or 'none'})", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    import redis

    queue = app.queue(task.queue)
    try:
        progress = _Progress(queue)
        before = scrape_wait(args.metrics_url, task.queue, task.name) \
            if args.metrics_url else None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        print(f"batchq bench load: cannot reach Redis or the metrics URL: {exc}",
              file=sys.stderr)
        return exitcodes.EXIT_REDIS
    tty = sys.stderr.isatty()
    try:
        state, _ = _run_async(_run_load(args, task, job_args, job_kwargs, progress, tty))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    settled_s = _settle(progress, state, args.settle)
    enq, done, running = progress.sample()
    after = None
    if args.metrics_url and before is not None:
        try:
            after = scrape_wait(args.metrics_url, task.queue, task.name)
        except OSError as exc:
            print(f"batchq bench load: could not scrape {args.metrics_url}: {exc}",
                  file=sys.stderr)
    end = state.start_s + settled_s if settled_s is not None else time.time()
    report: dict[str, Any] = {
        "task": task.name, "queue": task.queue, **state.as_dict(),
        "completed": done, "others_enqueued": max(0, enq - state.sent),
        "completion_rate": done / max(1e-6, end - state.start_s),
        "running_at_end": running, "peak_pending": progress.peak_pending,
        "settled_after_last_send_s": None if settled_s is None
        else max(0.0, end - state.last_send_s),
        "worker_wait_ms": wait_percentiles(before, after) if before and after else None,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render(report))
    return 1 if state.errors else 0


def _run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)


def _settle(progress: _Progress, state: LoadState, limit_s: float) -> float | None:
    """Seconds from the schedule's start until the queue is back to its starting
    number of pending jobs (None: not within ``limit_s`` after the last send)."""
    deadline = time.monotonic() + limit_s
    while True:
        progress.sample()
        if progress.last[1] <= progress.base[1]:
            return time.time() - state.start_s
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def render(r: dict[str, Any]) -> str:
    """The report as a markdown table."""
    late = r["send_lateness_ms"]
    rows = [
        ("task", f"{r['task']} (queue {r['queue']})"),
        ("offered rate", f"{r['offered_rate']:,.1f} jobs/s for {r['duration_s']:g} s"),
        ("sent / errors", f"{r['sent']:,} / {r['errors']:,}"
         + (f" ({r['first_error']})" if r["first_error"] else "")),
        ("achieved send rate", f"{r['achieved_send_rate']:,.1f} jobs/s"),
        ("send lateness p50 / p90 / p99 / p99.9 / max",
         " / ".join(f"{late[k]:.2f}" for k in percentile_keys()) + " ms"),
        ("completed (queue-wide)", f"{r['completed']:,}"
         + (f" (includes {r['others_enqueued']:,} jobs of other producers)"
            if r["others_enqueued"] else "")),
        ("completion rate", f"{r['completion_rate']:,.1f} jobs/s"),
        ("peak pending", f"{r['peak_pending']:,}"),
        ("queue back to its starting depth", "not within --settle"
         if r["settled_after_last_send_s"] is None
         else f"{r['settled_after_last_send_s']:.2f} s after the last send"),
    ]
    w = r["worker_wait_ms"]
    if w is not None:
        rows.append((f"workers' enqueue-to-start, {w['count']:,.0f} jobs (bucket bounds)",
                     " / ".join(f"<= {w[k]:g}" for k in percentile_keys()) + " ms "
                     "(p50 / p90 / p99 / p99.9 / max)"))
    out = ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(out)
