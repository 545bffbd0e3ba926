"""nack.lua: failed jobs go to the delayed set for a retry, or to the dead store."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import entry, leases, ns_keys, pop, refunded, server_ms, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.store import codec
from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


def nack(s: SyncScripts, k: QueueKeys, retries: list[tuple[bytes, int]],
         dead: list[tuple[bytes, bytes]]) -> list[int]:
    return [int(x) for x in s.call(calls.nack(k, retries, dead))]


def popped(r: redis.Redis, s: SyncScripts, k: QueueKeys, *ids: str,
           max_attempts: int = 3) -> list[bytes]:
    r.rpush(k.ready_for(0), *[entry(i, max_attempts=max_attempts) for i in ids])
    jobs = pop(s, k, len(ids))
    r.delete(k.wake)
    return jobs


def test_retry_moves_the_inflight_entry_to_delayed(redis_client, s, k, namespace):
    (job,) = popped(redis_client, s, k, "a")
    before = server_ms(redis_client)
    assert nack(s, k, [(b"a:1", 5000)], []) == []
    after = server_ms(redis_client)

    delayed = redis_client.zrange(k.delayed, 0, -1, withscores=True)
    assert [m for m, _ in delayed] == [job]
    assert job == with_attempt(entry("a"), 1)  # the attempt stays counted
    assert before + 5000 <= delayed[0][1] <= after + 5000
    # an idle worker is woken to learn the retry's due time
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert ns_keys(redis_client, namespace) == {k.delayed.encode(), k.wake.encode(),
                                                k.stats.encode(), k.pending.encode()}


def test_retry_with_zero_delay_is_due_now(redis_client, s, k):
    popped(redis_client, s, k, "z")
    before = server_ms(redis_client)
    nack(s, k, [(b"z:1", 0)], [])
    after = server_ms(redis_client)
    assert before <= redis_client.zscore(k.delayed, with_attempt(entry("z"), 1)) <= after


def test_dead_stores_the_record_and_indexes_the_id(redis_client, s, k, namespace):
    (job,) = popped(redis_client, s, k, "d", max_attempts=1)
    rec = codec.encode_dead_record("d", "error", job, error_type="ValueError",
                                   error_message="boom", traceback="Traceback ...")
    before = server_ms(redis_client)
    assert nack(s, k, [], [(b"d:1", rec)]) == []
    after = server_ms(redis_client)

    assert redis_client.hgetall(k.dead_jobs) == {b"d": rec}
    died = redis_client.zrange(k.dead, 0, -1, withscores=True)
    assert [m for m, _ in died] == [b"d"]
    assert before <= died[0][1] <= after
    assert ns_keys(redis_client, namespace) == {k.dead.encode(), k.dead_jobs.encode(),
                                                k.stats.encode()}
    back = codec.decode_dead_record(redis_client.hget(k.dead_jobs, "d"))
    assert back["raw"] == job
    assert back["error_type"] == "ValueError"


def test_retries_and_dead_in_one_call_are_routed_by_position(redis_client, s, k):
    jobs = popped(redis_client, s, k, "r1", "r2", "d1", "d2")
    rec1 = codec.encode_dead_record("d1", "error", jobs[2], error_message="one")
    rec2 = codec.encode_dead_record("d2", "error", jobs[3], error_message="two")
    now = server_ms(redis_client)
    assert nack(s, k, [(b"r1:1", 1000), (b"r2:1", 90_000)],
                [(b"d1:1", rec1), (b"d2:1", rec2)]) == []

    delayed = dict(redis_client.zrange(k.delayed, 0, -1, withscores=True))
    assert set(delayed) == {jobs[0], jobs[1]}
    assert now + 1000 <= delayed[jobs[0]] < now + 90_000 <= delayed[jobs[1]]
    assert redis_client.hgetall(k.dead_jobs) == {b"d1": rec1, b"d2": rec2}
    assert set(redis_client.zrange(k.dead, 0, -1)) == {b"d1", b"d2"}
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_stale_leases_are_skipped_and_reported(redis_client, s, k, namespace):
    (job,) = popped(redis_client, s, k, "s")
    deadline = redis_client.zscore(k.reserved, b"s:1")
    rec = codec.encode_dead_record("s", "error", job)
    # wrong attempt for a retry and for a dead-letter, and an unknown job
    assert nack(s, k, [(b"s:2", 1000), (b"nobody:1", 1000)], [(b"s:7", rec)]) == [1, 2, 3]

    assert redis_client.zrange(k.reserved, 0, -1, withscores=True) == [(b"s:1", deadline)]
    assert leases(redis_client, k) == {b"s": job}
    assert ns_keys(redis_client, namespace) == {k.reserved.encode(), k.inflight.encode()}


def test_stale_lease_after_reap_and_repop_does_not_touch_the_new_run(redis_client, s, k):
    popped(redis_client, s, k, "j")
    redis_client.zadd(k.reserved, {b"j:1": 1}, xx=True)  # lease expired
    (second,) = pop(s, k, 1)
    assert second == refunded(entry("j"), 2)

    assert nack(s, k, [(b"j:1", 1000)], []) == [1]
    assert redis_client.exists(k.delayed) == 0
    assert redis_client.zrange(k.reserved, 0, -1) == [b"j:2"]
    assert leases(redis_client, k) == {b"j": second}


def test_nack_twice_reports_the_second_as_stale(redis_client, s, k):
    popped(redis_client, s, k, "t")
    assert nack(s, k, [(b"t:1", 60_000)], []) == []
    assert nack(s, k, [(b"t:1", 1)], []) == [1]
    assert redis_client.zcard(k.delayed) == 1


def test_stale_positions_count_pairs_across_retries_and_dead(redis_client, s, k):
    jobs = popped(redis_client, s, k, "r", "d")
    rec = codec.encode_dead_record("d", "error", jobs[1])
    stale_rec = codec.encode_dead_record("x", "error", b"")
    got = nack(s, k, [(b"r:1", 1000), (b"r:5", 1000)], [(b"x:1", stale_rec), (b"d:1", rec)])
    assert got == [2, 3]
    assert [m for m, _ in redis_client.zrange(k.delayed, 0, -1, withscores=True)] == [jobs[0]]
    assert redis_client.hgetall(k.dead_jobs) == {b"d": rec}
    assert redis_client.exists(k.reserved, k.inflight) == 0


def test_nack_counts_retried_and_dead_in_the_stats_hash(redis_client, s, k):
    popped(redis_client, s, k, "r", "d")
    rec = codec.encode_dead_record("d", "failed", b"raw")
    assert nack(s, k, [(b"r:1", 10)], [(b"d:1", rec)]) == []
    assert nack(s, k, [(b"r:1", 10)], [(b"d:1", rec)]) == [1, 2]  # stale: not counted
    assert redis_client.hmget(k.stats, ["retried", "dead"]) == [b"1", b"1"]
