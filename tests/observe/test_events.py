"""Job events (``batchq.ops.events``) written by real worker processes
(``apps.events_app:app``): one event per state change of each kind, the trim by count
and by age, the gap a late reader is told about, follow mode (sync, async and the CLI),
and a worker SIGKILLed mid-drain (no settled job's event missing, none written twice for
one change)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from apps.events_app import EV_QUEUE, build
from fixtures.basic import *  # noqa: F403
from helpers import drop_namespace, run_cli, start_cli, wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.worker import exitcodes

pytestmark = pytest.mark.integration

APP_REF = "apps.events_app:app"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def app(redis_url: str, namespace: str, log_path: Path,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = build(redis_url, namespace, str(log_path))
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def env(redis_url: str, namespace: str, log_path: Path) -> dict[str, str | None]:
    return worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                       "BATCHQ_TEST_LOG": str(log_path)})


@pytest.fixture
def workers(env: dict[str, str | None]) -> Iterator[WorkerProcs]:
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def _drained(app: batchq.App) -> bool:
    s = app.queue(EV_QUEUE).stats()
    return s.ready + s.delayed + s.reserved == 0


def _events(app: batchq.App, since: str = "0") -> list[batchq.Event]:
    return list(app.events([EV_QUEUE], since=since))


def _numbers(evs: list[batchq.Event]) -> list[int]:
    return [int(e.id.split("-")[1]) for e in evs if e.kind != "gap"]


def test_each_state_change_writes_one_event(app: batchq.App, workers: WorkerProcs) -> None:
    q = app.queue(EV_QUEUE)
    q.events(max_len=10_000, max_age_s=3600)
    t = app.tasks
    ids = {name: t[name].enqueue("a") for name in ("ok", "flaky", "doomed", "limited")}
    ready_cancel = t["ok"].enqueue("never")
    delayed_cancel = t["ok"].options(delay_s=600).enqueue("later")
    assert app.cancel(ready_cancel) and app.cancel(delayed_cancel)
    q.hold(60, group="acme")
    q.release(group="acme")
    workers.start("-q", EV_QUEUE, "--burst", serving=0)
    wait_until(lambda: _drained(app) and sum(
        e.kind in ("succeeded", "dead") for e in _events(app)) == 4, timeout_s=30)

    evs = _events(app)
    assert _numbers(evs) == list(range(1, len(evs) + 1)), "ids number every event once"
    by_job: dict[str, list[tuple[str, int | None]]] = {}
    for e in evs:
        assert e.queue == EV_QUEUE and e.at_ms > 0
        by_job.setdefault(e.job_id, []).append((e.kind, e.attempt))
    assert by_job[ids["ok"]] == [("started", 1), ("succeeded", 1)]
    assert by_job[ids["flaky"]] == [("started", 1), ("retried", 1), ("started", 2),
                                    ("succeeded", 2)]
    assert by_job[ids["doomed"]] == [("started", 1), ("retried", 1), ("started", 2),
                                     ("dead", 2)]
    # RateLimited: the job went back with its attempt refunded, the queue was held
    assert by_job[ids["limited"]] == [("started", 1), ("started", 1), ("succeeded", 1)]
    assert [k for k, _ in by_job[ready_cancel]] == ["cancelled"]
    assert [k for k, _ in by_job[delayed_cancel]] == ["cancelled"]

    def one(kind: str, job: str) -> batchq.Event:
        (e,) = [e for e in evs if e.kind == kind and e.job_id == job]
        return e

    assert "ValueError: flaky a" in (one("retried", ids["flaky"]).error or "")
    dead = one("dead", ids["doomed"])
    assert dead.task == "doomed" and "failed" in (dead.error or "") \
        and "RuntimeError: doomed a" in (dead.error or "")
    assert one("succeeded", ids["ok"]).task == "ok"
    assert one("cancelled", delayed_cancel).task == "ok"  # a delayed job's entry is read
    holds = [e for e in evs if e.kind in ("held", "hold_lifted")]
    assert [(e.kind, e.group, e.error) for e in holds] == [
        ("held", "acme", "operator"), ("hold_lifted", "acme", None),
        ("held", None, "RateLimited")]
    assert all(e.until_ms and e.until_ms >= e.at_ms for e in holds)


def test_grouped_and_campaign_jobs_carry_them(app: batchq.App,
                                              workers: WorkerProcs) -> None:
    app.queue(EV_QUEUE).events()
    with app.campaign("spring") as c:
        jids = app.tasks["ok"].options(campaign=c, group="cust7").enqueue_many(
            [(i,) for i in range(3)])
    workers.start("-q", EV_QUEUE, "--burst", serving=0)
    wait_until(lambda: any(e.kind == "campaign_done" for e in _events(app)), timeout_s=30)
    evs = _events(app)
    for jid in jids:
        kinds = [(e.kind, e.group, e.campaign) for e in evs if e.job_id == jid]
        assert kinds == [("started", "cust7", "spring"), ("succeeded", "cust7", "spring")]
    (done,) = [e for e in evs if e.kind == "campaign_done"]
    assert done.campaign == "spring" and done.error == "succeeded=3 dead=0 cancelled=0"


def test_off_writes_nothing_and_takes_effect_without_restart(
        app: batchq.App, workers: WorkerProcs, redis_client: redis.Redis) -> None:
    q = app.queue(EV_QUEUE)
    workers.start("-q", EV_QUEUE)
    app.tasks["ok"].enqueue_many([(i,) for i in range(20)])
    wait_until(lambda: _drained(app), timeout_s=30)
    assert not redis_client.exists(app.keys(EV_QUEUE).events)
    q.events(max_len=1000)  # the running worker applies it on its next call
    ids = app.tasks["ok"].enqueue_many([(i,) for i in range(20)])
    wait_until(lambda: sum(e.kind == "succeeded" for e in _events(app)) == 20, timeout_s=30)
    assert {e.job_id for e in _events(app)} == set(ids)
    q.events(False)
    assert not q.events_config().enabled
    app.tasks["ok"].enqueue_many([(i,) for i in range(20)])
    wait_until(lambda: _drained(app), timeout_s=30)
    assert len(_events(app)) == 40  # the stream stays readable, nothing added
    q.events(max_len=1000)
    jid = app.tasks["ok"].enqueue("again")
    # its "started" and its "succeeded" (written by the ack, after the start)
    wait_until(lambda: sum(e.job_id == jid for e in _events(app)) == 2, timeout_s=30)
    assert _numbers(_events(app)) == list(range(1, 43)), "the count goes on"


def test_trim_by_count_and_age_and_the_gap_is_reported(
        app: batchq.App, workers: WorkerProcs, redis_client: redis.Redis) -> None:
    q = app.queue(EV_QUEUE)
    k = app.keys(EV_QUEUE)
    q.events(max_len=100, max_age_s=0)
    app.tasks["ok"].enqueue_many([(i,) for i in range(5)])
    workers.start("-q", EV_QUEUE, "--burst", serving=0)
    wait_until(lambda: len(_events(app)) == 10, timeout_s=30)
    last = _events(app)[-1].id  # a reader stopped here

    app.tasks["ok"].enqueue_many([(i,) for i in range(400)])
    # one job a pop and an ack: two entries a job (a call's jobs of one kind share one)
    workers.start("-q", EV_QUEUE, "--burst", "-c", "1", "--fetch-batch", "1", serving=0)
    wait_until(lambda: q.events_config().last_id
               and int(str(q.events_config().last_id).split("-")[1]) == 810, timeout_s=60)
    # MAXLEN ~ trims whole stream nodes (100 entries each by default)
    assert 100 <= redis_client.xlen(k.events) <= 200
    resumed = _events(app, since=last)
    assert resumed[0].kind == "gap" and resumed[0].queue == EV_QUEUE
    kept = resumed[1:]
    assert resumed[0].missed + len(kept) == 800, "every event after the reader's id counted"
    assert _numbers(kept) == list(range(811 - len(kept), 811))
    # from "0": the oldest kept, no gap (nothing was promised before it)
    assert _events(app)[0].kind != "gap"

    # by age: once the entries are older than max_age_s, the next writing call drops them
    q.events(max_len=100_000, max_age_s=0.5)
    before = redis_client.xlen(k.events)
    wait_until(lambda: redis_client.time()[0] * 1000 > int(kept[-1].id.split("-")[0]) + 600,
               timeout_s=10)
    app.tasks["ok"].enqueue("late")
    workers.start("-q", EV_QUEUE, "--burst", serving=0)
    wait_until(lambda: redis_client.xlen(k.events) < before, timeout_s=30)


def test_follow_sync_async_and_cli(app: batchq.App, workers: WorkerProcs,
                                   env: dict[str, str | None]) -> None:
    app.queue(EV_QUEUE).events()
    seen: list[batchq.Event] = []
    reader = batchq.App(app.redis_url, namespace=app.namespace)

    def follow() -> None:
        for e in reader.events([EV_QUEUE], since="$", follow=True):
            seen.append(e)
            if sum(x.kind == "succeeded" for x in seen) == 10:
                return

    th = threading.Thread(target=follow, daemon=True)
    th.start()
    cli = start_cli(["events", APP_REF, "-q", EV_QUEUE, "--since", "$", "--follow",
                     "--json"], env=env)

    async def afollow() -> list[batchq.Event]:
        out: list[batchq.Event] = []
        async for e in reader.aevents([EV_QUEUE], since="$", follow=True):
            out.append(e)
            if sum(x.kind == "succeeded" for x in out) == 10:
                break
        return out

    async def main() -> list[batchq.Event]:
        task = asyncio.create_task(afollow())
        await asyncio.sleep(0.5)  # the readers are past "$"
        ids = await app.tasks["ok"].aenqueue_many([(i,) for i in range(10)])
        workers.start("-q", EV_QUEUE, serving=0)
        got = await asyncio.wait_for(task, timeout=30)
        assert {e.job_id for e in got if e.kind == "succeeded"} == set(ids)
        return got

    got = asyncio.run(main())
    th.join(timeout=30)
    assert not th.is_alive()
    assert [e.id for e in seen] == [e.id for e in got]
    wait_until(lambda: cli.read_log().count('"succeeded"') >= 10, timeout_s=30)
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=15) == exitcodes.EXIT_OK
    rows = [json.loads(line) for line in cli.read_log().splitlines() if line.startswith("{")]
    assert [r["id"] for r in rows] == [e.id for e in got]
    reader.close()


def test_cli_prints_and_checks_its_flags(app: batchq.App, workers: WorkerProcs,
                                         env: dict[str, str | None]) -> None:
    r = run_cli(["events", APP_REF, "-q", EV_QUEUE, "--enable", "--max-len", "500"],
                env=env)
    assert r.returncode == 0 and "events of ev on" in r.stdout
    jid = app.tasks["doomed"].enqueue("x")
    workers.start("-q", EV_QUEUE, "--burst", serving=0)
    wait_until(lambda: any(e.kind == "dead" for e in _events(app)), timeout_s=30)
    r = run_cli(["events", APP_REF, "-q", EV_QUEUE], env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split("  ")[3] for ln in lines] == ["started", "retried", "started", "dead"]
    assert all(jid in ln for ln in lines) and "error=failed: RuntimeError: doomed x" \
        in lines[-1]
    for bad in (["--max-len", "0"], ["--since", "yesterday"], ["--bogus"]):
        r = run_cli(["events", APP_REF, "-q", EV_QUEUE, *bad], env=env)
        assert r.returncode == exitcodes.EXIT_USAGE, (bad, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_sigkill_mid_drain_loses_and_doubles_no_event(
        app: batchq.App, workers: WorkerProcs, redis_client: redis.Redis) -> None:
    """A worker killed with jobs running: its leases expire and another worker runs
    them again. Every job ends with exactly one "succeeded" (the one ack that settled
    it), no state change is written twice (each run's "started" has its own attempt),
    and the event numbers have no hole."""
    app.queue(EV_QUEUE).events()
    ids = app.tasks["nap"].enqueue_many([(i, 0.05) for i in range(300)])
    victim = workers.start("-q", EV_QUEUE, "-c", "50", "--lease-s", "1")
    wait_until(lambda: sum(e.kind == "succeeded" for e in _events(app)) >= 60,
               timeout_s=30)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    workers.start("-q", EV_QUEUE, "-c", "50", "--lease-s", "1")
    wait_until(lambda: _drained(app)
               and sum(e.kind == "succeeded" for e in _events(app)) >= 300, timeout_s=60)
    evs = _events(app)
    assert _numbers(evs) == list(range(1, len(evs) + 1))
    done = Counter(e.job_id for e in evs if e.kind == "succeeded")
    assert set(done) == set(ids) and set(done.values()) == {1}
    runs = Counter((e.job_id, e.attempt) for e in evs if e.kind == "started")
    assert set(runs.values()) == {1}, "one started event per run"
    assert any(n > 1 for n in Counter(j for j, _ in runs).values()), \
        "some job ran again after the kill (else the test proved nothing)"
    for e in evs:
        if e.kind == "succeeded":
            assert (e.job_id, e.attempt) in runs


def test_delivery_receipts_example(app: batchq.App, workers: WorkerProcs,
                                   env: dict[str, str | None], tmp_path: Path) -> None:
    """docs/snippets/events.md's receipts consumer (docs/examples/receipts.py): it
    follows the events and writes one delivery row per message into sqlite, and after a
    restart goes on from its last id: each message exactly once."""
    import sqlite3

    app.queue(EV_QUEUE).events()
    db = tmp_path / "receipts.db"
    script = REPO / "docs" / "examples" / "receipts.py"
    cenv = {**os.environ, **{k: v for k, v in env.items() if v is not None},
            "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{REPO}"}
    cenv.pop("BATCHQ_TEST_LOG", None)

    def consumer(limit: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), APP_REF, EV_QUEUE, str(db),
                               "--stop-after", str(limit)], env=cenv, text=True,
                              capture_output=True, timeout=60)

    first = [f"+1555000{i:04d}" for i in range(10)]
    ids = app.tasks["send_sms"].enqueue_many([(n,) for n in first])
    workers.start("-q", EV_QUEUE, serving=1)
    r = consumer(10)
    assert r.returncode == 0, r.stderr
    second = [f"+1555111{i:04d}" for i in range(10)]
    ids += app.tasks["send_sms"].enqueue_many([(n,) for n in second])
    r = consumer(10)  # a restart: resumes after the last id it stored
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT job_id, provider_id FROM deliveries").fetchall()
    sent = {}
    for line in Path(env["BATCHQ_TEST_LOG"] or "").read_text().splitlines():
        rec = json.loads(line)
        sent[rec["id"]] = rec["provider_id"]
    assert sorted(rows) == sorted((j, sent[j]) for j in ids)
