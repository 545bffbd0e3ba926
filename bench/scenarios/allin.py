"""The ``allin`` scenario: what a user gets with default flags, timed as a user times it.

``N`` no-op jobs are enqueued (not timed), then ``batchq worker bench.apps:app --burst``
is started as a subprocess with nothing but the flag under test, and timed from just
before the process is spawned to its exit (``Popen`` then ``wait``): interpreter
start-up, imports, connecting, the drain, the burst end and the shutdown all count.
Beside it, the first-entry-to-last-exit figure of the same run (the handlers' own
clocks, as in ``drain``), and the worker process's own CPU time per job (``wait4``
rusage): on a shared machine the wall-clock figures move with the neighbours' load, the
CPU time much less, and the server's time in the worker's scripts per job (pop, ack and
the rest: ``INFO commandstats`` evalsha/fcall usec over the run, reset after the fill; a
command a script calls is counted inside the script's time), with the ceiling it sets
on one queue (1 s ÷ that, since Redis runs scripts on one core). Cases: the async no-op
with metrics on (the default) and with ``--no-metrics``, the batch no-op
(``batch_size=100``) with default flags, and an empty ``--burst`` run (nothing
enqueued) from start to exit.

``--before DIR`` runs every case a second time from another checkout (e.g. ``git
archive <commit> | tar -x -C DIR``), alternating with this one in every repeat, so a
before/after comparison comes from one run on the same server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.apps import QUEUE
from bench.harness import REPO_ROOT, Context, Row, add_ratios
from bench.scenarios.throughput import fill

CASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("empty --burst", "", ()),
    ("async no-op, metrics on (default)", "noop", ()),
    ("async no-op, --no-metrics", "noop", ("--no-metrics",)),
    ("batch no-op (batch_size 100), default flags", "batch_noop", ()),
)


def worker_argv(extra: tuple[str, ...]) -> list[str]:
    """``batchq worker bench.apps:app --burst`` with default flags but ``extra``."""
    return [sys.executable, "-m", "batchq", "worker", "bench.apps:app", "--burst", *extra]


def worker_env(ctx: Context, tree: Path) -> dict[str, str]:
    """The fleet's environment with ``tree`` first on the path (``-m`` puts the working
    directory first too), and bytecode caching on: a user's installed package has its
    ``.pyc`` files, and ``PYTHONDONTWRITEBYTECODE=1`` (set in some dev shells) would
    make every start compile batchq from source (~0.14 s)."""
    env = ctx.fleet_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get(
        "PYTHONPATH")])])
    return env


def timed_burst(ctx: Context, tree: Path, extra: tuple[str, ...],
                timeout_s: float) -> tuple[float, float, str]:
    """Start one burst worker from ``tree`` and wait for its exit: (seconds from spawn to
    exit, its CPU seconds, the tail of its log); an exit other than 0 fails."""
    env = worker_env(ctx, tree)
    fd, name = tempfile.mkstemp(prefix="bench-allin-", suffix=".log")
    os.close(fd)
    log_path = Path(name)
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(worker_argv(extra), cwd=tree, env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        # wait4: the exit seen at once (no polling), and the worker's own CPU time
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        proc.returncode = code = os.waitstatus_to_exitcode(status)
    tail = log_path.read_text(errors="replace")[-2000:]
    log_path.unlink(missing_ok=True)
    if code == -signal.SIGKILL:
        raise RuntimeError(f"burst worker did not exit within {timeout_s:.0f}s\n{tail}")
    if code != 0:
        raise RuntimeError(f"burst worker exited {code}\n{tail}")
    return wall, usage.ru_utime + usage.ru_stime, tail


def run_once(ctx: Context, tree: Path, task: str, jobs: int, extra: tuple[str, ...],
             timeout_s: float) -> dict[str, Any]:
    """Enqueue ``jobs`` jobs of ``task`` (none for ``task == ""``), then time one burst
    worker started from ``tree`` until it exits."""
    ctx.reset()
    n = jobs if task else 0
    if n:
        fill(ctx, task, n)
    ctx.client.config_resetstat()
    wall, cpu, tail = timed_burst(ctx, tree, extra, timeout_s)
    got, first, last, _ = record.read_totals(ctx.client, ctx.key)
    st = ctx.app.queue(QUEUE).stats()
    if got != n or st.pending or st.dead:
        raise RuntimeError(f"handlers reported {got} of {n} jobs; queue {st}\n{tail}")
    stats = ctx.client.info("commandstats")
    script_us = sum(int(v["usec"]) for name, v in stats.items()
                    if name.removeprefix("cmdstat_") in ("evalsha", "eval", "fcall"))
    out: dict[str, Any] = {"tree": str(tree), "task": task, "jobs": n, "flags": list(extra),
                           "wall_s": wall, "worker_cpu_s": cpu}
    if n:
        out["all_in_jobs_per_s"] = n / wall
        out["worker_cpu_us_per_job"] = cpu / n * 1e6
        out["redis_script_us_per_job"] = script_us / n
        out["drain_s"] = max(last - first, 1e-6)
        out["jobs_per_s"] = n / out["drain_s"]
    return out


def run_allin(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
              before: Path | None) -> list[Row]:
    trees: list[tuple[str, Path]] = [("", REPO_ROOT)]
    if before is not None:
        trees.insert(0, ("before: ", before.resolve()))
    rows: dict[tuple[str, str], Row] = {}
    for label, tree in trees:
        for name, task, extra in CASES:
            rows[label, name] = Row(f"{label}{name}", {"task": task, "flags": list(extra),
                                                        "tree": str(tree), "jobs": jobs})
    ratios: dict[str, Row] = {label: Row(f"{label}metrics on ÷ off (all-in)")
                              for label, _ in trees}
    timeout_s = 120 + jobs / 2000
    for _, tree in trees:  # untimed: writes the bytecode caches, warms the page cache
        run_once(ctx, tree, "", 0, (), timeout_s)
    for i in range(repeat):
        for name, task, extra in CASES:
            for label, tree in trees:  # alternating trees inside each case
                r = run_once(ctx, tree, task, jobs, extra, timeout_s)
                row = rows[label, name]
                row.add("start-to-exit", r["wall_s"], "s")
                if task:
                    row.add("all-in jobs/s", r["all_in_jobs_per_s"], "jobs/s")
                    row.add("first-entry-to-last-exit jobs/s", r["jobs_per_s"], "jobs/s")
                    row.add("worker CPU µs/job", r["worker_cpu_us_per_job"], "µs")
                    row.add("Redis script µs/job", r["redis_script_us_per_job"], "µs")
                    row.add("ceiling of one queue (1 s ÷ Redis µs/job)",
                            1e6 / max(r["redis_script_us_per_job"], 1e-9), "jobs/s")
                else:
                    row.add("worker CPU s", r["worker_cpu_s"], "s")
                rec["runs"].append({"case": row.name, "repeat": i, **r})
        for label, _ in trees:
            on = rows[label, CASES[1][0]].values["all-in jobs/s"][-1]
            off = rows[label, CASES[2][0]].values["all-in jobs/s"][-1]
            ratios[label].add("ratio", on / off)
    for label, _ in trees:
        add_ratios([rows[label, name] for name, _, _ in CASES[1:]], "all-in jobs/s",
                   "÷ default flags")
    if before is not None:
        for name, _, _ in CASES[1:]:
            add_ratios([rows["before: ", name], rows["", name]], "all-in jobs/s", "÷ before")
    record.reset(ctx.client, ctx.key)
    return [*rows.values(), *ratios.values()]
