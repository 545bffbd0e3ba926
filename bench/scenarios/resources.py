"""Resource scenarios: ``memory`` (Redis bytes per queued job, worker RSS) and ``idle``
(CPU and Redis commands of a fleet with nothing to do).

memory: ``INFO memory`` ``used_memory`` is read before and after ``enqueue_many`` of N
jobs with a payload of the stated size (one ``bytes`` argument); the delta over N is the
cost of a queued job, and the part above the encoded entry (``len`` of the bytes the
producer writes) is Redis's own overhead per list element. Then a ``--burst`` fleet
drains them while the harness samples the peak RSS (``VmHWM`` in ``/proc/<pid>/status``)
of every fleet process every 10 ms.

idle: after a warm-up, the CPU time (``/proc/<pid>/stat`` utime + stime) of the
supervisor and its workers and the server's ``INFO commandstats`` call counts are read
at the start and the end of the window; the harness's own two ``INFO`` calls are
subtracted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Any

from batchq.produce import producer
from bench import record
from bench.harness import (
    EXIT_GRACE_S,
    Context,
    Fleet,
    Row,
    batchq_worker_argv,
    cpu_seconds,
    peak_rss_bytes,
    process_tree,
    wait_for_totals,
)
from bench.scenarios.throughput import fill


def used_memory(ctx: Context) -> int:
    return int(ctx.client.info("memory")["used_memory"])


def entry_bytes(ctx: Context, payload: bytes) -> int:
    """Length of the encoded entry the producer writes for one such job."""
    task = ctx.app.tasks["noop"]
    p = producer.plan(ctx.app, task.name, task.queue, 0, task.config.max_attempts, None, None)
    return len(p.entry((payload,), {}, int(time.time() * 1000))[1])


def memory_once(ctx: Context, n: int, payload_bytes: int, processes: int | None,
                concurrency: int) -> dict[str, Any]:
    payload = b"x" * payload_bytes
    ctx.reset()
    ctx.app.tasks["noop"].enqueue_many([])  # registers the queue before the baseline
    time.sleep(0.2)
    before = used_memory(ctx)
    enqueue_s = fill(ctx, "noop", n, payload)
    after = used_memory(ctx)
    per_job = (after - before) / n
    entry = entry_bytes(ctx, payload)
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=True), ctx.fleet_env())
    peak: dict[int, int] = {}
    with fleet:
        fleet.start()
        # VmHWM is a process's peak RSS so far, so one late sample still sees the peak;
        # keep sampling until the workers were seen (a tiny run can end in a blink)
        while fleet.running() and (record.read_totals(ctx.client, ctx.key)[0] < n
                                   or len(peak) < 1 + (1 if processes else 0)):
            for pid in process_tree(fleet.pid):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    peak[pid] = max(peak.get(pid, 0), peak_rss_bytes(pid))
            time.sleep(0.01)
        wait_for_totals(ctx.client, ctx.key, n, 10.0, fleet)
        try:
            code = fleet.proc.wait(EXIT_GRACE_S) if fleet.proc is not None else 0
        except subprocess.TimeoutExpired:
            ctx.note_hang()
        else:
            if code != 0:
                raise RuntimeError(f"worker fleet exited {code}\n{fleet.log_tail()}")
    drained = used_memory(ctx)
    workers = [v for pid, v in peak.items() if pid != fleet.pid] if processes else \
        list(peak.values())
    return {
        "jobs": n, "payload_bytes": payload_bytes, "enqueue_s": enqueue_s,
        "used_memory_before": before, "used_memory_after": after,
        "used_memory_after_drain": drained, "bytes_per_job": per_job,
        "entry_bytes": entry, "overhead_bytes_per_job": per_job - entry,
        "worker_peak_rss_bytes": max(workers, default=0),
        "supervisor_peak_rss_bytes": peak.get(fleet.pid, 0) if processes else None,
        "processes_sampled": len(peak),
    }


def run_memory(ctx: Context, rec: dict[str, Any], *, jobs: int, repeat: int,
               payload_bytes: int, processes: int | None, concurrency: int) -> list[Row]:
    procs = processes or os.cpu_count() or 1
    row = Row(f"{jobs:,} jobs, {payload_bytes:,} B payload, drained by -p {procs}",
              {"jobs": jobs, "payload_bytes": payload_bytes, "processes": procs})
    for i in range(repeat):
        r = memory_once(ctx, jobs, payload_bytes, procs, concurrency)
        row.add("bytes/job", r["bytes_per_job"], "B")
        row.add("encoded entry", r["entry_bytes"], "B")
        row.add("overhead/job", r["overhead_bytes_per_job"], "B")
        row.add("worker peak RSS", r["worker_peak_rss_bytes"] / 2**20, "MiB")
        if r["supervisor_peak_rss_bytes"] is not None:
            row.add("supervisor RSS", r["supervisor_peak_rss_bytes"] / 2**20, "MiB")
        rec["runs"].append({"repeat": i, **r})
    ctx.reset()
    return [row]


def idle_once(ctx: Context, processes: int | None, concurrency: int, warmup_s: float,
              duration_s: float) -> dict[str, Any]:
    ctx.reset()
    fleet = Fleet(batchq_worker_argv(processes, concurrency, burst=False), ctx.fleet_env())
    server_pid = ctx.server["pid"] if ctx.embedded is not None else 0
    with fleet:
        fleet.start()
        # the supervisor forks its workers only after importing the app and checking
        # Redis: wait for them (a loaded machine can take seconds), then warm up
        want = 1 + (processes or 0)
        deadline = time.monotonic() + 30.0
        while len(process_tree(fleet.pid)) < want and time.monotonic() < deadline:
            if not fleet.running():
                break
            time.sleep(0.05)
        time.sleep(warmup_s)
        if not fleet.running():
            raise RuntimeError(f"worker fleet exited\n{fleet.log_tail()}")
        pids = process_tree(fleet.pid)
        cpu0 = {p: cpu_seconds(p) for p in pids}
        srv0 = cpu_seconds(server_pid) if server_pid else 0.0
        cmd0 = ctx.client.info("commandstats")
        t0 = time.perf_counter()
        time.sleep(duration_s)
        cmd1 = ctx.client.info("commandstats")
        elapsed = time.perf_counter() - t0
        cpu1 = {p: cpu_seconds(p) for p in pids}
        srv1 = cpu_seconds(server_pid) if server_pid else 0.0
    calls: dict[str, int] = {}
    for name, st in cmd1.items():
        d = int(st["calls"]) - int(cmd0.get(name, {}).get("calls", 0))
        if d:
            calls[name.removeprefix("cmdstat_")] = d
    calls["info"] = calls.get("info", 0) - 1  # the second INFO is counted, the first not
    if calls["info"] <= 0:
        del calls["info"]
    total = sum(calls.values())
    fleet_cpu = sum(cpu1[p] - cpu0[p] for p in pids)
    return {
        "seconds": elapsed, "processes": len(pids),
        "fleet_cpu_percent": fleet_cpu / elapsed * 100,
        "per_process_cpu_percent": {str(p): (cpu1[p] - cpu0[p]) / elapsed * 100 for p in pids},
        "server_cpu_percent": (srv1 - srv0) / elapsed * 100 if server_pid else None,
        "commands_per_s": total / elapsed,
        "commands": calls,
    }


def run_idle(ctx: Context, rec: dict[str, Any], *, repeat: int, processes: int | None,
             concurrency: int, warmup_s: float, duration_s: float) -> list[Row]:
    procs = processes or os.cpu_count() or 1
    row = Row(f"idle fleet -p {procs} -c {concurrency}, {duration_s:g} s",
              {"processes": procs, "concurrency": concurrency, "duration_s": duration_s})
    for i in range(repeat):
        r = idle_once(ctx, procs, concurrency, warmup_s, duration_s)
        row.add("fleet CPU", r["fleet_cpu_percent"], "% of a core")
        row.add("Redis commands/s", r["commands_per_s"], "cmd/s")
        if r["server_cpu_percent"] is not None:
            row.add("server CPU", r["server_cpu_percent"], "% of a core")
        rec["runs"].append({"repeat": i, **r})
    if ctx.shared_server:
        ctx.notes.append("commands/s counts every client of the given server")
        rec["notes"] = list(ctx.notes)
    return [row]
