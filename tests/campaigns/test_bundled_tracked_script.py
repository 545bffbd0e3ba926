"""Tracked jobs (campaign members, dedup keys) leased in bundles: a bundling pop takes
them with its plain jobs, and every way a bundle job ends settles them by id exactly
once (ack by positions, ack_result, nack, the reaper, release, extend, campaign cancel,
expiry)."""

from __future__ import annotations

import msgpack
import pytest
import redis
from fixtures.lua import entry, server_ms
from fixtures.scripts import *  # noqa: F403

from batchq.ops import events
from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls
from batchq.store.scripts.replies import PopReply, decode_pop_reply

pytestmark = pytest.mark.script

CID = "camp"


def counts(r: redis.Redis, k: QueueKeys) -> dict[str, int]:
    return {n: int(r.hget(k.campaigns, f"{CID}:{n}") or 0) for n in "tpsdc"}


def sid(n: int) -> str:
    return f"abcdABCDEFGHIJKLM-{n:x}_m"  # <ref><13 random>-<hex seq>_m, as plan.finish


def write(s: SyncScripts, k: QueueKeys, ids: list[str], keys: list[str] | None = None,
          cid: str = CID, max_attempts: int = 2) -> None:
    pairs: list[bytes | str] = []
    for i, jid in enumerate(ids):
        pairs += [entry(jid, max_attempts=max_attempts), (keys[i] if keys else "")]
    reply = s.call(calls.enqueue_tracked(k, 0, "ready", 0, cid, 60_000, 100, pairs,
                                         check=False))
    assert reply[:2] == [0, len(ids)], reply


def campaign(s: SyncScripts, k: QueueKeys, n: int, seal: bool = True,
             first: int = 0) -> list[str]:
    """n jobs of campaign CID on the queue (sequence numbers reserved first)."""
    assert int(s.call(calls.reserve(k, n))) == first
    s.call(calls.campaign_queue(k, CID, "open", "1"))
    ids = [sid(first + i) for i in range(n)]
    write(s, k, ids)
    if seal:
        s.call(calls.campaign_queue(k, CID, "seal"))
    return ids


def bpop(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000) -> PopReply:
    return decode_pop_reply(s.call(calls.pop(k, want, lease, 100, bundle=True)))


def held(b: bytes, *positions: int) -> list[bytes]:
    return [b + p.to_bytes(2, "big") for p in positions]


def test_a_campaigns_jobs_come_back_bundled_and_leave_their_waiting_bits(redis_client,
                                                                        s, k):
    r = redis_client
    ids = campaign(s, k, 5)
    assert [r.getbit(k.waiting0, i) for i in range(5)] == [1] * 5
    res = bpop(s, k, 5)
    name, n = res.bundle
    assert int(n) == 5 and [j.split(b":")[3].decode() for j in res.jobs] == ids
    assert not r.exists(k.reserved) and r.zrange(k.bundles, 0, -1) == [name]
    assert int(r.hget(k.stats, "bundled")) == 5
    assert [r.getbit(k.waiting0, i) for i in range(5)] == [0] * 5
    # still tracked while they run
    assert r.hlen(k.jobmeta) == 5 and counts(r, k) == dict(t=5, p=5, s=0, d=0, c=0)
    assert s.call(calls.status(k, ids[2], payload=False))[0] == b"reserved"


def test_acks_by_positions_settle_each_job_once(redis_client, s, k):
    r = redis_client
    campaign(s, k, 4)
    name, _ = bpop(s, k, 4).bundle
    # one argument of two positions, then one lease alone, then a double ack
    assert s.call(calls.ack(k, held(name, 1, 3))) == []
    assert counts(r, k) == dict(t=4, p=2, s=2, d=0, c=0)
    assert s.call(calls.ack(k, [held(name, 2)[0], b"nobody:1"])) == [2]
    assert s.call(calls.ack(k, held(name, 1, 2, 3))) == [1, 2, 3]  # stale: none counted
    assert counts(r, k) == dict(t=4, p=1, s=3, d=0, c=0)
    assert int(r.hget(k.stats, "succeeded")) == 3
    # the last one: the campaign is due (0, then its id, after the stale positions)
    assert s.call(calls.ack(k, held(name, 4, 1))) == [2, 0, CID.encode()]
    assert counts(r, k) == dict(t=4, p=0, s=4, d=0, c=0)
    assert r.hlen(k.jobmeta) == 0 and not r.exists(k.bundles)
    assert int(r.hget(k.stats, "bundled")) == 0


def test_an_ack_mixing_bundle_and_own_leases_settles_in_one_call(redis_client, s, k):
    r = redis_client
    campaign(s, k, 3)
    one = decode_pop_reply(s.call(calls.pop(k, 1, 30_000, 100)))  # a lease of its own
    e = one.jobs[0]
    own = e.split(b":")[3] + b":" + e.split(b":")[1]
    name, _ = bpop(s, k, 2).bundle
    assert s.call(calls.ack(k, [*held(name, 1), own, *held(name, 2)])) == \
        [0, CID.encode()]
    assert counts(r, k) == dict(t=3, p=0, s=3, d=0, c=0) and r.hlen(k.jobmeta) == 0


def test_an_ack_after_the_bundle_was_reaped_is_stale(redis_client, s, k):
    r = redis_client
    ids = campaign(s, k, 3)
    name, _ = bpop(s, k, 3, lease=1).bundle
    r.zadd(k.bundles, {name: server_ms(r) - 10})
    res = decode_pop_reply(s.call(calls.pop(k, 0, 30_000, 100)))
    assert res.reaped == 3 and not r.exists(k.bundles)
    # requeued, still tracked: nothing counted, pending again
    assert r.hlen(k.jobmeta) == 3 and counts(r, k) == dict(t=3, p=3, s=0, d=0, c=0)
    assert sorted(j.split(b":")[3].decode() for j in r.lrange(k.ready_for(0), 0, -1)) \
        == sorted(ids)
    assert s.call(calls.ack(k, held(name, 1, 2, 3))) == [1, 2, 3]
    assert counts(r, k)["s"] == 0
    # run again (recovered jobs have leases of their own) and acked: counted once
    again = decode_pop_reply(s.call(calls.pop(k, 3, 30_000, 100, bundle=True)))
    assert again.bundle == [] and len(again.jobs) == 3
    leases = [j.split(b":")[3] + b":" + j.split(b":")[1] for j in again.jobs]
    assert s.call(calls.ack(k, leases)) == [0, CID.encode()]
    assert counts(r, k) == dict(t=3, p=0, s=3, d=0, c=0) and r.hlen(k.jobmeta) == 0


def test_a_reaped_bundle_on_its_last_charged_attempt_settles_dead(redis_client, s, k):
    r = redis_client
    assert int(s.call(calls.reserve(k, 2))) == 0
    s.call(calls.campaign_queue(k, CID, "open", "1"))
    write(s, k, [sid(0), sid(1)], max_attempts=1)
    s.call(calls.campaign_queue(k, CID, "seal"))
    name, _ = bpop(s, k, 2, lease=1).bundle
    # the first job's handler was known to start: charged, and on its last attempt
    r.hset(k.started, sid(0), held(name, 1)[0])
    r.zadd(k.bundles, {name: server_ms(r) - 10})
    res = decode_pop_reply(s.call(calls.pop(k, 0, 30_000, 100)))
    assert res.crashed == 1 and res.reaped == 1
    assert counts(r, k) == dict(t=2, p=1, s=0, d=1, c=0)
    assert r.hexists(k.jobmeta, sid(1)) and not r.hexists(k.jobmeta, sid(0))


def test_nack_retry_keeps_it_tracked_and_dead_settles_d(redis_client, s, k):
    r = redis_client
    campaign(s, k, 3)
    name, _ = bpop(s, k, 3).bundle
    reply = s.call(calls.nack(k, retries=[(held(name, 1)[0], 0)],
                              dead=[(held(name, 2)[0], b"rec")]))
    assert reply == []
    assert counts(r, k) == dict(t=3, p=2, s=0, d=1, c=0)
    assert r.zcard(k.delayed) == 1 and r.hexists(k.jobmeta, sid(0))
    assert s.call(calls.nack(k, dead=[(held(name, 2)[0], b"rec")])) == [1]  # stale
    reply = s.call(calls.nack(k, dead=[(held(name, 3)[0], b"rec")]))
    assert reply == []  # the retried one is still pending: not due
    assert counts(r, k) == dict(t=3, p=1, s=0, d=2, c=0)
    # the retry runs again (its own bundle or lease) and succeeds: due now
    r.zadd(k.delayed, {r.zrange(k.delayed, 0, 0)[0]: 0})
    res = bpop(s, k, 5)
    e = res.jobs[0]
    own = e.split(b":")[3] + b":" + e.split(b":")[1]
    assert s.call(calls.ack(k, [own])) == [0, CID.encode()]
    assert counts(r, k) == dict(t=3, p=0, s=1, d=2, c=0)


def test_release_and_extend_keep_it_pending(redis_client, s, k):
    r = redis_client
    campaign(s, k, 2)
    name, _ = bpop(s, k, 2).bundle
    assert s.call(calls.extend(k, 60_000, [name])) is not None
    assert s.call(calls.release(k, held(name, 2))) == 1
    assert counts(r, k) == dict(t=2, p=2, s=0, d=0, c=0)
    assert r.lrange(k.ready_for(0), 0, -1)[0].split(b":")[3].decode() == sid(1)
    assert s.call(calls.ack(k, held(name, 1))) == []
    assert counts(r, k) == dict(t=2, p=1, s=1, d=0, c=0)


def test_ack_result_settles_a_bundled_tracked_job(redis_client, s, k):
    r = redis_client
    campaign(s, k, 2)
    name, _ = bpop(s, k, 2).bundle
    items = [(held(name, 1)[0], 60_000, b"\x01"), (held(name, 2)[0], 60_000, b"\x02")]
    assert s.call(calls.ack_result(k, items, [sid(0), sid(1)])) == [0, CID.encode()]
    assert s.call(calls.ack_result(k, items, [sid(0), sid(1)])) == [1, 2]
    assert counts(r, k) == dict(t=2, p=0, s=2, d=0, c=0)
    assert r.get(k.result(sid(1))) == b"\x02"


def test_dedup_keys_start_lapsing_when_a_bundled_job_settles(redis_client, s, k):
    r = redis_client
    assert int(s.call(calls.reserve(k, 3))) == 0
    write(s, k, [sid(0), sid(1), sid(2)], keys=["x", "y", "z"], cid="")
    r.rpush(k.ready_for(0), entry("plain"))
    res = bpop(s, k, 4)
    name, n = res.bundle
    assert int(n) == 4 and not r.exists(k.dedup_exp)
    now = server_ms(r)
    assert s.call(calls.ack(k, held(name, 1, 4))) == []
    assert s.call(calls.nack(k, dead=[(held(name, 2)[0], b"rec")])) == []
    lapse = dict(r.zrange(k.dedup_exp, 0, -1, withscores=True))
    assert set(lapse) == {b"x", b"y"}
    assert all(now + 60_000 <= v <= server_ms(r) + 60_000 for v in lapse.values())
    assert r.hget(k.dedup, "z") == sid(2).encode()  # still running: held, no lapse
    assert r.hlen(k.jobmeta) == 1


def test_a_cancelled_campaign_counts_its_bundled_jobs_as_leased(redis_client, s, k):
    r = redis_client
    campaign(s, k, 5, seal=False)
    r.rpush(k.ready_for(0), entry("plain"))
    name, n = bpop(s, k, 2).bundle
    assert int(n) == 2
    mask = r.hget(k.inflight, name + b"~")
    reply = s.call(calls.campaign_queue(k, CID, "cancel"))
    assert reply == [b"cancelled", 5, 5, 0, 0, 0, 2, 0]  # two hold a (bundle's) lease
    assert r.hget(k.inflight, name + b"~") == mask  # read only
    # the rest are dropped when popped (screened), the plain job bundled on
    res = bpop(s, k, 10)
    assert [j.split(b":")[3] for j in res.jobs] == [b"plain"]
    assert counts(r, k) == dict(t=5, p=2, s=0, d=0, c=3)
    assert s.call(calls.ack(k, held(name, 1, 2))) == [0, CID.encode()]
    assert counts(r, k) == dict(t=5, p=0, s=2, d=0, c=3)


def test_while_a_campaign_is_cancelled_the_others_are_screened_into_the_bundle(
        redis_client, s, k):
    r = redis_client
    s.call(calls.campaign_queue(k, "gone", "open", "1"))
    s.call(calls.campaign_queue(k, "gone", "cancel"))
    ids = campaign(s, k, 3)
    r.rpush(k.ready_for(0), entry("plain"))
    res = bpop(s, k, 4)
    name, n = res.bundle
    assert int(n) == 4
    assert [j.split(b":")[3].decode() for j in res.jobs] == [*ids, "plain"]
    assert s.call(calls.ack(k, held(name, 1, 2, 3, 4))) == [0, CID.encode()]
    assert counts(r, k) == dict(t=3, p=0, s=3, d=0, c=0)


def test_events_of_bundled_campaign_jobs_name_their_campaign(redis_client, s, k):
    r = redis_client
    r.hset(k.evconf, mapping={"len": 1000, "age": 0})
    campaign(s, k, 2)
    r.rpush(k.ready_for(0), entry("plain"))
    name, _ = bpop(s, k, 3).bundle
    s.call(calls.ack(k, held(name, 1, 2, 3)))
    got = []
    for eid, f in r.xrange(k.events):
        assert not f.get(b"b")  # one event a job: each names its campaign
        got += events.decode(k.queue, eid, f)
    assert [(e.kind, e.job_id, e.campaign, e.attempt) for e in got] == [
        ("started", sid(0), CID, 1), ("started", sid(1), CID, 1),
        ("started", "plain", None, 1),
        ("succeeded", sid(0), CID, 1), ("succeeded", sid(1), CID, 1),
        ("succeeded", "plain", None, 1)]


def test_an_expiring_job_running_in_a_bundle_loses_its_tombstone_once_settled(
        redis_client, s, k):
    r = redis_client
    campaign(s, k, 2)
    name, _ = bpop(s, k, 2).bundle
    # its deadline passes while it runs
    r.zadd(k.expires, {"x" + sid(0): 1})
    s.call(calls.pop(k, 1, 30_000, 100, bundle=True))
    assert r.hget(k.cancel, sid(0)) == b"x"
    recheck = r.zscore(k.expires, "~" + sid(0))
    assert recheck is not None  # looked at again: it runs in a bundle
    assert s.call(calls.ack(k, held(name, 1, 2))) == [0, CID.encode()]
    r.zadd(k.expires, {"~" + sid(0): 1})
    s.call(calls.pop(k, 1, 30_000, 100, bundle=True))
    assert not r.hexists(k.cancel, sid(0))  # settled: the tombstone went
    assert counts(r, k) == dict(t=2, p=0, s=2, d=0, c=0)


def test_a_bundle_of_plain_jobs_is_not_unpacked_by_an_ack(redis_client, s, k):
    # (a body that spells "_m:" only costs an unpack: nothing is settled for it)
    r = redis_client
    es = [entry("p1", args=["x_m:y"]), entry("p2")]
    r.rpush(k.ready_for(0), *es)
    name, _ = bpop(s, k, 2).bundle
    assert msgpack.unpackb(r.hget(k.inflight, name), raw=True) == es
    assert s.call(calls.ack(k, held(name, 1, 2))) == []
    assert int(r.hget(k.stats, "succeeded")) == 2 and not r.exists(k.campaigns)
