"""redrive.lua: dead jobs back to the tail of their ready list; ids no longer dead skipped."""

from __future__ import annotations

from functools import partial

import pytest
import redis
from fixtures.lua import enqueued, ns_keys, pop
from fixtures.lua import entry as _entry
from fixtures.scripts import *  # noqa: F403

from batchq.store import codec
from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script

# one attempt, so a job's first failure (or expired lease) dead-letters it
entry = partial(_entry, max_attempts=1)


def redrive(s: SyncScripts, k: QueueKeys, pairs: list[tuple[str, bytes]]) -> int:
    return int(s.call(calls.redrive(k, pairs)))


def kill(r: redis.Redis, s: SyncScripts, k: QueueKeys, jid: str, prio: int = 0) -> bytes:
    """Run a job through pop and a dead nack; return the raw bytes of its dead record."""
    r.rpush(k.ready_for(prio), entry(jid, prio))
    (job,) = pop(s, k, 1)
    rec = codec.encode_dead_record(jid, "error", job, error_message="boom")
    assert s.call(calls.nack(k, dead=[(f"{jid}:1", rec)])) == []
    r.delete(k.wake)
    return job


def test_redrive_moves_dead_jobs_back_with_fresh_attempts(redis_client, s, k, namespace):
    raw = kill(redis_client, s, k, "d")
    assert codec.decode_dead_record(redis_client.hget(k.dead_jobs, "d"))["raw"] == raw
    fresh = codec.reset_attempt(raw)
    assert fresh == entry("d")

    assert redrive(s, k, [("d", fresh)]) == 1
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [fresh]
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    # a redriven job counts as enqueued again
    assert redis_client.hget(k.stats, "enqueued") == b"1"
    assert ns_keys(redis_client, namespace) == {
        k.ready_for(0).encode(), k.wake.encode(), k.stats.encode(), k.pending.encode()}
    # and it runs again as attempt 1
    assert pop(s, k, 1)[0].split(b":", 2)[1] == b"1"


def test_second_redrive_of_the_same_ids_moves_nothing(redis_client, s, k):
    fresh = codec.reset_attempt(kill(redis_client, s, k, "once"))
    assert redrive(s, k, [("once", fresh)]) == 1
    redis_client.delete(k.wake)
    assert redrive(s, k, [("once", fresh)]) == 0
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [fresh]
    assert redis_client.exists(k.wake) == 0
    assert enqueued(redis_client, k) == 1


def test_redrive_appends_to_the_tail_of_the_jobs_level(redis_client, s, k):
    fresh = codec.reset_attempt(kill(redis_client, s, k, "p7", prio=7))
    waiting = entry("waiting", prio=7)
    redis_client.rpush(k.ready_for(7), waiting)
    assert redrive(s, k, [("p7", fresh)]) == 1
    assert redis_client.lrange(k.ready_for(7), 0, -1) == [waiting, fresh]
    assert redis_client.llen(k.ready_for(0)) == 0


def test_only_ids_still_dead_are_moved(redis_client, s, k):
    a = codec.reset_attempt(kill(redis_client, s, k, "a"))
    b = codec.reset_attempt(kill(redis_client, s, k, "b"))
    c = codec.reset_attempt(kill(redis_client, s, k, "c"))
    # someone else purged "b" meanwhile
    redis_client.zrem(k.dead, "b")
    redis_client.hdel(k.dead_jobs, "b")

    assert redrive(s, k, [("a", a), ("b", b), ("c", c), ("ghost", entry("ghost"))]) == 2
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [a, c]
    assert redis_client.exists(k.dead, k.dead_jobs) == 0
    assert enqueued(redis_client, k) == 2


def test_other_dead_jobs_stay(redis_client, s, k):
    a = codec.reset_attempt(kill(redis_client, s, k, "a"))
    kill(redis_client, s, k, "b")
    died_b = redis_client.zscore(k.dead, "b")
    assert redrive(s, k, [("a", a)]) == 1
    assert redis_client.zrange(k.dead, 0, -1, withscores=True) == [(b"b", died_b)]
    assert redis_client.hkeys(k.dead_jobs) == [b"b"]


def test_crashed_worker_record_from_the_reaper_can_be_redriven(redis_client, s, k):
    redis_client.rpush(k.ready_for(3), entry("reaped", prio=3, max_attempts=1))
    pop(s, k, 1)
    s.call(calls.start(k, [b"reaped:1"]))  # its handler started...
    redis_client.zadd(k.reserved, {b"reaped:1": 1}, xx=True)  # ...and its worker died
    pop(s, k, 0)  # max_attempts 1: the reaper dead-letters it
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, "reaped"))
    assert rec["reason"] == "crashed_worker"

    fresh = codec.reset_attempt(rec["raw"])
    assert redrive(s, k, [("reaped", fresh)]) == 1
    assert redis_client.lrange(k.ready_for(3), 0, -1) == [entry("reaped", prio=3,
                                                                 max_attempts=1)]
