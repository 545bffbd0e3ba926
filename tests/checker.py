"""The delivery checker: what a fault did to at-least-once delivery.

batchq promises at-least-once delivery: a job is never lost once ``enqueue`` returned,
and it runs more than once only when its worker died or its lease expired while it ran.
A fault test records, outside the queue under test,

* which jobs it enqueued: the tokens whose ``enqueue`` returned (``enqueued``), those
  whose ``enqueue`` raised with an unknown outcome (``maybe``: ``EnqueueError.unknown``),
  and those whose ``enqueue`` may have been retried by the producer after a lost reply
  (``retried_enqueues``: such a retry can write the job a second time, see README
  "Reconnects do not double jobs");
* every run of every job (:class:`Run`, written by the handlers to files, see
  ``faults/fault_app.py``; :func:`read_runs` reads them back);
* the dead-letter store after the drain (``dead``: token -> reason);
* the pids it killed (``killed_pids``), and whether a lease could have expired while a
  run was going on (``expired_leases_possible``: a bool, or a predicate over runs).

:func:`check` turns these into a :class:`Report`:

* **lost**: enqueued, never ran to completion and not dead-lettered;
* **unexpected**: ran (or was dead-lettered) although never enqueued;
* **duplicated**: ran to completion more than once. Every run of such a job but the last
  one started must be explained: its process was killed, or its lease could have expired
  (then the job was handed out again), or the job was written twice by a retried
  enqueue (then both runs are attempt 1 of the same job id, or the task does not see its
  job). ``Report.valid`` is True when nothing is lost or unexpected and every duplicate
  is explained.

:func:`leftovers` checks the queue's keys in Redis after the drain (nothing ready,
delayed, reserved or in flight; no key besides the expected ones) and
:func:`reconcile` checks ``/metrics``: ``batchq_jobs_enqueued = succeeded + dead +
still queued``.
"""

from __future__ import annotations

import os
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- runs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """One run of one job: ``end`` is None when it never ran to completion."""

    token: str
    job_id: str
    attempt: int
    pid: int
    start: float
    end: float | None = None
    cancels_ignored: int = 0

    @property
    def completed(self) -> bool:
        return self.end is not None


def read_runs(directory: str | os.PathLike[str]) -> list[Run]:
    """Every run recorded in ``directory/runs-*.log`` (see ``faults/fault_app.py``).

    A start line and an end line of the same run (same token, pid and start time) make
    one :class:`Run`; an end line alone is a completed run too (the soak writes no start
    lines). A last line without its newline is a record still being written (or whose
    writer was killed mid-write) and is left out. Raises ``ValueError`` on any other
    malformed line: that would be a bug of the recorder, not something to skip."""
    # (token, pid, start as written) -> [job id, attempt, end]
    runs: dict[tuple[str, int, str], list[Any]] = {}
    cancels: Counter[tuple[str, int]] = Counter()
    for path in sorted(Path(directory).glob("runs-*.log")):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # only the last line can lack it: an unfinished record
                parts = line.split()
                try:
                    kind, token, jid, attempt, pid = parts[:5]
                    if kind == "C":
                        cancels[(token, int(pid))] += 1
                        continue
                    key = (token, int(pid), parts[5])
                    rec = runs.get(key)
                    if rec is None:
                        rec = runs[key] = [jid, int(attempt), None]
                    if kind == "E":
                        rec[2] = float(parts[6])
                    elif kind != "S":
                        raise ValueError(kind)
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"{path}:{n}: malformed record {line!r}") from exc
    out = [Run(token, jid, attempt, pid, float(start), end,
               cancels.get((token, pid), 0) if end is None else 0)
           for (token, pid, start), (jid, attempt, end) in runs.items()]
    out.sort(key=lambda r: (r.start, r.pid))
    return out


# --- the check -------------------------------------------------------------------------


@dataclass
class Report:
    attempted: int
    """Enqueues tried (returned, raised with an unknown outcome, or refused)."""
    enqueued: int
    """Enqueues that returned: these must not be lost."""
    maybe: int
    """Enqueues that raised with an unknown outcome: may run or not."""
    started: int
    """Runs that began (every attempt, completed or not)."""
    run: int
    """Runs that ran to completion (a job completed twice counts twice)."""
    completed: int
    """Distinct jobs that ran to completion at least once."""
    dead: int
    """Distinct jobs in the dead-letter store."""
    interrupted: int
    """Runs that began and never completed (killed, cancelled by a shutdown, ...)."""
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: dict[str, list[Run]] = field(default_factory=dict)
    unexplained: dict[str, str] = field(default_factory=dict)
    """Duplicated tokens whose extra runs nothing explains, and why not."""
    explained_by: Counter[str] = field(default_factory=Counter)
    """How the extra runs of duplicates were explained (killed / lease / double write)."""

    @property
    def valid(self) -> bool:
        return not self.lost and not self.unexpected and not self.unexplained

    def counts(self) -> dict[str, int]:
        """The figures, for tables and JSON."""
        return {
            "attempted": self.attempted, "enqueued": self.enqueued, "maybe": self.maybe,
            "started": self.started, "run": self.run, "completed": self.completed,
            "dead": self.dead, "interrupted": self.interrupted, "lost": len(self.lost),
            "unexpected": len(self.unexpected), "duplicated": len(self.duplicated),
            "unexplained": len(self.unexplained),
        }

    def summary(self) -> str:
        c = self.counts()
        text = " ".join(f"{k}={v}" for k, v in c.items())
        text += f" valid={self.valid}"
        if self.explained_by:
            text += " explained_by=" + ",".join(f"{k}:{v}" for k, v in
                                                sorted(self.explained_by.items()))
        return text

    def details(self, limit: int = 10) -> str:
        """A failure message: the summary and the first few problems of each kind."""
        lines = [self.summary()]
        if self.lost:
            lines.append(f"lost ({len(self.lost)}): {self.lost[:limit]}")
        if self.unexpected:
            lines.append(f"unexpected ({len(self.unexpected)}): {self.unexpected[:limit]}")
        for token, why in list(self.unexplained.items())[:limit]:
            runs = self.duplicated.get(token, [])
            lines.append(f"unexplained duplicate {token}: {why}; runs: {runs}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


LeasePredicate = Callable[[Run], bool]


def check(
    enqueued: Iterable[str],
    runs: Iterable[Run],
    dead: Mapping[str, str] | Iterable[str] = (),
    killed_pids: Collection[int] = (),
    expired_leases_possible: bool | LeasePredicate = False,
    *,
    maybe: Iterable[str] = (),
    retried_enqueues: Collection[str] = (),
    attempted: int | None = None,
) -> Report:
    """Compare what was enqueued with what ran; see the module docstring."""
    enq = set(enqueued)
    maybe_set = set(maybe) - enq
    known = enq | maybe_set
    dead_set = set(dead.keys() if isinstance(dead, Mapping) else dead)
    all_runs = list(runs)
    killed = set(killed_pids)
    lease_ok: LeasePredicate
    if callable(expired_leases_possible):
        lease_ok = expired_leases_possible
    else:
        flag = bool(expired_leases_possible)

        def lease_ok(_run: Run) -> bool:
            return flag

    by_token: dict[str, list[Run]] = defaultdict(list)
    for r in all_runs:
        by_token[r.token].append(r)
    completed = {t for t, rs in by_token.items() if any(r.completed for r in rs)}

    report = Report(
        attempted=attempted if attempted is not None else len(known),
        enqueued=len(enq),
        maybe=len(maybe_set),
        started=len(all_runs),
        run=sum(1 for r in all_runs if r.completed),
        completed=len(completed),
        dead=len(dead_set),
        interrupted=sum(1 for r in all_runs if not r.completed),
    )
    report.lost = sorted(enq - completed - dead_set)
    report.unexpected = sorted((set(by_token) | dead_set) - known)

    for token, rs in by_token.items():
        done = sorted((r for r in rs if r.completed), key=lambda r: (r.start, r.pid))
        if len(done) < 2:
            continue
        report.duplicated[token] = done
        problems = []
        for earlier in done[:-1]:
            if earlier.pid in killed:
                report.explained_by["killed"] += 1
            elif lease_ok(earlier):
                report.explained_by["lease"] += 1
            elif token in retried_enqueues and _double_write(earlier, done):
                report.explained_by["double_write"] += 1
            else:
                problems.append(f"run on pid {earlier.pid} (attempt {earlier.attempt}) was "
                                "not on a killed process, and its lease was not allowed "
                                "to expire")
        if problems:
            report.unexplained[token] = "; ".join(problems)
    return report


def _double_write(earlier: Run, done: list[Run]) -> bool:
    """A job written twice runs twice as attempt 1 of the same id (a plain task, which
    does not see its job, records attempt 0: nothing to tell, so it is accepted)."""
    if earlier.attempt == 0:
        return True
    return earlier.attempt == 1 and sum(
        1 for r in done if r.attempt == 1 and r.job_id == earlier.job_id) >= 2


def outage_predicate(windows: Iterable[tuple[float, float]], lease_s: float,
                     slack_s: float = 1.0) -> LeasePredicate:
    """A run could have lost its lease if it overlapped an outage (a window of real
    times) widened by the lease before it and ``slack_s`` after: for that long the worker
    could not extend the lease, so a pop after the outage may have reaped it."""
    spans = [(a - lease_s, b + slack_s) for a, b in windows]

    def possible(run: Run) -> bool:
        end = run.end if run.end is not None else float("inf")
        return any(run.start <= b and end >= a for a, b in spans)

    return possible


def dead_tokens(queue: Any) -> dict[str, str]:
    """token (the job's first argument) -> reason, for every job in the dead store of
    ``queue`` (a ``batchq.Queue``)."""
    return {str(d.args[0]) if d.args else d.id: d.reason for d in queue.dead_jobs()}


# --- Redis after the drain ---------------------------------------------------------------


def leftovers(r: Any, namespace: str, queues: Iterable[str], *,
              allow_dead: bool = True, allow_pending: bool = False) -> list[str]:
    """Problems with what the queues left in Redis (empty when all is well):

    * reserved leases or in-flight entries (nothing may hold a job after a full drain);
    * ready or delayed jobs (unless ``allow_pending``);
    * a paused flag, more than one wake token, dead letters (unless ``allow_dead``);
    * any key of the namespace besides the expected ones: the queues' keys, the queue
      registry ``NS:queues``, the worker registry ``NS:workers`` and worker entries
      ``NS:worker:<id>`` that expire (a TTL), campaign records and their index;
    * tracked jobs' entries (jobmeta) left when nothing is pending."""
    from batchq.store.keys import QueueKeys

    problems: list[str] = []
    allowed: set[bytes] = {f"{namespace}:queues".encode(), f"{namespace}:workers".encode(),
                           f"{namespace}:campaigns".encode(),
                           f"{namespace}:campaigns:open".encode()}
    campaign_prefix = f"{namespace}:{{{namespace}:campaign:".encode()
    for q in queues:
        k = QueueKeys(namespace, q)
        allowed |= {x.encode() for x in (*k.all(), k.seq, k.waiters)}
        for name, n in (("reserved", r.zcard(k.reserved)), ("bundles", r.zcard(k.bundles)),
                        ("inflight", r.hlen(k.inflight))):
            if n:
                problems.append(f"{q}: {n} entries left in {name}")
        if not allow_pending:
            ready = sum(int(r.llen(x)) for x in k.ready)
            delayed = int(r.zcard(k.delayed))
            if ready or delayed:
                problems.append(f"{q}: {ready} ready and {delayed} delayed jobs left")
            if r.hlen(k.jobmeta):
                problems.append(f"{q}: {r.hlen(k.jobmeta)} tracked jobs never settled")
        if r.exists(k.paused):
            problems.append(f"{q}: still paused")
        if int(r.llen(k.wake)) > 1:
            problems.append(f"{q}: {r.llen(k.wake)} wake tokens (at most one)")
        if not allow_dead and (r.zcard(k.dead) or r.hlen(k.dead_jobs)):
            problems.append(f"{q}: dead letters {r.zcard(k.dead)} / {r.hlen(k.dead_jobs)}")
        if r.zcard(k.dead) != r.hlen(k.dead_jobs):
            problems.append(f"{q}: dead zset ({r.zcard(k.dead)}) and dead:jobs "
                            f"({r.hlen(k.dead_jobs)}) disagree")
    worker_prefix = f"{namespace}:worker:".encode()
    for key in r.scan_iter(match=f"{namespace}:*", count=1000):
        if key in allowed or key.startswith(campaign_prefix):
            continue
        if key.startswith(worker_prefix) and int(r.ttl(key)) > 0:
            continue
        problems.append(f"stray key {key!r} ({r.type(key)!r})")
    return problems


# --- metrics -----------------------------------------------------------------------------


def scrape(port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as resp:
        body: bytes = resp.read()
    return body.decode()


@dataclass(frozen=True)
class Reconciliation:
    enqueued: float
    succeeded: float
    dead: float
    queued: float
    """ready + delayed + reserved, read from Redis at scrape time."""
    dead_stored: float
    """The dead-letter store's size (equals ``dead`` unless letters were purged)."""
    stale: float = 0.0
    """``batchq_stale_acks``: results for leases already gone."""
    cancelled: float = 0.0
    """``batchq_jobs_cancelled``: jobs cancelled before they started (dropped)."""

    @property
    def missing(self) -> float:
        return self.enqueued - (self.succeeded + self.dead + self.cancelled + self.queued)

    @property
    def ok(self) -> bool:
        return self.missing == 0

    @property
    def ok_but_stale(self) -> bool:
        """Off only by results counted as stale: an ack (or nack) that Redis applied
        but whose reply was lost is sent again, finds its lease gone and is counted
        stale instead of succeeded (the worker cannot tell the two apart)."""
        return 0 <= self.missing <= self.stale

    def __str__(self) -> str:
        return (f"enqueued {self.enqueued:g} vs succeeded {self.succeeded:g} + dead "
                f"{self.dead:g} + cancelled {self.cancelled:g} + queued {self.queued:g} = "
                f"{self.enqueued - self.missing:g} (dead store "
                f"{self.dead_stored:g}, stale acks {self.stale:g})")


def reconcile(text: str, queue: str) -> Reconciliation:
    """``batchq_jobs_enqueued`` against the outcomes Redis counted and the depths."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("queue") != queue:
                continue
            if s.name == "batchq_jobs_enqueued_total":
                sums["enqueued"] += s.value
            elif s.name == "batchq_queue_outcomes_total":
                # counted by the scripts in Redis: exact under kills and lost replies
                outcome = s.labels.get("outcome")
                if outcome in ("succeeded", "dead"):
                    sums[outcome] += s.value
            elif s.name == "batchq_jobs_succeeded_total":
                sums["workers_succeeded"] += s.value
            elif s.name == "batchq_jobs_dead_total":
                sums["workers_dead"] += s.value
            elif s.name == "batchq_stale_acks_total":
                sums["stale"] += s.value
            elif s.name == "batchq_jobs_cancelled_total":
                sums["cancelled"] += s.value
            elif s.name == "batchq_queue_jobs":
                state = s.labels.get("state")
                if state in ("ready", "delayed", "reserved"):
                    sums["queued"] += s.value
                elif state == "dead":
                    sums["dead_stored"] += s.value
    return Reconciliation(sums["enqueued"], sums["succeeded"], sums["dead"], sums["queued"],
                          sums["dead_stored"], sums["stale"], sums["cancelled"])
