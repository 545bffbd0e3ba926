"""What every scenario shares: the Redis under test, the worker fleet as a subprocess,
machine and version facts, summaries over repeats, the JSON record and the markdown table.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

import batchq
from batchq.dev.server import EmbeddedServer

from . import record

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# --- summaries -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread (min, max) of one figure over the repeats."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "values": vals}


@dataclass
class Row:
    """One line of a scenario's table: a case and its figures over the repeats."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    values: dict[str, list[float]] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    def add(self, metric: str, value: float, unit: str = "") -> None:
        self.values.setdefault(metric, []).append(float(value))
        if unit:
            self.units[metric] = unit

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params,
                "figures": {m: {**summarize(v), "unit": self.units.get(m, "")}
                            for m, v in self.values.items()}}


def add_ratios(rows: Sequence[Row], metric: str, label: str, base: int = 0) -> None:
    """Give each row that has ``metric`` a figure ``label``: its median ``metric`` over
    the base row's (``rows[base]``), so the table states the comparison as a ratio."""
    ref = rows[base].values.get(metric)
    if not ref:
        return
    denom = statistics.median(ref)
    for r in rows:
        if r.values.get(metric) and denom:
            r.add(label, statistics.median(r.values[metric]) / denom)


# --- facts about the run ---------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _mem_total_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def loadavg() -> list[float]:
    with contextlib.suppress(OSError, ValueError):
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return []


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": _mem_total_bytes(),
        "kernel": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
        "loadavg_at_start": loadavg(),
    }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "batchq": batchq.__version__,
        "redis-py": redis.__version__,
        "hiredis": _dist_version("hiredis"),
        "msgpack": _dist_version("msgpack"),
        "uvloop": _dist_version("uvloop"),
        "server": f"{server.get('name', '?')} {server.get('version', '?')}",
    }


def server_info(client: redis.Redis) -> dict[str, Any]:
    info = client.info("server")
    name = "valkey" if "valkey_version" in info else str(info.get("server_name") or "redis")
    return {
        "name": name,
        "version": str(info.get("valkey_version") or info.get("redis_version")),
        "redis_version": str(info.get("redis_version")),
        "pid": int(info.get("process_id", 0)),
        "tcp_port": info.get("tcp_port"),
    }


# --- the context of one harness run ----------------------------------------------------


class Context:
    """The Redis under test (embedded unless a URL is given), the bench app bound to it,
    and the key where handlers report their timings."""

    def __init__(self, redis_url: str | None, namespace: str | None = None,
                 out_dir: Path | None = None, quick: bool = False) -> None:
        self.embedded: EmbeddedServer | None = None
        if redis_url is None:
            self.embedded = EmbeddedServer().start()
            redis_url = self.embedded.url
        self.url = redis_url
        self.namespace = namespace or f"bench{uuid.uuid4().hex[:8]}"
        self.key = f"{self.namespace}:rec"
        self.out_dir = out_dir or RESULTS_DIR
        self.quick = quick
        self.client = redis.Redis.from_url(redis_url)
        self.server = server_info(self.client)
        from .apps import make_app

        self.app = make_app(redis_url, self.namespace)
        self.notes: list[str] = []
        self.hangs = 0
        if self.embedded is None:
            self.notes.append("Redis given by --redis-url: other clients of that server, if "
                              "any, share its CPU and show up in its INFO figures.")

    def note_hang(self) -> None:
        """A --burst fleet did not exit after its last job and was stopped."""
        self.hangs += 1
        note = ("--burst worker fleets that did not exit within "
                f"{EXIT_GRACE_S:g}s of their last job (stopped; timings unaffected): ")
        self.notes = [n for n in self.notes if not n.startswith(note)]
        self.notes.append(f"{note}{self.hangs}")

    @property
    def shared_server(self) -> bool:
        return self.embedded is None

    def fleet_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BATCHQ_", "BENCH_"))}
        env.update(BATCHQ_REDIS_URL=self.url, BENCH_REDIS_URL=self.url, BENCH_KEY=self.key,
                   BENCH_NAMESPACE=self.namespace, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env.update(extra)
        return env

    def reset(self) -> None:
        """Empty the bench queue and the timing reports."""
        from .apps import QUEUE

        self.app.queue(QUEUE).clear()
        record.reset(self.client, self.key)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.reset()
        self.app.close()
        self.client.close()
        if self.embedded is not None:
            self.embedded.stop()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the worker fleet ------------------------------------------------------------------


def batchq_worker_argv(processes: int | None, concurrency: int, burst: bool,
                       extra: Sequence[str] = ()) -> list[str]:
    """``python -m batchq worker bench.apps:app ...``; ``processes=None``: one process."""
    argv = [sys.executable, "-m", "batchq", "worker", "bench.apps:app",
            "-c", str(concurrency), "--no-metrics", "--log-level", "WARNING"]
    if processes:
        argv += ["-p", str(processes)]
    if burst:
        argv.append("--burst")
    return [*argv, *extra]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    kids = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (/proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of one process so far (``VmHWM``, /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int) -> int:
    """Resident set size of one process now (/proc/<pid>/statm)."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


class Fleet:
    """A worker fleet (or any command) run as a subprocess; output goes to a log file."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cwd: Path = REPO_ROOT) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix="bench-fleet-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self.started_at = 0.0
        self.started_wall = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Fleet:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        self.started_at = time.perf_counter()
        self.started_wall = time.time()
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(signal.SIGINT)
            raise RuntimeError(f"{self.argv[2:6]} did not finish within {timeout_s:.0f}s\n"
                               f"{self.log_tail()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        """Signal the fleet (its main process), wait, then SIGKILL the whole tree."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for pid in reversed(process_tree(self.proc.pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        self.stop(signal.SIGINT, timeout_s=10)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_totals(client: redis.Redis, key: str, jobs: int, timeout_s: float,
                    fleet: Fleet | None = None, stall_s: float | None = None,
                    ) -> tuple[int, float, float, int]:
    """Poll the handlers' reports until they account for ``jobs`` jobs. A fleet that
    exits with an error, or exits cleanly without the reports arriving, fails it. With
    ``stall_s``, a count that has not grown for that long is returned as it is (the
    caller reports the jobs that never ran)."""
    deadline = time.monotonic() + timeout_s
    seen, seen_at = -1, time.monotonic()
    while True:
        totals = record.read_totals(client, key)
        if totals[0] >= jobs:
            return totals
        if totals[0] != seen:
            seen, seen_at = totals[0], time.monotonic()
        elif stall_s is not None and seen > 0 and time.monotonic() - seen_at > stall_s:
            return totals
        code = fleet.proc.poll() if fleet is not None and fleet.proc is not None else None
        if code is not None and code != 0:
            raise RuntimeError(f"worker fleet exited {code}\n{fleet.log_tail() if fleet else ''}")
        if code == 0:
            deadline = min(deadline, time.monotonic() + 5.0)
        if time.monotonic() > deadline:
            tail = f"\n{fleet.log_tail()}" if fleet is not None else ""
            raise RuntimeError(f"handlers reported {totals[0]} of {jobs} jobs within "
                               f"{timeout_s:.0f}s{tail}")
        time.sleep(0.02)


EXIT_GRACE_S = 3.0


def run_burst(fleet: Fleet, client: redis.Redis, key: str, jobs: int,
              timeout_s: float) -> tuple[tuple[int, float, float, int], float | None]:
    """Start a ``--burst`` fleet, wait until its handlers report ``jobs`` jobs, then for
    it to exit by itself. Returns the totals and the fleet's wall time, or ``None`` for
    the wall time when it had to be stopped (it did not exit within ``EXIT_GRACE_S``
    of its last job: the handler timings stay valid)."""
    fleet.start()
    totals = wait_for_totals(client, key, jobs, timeout_s, fleet)
    assert fleet.proc is not None
    try:
        code = fleet.proc.wait(timeout=EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        fleet.stop(signal.SIGINT)
        return totals, None
    if code != 0:
        raise RuntimeError(f"worker fleet exited {code}\n{fleet.log_tail()}")
    return totals, time.perf_counter() - fleet.started_at


# --- output ----------------------------------------------------------------------------


def new_record(ctx: Context, scenario: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "parameters": parameters,
        "machine": machine(),
        "versions": versions(ctx.server),
        "server": {**ctx.server, "embedded": ctx.embedded is not None},
        "notes": list(ctx.notes),
        "rows": [],
        "runs": [],
    }


def finish_record(rec: dict[str, Any], out_dir: Path, rows: Sequence[Row],
                  ctx: Context | None = None) -> Path:
    """Add the rows, the closing load average, and write ``<scenario>-<timestamp>.json``."""
    rec["rows"] = [r.as_dict() for r in rows]
    if ctx is not None:
        rec["notes"] = list(ctx.notes)
    rec["machine"]["loadavg_at_end"] = loadavg()
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = out_dir / f"{rec['scenario']}-{stamp}.json"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{rec['scenario']}-{stamp}-{n}.json"
    path.write_text(json.dumps(rec, indent=1, sort_keys=False) + "\n")
    return path


def fmt(value: float, unit: str = "") -> str:
    if unit in ("jobs/s", "cmd/s", "bytes", "B/job") or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def cell(fig: dict[str, Any]) -> str:
    unit = fig.get("unit", "")
    if len(fig["values"]) == 1 or fig["min"] == fig["max"]:
        return fmt(fig["median"], unit)
    return f"{fmt(fig['median'], unit)} ({fmt(fig['min'], unit)}-{fmt(fig['max'], unit)})"


def markdown(rec: dict[str, Any]) -> str:
    """The record's rows as a markdown table: median (min-max) over the repeats."""
    rows = rec["rows"]
    metrics: list[str] = []
    units: dict[str, str] = {}
    for r in rows:
        for m, f in r["figures"].items():
            if m not in metrics:
                metrics.append(m)
                units[m] = f.get("unit", "")
    head = ["case", *(f"{m} ({units[m]})" if units[m] and units[m] != m else m
                     for m in metrics)]
    lines = [f"### {rec['scenario']} — {rec['timestamp']}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["name"], *(cell(r["figures"][m]) if m in r["figures"] else "-"
                              for m in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    reps = rec["parameters"].get("repeat")
    if reps and reps > 1:
        lines += ["", f"median (min-max) over {reps} repeats"]
    for note in rec.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines)


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    out: list[float] = []
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - t0)
