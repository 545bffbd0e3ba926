"""End-to-end tests of the pre-fork supervisor: ``batchq worker apps.sup_app:app -p N``.

Real CLI processes, real signals sent with ``os.kill`` to the pids these tests started
(the supervisor, or one of its children found through ``/proc``). What the workers did
is read from the run records that ``apps.sup_app`` writes outside the queue under test
(``<ns>:starts`` / ``<ns>:runs``: "<job id> <attempt> <pid> <VERSION>"), and the queue
state from ``Queue.stats()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from apps import sup_app
from helpers import CliProcess, alive, run_cli
from workers import WorkerFleet, log_tail

import batchq
from batchq.dev.server import EmbeddedServer

pytestmark = pytest.mark.e2e

APP = "apps.sup_app:app"


# --- the harness -------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    id: str
    attempt: int
    pid: int
    version: str


class Harness(WorkerFleet):
    """One test's namespace, producer app, version file and started processes (on the
    shared :class:`workers.WorkerFleet`): every start gets ``--metrics-port 0`` unless
    given, so the supervisor's children are its workers; cleanup stops a supervisor with
    SIGINT (fast), then SIGKILL."""

    metrics_port_always = True
    cleanup_signal = signal.SIGINT
    log_lines = 40

    def __init__(self, url: str, ns: str, version_file: Path, r: redis.Redis,
                 app: batchq.App) -> None:
        super().__init__(url, r, app, APP)
        self.ns = ns
        self.version_file = version_file

    def app_env(self) -> dict[str, str | None]:
        return {"SUP_NS": self.ns, "SUP_VERSION_FILE": str(self.version_file)}

    def enqueue(self, task: str, items: list[Any]) -> list[str]:
        return self.app.tasks[task].enqueue_many(items)

    def records(self, key: str) -> list[Run]:
        out = []
        for raw in self.r.lrange(key, 0, -1):
            jid, attempt, pid, version = raw.decode().split(" ")
            out.append(Run(jid, int(attempt), int(pid), version))
        return out

    def starts(self) -> list[Run]:
        return self.records(sup_app.starts_key(self.ns))

    def runs(self) -> list[Run]:
        return self.records(sup_app.runs_key(self.ns))

    def done_ids(self) -> set[str]:
        return {run.id for run in self.runs()}

    def wait_done(self, ids: list[str], timeout_s: float = 20.0) -> None:
        want = set(ids)
        self.until(lambda: want <= self.done_ids(), timeout_s,
                   f"{len(want)} jobs done")


def log(proc: CliProcess) -> str:
    return proc.read_log()


def wait_exit(proc: CliProcess, timeout_s: float) -> tuple[int, float]:
    """(exit code, seconds waited); fails the test if it does not exit in time."""
    t0 = time.monotonic()
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pid {proc.pid} still running after {timeout_s}s\n{log_tail(proc)}")
    return code, time.monotonic() - t0


@pytest.fixture
def h(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Harness]:
    version_file = tmp_path / "version"
    version_file.write_text("v1\n")
    client = redis.Redis.from_url(redis_url)
    harness = Harness(redis_url, namespace, version_file, client,
                      sup_app.build(namespace, redis_url))
    try:
        yield harness
    finally:
        harness.cleanup()
        client.close()


# --- 1. a child killed mid-run -------------------------------------------------------


def test_sigkill_of_a_child_is_replaced_and_only_its_jobs_run_twice(h: Harness) -> None:
    ids = h.enqueue("slow", [(1.0,)] * 60)
    sup = h.start("-p", "3", "-c", "5", "--fetch-batch", "5", "--lease-s", "2")
    before = h.wait_children(sup, 3)
    # a child that is running jobs right now
    victim = h.until(lambda: next((s.pid for s in h.starts() if s.pid in before), None),
                     10, "a child started a job")
    time.sleep(0.3)
    os.kill(victim, signal.SIGKILL)
    after = h.until(lambda: (k := h.children(sup)) and len(k) == 3 and victim not in k
                    and k, 10, "a replacement child")
    assert len(after - before) == 1
    h.wait_done(ids, timeout_s=30)

    starts = h.starts()
    by_id: dict[str, list[Run]] = {}
    for s in starts:
        by_id.setdefault(s.id, []).append(s)
    twice = {jid: rs for jid, rs in by_id.items() if len(rs) > 1}
    for jid, rs in twice.items():
        assert rs[0].pid == victim, f"{jid} ran twice but not first on the killed child: {rs}"
    # every job the killed child had started and not finished ran again elsewhere
    victim_done = {r.id for r in h.runs() if r.pid == victim}
    for s in starts:
        if s.pid == victim and s.id not in victim_done:
            assert len(by_id[s.id]) >= 2, f"{s.id} was interrupted and never retried"
    st = h.stats()
    assert (st.ready, st.reserved, st.delayed, st.dead) == (0, 0, 0, 0)
    assert "died (signal SIGKILL)" in log(sup)
    assert sup.poll() is None


# --- 2. SIGTERM with hundreds of jobs in flight --------------------------------------


def test_sigterm_drains_in_time_and_a_burst_worker_finishes_the_rest(h: Harness) -> None:
    ids = h.enqueue("slow", [(0.5,)] * 900)
    sup = h.start("-p", "3", "-c", "100", "--shutdown-timeout", "5", "--lease-s", "10")
    kids = h.wait_children(sup, 3)
    # every slot of the three children busy (the prefetch is sized from run time: a
    # child of slow jobs holds about one job per slot, not c + 2 x fetch-batch)
    h.until(lambda: h.stats().reserved >= 300, 15, "300 jobs in flight")
    os.kill(sup.pid, signal.SIGTERM)
    code, took = wait_exit(sup, 5 + 5 + 2)
    assert code == 0, log_tail(sup)
    assert took <= 5 + 5, f"{took:.1f}s\n{log_tail(sup)}"
    assert h.stats().reserved == 0
    assert not any(alive(pid) for pid in kids), "a child outlived the supervisor"
    assert "Traceback" not in log(sup)
    assert "after the shutdown timeout: SIGKILL" not in log(sup), "children did not exit"

    done_by_sup = h.done_ids()
    assert done_by_sup, "the supervisor's children ran nothing"
    rest = run_cli(["worker", APP, "--burst", "-c", "200", "--lease-s", "10"], env=h.env(),
                   timeout_s=60)
    assert rest.returncode == 0, rest.stderr[-3000:]
    runs = Counter(r.id for r in h.runs())
    assert set(runs) == set(ids), f"{len(set(ids) - set(runs))} jobs lost"
    assert max(runs.values()) == 1, "a job ran twice although no worker died"
    st = h.stats()
    assert (st.ready, st.reserved, st.delayed, st.dead) == (0, 0, 0, 0)


# --- 3. SIGHUP: rolling restart with a fresh import ----------------------------------


def test_sighup_reimports_the_app_replaces_every_child_and_loses_nothing(h: Harness) -> None:
    sup = h.start("-p", "2", "-c", "10", "--fetch-batch", "5", "--lease-s", "5")
    old = h.wait_children(sup, 2)
    first = h.enqueue("which_version", [()] * 10)
    h.wait_done(first)
    assert {r.version for r in h.runs()} == {"v1"}

    slow = h.enqueue("slow", [(0.3,)] * 40)
    h.until(lambda: len(h.starts()) > 15, 10, "slow jobs running")
    h.version_file.write_text("v2\n")
    os.kill(sup.pid, signal.SIGHUP)
    new = h.until(lambda: (k := h.children(sup)) and len(k) == 2 and not k & old and k,
                  20, "every child replaced")
    h.wait_children(sup, 2)
    assert not any(alive(pid) for pid in old)

    after = h.enqueue("which_version", [()] * 10)
    h.wait_done(after + slow)
    runs = h.runs()
    assert {r.version for r in runs if r.id in set(after)} == {"v2"}
    assert {r.pid for r in runs if r.id in set(after)} <= new
    counts = Counter(r.id for r in runs)
    assert all(counts[i] == 1 for i in first + slow + after), "a job was lost or ran twice"
    assert sup.poll() is None


def test_sighup_into_code_that_fails_to_import_keeps_the_running_children(
        h: Harness) -> None:
    sup = h.start("-p", "2", "-c", "10")
    old = h.wait_children(sup, 2)
    h.version_file.write_text("RAISE\n")
    os.kill(sup.pid, signal.SIGHUP)
    h.until(lambda: "could not boot" in log(sup), 15, "a new child failed to boot")
    time.sleep(3)  # time enough for a wrong rolling restart to happen
    assert sup.poll() is None, log_tail(sup)
    assert h.children(sup) == old, f"the running generation was replaced\n{log_tail(sup)}"
    ids = h.enqueue("which_version", [()] * 5)
    h.wait_done(ids)
    assert {r.version for r in h.runs()} == {"v1"}

    # the code is fixed: the next SIGHUP must load it
    h.version_file.write_text("v3\n")
    os.kill(sup.pid, signal.SIGHUP)
    h.until(lambda: (k := h.children(sup)) and len(k) == 2 and not k & old, 20,
            "every child replaced")
    h.wait_children(sup, 2)
    ids = h.enqueue("which_version", [()] * 5)
    h.wait_done(ids)
    assert {r.version for r in h.runs() if r.id in set(ids)} == {"v3"}, log_tail(sup)


# --- 4. a handler that blocks the event loop -----------------------------------------


def test_children_of_a_sigkilled_supervisor_stop_and_give_their_jobs_back(h: Harness) -> None:
    """A supervisor SIGKILLed (or OOM-killed) leaves nobody to reap, replace or stop its
    children: each notices on its next heartbeat that its parent is gone and stops
    gracefully, giving back what it had fetched, instead of running on as an orphan."""
    sup = h.start("-p", "2")
    kids = h.wait_children(sup, 2)
    sup.send_signal(signal.SIGKILL)
    sup.wait(10)
    h.until(lambda: not any(alive(pid) for pid in kids), 15, "orphaned children stopped")
    assert f"the supervisor (pid {sup.pid}) is gone" in h.logs(), h.logs()


def test_a_child_with_a_blocked_loop_is_killed_and_its_job_retried(h: Harness) -> None:
    hog = h.app.tasks["hog"]
    sup = h.start("-p", "3", "-c", "2", "--fetch-batch", "2", "--heartbeat-timeout", "2",
                  "--lease-s", "2")
    h.wait_children(sup, 3)
    once = hog.enqueue(30, 1)  # blocks the loop on attempt 1 only
    h.until(lambda: any(s.id == once for s in h.starts()), 10, "the first hog started")
    always = hog.options(max_attempts=2).enqueue(30, 99)  # blocks on every attempt
    quick = h.enqueue("quick", [()] * 30)

    h.wait_done([once, *quick], timeout_s=30)
    assert min(s.attempt for s in h.starts() if s.id == once) == 1  # the one that blocked
    # it ran again elsewhere (at least once: a lease that expired while the loop was
    # blocked may hand it out twice before the blocked child is killed)
    retries = [r.attempt for r in h.runs() if r.id == once]
    assert retries and min(retries) >= 2, retries

    q = h.app.queue("default")
    h.until(lambda: q.dead_ids() == [always], 30, "the always-blocking job dead-lettered")
    (dead,) = q.dead_jobs()
    # a job whose worker is killed is refunded while it might be innocent, then run alone
    # and charged (see README "Crashed workers and poison jobs"): it ends as crashed_worker
    # after max_attempts charged runs, each of which blocked its worker's loop
    assert dead.reason == "crashed_worker", dead
    # charged twice (max_attempts), each a run alone whose start was recorded first; the
    # recoveries before it ran alone need not have started it (a child whose loop was
    # already blocked may have been handed the job, or may have fetched it, and died
    # holding it), so they are counted by the reaper, not by the runs
    assert "while running it, 2 times;" in dead.error_message, dead
    hog_kills = [s for s in h.starts() if s.id == always]
    assert len(hog_kills) >= 2
    assert always not in h.done_ids()

    # every child whose loop blocked was killed, and the pool is back to 3
    blocked = {s.pid for s in h.starts()
               if s.id == always or (s.id == once and s.attempt == 1)}
    h.until(lambda: not any(alive(p) for p in blocked), 20, "blocked children killed")
    kids = h.wait_children(sup, 3)
    assert not kids & blocked
    assert log(sup).count("unresponsive") >= len(blocked)
    assert sup.poll() is None


# --- 5. cannot start -----------------------------------------------------------------


def test_an_app_that_cannot_be_imported_exits_3_without_a_crash_loop(h: Harness) -> None:
    h.version_file.write_text("RAISE\n")
    sup = h.start("-p", "2")
    code, took = wait_exit(sup, 15)
    assert code == 3, log_tail(sup)
    assert took < 10
    text = log(sup)
    assert "cannot import 'apps.sup_app'" in text and "RAISE" in text, text
    assert " serving " not in text


def test_unreachable_redis_exits_4_quickly(h: Harness) -> None:
    sup = h.start("-p", "2", "--redis-url", "redis://127.0.0.1:1/0")
    code, took = wait_exit(sup, 15)
    assert code == 4, log_tail(sup)
    assert took < 10
    assert "cannot reach Redis" in log(sup)


# --- 6. TTIN / TTOU ------------------------------------------------------------------


def test_ttin_and_ttou_change_the_number_of_children(h: Harness) -> None:
    sup = h.start("-p", "3")
    three = h.wait_children(sup, 3)
    os.kill(sup.pid, signal.SIGTTIN)
    four = h.wait_children(sup, 4)
    assert three < four
    os.kill(sup.pid, signal.SIGTTOU)
    back = h.wait_children(sup, 3)
    assert back < four
    ids = h.enqueue("quick", [()] * 20)
    h.wait_done(ids)
    assert sup.poll() is None


# --- 7. TSTP / CONT ------------------------------------------------------------------


def _wait_paused(h: Harness, sup: CliProcess, n: int) -> None:
    h.until(lambda: log(sup).count("fetching paused") >= n, 10, f"{n} children paused")


def test_sigtstp_pauses_fetching_and_sigcont_resumes(h: Harness) -> None:
    sup = h.start("-p", "2")
    h.wait_children(sup, 2)
    os.kill(sup.pid, signal.SIGTSTP)
    _wait_paused(h, sup, 2)
    ids = h.enqueue("quick", [()] * 10)
    time.sleep(1.5)
    st = h.stats()
    assert (st.ready, st.reserved) == (10, 0)
    assert h.runs() == []
    os.kill(sup.pid, signal.SIGCONT)
    h.wait_done(ids, timeout_s=10)
    assert sup.poll() is None


def test_a_child_started_while_paused_is_paused_too(h: Harness) -> None:
    # -p 1: no paused sibling whose pending BLPOP could take the wake token instead
    sup = h.start("-p", "1")
    (child,) = h.wait_children(sup, 1)
    os.kill(sup.pid, signal.SIGTSTP)
    _wait_paused(h, sup, 1)
    os.kill(child, signal.SIGKILL)  # the supervisor replaces it while paused
    h.until(lambda: (k := h.children(sup)) and child not in k and k, 10, "a replacement")
    h.wait_children(sup, 1)
    ids = h.enqueue("quick", [()] * 10)
    time.sleep(1.5)
    st = h.stats()
    # the killed child's hand-off registration lapses only max_block_s + 1 s after its
    # last empty pop, so the enqueue may hand it the first job: that one waits, leased,
    # on the wake list for the next fetch; nothing else left the ready list
    handed = h.r.llen(h.app.keys("default").wake) if st.reserved else 0
    assert (st.ready, st.reserved) in ((10, 0), (9, 1)) and handed == st.reserved, (
        f"a replacement child fetched while the supervisor is paused: {st}")
    assert h.starts() == [], "a job started while the supervisor is paused"
    os.kill(sup.pid, signal.SIGCONT)
    h.wait_done(ids, timeout_s=10)


# --- 8. recycling ----------------------------------------------------------------------


def test_max_jobs_per_child_recycles_children_and_runs_every_job_once(h: Harness) -> None:
    ids = h.enqueue("quick", [()] * 300)
    sup = h.start("-p", "1", "--max-jobs-per-child", "50")
    h.wait_done(ids, timeout_s=20)
    runs = h.runs()
    counts = Counter(r.id for r in runs)
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1
    per_pid = Counter(r.pid for r in runs)
    assert len(per_pid) >= 6, per_pid
    assert max(per_pid.values()) <= 50, per_pid
    assert sup.poll() is None
    assert "died" not in log(sup)


# --- 9. SIGINT ---------------------------------------------------------------------------


def test_sigint_is_fast_and_gives_running_jobs_back(h: Harness) -> None:
    ids = h.enqueue("slow", [(30,)] * 20)
    sup = h.start("-p", "2", "-c", "10", "--fetch-batch", "10", "--lease-s", "30")
    kids = h.wait_children(sup, 2)
    h.until(lambda: len(h.starts()) >= 10 and h.stats().reserved == 20, 10, "jobs running")
    os.kill(sup.pid, signal.SIGINT)
    code, took = wait_exit(sup, 10)
    assert code == 0, log_tail(sup)
    # fast: the 30 s jobs are interrupted (the supervisor's SIGKILL deadline is 2 s)
    assert took < 5, f"{took:.1f}s\n{log_tail(sup)}"
    assert "SIGKILL" not in log(sup), log_tail(sup)
    st = h.stats()
    assert (st.ready, st.reserved, st.dead) == (20, 0, 0), f"{st}\n{log_tail(sup)}"
    assert h.runs() == []
    assert not any(alive(pid) for pid in kids)
    assert len(ids) == 20


# --- 10. JSON logs, and no password in them ----------------------------------------------


def test_json_logs_name_pid_and_role_and_never_show_the_password(
        h: Harness, namespace: str) -> None:
    with EmbeddedServer() as server:
        # the password is set after start: see the EmbeddedServer test below
        redis.Redis(port=server.port).config_set("requirepass", "sekret")
        url = f"redis://:sekret@127.0.0.1:{server.port}/0"
        h.app = sup_app.build(namespace, url)
        h.r = redis.Redis.from_url(url)
        sup = h.start("-p", "2", "--log-format", "json", "--redis-url", url,
                      env={"BATCHQ_REDIS_URL": None})
        kids = h.wait_children(sup, 2)
        ids = h.enqueue("quick", [()] * 20)
        h.wait_done(ids)
        os.kill(min(kids), signal.SIGKILL)  # a warning line from the supervisor
        h.wait_children(sup, 2)
        os.kill(sup.pid, signal.SIGTERM)
        code, _ = wait_exit(sup, 15)
        h.r.close()
    assert code == 0
    text = log(sup)
    assert "sekret" not in text
    roles = set()
    for line in text.splitlines():
        obj = json.loads(line)  # every line is one JSON object
        assert isinstance(obj, dict), line
        assert isinstance(obj["pid"], int) and obj["role"], line
        roles.add(obj["role"])
        if obj["role"] == "supervisor":
            assert obj["pid"] == sup.pid, line
        else:
            assert obj["pid"] in h.seen, line
    assert "supervisor" in roles
    assert any(r.startswith("worker-") for r in roles), roles


def test_embedded_server_with_requirepass_starts() -> None:
    server = EmbeddedServer(extra_args=["--requirepass", "sekret"])
    try:
        server.start(timeout_s=3)
        client = redis.Redis(port=server.port, password="sekret")
        assert client.ping()
        client.close()
    finally:
        server.stop()


# --- 11. burst -----------------------------------------------------------------------------


def test_burst_supervisor_exits_0_once_the_queue_is_drained(h: Harness) -> None:
    ids = h.enqueue("quick", [()] * 50)
    sup = h.start("-p", "2", "--burst")
    code, _ = wait_exit(sup, 20)
    assert code == 0, log_tail(sup)
    assert Counter(r.id for r in h.runs()) == Counter(ids)
    assert h.stats().pending == 0


def test_burst_with_recycling_still_drains_the_queue(h: Harness) -> None:
    ids = h.enqueue("quick", [()] * 40)
    sup = h.start("-p", "1", "--burst", "--max-jobs-per-child", "10")
    code, _ = wait_exit(sup, 20)
    assert code == 0, log_tail(sup)
    st = h.stats()
    assert st.pending == 0, f"burst exited 0 with {st.pending} jobs left"
    assert Counter(r.id for r in h.runs()) == Counter(ids)


def test_burst_replaces_a_child_that_died(h: Harness) -> None:
    ids = h.enqueue("slow", [(1.0,)] * 6)
    sup = h.start("-p", "1", "--burst", "--lease-s", "2")
    (child,) = h.wait_children(sup, 1)
    h.until(lambda: any(s.pid == child for s in h.starts()), 10, "a job started")
    os.kill(child, signal.SIGKILL)
    code, _ = wait_exit(sup, 30)
    assert code == 0, log_tail(sup)
    st = h.stats()
    assert st.pending == 0, f"burst exited 0 with {st.pending} jobs left\n{log_tail(sup)}"
    assert set(ids) <= h.done_ids()
