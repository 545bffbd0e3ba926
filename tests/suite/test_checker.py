"""The checker itself, on made-up records (no workers)."""

from __future__ import annotations

from pathlib import Path

import checker
import pytest
import redis
from checker import Run, check

import batchq

pytestmark = pytest.mark.fault


def run(token: str, pid: int = 1, attempt: int = 1, start: float = 0.0,
        end: float | None = 1.0, jid: str = "") -> Run:
    return Run(token, jid or f"id-{token}", attempt, pid, start, end)


def test_lost_unexpected_and_clean() -> None:
    r = check(["a", "b", "c", "d"], [run("a"), run("b", end=None), run("x")], dead=["c"])
    assert r.lost == ["b", "d"]  # b started but never completed
    assert r.unexpected == ["x"]
    assert not r.valid
    assert (r.attempted, r.started, r.run, r.completed, r.dead, r.interrupted) == \
        (4, 3, 2, 2, 1, 1)
    ok = check(["a", "c"], [run("a")], dead={"c": "lease_expired"})
    assert ok.valid and ok.counts()["lost"] == 0


def test_maybe_enqueued_may_run_or_not() -> None:
    r = check(["a"], [run("a"), run("m1")], maybe=["m1", "m2"])
    assert r.valid and r.maybe == 2 and r.attempted == 3


def test_duplicates_need_an_explanation() -> None:
    twice = [run("a", pid=7, start=0.0), run("a", pid=8, attempt=2, start=5.0)]
    bad = check(["a"], twice)
    assert not bad.valid and list(bad.unexplained) == ["a"]
    assert check(["a"], twice, killed_pids={7}).valid
    # the later run's process being killed explains nothing: the earlier one's ack went
    assert not check(["a"], twice, killed_pids={8}).valid
    assert check(["a"], twice, expired_leases_possible=True).valid
    window = checker.outage_predicate([(2.0, 3.0)], lease_s=1.5)
    assert check(["a"], twice, expired_leases_possible=window).valid
    assert not check(["a"], twice,
                     expired_leases_possible=checker.outage_predicate([(9, 10)], 1.0)).valid
    # an interrupted run followed by a completed one is no duplicate
    assert check(["a"], [run("a", end=None), run("a", attempt=2, start=2)]).valid


def test_a_double_write_is_two_first_attempts_of_one_id() -> None:
    same = [run("a", pid=1, start=0), run("a", pid=2, start=1)]
    assert check(["a"], same, retried_enqueues={"a"}).valid
    assert not check(["a"], same).valid
    redelivered = [run("a", pid=1, start=0), run("a", pid=2, attempt=2, start=1)]
    assert not check(["a"], redelivered, retried_enqueues={"a"}).valid


def test_read_runs_merges_start_and_end_lines(tmp_path: Path) -> None:
    (tmp_path / "runs-10.log").write_text(
        "S a id1 1 10 1.000000\n"
        "S b id2 1 10 2.000000\n"
        "E a id1 1 10 1.000000 1.500000\n"
        "C b id2 1 10 2.100000\n")
    (tmp_path / "runs-11.log").write_text("E c id3 2 11 3.000000 3.100000\n")
    runs = checker.read_runs(tmp_path)
    assert runs == [Run("a", "id1", 1, 10, 1.0, 1.5), Run("b", "id2", 1, 10, 2.0, None, 1),
                    Run("c", "id3", 2, 11, 3.0, 3.1)]


def test_leftovers_and_reconcile(redis_client: redis.Redis, redis_url: str,
                                 namespace: str) -> None:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task
    async def t(x: int) -> None: ...

    t.enqueue(1)
    assert checker.leftovers(redis_client, namespace, ["default"]) == \
        ["default: 1 ready and 0 delayed jobs left"]
    assert checker.leftovers(redis_client, namespace, ["default"], allow_pending=True) == []
    redis_client.set(f"{namespace}:junk", 1)
    redis_client.hset(f"{namespace}:worker:w1", "id", "w1")  # no TTL: stray too
    problems = checker.leftovers(redis_client, namespace, ["default"], allow_pending=True)
    assert len(problems) == 2 and all("stray key" in p for p in problems)
    app.queue().clear()
    redis_client.delete(f"{namespace}:junk", f"{namespace}:worker:w1",
                        f"{namespace}:queues")
    app.close()

    text = "\n".join([
        '# TYPE batchq_jobs_enqueued counter',
        'batchq_jobs_enqueued_total{queue="q"} 10.0',
        '# TYPE batchq_jobs_succeeded counter',
        'batchq_jobs_succeeded_total{queue="q",task="a"} 6.0',
        'batchq_jobs_succeeded_total{queue="q",task="b"} 1.0',
        'batchq_jobs_succeeded_total{queue="other",task="a"} 100.0',
        '# TYPE batchq_jobs_dead counter',
        'batchq_jobs_dead_total{queue="q",reason="failed",task="a"} 1.0',
        '# TYPE batchq_queue_outcomes counter',
        'batchq_queue_outcomes_total{queue="q",outcome="succeeded"} 7.0',
        'batchq_queue_outcomes_total{queue="q",outcome="dead"} 1.0',
        'batchq_queue_outcomes_total{queue="q",outcome="retried"} 3.0',
        'batchq_queue_outcomes_total{queue="other",outcome="succeeded"} 100.0',
        '# TYPE batchq_stale_acks counter',
        'batchq_stale_acks_total{queue="q"} 1.0',
        '# TYPE batchq_queue_jobs gauge',
        'batchq_queue_jobs{queue="q",state="ready"} 1.0',
        'batchq_queue_jobs{queue="q",state="dead"} 1.0',
        ""])
    rec = checker.reconcile(text, "q")
    assert (rec.enqueued, rec.succeeded, rec.dead, rec.queued, rec.stale) == (10, 7, 1, 1, 1)
    assert not rec.ok and rec.missing == 1 and rec.ok_but_stale


def test_read_runs_leaves_out_an_unfinished_last_line_but_not_a_bad_one(tmp_path: Path) -> None:
    (tmp_path / "runs-7.log").write_text(
        "E a id1 1 7 1.000000 1.500000\nS b id2 1 7 2.0")  # the writer was killed mid-line
    assert [r.token for r in checker.read_runs(tmp_path)] == ["a"]
    (tmp_path / "runs-8.log").write_text("X junk\nE c id3 1 8 1.0 2.0\n")
    with pytest.raises(ValueError, match=r"runs-8\.log:1: malformed record"):
        checker.read_runs(tmp_path)
