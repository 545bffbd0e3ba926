"""``batchq bench``: load-test a target through your own task, or run the harness.

``batchq bench load MODULE:APP TASK`` sends jobs of ``TASK`` on an open-loop rate
profile (``batchq.load.schedule``): ``--rate R --duration D``, ``--steps 500,1000,2000
--step-s 30`` or ``--ramp 0:5000 --duration 120``. Each job carries its intended send
time, and the workers that run it (any number, on any machine) record the task's run
time (the target's latency as the handler saw it), enqueue-to-start and
enqueue-to-done from that intended time (no coordinated omission), and the outcome: an
exception by its type, or what the task reported with
``batchq.current_job().record(status="429")``. They merge their figures through Redis
once a second (``batchq.load``), so the report covers the whole fleet:
p50 / p90 / p99 / p99.9 / max of each, errors by type with an example, offered and
achieved rate, and a per-second timeline. ``--abort-on "p99>500ms"`` / ``"errors>1%"``
stops the run once the last seconds pass the limit (the knee of the target). ``--json``
prints the report as one object, ``--out report.html`` / ``report.png`` plots it.

The generator can be spread: ``--producers N`` runs N producer processes here, and
``--join RUN_ID`` (the id is printed at the start) adds another machine's sends to a
running run. A load job is acknowledged whatever its handler does (its outcome goes to
the report, not to retries or the dead-letter queue); jobs still queued after an abort
are acknowledged without running.

``batchq bench SCENARIO ...`` (enqueue, drain, allin, latency, memory, idle, scale,
campaign, fanout, groups, ratecheck, iocurve, peers, plot) says to run ``python -m bench
SCENARIO ...`` from a batchq source checkout and exits 2: the harness is the
repository's top-level ``bench/`` folder, which is not installed, and the installed
package never imports it.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import importlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tasks.loading import AppImportError, load_app
from ..worker import exitcodes
from .flags import add_redis_url, count_between, positive_number, seconds

# the load-test machinery is imported by the commands that use it: the parser of every
# `batchq` command (a worker's start-up included) builds this module's subcommands
if TYPE_CHECKING:
    from ..load.driver import Driver
    from ..load.profiles import AbortRule
    from ..load.schedule import Profile

PRODUCER_GRACE_S = 15.0
"""How long after its schedule ends a producer process may take to merge and exit (it
stops sending ``load.driver.SEND_GRACE_S`` after the end, however far behind)."""
CALIBRATE_ABOVE = 5_000.0
"""Peak rates per producer process above this are checked against a calibration first
(below it any producer keeps up)."""
LEFTOVER_WAIT_S = 10.0
"""After marking a run incomplete, how long to wait for the workers to skip its jobs
still queued."""
STACKS_WAIT_S = 0.5
"""How long a wedged producer has to print its stacks (SIGUSR1) before it is stopped."""

HARNESS_COMMANDS = ("enqueue", "drain", "allin", "latency", "memory", "idle", "scale",
                    "campaign", "fanout", "groups", "ratecheck", "iocurve", "shards", "peers",
                    "plot", "cancel-drop", "fanout-drain")


MAX_LOAD_RATE = 1_000_000.0
"""``--rate``: jobs per second; the producers' own ceiling is measured at the run."""
MAX_LOAD_S = 7 * 86400.0
"""``--duration``, ``--step-s``, ``--settle``: a week at most."""
LOAD_DESCRIPTION = (
    "Send jobs of TASK on an open-loop rate profile (--rate R --duration S, --steps "
    "R1,R2 --step-s S or --ramp A:B --duration S) and report what the workers running "
    "them measured: latency percentiles, errors by type, offered and achieved rate, a "
    "per-second timeline. --abort-on stops at a limit, --out plots the run (.png needs "
    "pip install 'batchq[bench]'), --producers N / --join RUN_ID spread the sending.")


def add_commands(sub: Any) -> None:
    """Add ``bench`` and its subcommands; each sets ``handler`` (args -> exit code)."""
    b = sub.add_parser("bench", help="load-test a task, or run the benchmark harness",
                       description=(__doc__ or "").replace("``", ""),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = b.add_subparsers(dest="bench_command", required=True)
    p = bsub.add_parser("load", help="load-test a target through one of your tasks",
                        description=LOAD_DESCRIPTION)
    p.add_argument("app", metavar="MODULE:APP", help="the app defining the task")
    p.add_argument("task", metavar="TASK", help="task name")
    p.add_argument("--rate", type=positive_number(MAX_LOAD_RATE), default=None,
                   help="a constant rate, jobs per second (with --duration)")
    p.add_argument("--steps", default=None, metavar="R1,R2,...",
                   help="rates of consecutive steps, jobs per second (with --step-s)")
    p.add_argument("--step-s", type=seconds(zero_ok=False, high=MAX_LOAD_S), default=None,
                   metavar="SECONDS", help="length of each step of --steps")
    p.add_argument("--ramp", default=None, metavar="START:END",
                   help="a linear ramp of the rate, jobs per second (with --duration)")
    p.add_argument("--duration", type=seconds(zero_ok=False, high=MAX_LOAD_S), default=None,
                   help="seconds of load (--rate, --ramp)")
    p.add_argument("--args", default=None, metavar="JSON",
                   help='arguments of every job: a JSON array (positional), an object '
                   '(keyword) or {"args": [...], "kwargs": {...}} (default [], or the '
                   "run's with --join)")
    p.add_argument("--abort-on", action="append", default=[], metavar="RULE",
                   help='stop when the last seconds pass a limit: "p99>500ms", '
                   '"done.p99>2s", "errors>1%%", "errors>100" (repeatable)')
    p.add_argument("--producers", type=count_between(1, 64, bounds_text="1..64"), default=1,
                   metavar="N",
                   help="producer processes on this machine (default 1)")
    p.add_argument("--join", default=None, metavar="RUN_ID",
                   help="add this machine's sends to a running run (its profile, unless "
                   "one is given here)")
    p.add_argument("--run-id", default=None, metavar="RUN_ID",
                   help="name the new run (default: time and a random suffix)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    p.add_argument("--settle", type=seconds(zero_ok=True, high=MAX_LOAD_S), default=30.0,
                   metavar="SECONDS",
                   help="after the last send, wait this long at most for the fleet to "
                   "finish the run's jobs (default 30)")
    p.add_argument("--force", action="store_true",
                   help="run even when the calibration says the producers cannot send "
                   "the rate (the run then stops at its duration, reported incomplete)")
    p.add_argument("--out", default=None, metavar="FILE.html|FILE.png",
                   help="plot latency and throughput over time, steps marked")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--metrics-url", default=None, help=argparse.SUPPRESS)
    add_redis_url(p)
    p.set_defaults(handler=cmd_load)
    for name in HARNESS_COMMANDS:
        h = bsub.add_parser(name, help=f"run `python -m bench {name}` from a source checkout",
                            add_help=False, prefix_chars="\0")
        h.add_argument("rest", nargs=argparse.REMAINDER)
        h.set_defaults(handler=cmd_harness)


def cmd_harness(args: argparse.Namespace) -> int:
    """The harness is not part of the installed package: say how to run it."""
    rest = " ".join(args.rest)
    print(f"batchq bench {args.bench_command}: the benchmark harness is not installed with "
          "batchq (only `batchq bench load` is): it is the top-level bench/ folder of a "
          "batchq source checkout. Run it there: "
          f"python -m bench {args.bench_command}{' ' + rest if rest else ''}",
          file=sys.stderr)
    return exitcodes.EXIT_USAGE


def _parse_args(raw: str) -> tuple[list[Any], dict[str, Any]]:
    value = json.loads(raw)
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        if set(value) <= {"args", "kwargs"} and value:
            return list(value.get("args", [])), dict(value.get("kwargs", {}))
        return [], value
    return [value], {}


# --- the load command -------------------------------------------------------------------


class _Usage(Exception):
    """A bad combination of flags (exit 2, with the message)."""


def _profile(args: argparse.Namespace) -> Profile | None:
    """The rate profile of the flags (None: none given, take the run's with --join)."""
    from ..load.profiles import parse_ramp, parse_steps
    from ..load.schedule import Profile

    given = [f for f in ("rate", "steps", "ramp") if getattr(args, f) is not None]
    if len(given) > 1:
        raise _Usage(f"give one of --rate, --steps, --ramp (got {', '.join(given)})")
    try:
        if args.steps is not None:
            if args.step_s is None or args.duration is not None:
                raise _Usage("--steps takes --step-s (each step's length), not --duration")
            return Profile.steps(parse_steps(args.steps), args.step_s)
        if args.step_s is not None:
            raise _Usage("--step-s goes with --steps")
        if not given:
            if args.duration is not None:
                raise _Usage("--duration needs --rate or --ramp")
            return None
        if args.duration is None:
            raise _Usage(f"--{given[0]} needs --duration")
        if args.ramp is not None:
            lo, hi = parse_ramp(args.ramp)
            return Profile.ramp(lo, hi, args.duration)
        return Profile.constant(args.rate, args.duration)
    except ValueError as exc:
        raise _Usage(str(exc)) from None


def _check(args: argparse.Namespace) -> tuple[Profile | None, list[AbortRule],
                                              tuple[int, int] | None]:
    from ..load.profiles import parse_abort

    profile = _profile(args)
    try:
        rules = [parse_abort(r) for r in args.abort_on]
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    part = None
    if args.part is not None:
        k, _, n = args.part.partition("/")
        if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)) or args.join is None:
            raise _Usage(f"--part {args.part!r}: K/N with 0 <= K < N, with --join")
        part = (int(k), int(n))
    if args.join is None and profile is None:
        raise _Usage("give a rate profile: --rate R --duration S, --steps R1,R2 --step-s S "
                     "or --ramp A:B --duration S (or --join RUN_ID)")
    if args.join is not None and (args.run_id or args.producers > 1):
        raise _Usage("--join adds this process to a run: not with --run-id or --producers")
    if args.out is not None and Path(args.out).suffix.lower() not in (".html", ".png"):
        raise _Usage(f"--out {args.out!r}: the file name ends in .html or .png")
    return profile, rules, part


def cmd_load(args: argparse.Namespace) -> int:
    name = "batchq bench load"
    try:
        profile, rules, part = _check(args)
        job = _parse_args(args.args) if args.args is not None else None
    except _Usage as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    except (ValueError, TypeError) as exc:
        print(f"{name}: bad --args: {exc}", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    if args.out is not None and Path(args.out).suffix.lower() == ".png":
        try:  # checked now: the plot is drawn only after the whole run
            importlib.import_module("matplotlib")
        except ImportError as exc:
            print(f"{name}: --out {args.out}: a PNG needs matplotlib ({exc}): pip install "
                  "'batchq[bench]'", file=sys.stderr)
            return exitcodes.EXIT_USAGE
    if args.metrics_url:
        print(f"{name}: --metrics-url is no longer needed: enqueue-to-start comes from the "
              "workers themselves", file=sys.stderr)
    try:
        if ":" in args.task and ":" not in args.app:
            # the older order TASK MODULE:APP (task names cannot contain ':')
            args.app, args.task = args.task, args.app
        app = load_app(args.app)
    except AppImportError as exc:
        print(f"{name}: {exc} (took {args.app!r} as MODULE:APP and {args.task!r} as TASK)",
              file=sys.stderr)
        return exitcodes.EXIT_IMPORT
    if args.redis_url:
        from ..store.connection import RedisSettings

        app.redis_settings = RedisSettings(args.redis_url)
    task = app.tasks.get(args.task)
    if task is None or task.is_batch:
        why = "is a batch task (not supported)" if task else "is not a task"
        print(f"{name}: {args.task!r} {why} in {args.app} (tasks: "
              f"{', '.join(sorted(app.tasks)) or 'none'})", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    import redis

    if part is not None:
        # a producer child: the parent asks for its stacks (SIGUSR1) before stopping it
        # when it outlives its schedule, so a wedge says where it was
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        code: int = _run_async(_load(args, app, task, profile, rules, part, job))
        return code
    except _Usage as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        print(f"{name}: cannot reach Redis: {exc}", file=sys.stderr)
        return exitcodes.EXIT_REDIS
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def _run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)


async def _load(args: argparse.Namespace, app: Any, task: Any, profile: Profile | None,
                rules: list[AbortRule], part: tuple[int, int] | None,
                job: tuple[list[Any], dict[str, Any]] | None) -> int:
    from ..load.driver import (
        CHILD_LEAD_S,
        Driver,
        RunGone,
        new_run_id,
        out_of_reach,
        peak_rate,
        profile_of,
        spawn_children,
    )
    from ..load.report import bottlenecks, build, incomplete, render, write_html, write_png
    from ..store.keys import load_keys

    tty = sys.stderr.isatty()

    def say(line: str) -> None:
        if part is None:
            print(("\r\x1b[K" if tty else "") + line, end="" if tty else "\n",
                  file=sys.stderr, flush=True)

    run_id = args.join or args.run_id or new_run_id()
    try:
        keys = load_keys(app.namespace, run_id)
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    d = Driver(task, keys, run_id, app.async_redis(), app.async_scripts(), rules, say)
    children: list[Any] = []
    wedged = False
    try:
        await d.redis.ping()
        if args.join is None:
            job_args, job_kwargs = job or ([], {})
            if profile is None:  # _check refuses it: for the type checker
                raise _Usage("give a rate profile")
            if peak_rate(profile) / args.producers > CALIBRATE_ABOVE:
                what = await out_of_reach(task, profile, args.producers, job_args,
                                          job_kwargs)
                if what and not args.force:
                    raise _Usage(f"{what}; lower the rate, add --producers or machines "
                                 "(--join), or pass --force to run anyway (it stops at "
                                 "its duration, incomplete)")
                if what:
                    say(f"warning: {what}; --force: the run stops at its duration, "
                        "incomplete")
            try:
                await d.open(profile, job_args, job_kwargs, CHILD_LEAD_S,
                             args.producers)
            except ValueError as exc:
                raise _Usage(str(exc)) from None
            print(f"load run {run_id} (other machines: --join {run_id})", file=sys.stderr)
            # the producers are child processes even when there is one: their event loop
            # does nothing but send, so reading and judging the run costs them no lateness
            children = spawn_children(args.app, task.name, run_id, args.producers,
                                      app.redis_url)
            # the producers end with their schedule; one that does not (wedged, or
            # stopped by hand) is not waited for forever
            planned_s = profile.duration_s if profile is not None else 0.0
            deadline = time.monotonic() + CHILD_LEAD_S + planned_s + PRODUCER_GRACE_S
            await d.watch(lambda: all(c.poll() is not None for c in children)
                          or time.monotonic() > deadline)
            late = [c for c in children if c.poll() is None]
            if late:
                say(f"{len(late)} producer process(es) still running "
                    f"{PRODUCER_GRACE_S:.0f} s after the schedule ended: stopping them "
                    f"(pids {', '.join(str(c.pid) for c in late)}; their stacks follow)")
                _stacks_then_stop(late)
                wedged = True
        else:
            try:
                meta = await d.join()
            except RunGone as exc:
                raise _Usage(str(exc)) from None
            if meta.get("task") != task.name:
                raise _Usage(f"run {run_id} loads task {meta.get('task')!r}, not "
                             f"{task.name!r}")
            inherited = profile is None
            profile = profile or profile_of(meta)
            run_args = json.loads(meta.get("args") or "{}")
            job_args, job_kwargs = job or (list(run_args.get("args", [])),
                                           dict(run_args.get("kwargs", {})))
            now = time.time() + 0.2
            start_s = float(meta["start_s"]) if part else \
                max(now, float(meta["start_s"])) if inherited else now
            if part is not None:
                st = await d.produce(profile, job_args, job_kwargs, start_s, part)
                return 1 if st.errors else 0
            await _produce_and_watch(d, profile, job_args, job_kwargs, start_s, (0, 1))
        run = await d.settle(args.settle)
        why = incomplete(run, args.settle, wedged) if args.join is None else ""
        if why:
            # the run is over: the workers acknowledge its queued jobs without running
            # them, and the report says why it is incomplete
            await d.finish(why)
            run = await d.settle(LEFTOVER_WAIT_S)
        if tty:
            print(file=sys.stderr)
        run.meta["run_id"] = run_id
        report = build(run)
        if args.json:
            print(json.dumps(report, indent=1))
            for note in bottlenecks(run):
                print(f"note: {note}", file=sys.stderr)
        else:
            print(render(run, report))
        if args.out:
            out = Path(args.out)
            plan = profile_of(run.meta) if run.meta.get("profile") else profile
            (write_png if out.suffix.lower() == ".png" else write_html)(out, run, report, plan)
            print(f"wrote {out}", file=sys.stderr)
        over = run.meta.get("status") in ("aborted", "incomplete")
        if over:
            print(f"{run.meta['status']}: {run.meta.get('reason', '')}", file=sys.stderr)
        return 1 if over or wedged or run.num("send_errors") else 0
    finally:
        _stop_children(children)
        await app.aclose()


def _stacks_then_stop(late: list[Any]) -> None:
    """Ask wedged producers for their stacks (SIGUSR1: ``faulthandler`` prints every
    thread's on their stderr, which is ours), then stop them."""
    for c in late:
        if c.poll() is None:
            c.send_signal(signal.SIGUSR1)
    time.sleep(STACKS_WAIT_S)
    _stop_children(late, grace_s=0)


def _stop_children(children: list[Any], grace_s: float = 10.0) -> None:
    """Wait for the producer processes a little, then end them (never forever)."""
    for c in children:
        try:
            c.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            c.terminate()
            try:
                c.wait(timeout=max(1.0, min(5.0, grace_s)))
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()


async def _produce_and_watch(d: Driver, profile: Profile, job_args: list[Any],
                             job_kwargs: dict[str, Any], start_s: float,
                             part: tuple[int, int]) -> None:
    done = False
    watcher = asyncio.create_task(d.watch(lambda: done))
    try:
        await d.produce(profile, job_args, job_kwargs, start_s, part)
    finally:
        done = True
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
