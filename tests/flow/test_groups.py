"""Groups end to end with real workers: served in turn, priorities strict inside a group,
delayed jobs and retries back in their group, cancel and status, the limits API."""

from __future__ import annotations

import time

import pytest
from fixtures.flow import *  # noqa: F403
from fixtures.runs import wait_exit
from helpers import wait_until

import batchq
from batchq.flow.limits import Limit, group_hex

pytestmark = pytest.mark.integration


def test_a_small_group_is_not_stuck_behind_a_big_one(app, queue_name, start_worker, runs):
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="big").enqueue_many([(i,) for i in range(3000)])
    work.options(group="small").enqueue_many([(f"s{i}",) for i in range(10)])
    proc = start_worker(queue_name, "--burst", "-c", "1")
    assert wait_exit(proc, 60) == 0, proc.read_log()
    order = [r.token for r in runs()]
    assert len(order) == 3010
    # the 10 small jobs are interleaved with the big group from the first fetch on
    last_small = max(i for i, t in enumerate(order) if t.startswith("s"))
    assert last_small < 120, order[:150]


def test_priorities_are_strict_inside_a_group_and_groups_share_turns(app, queue_name,
                                                                       start_worker, runs):
    work = app.tasks["work"].options(queue=queue_name)
    a = work.options(group="a")
    a.enqueue_many([(f"a-low{i}",) for i in range(20)])
    a.options(priority=9).enqueue("a-high")
    work.options(group="b").enqueue_many([(f"b{i}",) for i in range(20)])
    proc = start_worker(queue_name, "--burst", "-c", "1")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    tokens = [r.token for r in runs()]
    a_order = [t for t in tokens if t.startswith("a")]
    assert a_order[0] == "a-high"
    assert a_order[1:] == [f"a-low{i}" for i in range(20)]
    # neither group ran more than a fetch ahead of the other
    first_b = tokens.index("b0")
    assert first_b < 12, tokens


def test_plain_jobs_share_the_queue_with_groups(app, queue_name, start_worker, runs):
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="g").enqueue_many([(f"g{i}",) for i in range(500)])
    work.enqueue_many([(f"p{i}",) for i in range(5)])
    proc = start_worker(queue_name, "--burst", "-c", "1")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    tokens = [r.token for r in runs()]
    assert len(tokens) == 505
    assert max(i for i, t in enumerate(tokens) if t.startswith("p")) < 120


def test_delayed_jobs_and_retries_come_back_to_their_group(app, queue_name, start_worker,
                                                           runs, redis_client):
    work = app.tasks["work"].options(queue=queue_name, group="late")
    jid = work.options(delay_s=0.3).enqueue("d1")
    assert jid.endswith("~" + group_hex("late"))
    k = app.keys(queue_name)
    assert redis_client.zcard(k.delayed) == 1
    proc = start_worker(queue_name, "--burst")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    (r,) = runs()
    assert r.token == "d1" and r.group == group_hex("late")
    assert app.job_status(jid) in ("succeeded", "unknown")
    # every counter of the group is back to nothing
    assert redis_client.hget(k.gstate, f"{group_hex('late')}:n") is None
    assert redis_client.zcard(k.gready) == 0 and redis_client.zcard(k.groups) == 0


def test_cancel_and_status_of_grouped_jobs(app, queue_name):
    work = app.tasks["work"].options(queue=queue_name, group="acme")
    ready = work.enqueue("r")
    later = work.options(delay_s=60).enqueue("d")
    assert app.job_status(ready) == "ready"
    assert app.job_status(later) == "delayed"
    assert app.cancel(ready) and app.cancel(later)
    assert app.job_status(ready) == "cancelled"
    assert app.job_status(later) == "cancelled"
    q = app.queue(queue_name)
    # both left the quota count at once (the ready one's entry goes when a pop drops it)
    assert [(g.group, g.pending) for g in q.groups()] in ([], [("acme", 0)])


def test_group_names_are_checked_at_enqueue(app, queue_name):
    work = app.tasks["work"].options(queue=queue_name)
    with pytest.raises(ValueError, match="group"):
        work.options(group="")
    with pytest.raises(ValueError, match="64"):
        work.options(group="x" * 65)
    with pytest.raises(TypeError, match="group"):
        work.options(group=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved"):
        work.options(group="*")
    # any text is fine: it travels hex-encoded
    jid = work.options(group="a:b~c d_m").enqueue(1)
    assert "~" + group_hex("a:b~c d_m") in jid and not jid.endswith("_m")


def test_limits_are_kept_in_redis_and_listed(app, queue_name):
    q = app.queue(queue_name)
    q.limit(rate_per_s=100, burst=100)
    q.limit(group="acme", rate_per_s=10, concurrency=5)
    q.limit(group="*", max_pending=1000)
    q.limit(group="big", weight=3)
    got = q.limits()
    assert got[0] == Limit(None, 100.0, 100)
    assert got[1] == Limit("*", max_pending=1000)
    assert Limit("acme", 10.0, None, 5) in got and Limit("big", weight=3.0) in got
    assert q.remove_limit(group="acme") and not q.remove_limit(group="acme")
    assert q.remove_limit()
    assert [x.group for x in q.limits()] == ["*", "big"]
    with pytest.raises(ValueError, match="at least one"):
        q.limit(group="x")
    with pytest.raises(ValueError, match="rate_per_s"):
        q.limit(rate_per_s=0)
    with pytest.raises(ValueError, match="per group"):
        q.limit(max_pending=5)
    with pytest.raises(TypeError, match="concurrency"):
        q.limit(concurrency=1.5)  # type: ignore[arg-type]


def test_a_limit_change_reaches_a_running_worker(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    q.limit(group="g", rate_per_s=1, burst=1)
    work = app.tasks["work"].options(queue=queue_name, group="g")
    work.enqueue_many([(i,) for i in range(20)])
    start_worker(queue_name)
    wait_until(lambda: len(runs()) >= 1, timeout_s=10)
    time.sleep(0.5)
    assert len(runs()) <= 2
    q.limit(group="g", rate_per_s=1000, burst=100)
    wait_until(lambda: len(runs()) == 20, timeout_s=10, message="limit change not applied")


def test_stats_count_grouped_jobs(app, queue_name):
    work = app.tasks["work"].options(queue=queue_name)
    work.options(group="a").enqueue_many([(i,) for i in range(7)])
    work.enqueue_many([(i,) for i in range(3)])
    s = app.queue(queue_name).stats()
    assert (s.ready, s.grouped, s.groups_active, s.groups_waiting) == (10, 7, 1, 0)


def test_groups_with_campaigns_and_dedup_keys(app, queue_name, start_worker, runs):
    q = app.queue(queue_name)
    q.limit(group="acme", max_pending=6)
    c = app.campaign(f"{queue_name}-c")
    work = app.tasks["work"].options(queue=queue_name, campaign=c)
    ids = work.options(group="acme").enqueue_many([(f"a{i}",) for i in range(5)],
                                                 key_fn=lambda row: row[0])
    again = work.options(group="acme").enqueue_many([(f"a{i}",) for i in range(5)],
                                                   key_fn=lambda row: row[0])
    assert again == ids  # every key held: nothing written
    assert all(x.endswith("~" + group_hex("acme") + "_m") for x in ids)
    with pytest.raises(batchq.QuotaExceeded):
        work.options(group="acme").enqueue_many([(f"b{i}",) for i in range(2)],
                                                key_fn=lambda row: row[0])
    work.options(group="other", delay_s=0.2).enqueue("late")
    c.seal()
    assert c.stats().total == 6
    proc = start_worker(queue_name, "--burst")
    assert wait_exit(proc, 30) == 0, proc.read_log()
    assert sorted(r.token for r in runs()) == ["a0", "a1", "a2", "a3", "a4", "late"]
    st = c.stats()
    assert (st.total, st.succeeded, st.pending) == (6, 6, 0)
    assert q.groups() == []


def test_python_and_lua_agree_on_the_flow_constants():
    from pathlib import Path

    from batchq.flow import limits

    lib = (Path(limits.__file__).parents[1] / "store" / "scripts" / "_lib.lua").read_text()
    assert f"local BLOCKED = {limits.BLOCKED:.0e}".replace("e+", "e") in lib
    assert f"local QUEUE = '{limits.QUEUE_FIELD}'" in lib
