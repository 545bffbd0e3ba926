"""ack.lua: finish jobs; a stale lease (wrong attempt) deletes nothing and is reported
by its position among the leases."""

from __future__ import annotations

import pytest
from fixtures.lua import entry, leases, ns_keys, pop, refunded, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


def ack(s: SyncScripts, k: QueueKeys, leases: list[bytes]) -> list[int]:
    return [int(x) for x in s.call(calls.ack(k, leases))]


def test_ack_removes_reservation_and_inflight_entry(redis_client, s, k, namespace):
    redis_client.rpush(k.ready_for(0), entry("a"), entry("b"), entry("c"))
    assert len(pop(s, k, 3)) == 3
    redis_client.delete(k.wake)

    assert ack(s, k, [b"a:1", b"c:1"]) == []
    assert redis_client.zrange(k.reserved, 0, -1) == [b"b:1"]
    assert leases(redis_client, k) == {b"b": with_attempt(entry("b"), 1)}

    assert ack(s, k, [b"b:1"]) == []
    assert ns_keys(redis_client, namespace) == {k.stats.encode()}


def test_ack_of_a_stale_lease_deletes_nothing(redis_client, s, k):
    e = entry("job")
    redis_client.rpush(k.ready_for(0), e)
    pop(s, k, 1)
    # the lease expires while the first run is still going; the job is handed out again
    redis_client.zadd(k.reserved, {b"job:1": 1}, xx=True)
    assert pop(s, k, 1) == [refunded(e, 2)]
    deadline = redis_client.zscore(k.reserved, b"job:2")

    assert ack(s, k, [b"job:1"]) == [1]
    assert redis_client.zrange(k.reserved, 0, -1, withscores=True) == [(b"job:2", deadline)]
    assert leases(redis_client, k) == {b"job": refunded(e, 2)}

    assert ack(s, k, [b"job:2"]) == []
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_mixed_batch_reports_only_the_stale_positions(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("x"), entry("y"))
    pop(s, k, 2)
    assert ack(s, k, [b"x:1", b"x:2", b"nobody:1", b"y:1"]) == [2, 3]
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_acking_twice_reports_the_second_as_stale(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("once"))
    pop(s, k, 1)
    assert ack(s, k, [b"once:1"]) == []
    assert ack(s, k, [b"once:1"]) == [1]
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_ack_of_1000_leases_in_one_call(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), *[entry(f"j{i}") for i in range(1000)])
    assert len(pop(s, k, 1000)) == 1000
    assert ack(s, k, [b"j%d:1" % i for i in range(1000)]) == []
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_ack_leaves_other_queues_state_alone(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("a"), entry("b"))
    pop(s, k, 1)
    ack(s, k, [b"a:1"])
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [entry("b")]


def test_ack_counts_applied_acks_in_the_stats_hash_exactly_once(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("a"), entry("b"))
    pop(s, k, 2)
    assert ack(s, k, [b"a:1", b"b:1"]) == []
    # the same acks again (a reply lost, the flush re-sent): stale, not counted twice
    assert ack(s, k, [b"a:1", b"b:1"]) == [1, 2]
    assert redis_client.hget(k.stats, "succeeded") == b"2"
