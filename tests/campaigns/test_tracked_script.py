"""enqueue_tracked.lua and the tracked-job blocks of pop, ack, nack and release: a
campaign job counts once whatever happens to its leases; a dedup key names one job."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import entry, pop_reply, server_ms
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls
from batchq.store.scripts.replies import PopReply, decode_pop_reply

pytestmark = pytest.mark.script

CID = "camp"


def counts(r: redis.Redis, k: QueueKeys) -> dict[str, int]:
    return {n: int(r.hget(k.campaigns, f"{CID}:{n}") or 0) for n in "tpsdc"}


def write(s: SyncScripts, k: QueueKeys, ids: list[str], keys: list[str] | None = None,
          cid: str = CID, check: bool = False) -> list[object]:
    pairs: list[bytes | str] = []
    for i, jid in enumerate(ids):
        pairs += [entry(jid, max_attempts=2), (keys[i] if keys else "")]
    reply: list[object] = s.call(calls.enqueue_tracked(k, 0, "ready", 0, cid, 60_000, 100,
                                                       pairs, check=check))
    return reply


def lease(e: bytes) -> bytes:
    _, a, _, jid, _ = e.split(b":", 4)
    return jid + b":" + a


def open_here(s: SyncScripts, k: QueueKeys, flag: str = "open") -> None:
    s.call(calls.campaign_queue(k, CID, "open", "1"))
    if flag != "open":
        s.call(calls.campaign_queue(k, CID, "seal" if flag == "sealed" else "cancel"))


def test_not_open_here_writes_nothing(redis_client, s, k):
    assert write(s, k, ["a_m"]) == [1]
    open_here(s, k, "sealed")
    assert write(s, k, ["a_m"]) == [2, b"sealed"]
    assert redis_client.llen(k.ready_for(0)) == 0 and redis_client.hlen(k.jobmeta) == 0


def test_a_job_counts_once_through_double_acks_and_a_stale_lease(redis_client, s, k):
    open_here(s, k)
    assert write(s, k, ["a_m", "b_m"]) == [0, 2]
    assert counts(redis_client, k) == dict(t=2, p=2, s=0, d=0, c=0)
    _, jobs = pop_reply(s, k, 2)
    open_here(s, k, "sealed")
    assert s.call(calls.ack(k, [lease(jobs[0])])) == []
    assert s.call(calls.ack(k, [lease(jobs[0])])) == [1]  # stale: nothing counted
    assert counts(redis_client, k) == dict(t=2, p=1, s=1, d=0, c=0)
    # the last one dies: a dead job is a completion; the campaign is due
    reply = s.call(calls.nack(k, dead=[(lease(jobs[1]), b"rec")]))
    assert reply == [0, CID.encode()]
    assert counts(redis_client, k) == dict(t=2, p=0, s=1, d=1, c=0)
    assert redis_client.hlen(k.jobmeta) == 0


def test_retry_and_release_keep_it_pending(redis_client, s, k):
    open_here(s, k)
    write(s, k, ["a_m", "b_m"])
    _, jobs = pop_reply(s, k, 2)
    s.call(calls.nack(k, retries=[(lease(jobs[0]), 0)]))
    assert s.call(calls.release(k, [lease(jobs[1])])) == 1
    assert counts(redis_client, k) == dict(t=2, p=2, s=0, d=0, c=0)


def test_reaped_lease_goes_back_and_a_dead_one_settles(redis_client, s, k):
    open_here(s, k)
    write(s, k, ["a_m"])
    open_here(s, k, "sealed")

    def expire(charged: bool) -> PopReply:
        _, jobs = pop_reply(s, k, 1, lease=1)
        if charged:  # its handler was known to start (start.lua's mark)
            redis_client.hset(k.started, "a_m", lease(jobs[0]))
        redis_client.zadd(k.reserved, {lease(jobs[0]): server_ms(redis_client) - 10})
        return decode_pop_reply(s.call(calls.pop(k, 0, 1000, 100)))

    expire(charged=False)  # back to ready, attempt refunded (max_attempts 2 -> 3)
    assert counts(redis_client, k) == dict(t=1, p=1, s=0, d=0, c=0)
    expire(charged=True)  # attempt 2 of 3 charged: back again
    assert counts(redis_client, k) == dict(t=1, p=1, s=0, d=0, c=0)
    res = expire(charged=True)  # the last attempt: dead as crashed_worker, settled
    assert res.crashed == 1 and res.due_campaigns == [CID.encode()]
    assert counts(redis_client, k) == dict(t=1, p=0, s=0, d=1, c=0)
    assert redis_client.hlen(k.jobmeta) == 0


def test_pop_drops_jobs_of_a_cancelled_campaign(redis_client, s, k):
    open_here(s, k)
    write(s, k, ["a_m", "b_m", "c_m"])
    redis_client.rpush(k.ready_for(0), entry("plain"))
    _, jobs = pop_reply(s, k, 1)
    reply = s.call(calls.campaign_queue(k, CID, "cancel"))
    assert reply == [b"cancelled", 3, 3, 0, 0, 0, 1, 0]  # one of the three holds a lease
    res = decode_pop_reply(s.call(calls.pop(k, 10, 30_000, 100)))
    assert [j.split(b":")[3] for j in res.jobs] == [b"plain"]
    assert res.due_campaigns == []  # one still running: not due yet
    assert counts(redis_client, k) == dict(t=3, p=1, s=0, d=0, c=2)
    assert s.call(calls.ack(k, [lease(jobs[0])])) == [0, CID.encode()]
    assert counts(redis_client, k) == dict(t=3, p=0, s=1, d=0, c=2)


def test_dedup_keys(redis_client, s, k):
    assert write(s, k, ["a_m", "b_m", "c_m"], ["x", "y", "x"], cid="") == [0, 2, 3, b"a_m"]
    assert write(s, k, ["d_m"], ["y"], cid="") == [0, 0, 1, b"b_m"]
    _, jobs = pop_reply(s, k, 2)
    s.call(calls.ack(k, [lease(j) for j in jobs]))
    # finished: held until now + ttl (60 s here)
    assert 59_000 < int(redis_client.zscore(k.dedup_exp, "x")) - server_ms(redis_client) <= 60_000
    assert write(s, k, ["e_m"], ["x"], cid="") == [0, 0, 1, b"a_m"]
    redis_client.zadd(k.dedup_exp, {"x": 1})  # lapsed
    assert write(s, k, ["f_m"], ["x"], cid="") == [0, 1]
    assert redis_client.hget(k.dedup, "x") == b"f_m"
    assert redis_client.zscore(k.dedup_exp, "x") is None


def test_retry_of_a_lost_call_writes_nothing_twice(redis_client, s, k):
    open_here(s, k)
    write(s, k, ["a_m", "b_m"])
    assert write(s, k, ["a_m", "b_m", "c_m"], check=True) == [0, 1]
    assert counts(redis_client, k)["t"] == 3 and redis_client.llen(k.ready_for(0)) == 3


def _seq_id(n: int) -> str:
    return f"abcdABCDEFGHIJKLM-{n:x}_m"  # <ref><13 random>-<hex seq>_m, as plan.finish


def test_waiting_bits_of_exactly_the_jobs_written(redis_client, s, k):
    # numbers 0..99 handed out; the rows: runs with unaligned edges, a byte-aligned run, a
    # lone number, a row whose key is held (by an earlier row of the same call) and one
    # beyond T:seq: bits are set per run, only for the jobs written
    assert int(s.call(calls.reserve(k, 100))) == 0
    seqs = [*range(3, 6), *range(11, 31), *range(40, 56), 70, 71, 200]
    keys = [f"k{n}" for n in seqs]
    keys[seqs.index(71)] = "k70"  # held by the row of 70: not written
    reply = write(s, k, [_seq_id(n) for n in seqs], keys=keys, cid="")
    assert reply[:2] == [0, len(seqs) - 1]
    want = {*range(3, 6), *range(11, 31), *range(40, 56), 70}
    assert [redis_client.getbit(k.waiting0, i) for i in range(100)] == \
        [int(i in want) for i in range(100)]
    assert redis_client.getbit(k.waiting0, 200) == 0
    # out of order rows still get their own bits
    assert int(s.call(calls.reserve(k, 100))) == 100
    write(s, k, [_seq_id(n) for n in (150, 120, 121, 101)], cid="")
    assert [i for i in range(100, 200) if redis_client.getbit(k.waiting0, i)] == \
        [101, 120, 121, 150]


def test_waiting_bits_across_a_generation_boundary(redis_client, s, k):
    gen = 1 << 23
    redis_client.set(k.seq, gen - 10)
    assert int(s.call(calls.reserve(k, 20))) == gen - 10
    write(s, k, [_seq_id(n) for n in range(gen - 10, gen + 10)], cid="")
    # bits gen-10 .. gen-1 of slot 0 and 0 .. 9 of slot 1, as with enqueue.lua's runs
    assert redis_client.getrange(k.waiting0, gen // 8 - 2, -1) == b"\x03\xff"
    assert redis_client.get(k.waiting1) == b"\xff\xc0"
