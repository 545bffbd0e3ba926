"""release.lua: reserved jobs go back to the head of ready, in order, attempt refunded."""

from __future__ import annotations

import pytest
from fixtures.lua import entry, leases, ns_keys, pop, refunded, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


def release(s: SyncScripts, k: QueueKeys, leases: list[bytes]) -> int:
    return int(s.call(calls.release(k, leases)))


def test_released_jobs_return_to_the_head_in_original_order(redis_client, s, k, namespace):
    es = [entry(f"j{i}") for i in range(3)]
    redis_client.rpush(k.ready_for(0), *es)
    assert pop(s, k, 3) == [with_attempt(e, 1) for e in es]
    later = entry("later")
    redis_client.rpush(k.ready_for(0), later)  # arrived while they were held
    redis_client.delete(k.wake)

    assert release(s, k, [b"j0:1", b"j1:1", b"j2:1"]) == 3
    # attempt refunded: the entries are byte-for-byte what was enqueued
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [*es, later]
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert ns_keys(redis_client, namespace) == {k.ready_for(0).encode(), k.wake.encode(),
                                                k.pending.encode()}

    # the next pop hands them out again in the same order, attempt 1 again
    assert pop(s, k, 4) == [with_attempt(e, 1) for e in [*es, later]]


def test_attempt_is_decremented_not_reset(redis_client, s, k):
    e = entry("second", max_attempts=5, attempt=2)
    redis_client.rpush(k.ready_for(0), e)
    assert pop(s, k, 1) == [with_attempt(e, 3)]
    assert release(s, k, [b"second:3"]) == 1
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [e]


def test_each_job_returns_to_its_own_priority_level(redis_client, s, k):
    hi, lo = entry("hi", prio=9), entry("lo", prio=2)
    redis_client.rpush(k.ready_for(9), hi)
    redis_client.rpush(k.ready_for(2), lo)
    pop(s, k, 2)
    waiting = entry("waiting", prio=2)
    redis_client.rpush(k.ready_for(2), waiting)

    assert release(s, k, [b"hi:1", b"lo:1"]) == 2
    assert redis_client.lrange(k.ready_for(9), 0, -1) == [hi]
    assert redis_client.lrange(k.ready_for(2), 0, -1) == [lo, waiting]


def test_stale_leases_are_skipped(redis_client, s, k, namespace):
    e = entry("s")
    redis_client.rpush(k.ready_for(0), e)
    pop(s, k, 1)
    redis_client.delete(k.wake)
    deadline = redis_client.zscore(k.reserved, b"s:1")

    assert release(s, k, [b"s:2", b"nobody:1"]) == 0
    assert redis_client.zrange(k.reserved, 0, -1, withscores=True) == [(b"s:1", deadline)]
    assert leases(redis_client, k) == {b"s": with_attempt(e, 1)}
    # nothing given back: no wake token either
    assert ns_keys(redis_client, namespace) == {k.reserved.encode(), k.inflight.encode()}


def test_mixed_live_and_stale(redis_client, s, k):
    es = [entry("a"), entry("b")]
    redis_client.rpush(k.ready_for(0), *es)
    pop(s, k, 2)
    assert release(s, k, [b"a:1", b"a:9", b"b:1"]) == 2
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_release_after_reap_and_repop_leaves_the_new_run_alone(redis_client, s, k):
    e = entry("r")
    redis_client.rpush(k.ready_for(0), e)
    pop(s, k, 1)
    redis_client.zadd(k.reserved, {b"r:1": 1}, xx=True)
    assert pop(s, k, 1) == [refunded(e, 2)]
    assert release(s, k, [b"r:1"]) == 0
    assert redis_client.zrange(k.reserved, 0, -1) == [b"r:2"]
    assert redis_client.llen(k.ready_for(0)) == 0
