"""enqueue.lua: append encoded jobs to one ready list, wake one idle worker, count them
in the stats hash, and in retry (check) mode write nothing if the earlier try landed."""

from __future__ import annotations

from functools import partial

import pytest
from fixtures.lua import enqueued, leases, ns_keys, with_attempt
from fixtures.lua import entry as _entry
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script

# enqueue tests encode jobs with no positional args
entry = partial(_entry, args=())


def enqueue(s: SyncScripts, k: QueueKeys, entries: list[bytes], prio: int = 0,
            check: bool = False, runs: str = "") -> int:
    return int(s.call(calls.enqueue(k, prio, entries, check=check, runs=runs)))


def test_appends_in_order_and_returns_list_length(redis_client, s, k):
    first = [entry(f"a{i}") for i in range(3)]
    second = [entry(f"b{i}") for i in range(2)]
    assert enqueue(s, k, first) == 3
    assert redis_client.lrange(k.ready_for(0), 0, -1) == first
    assert enqueue(s, k, second) == 5
    assert redis_client.lrange(k.ready_for(0), 0, -1) == first + second
    assert enqueued(redis_client, k) == 5


def test_writes_only_the_target_list_wake_list_and_stats(redis_client, s, k, namespace):
    es = [entry(f"j{i}", prio=7) for i in range(4)]
    assert enqueue(s, k, es, prio=7) == 4
    assert ns_keys(redis_client, namespace) == {
        k.ready_for(7).encode(), k.wake.encode(), k.stats.encode()}
    assert redis_client.lrange(k.ready_for(7), 0, -1) == es
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert redis_client.hgetall(k.stats) == {b"enqueued": b"4"}


def test_wake_list_never_holds_more_than_one_token(redis_client, s, k):
    assert redis_client.llen(k.wake) == 0
    enqueue(s, k, [entry("a")])
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    for i in range(5):
        enqueue(s, k, [entry(f"b{i}"), entry(f"c{i}")])
        assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    # a worker took the token: the next enqueue leaves exactly one again
    assert redis_client.lpop(k.wake) == b"1"
    enqueue(s, k, [entry("d")])
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]


def test_a_full_chunk_of_1000_jobs_in_one_call(redis_client, s, k):
    es = [entry(f"j{i}") for i in range(1000)]
    assert enqueue(s, k, es) == 1000
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es
    assert redis_client.llen(k.wake) == 1
    assert enqueued(redis_client, k) == 1000


def test_normal_mode_does_not_deduplicate(redis_client, s, k):
    e = entry("same")
    assert enqueue(s, k, [e]) == 1
    assert enqueue(s, k, [e]) == 2
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [e, e]
    assert enqueued(redis_client, k) == 2


def test_check_mode_writes_when_first_job_is_nowhere(redis_client, s, k):
    es = [entry("x1"), entry("x2")]
    assert enqueue(s, k, es, check=True) == 2
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    assert enqueued(redis_client, k) == 2


def test_check_mode_writes_when_other_jobs_are_queued(redis_client, s, k):
    other = [entry("o1"), entry("o2")]
    enqueue(s, k, other)
    es = [entry("n1"), entry("n2")]
    assert enqueue(s, k, es, check=True) == 4
    assert redis_client.lrange(k.ready_for(0), 0, -1) == other + es
    assert enqueued(redis_client, k) == 4


def test_check_mode_returns_minus_one_when_first_job_is_already_queued(
        redis_client, s, k, namespace):
    es = [entry(f"j{i}", prio=3) for i in range(3)]
    assert enqueue(s, k, es, prio=3) == 3
    later = [entry("later", prio=3)]
    enqueue(s, k, later, prio=3)
    redis_client.delete(k.wake)  # an idle worker consumed the token

    assert enqueue(s, k, es, prio=3, check=True) == -1
    assert redis_client.lrange(k.ready_for(3), 0, -1) == es + later
    # nothing at all was written: no wake token, no count
    assert ns_keys(redis_client, namespace) == {k.ready_for(3).encode(), k.stats.encode()}
    assert enqueued(redis_client, k) == 4


def test_check_mode_returns_minus_one_when_first_job_is_running(redis_client, s, k, namespace):
    es = [entry("run1"), entry("run2")]
    # the earlier call landed and a worker already popped the first job
    redis_client.hset(k.inflight, "run1", with_attempt(es[0], 1))
    redis_client.rpush(k.ready_for(0), es[1])

    assert enqueue(s, k, es, check=True) == -1
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [es[1]]
    assert leases(redis_client, k) == {b"run1": with_attempt(es[0], 1)}
    assert ns_keys(redis_client, namespace) == {k.ready_for(0).encode(), k.inflight.encode()}
    assert enqueued(redis_client, k) == 0


def test_check_mode_ignores_an_unrelated_inflight_job(redis_client, s, k):
    redis_client.hset(k.inflight, "someone-else", with_attempt(entry("someone-else"), 1))
    es = [entry("mine")]
    assert enqueue(s, k, es, check=True) == 1
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es


def _bits(redis_client, key: str, n: int) -> list[int]:
    return [redis_client.getbit(key, i) for i in range(n)]


def test_runs_set_exactly_their_bits_in_a_few_commands(redis_client, s, k):
    # sequence numbers 0..99 handed out; runs with unaligned edges, one byte-aligned run
    # and single bits; the bits around them stay clear
    assert int(s.call(calls.reserve(k, 100))) == 0
    enqueue(s, k, [entry(f"j{i}") for i in range(3 + 20 + 16 + 1)],
            runs="3:3,11:20,40:16,70:1")
    want = {*range(3, 6), *range(11, 31), *range(40, 56), 70}
    assert _bits(redis_client, k.waiting0, 100) == [int(i in want) for i in range(100)]
    # numbers never handed out (>= T:seq) set nothing
    enqueue(s, k, [entry("x")], runs="200:1")
    assert redis_client.getbit(k.waiting0, 200) == 0


def test_a_new_generation_empties_the_slot_it_reuses(redis_client, s, k):
    gen = 1 << 23
    redis_client.setbit(k.waiting1, 5, 1)  # as if left by generation 1 - 4 (slot 1)
    redis_client.set(k.seq, gen - 10)
    assert int(s.call(calls.reserve(k, 20))) == gen - 10
    assert not redis_client.exists(k.waiting1)
    enqueue(s, k, [entry(f"j{i}") for i in range(20)], runs=f"{gen - 10}:20")
    # bits gen-16 .. gen-1 of slot 0 and 0 .. 15 of slot 1
    assert redis_client.getrange(k.waiting0, gen // 8 - 2, -1) == b"\x03\xff"
    assert redis_client.get(k.waiting1) == b"\xff\xc0"
