"""The ``iocurve`` scenario: the I/O-bound fan-out curve.

For each concurrency level C (``--levels``, default 100, 1,000, 5,000), N jobs of the
``io_wait`` task (``await asyncio.sleep(--sleep-ms)``, standing in for an HTTP call to a
provider) are enqueued first (not timed); then ONE worker process,
``python -m batchq worker bench.apps:app -c C --burst --no-metrics`` (no ``-p``), drains
them. Timed as in ``drain``: **jobs/s = jobs / (last handler exit - first handler
entry)**, from the handlers' own clocks (``bench/record.py``). Beside it:

* the ideal ``C / sleep`` (every slot always busy) and the achieved ratio
  ``jobs/s / min(C / sleep, --cap)``: the target is >= 80 % up to 10,000 jobs/s;
* the worker's peak RSS: its ``VmHWM`` (``/proc/<pid>/status``, the kernel's high-water
  mark of its RSS since the exec), read every 50 ms while it runs, the last reading
  kept; and the largest ``/proc/<pid>/statm`` RSS of those samples. Not ``ru_maxrss``
  from ``os.wait4``: Linux carries the pre-exec RSS of the forked (or vforked) harness
  process into the child's ``maxrss``, so it reads the harness's own size whenever
  that is larger (55 MiB against the worker's 37 MiB at ``-c 100``);
* the worker's CPU time in the drain window (``/proc/<pid>/stat`` utime + stime, sampled
  every 50 ms, interpolated at the first entry and the last exit) per job and in % of
  one core, and its whole-life CPU (``wait4``) per job; the embedded server's CPU in
  the same window (% of one core; not with ``--redis-url``).

Default jobs per level: ``max(20 x C, 20,000, 8 s at min(C / sleep, 20,000) jobs/s)``,
so every slot runs at least 20 jobs and a level takes ~4-10 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from itertools import pairwise
from itertools import repeat as _repeat
from typing import Any

from bench import record
from bench.apps import QUEUE
from bench.harness import (
    EXIT_GRACE_S,
    Context,
    Fleet,
    Row,
    batchq_worker_argv,
    cpu_seconds,
    peak_rss_bytes,
    rss_bytes,
    timed,
)

TASK = "io_wait"
CAP_JOBS_PER_S = 10_000.0
"""Issue 14: >= 80 % of C / sleep "up to 10,000 jobs/s"."""
SAMPLE_EVERY_S = 0.05
LEVEL_S = 8.0
SIZING_JOBS_PER_S = 20_000.0
"""Default jobs per level: about ``LEVEL_S`` at min(C / sleep, 20,000) jobs/s, at least
20 per slot and 20,000: 20,000 / 160,000 / 160,000 for the default levels, 4-10 s each
where one process reaches those rates."""


def default_jobs(concurrency: int, sleep_s: float, quick: bool) -> int:
    if quick:
        return max(5 * concurrency, 200)
    return max(20 * concurrency, 20_000,
               round(LEVEL_S * min(concurrency / sleep_s, SIZING_JOBS_PER_S)))


class Sampler:
    """Samples one process's RSS (``statm``) and CPU time (``stat``) every 50 ms on a
    thread, ``(wall time, cpu seconds, rss bytes)``, and its ``VmHWM``."""

    def __init__(self, pid: int, server_pid: int = 0) -> None:
        self.pid = pid
        self.server_pid = server_pid
        self.samples: list[tuple[float, float, int]] = []
        self.server: list[tuple[float, float, int]] = []
        """The embedded server's ``(wall time, cpu seconds, 0)``, when there is one."""
        self.hwm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="iocurve-sampler",
                                        daemon=True)

    def _one(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            cpu, rss = cpu_seconds(self.pid), rss_bytes(self.pid)
            if rss:  # a zombie's statm reads 0 (and its status has no VmHWM)
                self.samples.append((time.time(), cpu, rss))
                self.hwm = max(self.hwm, peak_rss_bytes(self.pid))
        if self.server_pid:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.server.append((time.time(), cpu_seconds(self.server_pid), 0))

    def _main(self) -> None:
        while not self._stop.is_set():
            self._one()
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t: float, server: bool = False) -> float:
        """CPU seconds at wall time ``t``, linearly interpolated between samples."""
        s = self.server if server else self.samples
        if not s:
            return 0.0
        if t <= s[0][0]:
            return s[0][1]
        for (t0, c0, _), (t1, c1, _) in pairwise(s):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return s[-1][1]

    @property
    def peak_rss(self) -> int:
        return max((r for _, _, r in self.samples), default=0)


def _try_reap(fleet: Fleet) -> tuple[int, Any] | None:
    """Reap the worker with ``os.wait4`` if it has exited (its rusage: CPU time), else
    ``None``. Popen must never reap it first (``poll``/``wait``
    would lose the rusage), hence this and ``_wait_done`` instead of
    ``harness.wait_for_totals``, whose loop polls."""
    assert fleet.proc is not None
    pid, status, usage = os.wait4(fleet.pid, os.WNOHANG)
    if not pid:
        return None
    code = os.waitstatus_to_exitcode(status)
    fleet.proc.returncode = code  # reaped here: Popen must not wait again
    return code, usage


def _wait_done(ctx: Context, fleet: Fleet, n: int, timeout_s: float,
               ) -> tuple[tuple[int, float, float, int], tuple[int, Any] | None]:
    """Wait until the handlers report ``n`` jobs (a burst worker's last report comes as
    it exits), then up to ``EXIT_GRACE_S`` for the worker to exit. Returns the totals
    and ``(exit code, rusage)``, or ``None`` if it did not exit."""
    deadline = time.monotonic() + timeout_s
    reaped = None
    while True:
        totals = record.read_totals(ctx.client, ctx.key)
        if totals[0] >= n:
            break
        if reaped is None:
            reaped = _try_reap(fleet)
            if reaped is not None:
                # exited: its last report is written before the exit, allow a moment
                deadline = min(deadline, time.monotonic() + 5.0)
        if reaped is not None and reaped[0] != 0:
            raise RuntimeError(f"worker exited {reaped[0]}\n{fleet.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"handlers reported {totals[0]} of {n} jobs within "
                               f"{timeout_s:.0f}s\n{fleet.log_tail()}")
        time.sleep(0.02)
    grace = time.monotonic() + EXIT_GRACE_S
    while reaped is None and time.monotonic() < grace:
        time.sleep(0.01)
        reaped = _try_reap(fleet)
    return totals, reaped


def iocurve_once(ctx: Context, concurrency: int, n: int, sleep_s: float) -> dict[str, Any]:
    """Enqueue ``n`` jobs of ``io_wait(sleep_s)``, drain them with one ``--burst``
    worker of ``-c concurrency``, and return its timings, RSS and CPU."""
    ctx.reset()
    with timed() as el:
        ids = ctx.app.tasks[TASK].enqueue_many(_repeat((sleep_s,), n))
    if len(ids) != n:
        raise RuntimeError(f"enqueue_many wrote {len(ids)} of {n} jobs")
    fleet = Fleet(batchq_worker_argv(None, concurrency, burst=True), ctx.fleet_env())
    reaped = None
    with fleet:
        fleet.start()
        server_pid = ctx.server["pid"] if ctx.embedded is not None else 0
        with Sampler(fleet.pid, server_pid) as sampler:
            (jobs, first, last, _), reaped = _wait_done(ctx, fleet, n, 60 + n / 200)
        if reaped is None:
            ctx.note_hang()
            fleet.stop(signal.SIGINT)
        elif reaped[0] != 0:
            raise RuntimeError(f"worker exited {reaped[0]}\n{fleet.log_tail()}")
    st = ctx.app.queue(QUEUE).stats()
    if jobs != n or st.pending or st.dead:
        raise RuntimeError(f"handlers reported {jobs} of {n} jobs; queue {st}")
    span = max(last - first, 1e-6)
    ideal = concurrency / sleep_s
    jobs_per_s = jobs / span
    window_cpu = max(sampler.cpu_at(last) - sampler.cpu_at(first), 0.0)
    out: dict[str, Any] = {
        "concurrency": concurrency, "jobs": n, "sleep_s": sleep_s, "enqueue_s": el[0],
        "drain_s": span, "jobs_per_s": jobs_per_s, "ideal_jobs_per_s": ideal,
        "target_basis_jobs_per_s": min(ideal, CAP_JOBS_PER_S),
        "ratio_of_capped_ideal": jobs_per_s / min(ideal, CAP_JOBS_PER_S),
        "ratio_of_ideal": jobs_per_s / ideal,
        "peak_rss_bytes": sampler.hwm,
        "sampled_peak_rss_bytes": sampler.peak_rss,
        "window_cpu_s": window_cpu,
        "window_cpu_us_per_job": window_cpu / jobs * 1e6,
        "window_cpu_percent": window_cpu / span * 100,
        "samples": len(sampler.samples),
        "server_cpu_percent": ((sampler.cpu_at(last, True) - sampler.cpu_at(first, True))
                               / span * 100 if server_pid else None),
        "fleet_exited_by_itself": reaped is not None,
    }
    if reaped is not None:
        usage = reaped[1]
        cpu = usage.ru_utime + usage.ru_stime
        out.update(fleet_wall_s=time.perf_counter() - fleet.started_at,
                   worker_cpu_s=cpu, worker_cpu_us_per_job=cpu / n * 1e6)
    return out


def run_iocurve(ctx: Context, rec: dict[str, Any], *, levels: list[int], jobs: int,
                repeat: int, sleep_ms: float, quick: bool) -> list[Row]:
    sleep_s = sleep_ms / 1000
    rows: list[Row] = []
    for c in levels:
        n = jobs or default_jobs(c, sleep_s, quick)
        rows.append(Row(f"-c {c:,}, {n:,} jobs of {sleep_ms:g} ms",
                        {"concurrency": c, "jobs": n, "sleep_ms": sleep_ms}))
    for i in range(repeat):
        for c, row in zip(levels, rows, strict=True):
            r = iocurve_once(ctx, c, row.params["jobs"], sleep_s)
            row.add("jobs/s", r["jobs_per_s"], "jobs/s")
            row.add(f"ideal C/{sleep_ms:g} ms", r["ideal_jobs_per_s"], "jobs/s")
            row.add("÷ ideal", r["ratio_of_ideal"])
            row.add(f"÷ min(ideal, {CAP_JOBS_PER_S:,.0f})", r["ratio_of_capped_ideal"])
            row.add("peak RSS", r["peak_rss_bytes"] / 2**20, "MiB")
            row.add("worker CPU µs/job", r["window_cpu_us_per_job"], "µs")
            row.add("worker CPU", r["window_cpu_percent"], "% of a core")
            if r["server_cpu_percent"] is not None:
                row.add("Valkey CPU", r["server_cpu_percent"], "% of a core")
            rec["runs"].append({"case": row.name, "repeat": i, **r})
    record.reset(ctx.client, ctx.key)
    return rows
