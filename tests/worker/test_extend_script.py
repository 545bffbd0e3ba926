"""extend.lua: push lease deadlines to server now + lease; report, never re-create, lost ones."""

from __future__ import annotations

import pytest
from fixtures.lua import entry, leases, pop, refunded, server_ms
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


def extend(s: SyncScripts, k: QueueKeys, lease_ms: int, leases: list[bytes]) -> list[int]:
    return [int(x) for x in s.call(calls.extend(k, lease_ms, leases))]


def test_deadlines_are_pushed_to_server_now_plus_lease(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("a"), entry("b"), entry("c"))
    pop(s, k, 3, lease=1_000)
    c_deadline = redis_client.zscore(k.reserved, b"c:1")

    before = server_ms(redis_client)
    assert extend(s, k, 60_000, [b"a:1", b"b:1"]) == []
    after = server_ms(redis_client)

    scores = dict(redis_client.zrange(k.reserved, 0, -1, withscores=True))
    assert scores[b"a:1"] == scores[b"b:1"]
    assert before + 60_000 <= scores[b"a:1"] <= after + 60_000
    assert scores[b"c:1"] == c_deadline  # not named, not touched
    assert len(scores) == 3
    # extend touches the reservation only
    assert len(leases(redis_client, k)) == 3


def test_an_expired_but_unreaped_lease_is_still_held_and_extended(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("late"))
    pop(s, k, 1)
    redis_client.zadd(k.reserved, {b"late:1": 1}, xx=True)
    before = server_ms(redis_client)
    assert extend(s, k, 30_000, [b"late:1"]) == []
    assert redis_client.zscore(k.reserved, b"late:1") >= before + 30_000


def test_lost_leases_are_reported_by_position_and_not_recreated(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), entry("keep1"), entry("gone"), entry("keep2"))
    pop(s, k, 3)
    # the lease of "gone" expires and the reaper hands the job out again
    redis_client.zadd(k.reserved, {b"gone:1": 1}, xx=True)
    assert pop(s, k, 1) == [refunded(entry("gone"), 2)]
    gone2 = redis_client.zscore(k.reserved, b"gone:2")

    before = server_ms(redis_client)
    assert extend(s, k, 60_000, [b"keep1:1", b"gone:1", b"keep2:1", b"never:1"]) == [2, 4]

    scores = dict(redis_client.zrange(k.reserved, 0, -1, withscores=True))
    assert set(scores) == {b"keep1:1", b"keep2:1", b"gone:2"}
    assert scores[b"gone:2"] == gone2  # the new run's lease is untouched
    assert scores[b"keep1:1"] >= before + 60_000
    assert redis_client.zscore(k.reserved, b"gone:1") is None
    assert redis_client.zscore(k.reserved, b"never:1") is None


def test_all_lost_writes_nothing(redis_client, s, k, namespace):
    assert extend(s, k, 60_000, [b"x:1", b"y:3"]) == [1, 2]
    assert list(redis_client.scan_iter(match=f"{namespace}:*")) == []


def test_extend_of_1000_leases(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), *[entry(f"j{i}") for i in range(1000)])
    pop(s, k, 1000)
    before = server_ms(redis_client)
    assert extend(s, k, 120_000, [b"j%d:1" % i for i in range(1000)]) == []
    lowest = redis_client.zrange(k.reserved, 0, 0, withscores=True)[0][1]
    assert lowest >= before + 120_000
