"""The hand-off (enqueue.lua, pop.lua): an empty pop registers its worker as idle, an
enqueue leases its first jobs to the registered workers and pushes the leased entries on
the wake list, and nothing new can be lost or run twice."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from fixtures.lua import entry, leases, refunded, server_ms, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls, source
from batchq.store.scripts.replies import PopReply, decode_pop_reply

pytestmark = pytest.mark.script

LEASE = 30_000
ME = "host:1"


def _pop(s: SyncScripts, k: QueueKeys, want: int, me: str = ME, lease: int = LEASE,
         idle_ms: int = 6_000) -> list[bytes]:
    return decode_pop_reply(s.call(calls.pop(k, want, lease, 100, me, idle_ms))).jobs


def _enqueue(s: SyncScripts, k: QueueKeys, *entries: bytes, check: bool = False) -> int:
    return int(s.call(calls.enqueue(k, 0, list(entries), check=check)))


def test_an_idle_worker_is_handed_the_first_job_leased(redis_client: redis.Redis,
                                                       s: SyncScripts, k: QueueKeys) -> None:
    r = redis_client
    assert _pop(s, k, 5) == []  # nothing: registered as idle
    (member, until), = r.zrange(k.idle, 0, -1, withscores=True)
    assert member == f"{LEASE}|{ME}".encode()
    assert 5_000 < until - server_ms(r) <= 6_000

    a, b, c = entry("a"), entry("b"), entry("c")
    assert _enqueue(s, k, a, b, c) == 2  # b and c wait in the ready list
    leased = with_attempt(a, 1)
    assert r.lrange(k.wake, 0, -1) == [leased]  # the entry itself, no token beside it
    assert r.hget(k.inflight, "a") == leased
    deadline = r.zscore(k.reserved, "a:1")
    assert deadline is not None and abs(deadline - (server_ms(r) + LEASE)) < 1_000
    assert r.lrange(k.ready_for(0), 0, -1) == [b, c]
    assert r.zcard(k.idle) == 0  # one registration, one job
    assert r.hget(k.stats, "handed") == b"1" and r.hget(k.stats, "enqueued") == b"3"

    # the worker's BLPOP takes its job; its next pop returns the rest
    assert r.blpop([k.wake], timeout=1) == (k.wake.encode(), leased)
    assert _pop(s, k, 5) == [with_attempt(b, 1), with_attempt(c, 1)]
    assert r.zcard(k.idle) == 0


def test_one_job_per_registration_and_a_pop_with_jobs_withdraws(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    r = redis_client
    assert _pop(s, k, 5, me="w1") == [] and _pop(s, k, 5, me="w2") == []
    a, b, c = entry("a"), entry("b"), entry("c")
    assert _enqueue(s, k, a, b, c) == 1
    assert r.lrange(k.wake, 0, -1) == [with_attempt(a, 1), with_attempt(b, 1)]
    assert r.zcard(k.idle) == 0
    assert len(leases(r, k)) == 2 and r.zcard(k.reserved) == 2

    # w3 registers; a job enqueued while the queue is paused is not handed off; once
    # resumed, w3's pop returns it and withdraws the registration
    r.delete(k.wake)
    assert _pop(s, k, 5, me="w3") == [with_attempt(c, 1)]
    assert _pop(s, k, 5, me="w3") == []
    assert r.zscore(k.idle, f"{LEASE}|w3") is not None
    r.set(k.paused, "1")
    d = entry("d")
    _enqueue(s, k, d)
    r.delete(k.paused)
    assert _pop(s, k, 5, me="w3") == [with_attempt(d, 1)]
    assert r.zscore(k.idle, f"{LEASE}|w3") is None


def test_no_hand_off_when_paused_held_limited_retried_or_lapsed(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    r = redis_client

    def handed_after(setup: object) -> int:
        r.delete(k.wake, k.ready_for(0), k.inflight, k.reserved, k.idle)
        assert _pop(s, k, 1) == []
        before = int(r.hget(k.stats, "handed") or 0)
        _enqueue(s, k, entry("x"), check=setup == "retry")
        return int(r.hget(k.stats, "handed") or 0) - before

    assert handed_after(None) == 1
    r.set(k.paused, "1")
    assert handed_after("paused") == 0
    assert r.llen(k.ready_for(0)) == 1 and r.lrange(k.wake, 0, -1) == [b"1"]
    r.delete(k.paused)
    r.hset(k.limits, "~q", "100,10,,,")  # a queue-wide rate limit: pops count tokens
    assert handed_after("limited") == 0
    r.delete(k.limits)
    r.zadd(k.gwait, {"~q": server_ms(r) + 60_000})  # RateLimited held the queue
    assert handed_after("held") == 0
    r.delete(k.gwait)
    assert handed_after("retry") == 0  # a retried call writes exactly what it wrote
    # a registration that lapsed is dropped, not used
    r.delete(k.wake, k.ready_for(0), k.inflight, k.reserved, k.idle)
    assert _pop(s, k, 1, idle_ms=1) == []
    time.sleep(0.01)
    _enqueue(s, k, entry("y"))
    assert r.zcard(k.idle) == 0 and r.llen(k.ready_for(0)) == 1
    # beside a live one, the lapsed one (the soonest to lapse) is popped first and
    # dropped: its job waits in the ready list; the next job takes the live one
    r.delete(k.ready_for(0), k.wake)
    r.zadd(k.idle, {f"{LEASE}|gone": server_ms(r) - 1})
    assert _pop(s, k, 1, me="live") == []
    assert _enqueue(s, k, entry("z1")) == 1  # pushed: nobody live took it
    assert r.zrange(k.idle, 0, -1) == [f"{LEASE}|live".encode()]
    assert _enqueue(s, k, entry("z2")) == 0  # handed: nothing pushed
    assert r.zcard(k.idle) == 0 and r.hexists(k.inflight, "z2")
    assert r.lrange(k.wake, 0, -1) == [b"1", with_attempt(entry("z2"), 1)]
    r.delete(k.ready_for(0), k.wake, k.inflight, k.reserved)
    _enqueue(s, k, entry("y"))
    # without a name, a pop registers nothing
    assert decode_pop_reply(s.call(calls.pop(k, 5, LEASE, 100))).jobs \
        == [with_attempt(entry("y"), 1)]
    assert decode_pop_reply(s.call(calls.pop(k, 5, LEASE, 100))).jobs == [] \
        and r.zcard(k.idle) == 0


def test_a_pop_claims_handed_jobs_nobody_took(redis_client: redis.Redis, s: SyncScripts,
                                              k: QueueKeys) -> None:
    r = redis_client
    assert _pop(s, k, 5, me="gone") == []  # a worker registers, then goes away
    a, b = entry("a"), entry("b")
    _enqueue(s, k, a, b)
    assert r.lrange(k.wake, 0, -1) == [with_attempt(a, 1)]
    # another worker's pop takes the handed job as it is (leased already), then b
    assert _pop(s, k, 5, me="other") == [with_attempt(a, 1), with_attempt(b, 1)]
    assert r.zrange(k.reserved, 0, -1) == [b"a:1", b"b:1"]
    # the workers that were blocked for it get a token: others may need waking
    assert r.lrange(k.wake, 0, -1) == [b"1"]


def test_an_expired_handed_job_is_reaped_once_and_leaves_the_wake_list(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    r = redis_client
    assert _pop(s, k, 5, lease=50) == []
    a = entry("a")
    _enqueue(s, k, a)
    assert r.llen(k.wake) == 1
    time.sleep(0.1)  # nobody took it: the lease expires
    reply = s.call(calls.pop(k, 0, LEASE, 100))
    assert int(reply[4]) == 1  # reaped: back at the head of the ready list
    assert r.lrange(k.wake, 0, -1) == [b"1"]  # the stale handed entry is gone
    assert r.lrange(k.ready_for(0), 0, -1) == [refunded(a, 1)]
    assert _pop(s, k, 5) == [refunded(a, 2)]  # it runs once, under a new lease name


def test_handed_jobs_never_wait_and_the_rest_keep_their_bits(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    """The waiting bit (status, cancel) is set for the jobs that wait in the ready list
    only: a handed job is leased by the call, whatever its place in the runs."""
    r = redis_client
    assert int(s.call(calls.reserve(k, 100))) == 0
    r.setbit(k.waiting0, 9, 1)  # another producer's waiting job, next to the run
    assert _pop(s, k, 5, me="w1") == [] and _pop(s, k, 5, me="w2") == []
    # ids 12, 10, 11, 13 in call order (runs are sorted): 12 and 10 are handed
    ids = [f"{'a' * 17}-{n:x}" for n in (12, 10, 11, 13)]
    assert int(s.call(calls.enqueue(k, 0, [entry(i) for i in ids], check=False,
                                    runs="10:4"))) == 2
    assert leases(r, k).keys() == {ids[0].encode(), ids[1].encode()}
    assert {i for i in range(100) if r.getbit(k.waiting0, i)} == {9, 11, 13}
    # one registration: a single job is handed, its run sets no bit at all
    r.delete(k.wake, k.ready_for(0))  # as if taken (and 11, 13 left waiting)
    assert _pop(s, k, 5, me="w3") == []
    one = f"{'a' * 17}-{14:x}"
    assert int(s.call(calls.enqueue(k, 0, [entry(one)], check=False, runs="14:1"))) == 0
    assert r.hexists(k.inflight, one)
    assert {i for i in range(100) if r.getbit(k.waiting0, i)} == {9, 11, 13}


def _commands(r: redis.Redis) -> dict[str, int]:
    """The commands the server ran since its last CONFIG RESETSTAT (inside scripts too),
    but for the script calls, script loads and the stats commands themselves."""
    stats = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()
            if not name.startswith(("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_script",
                                    "cmdstat_function", "cmdstat_config", "cmdstat_info"))}


def test_an_idle_workers_pop_is_nine_commands(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    """The pop a worker makes between two handed jobs (it registers again) runs on a
    cold server at low rates: each zset of due work read by its earliest entry only,
    one EXISTS for everything a plain queue does not have (pause, crash marks, cancelled
    and pending jobs, limits, groups, waits), one LMPOP over the ten ready lists."""
    r = redis_client
    assert _pop(s, k, 5) == []
    r.config_resetstat()
    assert _pop(s, k, 5) == []
    assert _commands(r) == {
        "time": 1, "zrange": 3,  # the earliest delayed job, lease, bundle
        "exists": 1,  # paused, recovered, cancel, pending, limits, groups, gwait
        "lpop": 1,  # handed entries on the wake list
        "lmpop": 1,  # the ready lists
        "zadd": 1}  # the registration
    # with jobs, the campaign lookup comes (once per call), and LMPOP is called again
    # until the pop has all it wants or the lists are empty
    r.rpush(k.ready_for(9), entry("p9"))
    r.rpush(k.ready_for(5), entry("p5"))
    r.config_resetstat()
    assert _pop(s, k, 5) == [with_attempt(entry("p9"), 1), with_attempt(entry("p5"), 1)]
    ran = _commands(r)
    # LMPOPs over the ten lists: p9, then p5, then none left
    assert ran["lpop"] == 1 and ran["lmpop"] == 3 and ran["hget"] == 1, ran
    assert "hlen" not in ran and "zscore" not in ran and "zrangebyscore" not in ran, ran


def test_a_queue_with_limits_or_marks_reads_each_in_full(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    """When the EXISTS finds any of those keys, the pop reads each one as before: the
    hold and the queue's limit, the groups, the groups' waits (due and next), the
    crash marks, cancelled and pending indexes."""
    r = redis_client
    r.hset(k.recovered, "someone", "1:0")  # a crash mark: not a plain queue's pop
    r.rpush(k.ready_for(0), entry("a"), entry("b"))
    r.config_resetstat()
    assert _pop(s, k, 5) == [with_attempt(entry("a"), 1), with_attempt(entry("b"), 1)]
    ran = _commands(r)
    assert ran["zscore"] == 1 and ran["zrangebyscore"] == 2 and ran["hlen"] == 3, ran
    # the campaigns flag, a's and b's marks; the queue's limit and the calendar flag: one HMGET
    assert ran["hget"] == 3 and ran["hmget"] == 1, ran
    assert ran["exists"] == 2, ran  # the gate, then paused on its own


def _pop_before_7(r: redis.Redis, k: QueueKeys, want: int, bundle: bool = False
                  ) -> PopReply:
    """``pop.lua`` as a server without LMPOP (Redis 6.2) runs it."""
    src = source("pop")
    line = "local LMPOP = (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000"
    assert line in src
    c = calls.pop(k, want, 5000, 100, bundle=bundle)
    res: list[Any] = r.eval(src.replace(line, "local LMPOP = false"), len(c.keys),
                            *c.keys, *c.args)
    return decode_pop_reply(res)


def test_before_redis_7_the_ready_lists_are_popped_in_turn(
        redis_client: redis.Redis, k: QueueKeys) -> None:
    """Redis 6.2 has no LMPOP: one EXISTS counts the non-empty lists, and LPOP takes
    them from 9 down to the last one holding jobs, a priority's jobs in order."""
    r = redis_client
    assert _pop_before_7(r, k, 5).jobs == []
    r.rpush(k.ready_for(9), entry("p9"))
    r.rpush(k.ready_for(5), entry("p5a"), entry("p5b"))
    r.rpush(k.ready_for(0), entry("p0"), entry("p0b"))
    r.config_resetstat()
    assert _pop_before_7(r, k, 3).jobs == [with_attempt(entry(j), 1)
                                           for j in ("p9", "p5a", "p5b")]
    ran = _commands(r)
    assert ran["lpop"] == 1 + 5 and ran["exists"] == 2 and "lmpop" not in ran, ran
    # a bundling pop takes the rest the same way, as a bundle (entries as popped)
    got = _pop_before_7(r, k, 5, bundle=True)
    assert got.bundle[1] == 2 and got.jobs == [entry("p0"), entry("p0b")]
    assert r.llen(k.ready_for(0)) == 0


def test_the_hand_off_of_one_job_is_eleven_commands(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys) -> None:
    """Its server time sits between the producer's enqueue and the worker's BLPOP reply:
    ZCARD, TIME, three gate reads, ZPOPMIN, HSET, ZADD, RPUSH and two HINCRBYs. No
    bit of a handed job is written, and nothing is pushed on the ready list."""
    r = redis_client
    assert int(s.call(calls.reserve(k, 1))) >= 0
    assert _pop(s, k, 5) == []
    jid = f"{'a' * 17}-{int(r.get(k.seq)) - 1:x}"
    r.config_resetstat()
    assert _enqueue(s, k, entry(jid)) == 0
    ran = _commands(r)
    assert ran == {"zcard": 1, "time": 1, "exists": 1, "hmget": 1, "zscore": 1,
                   "zpopmin": 1, "hset": 1, "zadd": 1, "rpush": 1, "hincrby": 2}, ran
