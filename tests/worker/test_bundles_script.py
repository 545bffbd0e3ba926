"""Bundles (``_lib.lua`` "Bundles"): a worker's pop leases its plain jobs as one
reservation; every script that ends or reads a lease handles a bundle's jobs."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from fixtures.lua import PIN, entry, refunded, server_ms, with_attempt
from fixtures.scripts import *  # noqa: F403

from batchq.ops import stats
from batchq.store import codec
from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.script


def bpop(s: SyncScripts, k: QueueKeys, want: int, lease: int = 30_000,
         chunk: int = 100) -> tuple[bytes | None, list[bytes], list[bytes]]:
    """(bundle name or None, the jobs of the bundle, the other jobs) of a bundling pop."""
    res = decode_pop_reply(s.call(calls.pop(k, want, lease, chunk, bundle=True)))
    jobs = res.jobs
    b = res.bundle
    if not b:
        return None, [], jobs
    n = int(b[1])
    return b[0], jobs[len(jobs) - n:], jobs[: len(jobs) - n]


def held(b: bytes, *positions: int) -> list[bytes]:
    """The leases of a bundle's jobs: its name, then the position in two bytes."""
    return [b + p.to_bytes(2, "big") for p in positions]


def counts(r: Any, k: QueueKeys) -> tuple[int, int]:
    """(live bundles, their running jobs as the stats field "bundled" counts them)."""
    return r.zcard(k.bundles), int(r.hget(k.stats, "bundled") or 0)


def fill(r: Any, k: QueueKeys, n: int, prio: int = 0) -> list[bytes]:
    es = [entry(f"j{i}", prio=prio) for i in range(n)]
    r.rpush(k.ready_for(prio), *es)
    return es


def test_a_pop_leases_its_plain_jobs_as_one_bundle(redis_client, s, k):
    es = fill(redis_client, k, 5)
    b, jobs, rest = bpop(s, k, 5)
    assert b is not None and b.startswith(b":b") and rest == []
    assert jobs == es  # as popped: the worker counts the attempt
    assert redis_client.zrange(k.bundles, 0, -1) == [b] and not redis_client.exists(k.reserved)
    fields = redis_client.hgetall(k.inflight)
    assert set(fields) == {PIN, b, b + b"~"}
    assert msgpack.unpackb(fields[b], raw=True) == es and fields[b + b"~"] == b"00000"
    assert counts(redis_client, k) == (1, 5)
    # a queue's stats count the bundle's jobs, not its one member
    assert stats.read(redis_client, [k])[0].stats.reserved == 5


def test_without_the_flag_each_job_has_its_own_lease(redis_client, s, k):
    fill(redis_client, k, 3)
    res = decode_pop_reply(s.call(calls.pop(k, 3, 30_000, 100)))
    assert res.bundle == [] and len(res.jobs) == 3
    assert redis_client.zcard(k.reserved) == 3


def test_acks_settle_jobs_one_by_one_and_the_last_takes_the_bundle(redis_client, s, k):
    fill(redis_client, k, 4)
    b, _, _ = bpop(s, k, 4)
    assert s.call(calls.ack(k, held(b, 1, 3))) == []
    assert redis_client.hget(k.inflight, b + b"~") == b"1010"
    assert counts(redis_client, k) == (1, 2)
    # a second ack of a settled job is stale, and changes nothing
    assert s.call(calls.ack(k, [*held(b, 3), b"nobody:1", *held(b, 2)])) == [1, 2]
    assert redis_client.hget(k.inflight, b + b"~") == b"1110"
    assert s.call(calls.ack(k, held(b, 4))) == []
    assert not redis_client.exists(k.inflight, k.reserved, k.bundles)  # the pin went with it
    assert counts(redis_client, k) == (0, 0)
    assert int(redis_client.hget(k.stats, "succeeded")) == 4


def test_a_bundle_and_single_leases_in_one_ack(redis_client, s, k):
    fill(redis_client, k, 2)
    b, _, _ = bpop(s, k, 2)
    redis_client.rpush(k.ready_for(0), entry("single"))
    assert decode_pop_reply(s.call(calls.pop(k, 1, 30_000, 100))).jobs \
        == [with_attempt(entry("single"), 1)]
    assert s.call(calls.ack(k, [held(b, 2)[0], b"single:1", b"gone:1", held(b, 1)[0]])) \
        == [3]
    assert not redis_client.exists(k.inflight, k.reserved, k.bundles)
    assert int(redis_client.hget(k.stats, "succeeded")) == 3


def test_an_ack_sends_a_run_of_one_bundles_jobs_as_one_argument(redis_client, s, k):
    """calls.ack joins each run of a bundle's leases ("<bundle>#<positions>"); the
    reply's stale positions still count jobs in the caller's order. Positions whose low
    byte is "#", ":" or a digit (35, 58, 48..57) are read as positions."""
    fill(redis_client, k, 60)
    b, jobs, _ = bpop(s, k, 60)
    assert len(jobs) == 60
    leases = [*held(b, *range(1, 31)), b"gone:1", *held(b, 31, 31, *range(32, 61))]
    c = calls.ack(k, leases)
    assert c.args == [b + b"#" + b"".join(p.to_bytes(2, "big") for p in range(1, 31)),
                      b"gone:1",
                      b + b"#" + b"".join(p.to_bytes(2, "big")
                                          for p in (31, 31, *range(32, 61)))]
    assert s.call(c) == [31, 33]  # the lease of nobody, and 31 a second time
    assert not redis_client.exists(k.inflight, k.bundles)
    assert int(redis_client.hget(k.stats, "succeeded")) == 60


def test_a_bundle_of_a_thousand_jobs_is_acked_in_one_argument(redis_client, s, k):
    """The largest pop (worker.state.CHUNK) makes the largest joined argument: 2,000
    bytes of positions, read with one string.byte."""
    fill(redis_client, k, 1000)
    b, jobs, _ = bpop(s, k, 1000)
    assert len(jobs) == 1000
    c = calls.ack(k, held(b, *range(1, 1001)))
    assert len(c.args) == 1 and len(c.args[0]) == len(b) + 1 + 2000
    assert s.call(c) == []
    assert not redis_client.exists(k.inflight, k.bundles)
    assert int(redis_client.hget(k.stats, "succeeded")) == 1000


def test_the_script_takes_a_bundles_leases_one_argument_each_too(redis_client, s, k):
    """ack.lua still reads "<bundle><position>" arguments (a caller that does not join
    them), alongside joined ones."""
    fill(redis_client, k, 40)
    b, _, _ = bpop(s, k, 40)
    keys = calls.ack(k, []).keys
    one_each = calls.Call("ack", keys, held(b, *range(1, 37)))
    assert s.call(one_each) == []
    assert redis_client.hget(k.inflight, b + b"~") == b"1" * 36 + b"0000"
    joined = calls.ack(k, held(b, 37, 38))
    mixed = calls.Call("ack", keys, [*held(b, 35), *joined.args, *held(b, 39, 40)])
    assert s.call(mixed) == [1]
    assert not redis_client.exists(k.inflight, k.bundles)
    assert int(redis_client.hget(k.stats, "succeeded")) == 40


def test_nack_retries_and_buries_a_bundle_job_with_its_attempt_counted(redis_client, s, k):
    es = fill(redis_client, k, 3)
    b, _, _ = bpop(s, k, 3)
    record = codec.encode_dead_record("j1", "error", es[1])
    stale = s.call(calls.nack(k, retries=[(held(b, 1)[0], 0)], dead=[(held(b, 2)[0], record)]))
    assert stale == []
    assert redis_client.zrange(k.delayed, 0, -1) == [with_attempt(es[0], 1)]
    assert redis_client.hget(k.pending, "j0") == with_attempt(es[0], 1)
    assert redis_client.hget(k.dead_jobs, "j1") == record
    assert counts(redis_client, k) == (1, 1)
    # the same again is stale
    assert s.call(calls.nack(k, retries=[(held(b, 1)[0], 0)])) == [1]


def test_release_gives_bundle_jobs_back_as_popped_in_order(redis_client, s, k):
    es = fill(redis_client, k, 3)
    b, _, _ = bpop(s, k, 3)
    redis_client.rpush(k.ready_for(0), entry("later"))
    assert s.call(calls.release(k, held(b, 1, 2, 3))) == 3
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [*es, entry("later")]
    assert not redis_client.exists(k.inflight, k.reserved, k.bundles)
    assert counts(redis_client, k) == (0, 0)
    assert redis_client.hget(k.pending, "j2") == b"r"


def test_extend_moves_the_bundle_deadline_and_reports_lost_ones(redis_client, s, k):
    fill(redis_client, k, 2)
    b, _, _ = bpop(s, k, 2, lease=1_000)
    before = redis_client.zscore(k.bundles, b)
    assert s.call(calls.extend(k, 60_000, [*held(b, 1, 2), b":b9.9\x00\x01"])) == [3]
    assert redis_client.zscore(k.bundles, b) > before + 50_000
    assert redis_client.zcard(k.bundles) == 1


def test_the_reaper_gives_back_only_running_jobs_refunded(redis_client, s, k):
    es = fill(redis_client, k, 4)
    b, _, _ = bpop(s, k, 4)
    assert s.call(calls.ack(k, held(b, 2))) == []
    redis_client.zadd(k.bundles, {b: server_ms(redis_client) - 10})
    res = decode_pop_reply(s.call(calls.pop(k, 0, 30_000, 100, bundle=True)))
    assert res.reaped == 3
    # back at the head, earliest first, attempt used and max_attempts raised
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [
        refunded(with_attempt(es[i], 1), 1) for i in (0, 2, 3)]
    assert not redis_client.exists(k.inflight, k.reserved, k.bundles)
    assert counts(redis_client, k) == (0, 0)
    assert redis_client.hget(k.recovered, "j0") == b"1:0"
    # a late ack of the reaped bundle finds nothing
    assert s.call(calls.ack(k, held(b, 1, 3))) == [1, 2]
    # jobs with crash marks are leased one by one (each may have to run alone)
    b2, _, rest = bpop(s, k, 3)
    assert b2 is None and len(rest) == 3
    assert redis_client.zrange(k.reserved, 0, -1) == [b"j0:2", b"j2:2", b"j3:2"]


def test_status_finds_a_running_bundle_job(redis_client, s, k):
    fill(redis_client, k, 3)
    b, _, _ = bpop(s, k, 3)

    def status(jid: str) -> bytes:
        return s.call(calls.status(k, jid, payload=False))[0]

    assert status("j1") == b"reserved"
    assert s.call(calls.ack(k, held(b, 2))) == []
    assert status("j1") == b"unknown" and status("j2") == b"reserved"
    assert status("j") == b"unknown"  # a prefix of every id is no job


def test_ack_result_keeps_a_bundle_jobs_result(redis_client, s, k):
    fill(redis_client, k, 2)
    b, _, _ = bpop(s, k, 2)
    assert s.call(calls.ack_result(k, [(held(b, 2)[0], 60_000, b"\x2a")], ["j1"])) == []
    assert redis_client.get(k.result("j1")) == b"\x2a"
    assert redis_client.hget(k.inflight, b + b"~") == b"01"
    assert s.call(calls.ack_result(k, [(held(b, 2)[0], 60_000, b"\x2b")], ["j1"])) == [1]
    assert redis_client.get(k.result("j1")) == b"\x2a"


def test_no_bundle_under_a_queue_concurrency_limit(redis_client, s, k):
    fill(redis_client, k, 3)
    bpop(s, k, 2)  # a bundle of 2 leased before the limit was set
    redis_client.hset(k.limits, "~q", ",,3,,")
    b2, _, rest = bpop(s, k, 5)
    # 2 running in the bundle: one slot left, taken with a lease of its own
    assert b2 is None and len(rest) == 1 and redis_client.zcard(k.reserved) == 1


@pytest.mark.parametrize("prio", [0, 9])
def test_tracked_jobs_join_the_bundle(redis_client, s, k, prio):
    # (campaign and dedup-key jobs: settled by id wherever a bundle job ends,
    # tests/campaigns/test_bundled_tracked_script.py)
    es = [entry("p1", prio), entry("c_m", prio), entry("p2", prio)]
    redis_client.rpush(k.ready_for(prio), *es)
    b, jobs, rest = bpop(s, k, 3)
    assert b is not None and jobs == es and rest == []
    assert not redis_client.exists(k.reserved)


def test_a_retried_enqueue_finds_its_first_job_running_in_a_bundle(redis_client, s, k):
    es = fill(redis_client, k, 3)
    b, _, _ = bpop(s, k, 3)
    # the retry of the call that wrote es (its reply lost) writes nothing again
    assert s.call(calls.enqueue(k, 0, es, check=True)) == -1
    assert s.call(calls.schedule(k, 0, "rel", 5_000, [es[0]], check=True)) == -1
    assert redis_client.llen(k.ready_for(0)) == 0 and redis_client.zcard(k.delayed) == 0
    # once the job is settled, it is no longer found
    assert s.call(calls.ack(k, held(b, 1))) == []
    assert s.call(calls.enqueue(k, 0, es[:1], check=True)) == 1


@pytest.mark.parametrize("bad", [b"x:0:3:id:body", b"12:0:3:id:body", b"0:0:3::body",
                                 b"0:0:3:id", b"0:0:100000000000000:id:body",
                                 b"0:1000000000000:3:id:body", b"0:0:1e+14:id:body",
                                 b"0:1000000000000:1000000000000:id:body"])
def test_a_bundling_pop_dead_letters_bad_headers_and_bundles_the_rest(redis_client, s, k,
                                                                      bad):
    good = entry("g1"), entry("g2")
    redis_client.rpush(k.ready_for(0), good[0], bad, good[1])
    res = decode_pop_reply(s.call(calls.pop(k, 3, 30_000, 100, bundle=True)))
    assert res.bundle[0].startswith(b":b")
    assert res.malformed == 1
    assert res.bundle[1] == 2 and res.jobs == list(good)
    (dead_id,) = redis_client.zrange(k.dead, 0, -1)
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, dead_id))
    assert (rec["reason"], rec["raw"]) == ("decode_error", bad)


def test_one_job_gets_a_lease_of_its_own(redis_client, s, k):
    e = entry("alone")
    redis_client.rpush(k.ready_for(0), e)
    b, _, rest = bpop(s, k, 5)
    assert b is None and rest == [with_attempt(e, 1)]
    assert redis_client.zrange(k.reserved, 0, -1) == [b"alone:1"]
    assert counts(redis_client, k) == (0, 0)


def test_long_but_legal_counts_are_bundled(redis_client, s, k):
    e = b"0:999999999999:999999999999:top:body"  # 12 digits each: the longest allowed
    redis_client.rpush(k.ready_for(0), e, entry("next"))
    b, jobs, _ = bpop(s, k, 2)
    assert jobs == [e, entry("next")]
    # taken out again, its attempt is counted as the per-job scripts count it
    assert s.call(calls.nack(k, retries=[(held(b, 1)[0], 0)])) == []
    assert redis_client.zrange(k.delayed, 0, -1) == [
        b"0:1000000000000:999999999999:top:body"]


@pytest.mark.parametrize("lease", [b":", b":b", b":b1", b":b1.2~\x00\x01", b":table\x00\x01"])
def test_a_lease_that_names_no_bundle_is_stale(redis_client, s, k, lease):
    fill(redis_client, k, 2)
    b, _, _ = bpop(s, k, 2)
    assert s.call(calls.ack(k, [lease])) == [1]
    assert s.call(calls.nack(k, retries=[(lease, 0)])) == [1]
    assert s.call(calls.release(k, [lease])) == 0
    assert s.call(calls.extend(k, 60_000, [lease])) == [1]
    assert counts(redis_client, k) == (1, 2)
    assert s.call(calls.ack(k, held(b, 1, 2))) == []


def test_a_bundle_without_its_mask_gives_every_job_back(redis_client, s, k):
    # a script stopped by an error between its delete of the mask and the write-back
    # (a key of the wrong type, written by hand): its jobs run again, never vanish
    es = fill(redis_client, k, 3)
    b, _, _ = bpop(s, k, 3)
    redis_client.hdel(k.inflight, b + b"~")
    redis_client.zadd(k.bundles, {b: server_ms(redis_client) - 10})
    assert int(s.call(calls.pop(k, 0, 30_000, 100, bundle=True))[4]) == 3
    assert redis_client.lrange(k.ready_for(0), 0, -1) == [
        refunded(with_attempt(e, 1), 1) for e in es]
    assert not redis_client.exists(k.inflight, k.reserved, k.bundles)
