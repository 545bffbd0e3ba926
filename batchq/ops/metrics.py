"""Prometheus metrics: definitions (built in the worker process, never before a fork),
cheap per-job aggregation, and the collectors read at scrape time.

Hot path: a worker does not touch prometheus_client per job. Per job a runner only
bumps a plain counter and appends its wait and run times to two lists of the job's
(queue, task) ``JobSeries``; every ``FOLD_EVERY_S`` those lists are bucketed in bulk
(``_Hist.observe_many``: C-level max, sort and bisect) into plain dicts of bucket
counts and sums (``Recorder.fold``), and a flush task moves the sums into the real
metrics once a second, adding to prometheus_client's histogram children in bulk.

Under the supervisor the metrics use prometheus_client's multiprocess mode: the CLI sets
``PROMETHEUS_MULTIPROC_DIR`` (wiped at start) before anything imports the library, each
child writes its own files, the supervisor calls ``mark_process_dead`` for exited
children, and a separate metrics process serves every scrape with a fresh registry
(``MultiProcessCollector``) plus collectors that read queue depths from Redis (one
pipelined read per scrape, ``stats.read``, the same reader as ``Queue.stats``) and the
supervisor's own counts (a small JSON file).

The HTTP server (/metrics, /healthz, /readyz) is in ``metrics_http.py``.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import platform
import time
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from ..flow import metrics as flow_metrics
from ..store import shards
from ..store.clients import Clients
from ..store.keys import SHARD_SEP
from . import stats

if TYPE_CHECKING:
    from prometheus_client.registry import Collector


class HasClients(Protocol):
    """What the metrics need of an app (``App`` is one): its clients and namespace,
    never its task registry. What is read through the registry (campaigns, periodic
    tasks, circuit breakers) comes as collectors from the caller
    (``supervisor_metrics.app_collectors``)."""

    @property
    def clients(self) -> Clients: ...

    @property
    def namespace(self) -> str: ...

log = logging.getLogger("batchq.metrics")

RUN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
               5.0, 10.0, 30.0, 60.0, 300.0)
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
REDIS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)

SUPERVISOR_FILE = "batchq-supervisor.json"
"""In the multiprocess directory: the supervisor's counts, read at scrape time."""


class _Hist:
    """Local histogram aggregation keyed by label values."""

    __slots__ = ("bounds", "counts", "sums")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts: dict[tuple[str, ...], list[int]] = {}
        self.sums: dict[tuple[str, ...], float] = {}

    def observe(self, key: tuple[str, ...], value: float) -> None:
        c = self.counts.get(key)
        if c is None:
            c = self.counts[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
        c[bisect.bisect_left(self.bounds, value)] += 1
        self.sums[key] += value

    def observe_many(self, key: tuple[str, ...], values: list[float]) -> None:
        """``observe`` each of ``values`` (a negative one counts as 0), in bulk: C-level
        min and max find the buckets the values span; values all in one bucket (most
        run times of short jobs, the waits of a backlog) are counted at once, others
        sorted and split at each bound between (C-level sort and bisect; ~40-75 ns a
        value, against ~400 for ``observe`` per value)."""
        if not values:
            return
        c = self.counts.get(key)
        if c is None:
            c = self.counts[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
        bounds = self.bounds
        lo, hi = min(values), max(values)
        first = bisect.bisect_left(bounds, lo)  # the buckets they span (le is inclusive)
        last = bisect.bisect_left(bounds, hi)
        if first == last:
            c[first] += len(values)
        else:
            ordered = sorted(values)
            done = 0
            for i in range(first, last):
                upto = bisect.bisect_right(ordered, bounds[i], done)
                c[i] += upto - done
                done = upto
            c[last] += len(ordered) - done
        self.sums[key] += sum(values) if lo >= 0 else sum(v for v in values if v > 0)

    def drain(self) -> Iterator[tuple[tuple[str, ...], list[int], float]]:
        counts, sums = self.counts, self.sums
        self.counts, self.sums = {}, {}
        for key, c in counts.items():
            yield key, c, sums[key]


class JobSeries:
    """What the runners note per job of one (queue, task), at the least cost Python
    allows: runs started, and the raw wait and run times (seconds) until the next
    ``Recorder.fold`` buckets them."""

    __slots__ = ("restarts", "runs", "waits")

    def __init__(self) -> None:
        self.waits: list[float] = []
        """Ready (or due) to start of first attempts: one per first attempt started."""
        self.restarts = 0
        """Later attempts started (they have no wait): runs started = this + waits."""
        self.runs: list[float] = []


FOLD_EVERY_S = 0.1
"""How often the raw per-job times are bucketed: bounds the lists (a few thousand
floats at full speed)."""


class Recorder:
    """Per-process aggregation of everything a worker counts; ``flush`` publishes it."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.by_queue: dict[str, dict[str, JobSeries]] = {}
        """Per queue, then task, filled by the runners (``series_of``): two lookups of
        str keys whose hashes are cached cost a runner less than one of a tuple."""
        self.wall_offset = time.time() - time.perf_counter()
        """Wall clock minus ``time.perf_counter``, set again at every ``fold``: the
        runners time jobs with the latter (one read serves a job's end and the next
        one's start) and add this to compare a start with a job's ready time."""
        self.started: dict[tuple[str, str], int] = {}
        self.succeeded: dict[tuple[str, str], int] = {}
        self.failed: dict[tuple[str, str, str], int] = {}
        self.retried: dict[tuple[str, str], int] = {}
        self.held: dict[tuple[str, str], int] = {}
        self.dead: dict[tuple[str, str, str], int] = {}
        self.redelivered: dict[str, int] = {}
        self.stale: dict[str, int] = {}
        self.run = _Hist(RUN_BUCKETS)
        self.wait = _Hist(WAIT_BUCKETS)
        self.batch = _Hist(BATCH_BUCKETS)
        self.redis = _Hist(REDIS_BUCKETS)
        self._c_started = Counter("batchq_jobs_started", "Job runs started",
                                  ["queue", "task"])
        self._c_succeeded = Counter("batchq_jobs_succeeded", "Jobs finished successfully "
                                    "(acks that were not stale)", ["queue", "task"])
        self._c_failed = Counter("batchq_jobs_failed", "Failed attempts",
                                 ["queue", "task", "reason"])
        self._c_retried = Counter("batchq_jobs_retried", "Failed attempts scheduled for a "
                                  "retry", ["queue", "task"])
        self._c_held = Counter("batchq_jobs_rate_limited", "Jobs given back because their "
                               "handler raised RateLimited (their group or queue held)",
                               ["queue", "task"])
        self._c_dead = Counter("batchq_jobs_dead", "Jobs moved to the dead-letter store",
                               ["queue", "task", "reason"])
        self._c_redelivered = Counter("batchq_jobs_redelivered", "Expired leases handed "
                                      "out again", ["queue"])
        self._c_stale = Counter("batchq_stale_acks", "Results for leases that had expired",
                                ["queue"])
        self._h_run = Histogram("batchq_job_run_seconds", "Handler run time",
                                ["queue", "task"], buckets=RUN_BUCKETS)
        self._h_wait = Histogram("batchq_job_wait_seconds", "Ready (or due) to start, first "
                                 "attempts", ["queue", "task"], buckets=WAIT_BUCKETS)
        self._h_batch = Histogram("batchq_fetch_batch_size", "Jobs per fetch", ["queue"],
                                  buckets=BATCH_BUCKETS)
        self._h_redis = Histogram("batchq_redis_seconds", "Redis round trips by operation",
                                  ["op"], buckets=REDIS_BUCKETS)
        self._g_progress = Gauge("batchq_jobs_in_progress", "Jobs running now", ["queue"],
                                 multiprocess_mode="livesum")
        self._g_concurrency = Gauge("batchq_worker_concurrency", "Configured concurrency of "
                                    "live worker processes", multiprocess_mode="livesum")

    def declare(self, pairs: list[tuple[str, str]]) -> None:
        """Create every (queue, task) series at 0, so that ``increase()`` and ``rate()``
        see the first job too (a series born at 1 hides its first increment)."""
        for q, t in pairs:
            for c in (self._c_started, self._c_succeeded, self._c_retried, self._c_held):
                c.labels(q, t)
            for reason in ("failed", "timeout"):
                self._c_failed.labels(q, t, reason)
                self._c_dead.labels(q, t, reason)
        # per queue: a dashboard panel over these shows 0, not "No data", until the
        # first redelivery or stale ack
        for q in dict.fromkeys(q for q, _ in pairs):
            self._c_redelivered.labels(q)
            self._c_stale.labels(q)

    def set_concurrency(self, n: int) -> None:
        self._g_concurrency.set(n)

    def series_of(self, queue: str, task: str) -> JobSeries:
        tasks = self.by_queue.setdefault(queue, {})
        s = tasks.get(task)
        if s is None:
            s = tasks[task] = JobSeries()
        return s

    def fold(self) -> None:
        """Bucket the runners' raw per-job figures into the local aggregates."""
        self.wall_offset = time.time() - time.perf_counter()
        for q, tasks in self.by_queue.items():
            for t, s in tasks.items():
                waits, restarts, runs = s.waits, s.restarts, s.runs
                if waits or restarts:
                    bump(self.started, (q, t), len(waits) + restarts)
                    s.restarts = 0
                if waits:
                    s.waits = []
                    self.wait.observe_many((q, t), waits)
                if runs:
                    s.runs = []
                    self.run.observe_many((q, t), runs)

    def flush(self, in_progress: dict[str, int]) -> None:
        """Publish what was counted since the last flush."""
        self.fold()
        for src, metric in ((self.started, self._c_started),
                            (self.succeeded, self._c_succeeded),
                            (self.failed, self._c_failed), (self.retried, self._c_retried),
                            (self.held, self._c_held),
                            (self.dead, self._c_dead)):
            items = list(src.items())
            src.clear()
            for key, n in items:
                metric.labels(_queue(key[0]), *key[1:]).inc(n)
        for src1, metric1 in ((self.redelivered, self._c_redelivered),
                              (self.stale, self._c_stale)):
            items1 = list(src1.items())
            src1.clear()
            for q, n in items1:
                metric1.labels(_queue(q)).inc(n)
        for hist, local in ((self._h_run, self.run), (self._h_wait, self.wait),
                            (self._h_batch, self.batch)):
            for key, counts, total in local.drain():
                _add_to_histogram(hist.labels(_queue(key[0]), *key[1:]), counts, total)
        for key, counts, total in self.redis.drain():
            _add_to_histogram(self._h_redis.labels(*key), counts, total)
        progress: dict[str, int] = {}
        for q, n in in_progress.items():
            progress[_queue(q)] = progress.get(_queue(q), 0) + n
        for q, n in progress.items():
            self._g_progress.labels(q).set(n)


def _queue(name: str) -> str:
    """The queue label of a (sub-)queue: a sharded queue is reported as one queue."""
    return name.partition(SHARD_SEP)[0]


def _add_to_histogram(child: Any, counts: list[int], total: float) -> None:
    """Add pre-aggregated observations to a prometheus_client histogram child.

    prometheus_client has no public bulk add, so this increments the child's bucket and
    sum values (``_buckets``, ``_sum``: the values ``observe`` itself increments). The
    dependency range in pyproject is pinned to the versions known to have them, and
    ``tests/observe/test_metrics.py`` checks the result against ``observe``. Should they
    ever be missing, every observation is replayed through ``observe`` at its bucket's
    upper bound instead (counts exact, sum approximate), rather than crash a worker."""
    buckets = getattr(child, "_buckets", None)
    sum_value = getattr(child, "_sum", None)
    if isinstance(buckets, list) and len(buckets) == len(counts) and sum_value is not None:
        for bucket, n in zip(buckets, counts, strict=True):
            if n:
                bucket.inc(n)
        sum_value.inc(total)
        return
    bounds = [float(b) for b in getattr(child, "_upper_bounds", [])]
    finite = [b for b in bounds if b != float("inf")]
    above = (finite[-1] * 2 + 1) if finite else 0.0  # any value past the last bound
    for i, n in enumerate(counts):
        value = finite[i] if i < len(finite) else above
        for _ in range(n):
            child.observe(value)


def bump(d: dict[Any, int], key: Any, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


# --- scrape-time collectors -------------------------------------------------------------


class QueueCollector:
    """Queue depths, ages and enqueue counts, read from Redis once per scrape, the
    flow-control gauges (``flow_metrics``: grouped jobs, groups by state, holds, and the
    use of each limit, bounded per queue).

    Never drops a scrape over data: a malformed name in the registry of queues is
    skipped and counted (``batchq_queue_names_malformed``), and a ready list whose head
    is not a runnable job is flagged (``batchq_queue_malformed_heads``) while the
    queue's other gauges are still served."""

    def __init__(self, app: HasClients) -> None:
        self.app = app

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        jobs = GaugeMetricFamily("batchq_queue_jobs", "Jobs by state", labels=["queue", "state"])
        age = GaugeMetricFamily("batchq_queue_oldest_job_age_seconds",
                                "Age of the oldest ready job (grouped jobs included)",
                                labels=["queue"])
        lag = GaugeMetricFamily("batchq_queue_delayed_lag_seconds",
                                "Now minus the oldest due delayed job not yet moved",
                                labels=["queue"])
        paused = GaugeMetricFamily("batchq_queue_paused", "1 while the queue is paused",
                                   labels=["queue"])
        malformed = GaugeMetricFamily(
            "batchq_queue_malformed_heads", "Ready lists whose head entry is not a runnable "
            "job (a worker dead-letters it as decode_error)", labels=["queue"])
        bad_names = GaugeMetricFamily(
            "batchq_queue_names_malformed", "Names in the registry of queues that are not "
            "usable queue names (skipped)")
        enq = CounterMetricFamily("batchq_jobs_enqueued", "Jobs written to the queue "
                                  "(enqueue, schedule, redrive)", labels=["queue"])
        done = CounterMetricFamily(
            "batchq_queue_outcomes", "Outcomes Redis applied, counted by the scripts "
            "themselves: exact even when workers are killed (their own counters lose what "
            "they had not published yet)", labels=["queue", "outcome"])
        handed = CounterMetricFamily(
            "batchq_jobs_handed_off", "Jobs an enqueue leased straight to a worker blocked "
            "idle on the queue (the wake-up carried the job)", labels=["queue"])
        cancelled = CounterMetricFamily("batchq_jobs_cancelled", "Jobs cancelled before they "
                                        "started, counted as they are dropped", labels=["queue"])
        expired = CounterMetricFamily("batchq_jobs_expired", "Jobs past their expiry "
                                      "(expires_s / expires_at) dropped before they started",
                                      labels=["queue"])
        up = GaugeMetricFamily("batchq_redis_up", "1 if the scrape could read Redis")
        c = self.app.clients
        try:
            names, bad = stats.registered_queues(c.redis, self.app.namespace)
            snaps = stats.read_queues(c.redis, self.app.namespace, names, c.shards)
        except Exception as exc:  # a scrape must answer even when Redis does not
            log.warning("cannot read queue metrics from Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        if bad:
            log.warning("skipping %d malformed name(s) in the registry of queues: %s",
                        len(bad), ", ".join(repr(b) for b in bad[:5]))
        up.add_metric([], 1)
        bad_names.add_metric([], len(bad))
        for snap in snaps:
            name, st = snap.name, snap.stats
            for state in ("ready", "delayed", "reserved", "dead"):
                jobs.add_metric([name, state], getattr(st, state))
            age.add_metric([name], st.oldest_age_s)
            lag.add_metric([name], snap.delayed_lag_s)
            paused.add_metric([name], 1 if st.paused else 0)
            malformed.add_metric([name], len(st.malformed_heads))
            for fam, o in ((enq, "enqueued"), (handed, "handed"), (cancelled, "cancelled"),
                           (expired, "expired")):
                fam.add_metric([name], snap.outcomes[o])
            for outcome in ("succeeded", "dead", "retried"):
                done.add_metric([name, outcome], snap.outcomes[outcome])
        yield from (jobs, age, lag, paused, malformed, enq, handed, cancelled, expired, done,
                    bad_names, up)
        yield from flow_metrics.queue_families(snaps)
        try:  # limits and the groups that wait; never at the cost of the above
            fams = flow_metrics.limit_families(c.redis, {
                s.name: [c.keys(x) for x in shards.names(s.name, s.shards)] for s in snaps})
        except Exception as exc:
            log.warning("cannot read the flow-control metrics from Redis: %s", exc)
        else:
            yield from fams


class SupervisorCollector:
    """The supervisor's counts (processes, restarts), from its JSON file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            with open(self.path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        procs = GaugeMetricFamily("batchq_worker_processes", "Live worker processes")
        procs.add_metric([], int(data.get("processes", 0)))
        restarts = CounterMetricFamily("batchq_worker_restarts", "Worker processes replaced",
                                       labels=["reason"])
        for reason in ("died", "unresponsive", "recycled", "memory"):
            restarts.add_metric([reason], int(data.get("restarts", {}).get(reason, 0)))
        yield procs
        yield restarts


def _version() -> str:
    """The installed distribution's version (no import of the package root)."""
    try:
        return metadata.version("batchq")
    except metadata.PackageNotFoundError:  # run from a checkout without installing
        return "unknown"


class BuildInfoCollector:
    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily("batchq_build_info", "batchq build", labels=["version", "python"])
        g.add_metric([_version(), platform.python_version()], 1)
        yield g


def write_supervisor_state(directory: str, processes: int, restarts: dict[str, int]) -> None:
    """Atomically replace the supervisor's JSON file (read by ``SupervisorCollector``)."""
    path = os.path.join(directory, SUPERVISOR_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"processes": processes, "restarts": restarts}, f)
    os.replace(tmp, path)


def build_registry(app: HasClients, multiproc_dir: str | None,
                   extra: Iterable[Collector] = ()) -> Any:
    """A registry for one scrape: process metrics (multiprocess-aggregated when a
    directory is given), queue state from Redis, supervisor counts, build info, and the
    ``extra`` collectors (what the app's registry knows: campaigns, periodic tasks,
    circuit breakers)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client import multiprocess as mp

    registry = CollectorRegistry()
    collectors: list[Collector] = [QueueCollector(app), BuildInfoCollector(), *extra]
    if multiproc_dir:
        mp.MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]
        collectors.append(SupervisorCollector(os.path.join(multiproc_dir, SUPERVISOR_FILE)))
    else:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    for c in collectors:
        with contextlib.suppress(ValueError):  # already registered on REGISTRY
            registry.register(c)
    return registry
