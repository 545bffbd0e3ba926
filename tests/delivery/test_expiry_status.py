"""What an expired job reads as, with real worker processes: ``job_status`` / ``job_info``
/ ``batchq job show`` say ``expired`` (a job kept in dead says ``dead``, reason
``expired``) while the drop's mark lives, then ``unknown``; a ``result``/``aresult``
waiter is told at the drop (``JobExpired``, or ``JobDead`` for a kept one), long before
its timeout."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import APP, Fleet
from helpers import run_cli

import batchq
from batchq.ops.jobinfo import EXPIRED_KEEP_MS
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def test_an_expired_job_reads_expired_then_unknown(fleet: Fleet) -> None:
    app = fleet.app
    work = app.tasks["work"]
    gone = work.options(expires_s=0.3).enqueue("x0")
    kept = work.options(expires_s=0.3, keep_expired=True).enqueue("k0")
    ran = work.enqueue("ok")
    assert app.job_status(gone) == "ready"
    time.sleep(0.5)
    assert app.job_status(gone) == "ready"  # past its deadline, not popped yet
    t0 = time.time() * 1000
    fleet.drain("-c", "2")
    assert [r.token for r in fleet.runs()] == ["ok"]
    assert app.job_status(gone) == "expired"
    assert app.job_status(kept) == "dead"
    assert app.job_status(ran) == "unknown"  # no result kept: as before
    info = app.job_info(gone)
    assert (info.state, info.queue) == ("expired", "default")
    assert info.finished_ms is not None and t0 - 1000 <= info.finished_ms <= t0 + 60_000
    dead = app.job_info(kept)
    assert (dead.state, dead.error and dead.error["reason"]) == ("dead", "expired")
    env = fleet.env()
    res = run_cli(["job", "show", APP, gone, "--json"], env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "expired"
    res = run_cli(["job", "show", APP, gone], env=env)
    assert res.returncode == 0 and "expired" in res.stdout, res.stdout + res.stderr
    # the mark's "~" member falls due: the next pop's sweep removes the mark
    k = app.keys("default")
    assert fleet.r.zscore(k.expires, f"~{gone}") is not None
    assert fleet.r.hgetall(k.cancel) == {gone.encode(): b"X"}  # none for the kept one
    fleet.r.zadd(k.expires, {f"~{gone}": 0})
    decode_pop_reply(app.sync_scripts.call(calls.pop(k, 1, 30_000, 100)))
    assert app.job_status(gone) == "unknown"
    assert fleet.r.hlen(k.cancel) == 0
    assert EXPIRED_KEEP_MS >= 60_000  # long enough for a caller to look
    # the kept one, redriven, runs: no mark of the drop turns it into a cancelled one
    assert app.queue("default").retry_dead([kept]) == 1
    fleet.drain("-c", "1")
    assert sorted(r.token for r in fleet.runs()) == ["k0", "ok"]
    assert fleet.r.hget(k.stats, "cancelled") is None


def test_a_cancel_before_the_deadline_still_reads_cancelled(fleet: Fleet) -> None:
    app = fleet.app
    jid = app.tasks["work"].options(expires_s=0.3).enqueue("c0")
    assert app.cancel(jid)
    time.sleep(0.5)
    fleet.drain("-c", "1")
    assert app.job_status(jid) == "cancelled"
    with pytest.raises(batchq.JobCancelled):
        app.result(jid, timeout_s=1)
    assert app.queue("default").stats().expired == 0


def _keep_task(app: batchq.App) -> None:
    @app.task(queue="kept", result_ttl_s=60)
    def keep(token: Any) -> Any:  # never runs: its jobs expire
        return token


def _waiting(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e
        out["secs"] = time.monotonic() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def test_a_result_waiter_is_told_at_the_drop(fleet: Fleet) -> None:
    app = fleet.app
    _keep_task(app)
    keep = app.tasks["keep"]
    gone = keep.options(expires_s=0.5).enqueue("x")
    kept = keep.options(expires_s=0.5, keep_expired=True).enqueue("k")
    waiters = [_waiting(lambda j=j: app.result(j, timeout_s=40)) for j in (gone, kept)]
    a_th, a_out = _waiting(lambda: asyncio.run(app.aresult(gone, timeout_s=40)))
    time.sleep(0.8)  # past the deadline: the waiters still wait (nothing popped it)
    assert all(th.is_alive() for th, _ in waiters) and a_th.is_alive()
    fleet.start("-q", "kept")
    for th, _ in [*waiters, (a_th, a_out)]:
        th.join(30)
        assert not th.is_alive()
    (_, gone_out), (_, kept_out) = waiters
    assert isinstance(gone_out.get("error"), batchq.JobExpired), gone_out
    assert gone in str(gone_out["error"]) and gone_out["error"].job_id == gone
    assert isinstance(a_out.get("error"), batchq.JobExpired), a_out
    assert isinstance(kept_out.get("error"), batchq.JobDead), kept_out
    # told at the drop, not at the timeout
    assert max(o["secs"] for o in (gone_out, kept_out, a_out)) < 25
    with pytest.raises(batchq.JobExpired):  # a later caller is told at once
        app.result(gone, timeout_s=5)


def test_campaign_show_and_list_count_expired(fleet: Fleet) -> None:
    app = fleet.app
    with app.campaign("exp-cli") as c:
        app.tasks["work"].options(campaign=c, expires_s=0.3).enqueue_many(
            [(f"e{i}",) for i in range(3)])
        app.tasks["work"].options(campaign=c).enqueue("ran")
    time.sleep(0.5)
    fleet.drain("-c", "2")
    fleet.until(lambda: app.campaign("exp-cli").stats().done, 20, "the campaign completes")
    where = ["--redis-url", fleet.url, "--namespace", fleet.ns]
    res = run_cli(["campaign", "show", "exp-cli", *where])
    assert res.returncode == 0, res.stderr
    assert "expired:    3" in res.stdout and "succeeded:  1" in res.stdout, res.stdout
    res = run_cli(["campaign", "show", "exp-cli", "--watch", "--interval", "0.1", *where])
    assert res.returncode == 0 and "expired 3" in res.stdout, res.stdout + res.stderr
    res = run_cli(["campaign", "list", *where])
    assert res.returncode == 0, res.stderr
    header, row = res.stdout.splitlines()[:2]
    assert header.split()[6:8] == ["CANCELLED", "EXPIRED"]
    assert row.split()[:8] == ["exp-cli", "done", "4", "0", "1", "0", "0", "3"], res.stdout
