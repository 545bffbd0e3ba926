"""schedule.lua: add jobs to the delayed set, due at a server-clock time; retry check."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import enqueued, entry, ns_keys, server_ms, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


def schedule(s: SyncScripts, k: QueueKeys, kind: str, when: int, entries: list[bytes],
             prio: int = 0, check: bool = False) -> int:
    return int(s.call(calls.schedule(k, prio, kind, when, entries, check=check)))


def delayed(r: redis.Redis, k: QueueKeys) -> dict[bytes, float]:
    return dict(r.zrange(k.delayed, 0, -1, withscores=True))


def test_rel_due_time_is_server_now_plus_delay(redis_client, s, k, namespace):
    es = [entry("a"), entry("b"), entry("c")]
    before = server_ms(redis_client)
    due = schedule(s, k, "rel", 5000, es)
    after = server_ms(redis_client)
    assert before + 5000 <= due <= after + 5000
    assert delayed(redis_client, k) == {e: float(due) for e in es}
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert redis_client.hgetall(k.stats) == {b"enqueued": b"3"}
    # nothing went to a ready list
    assert ns_keys(redis_client, namespace) == {
        k.delayed.encode(), k.wake.encode(), k.stats.encode(), k.pending.encode()}


def test_rel_zero_delay_is_server_now(redis_client, s, k):
    before = server_ms(redis_client)
    due = schedule(s, k, "rel", 0, [entry("z")])
    after = server_ms(redis_client)
    assert before <= due <= after


def test_abs_due_time_is_used_as_given(redis_client, s, k):
    when = server_ms(redis_client) + 3_600_000
    es = [entry("a", prio=4), entry("b", prio=4)]
    assert schedule(s, k, "abs", when, es, prio=4) == when
    assert delayed(redis_client, k) == {e: float(when) for e in es}
    assert redis_client.llen(k.ready_for(4)) == 0


def test_abs_due_time_in_the_past_is_kept_exactly(redis_client, s, k):
    # a past ETA is still written to the delayed set: the next pop promotes it
    assert schedule(s, k, "abs", 1_000, [entry("old")]) == 1_000
    assert delayed(redis_client, k) == {entry("old"): 1000.0}


def test_large_abs_due_time_keeps_millisecond_precision(redis_client, s, k):
    when = 4_102_444_800_123  # 2100-01-01 00:00:00.123 UTC
    assert schedule(s, k, "abs", when, [entry("far")]) == when
    assert redis_client.zscore(k.delayed, entry("far")) == float(when)


def test_wake_list_never_holds_more_than_one_token(redis_client, s, k):
    for i in range(4):
        schedule(s, k, "rel", 1000, [entry(f"j{i}")])
        assert redis_client.lrange(k.wake, 0, -1) == [b"1"]


def test_check_mode_writes_when_first_job_is_nowhere(redis_client, s, k):
    redis_client.zadd(k.delayed, {entry("other"): 5})
    es = [entry("n1"), entry("n2")]
    when = server_ms(redis_client) + 10_000
    assert schedule(s, k, "abs", when, es, check=True) == when
    assert delayed(redis_client, k) == {entry("other"): 5.0, es[0]: when, es[1]: when}
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert enqueued(redis_client, k) == 2


def test_check_mode_rel_computes_due_from_server_time(redis_client, s, k):
    before = server_ms(redis_client)
    due = schedule(s, k, "rel", 2500, [entry("r")], check=True)
    after = server_ms(redis_client)
    assert before + 2500 <= due <= after + 2500
    assert redis_client.zscore(k.delayed, entry("r")) == float(due)


def test_check_mode_minus_one_when_first_job_is_already_delayed(redis_client, s, k, namespace):
    es = [entry("d1"), entry("d2")]
    due = schedule(s, k, "rel", 60_000, es)
    redis_client.delete(k.wake)
    assert schedule(s, k, "rel", 90_000, es, check=True) == -1
    # untouched: same members, same (first) due time, no wake token, no count
    assert delayed(redis_client, k) == {es[0]: float(due), es[1]: float(due)}
    assert ns_keys(redis_client, namespace) == {k.delayed.encode(), k.stats.encode(),
                                                k.pending.encode()}
    assert enqueued(redis_client, k) == 2


def test_check_mode_minus_one_when_first_job_is_running(redis_client, s, k, namespace):
    es = [entry("r1"), entry("r2")]
    redis_client.hset(k.inflight, "r1", with_attempt(es[0], 1))
    assert schedule(s, k, "rel", 1000, es, check=True) == -1
    assert redis_client.exists(k.delayed) == 0
    assert ns_keys(redis_client, namespace) == {k.inflight.encode()}


def test_check_mode_minus_one_when_first_job_was_already_promoted(
        redis_client, s, k, namespace):
    es = [entry("p1", prio=6), entry("p2", prio=6)]
    # the earlier call landed and a pop already moved the jobs to their ready list
    redis_client.rpush(k.ready_for(6), *es)
    assert schedule(s, k, "rel", 1000, es, prio=6, check=True) == -1
    assert redis_client.lrange(k.ready_for(6), 0, -1) == es
    assert ns_keys(redis_client, namespace) == {k.ready_for(6).encode()}
