"""pop.lua: promote due delayed jobs, reap expired leases, pop and reserve by priority.

The reply is ``[now, next_due, next_deadline, promoted, reaped, expired, malformed, *jobs]``
(``expired``: leases dead-lettered as lease_expired; ``malformed``: entries dead-lettered
as decode_error).
"""

from __future__ import annotations

import hashlib
from functools import partial

import pytest
import redis
from fixtures.lua import entry as _entry
from fixtures.lua import leases, ns_keys, pop_marks, refunded, server_ms, with_attempt
from fixtures.lua import pop_reply as pop
from fixtures.scripts import *  # noqa: F403

from batchq.store import codec
from batchq.store.keys import QueueKeys
from batchq.store.scripts import calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.script

# pop tests encode jobs with a keyword argument, checked after decoding
entry = partial(_entry, kwargs={"k": 1})



def reserve(r: redis.Redis, k: QueueKeys, e: bytes, deadline: int) -> bytes:
    """State as left by an earlier pop: ``e`` (attempt counted) reserved until deadline."""
    _, a, _, jid, _ = e.split(b":", 4)
    member = jid + b":" + a
    r.hset(k.inflight, jid, e)
    r.zadd(k.reserved, {member: deadline})
    return member


# --- popping ---------------------------------------------------------------------------


def test_priority_9_before_0_and_fifo_within_a_level(redis_client, s, k):
    lo = [entry(f"lo{i}", prio=0) for i in range(3)]
    mid = [entry(f"mid{i}", prio=5) for i in range(3)]
    hi = [entry(f"hi{i}", prio=9) for i in range(3)]
    redis_client.rpush(k.ready_for(0), *lo)
    redis_client.rpush(k.ready_for(5), *mid)
    redis_client.rpush(k.ready_for(9), *hi)

    _, jobs = pop(s, k, 20)
    assert jobs == [with_attempt(e, 1) for e in hi + mid + lo]
    for key in k.ready:
        assert redis_client.llen(key) == 0


def test_count_limit_takes_from_the_highest_levels_first(redis_client, s, k):
    hi = [entry(f"hi{i}", prio=9) for i in range(2)]
    lo = [entry(f"lo{i}", prio=0) for i in range(4)]
    redis_client.rpush(k.ready_for(9), *hi)
    redis_client.rpush(k.ready_for(0), *lo)

    _, jobs = pop(s, k, 3)
    assert jobs == [with_attempt(e, 1) for e in [*hi, lo[0]]]
    assert redis_client.llen(k.ready_for(9)) == 0
    assert redis_client.lrange(k.ready_for(0), 0, -1) == lo[1:]
    assert redis_client.zcard(k.reserved) == 3
    assert len(leases(redis_client, k)) == 3


def test_attempt_counted_in_entry_inflight_and_reserved_member(redis_client, s, k):
    fresh = entry("fresh", max_attempts=5)
    again = entry("again", max_attempts=5, attempt=2)
    redis_client.rpush(k.ready_for(0), fresh, again)

    before = server_ms(redis_client)
    meta, jobs = pop(s, k, 10, lease=45_000)
    after = server_ms(redis_client)
    now = meta[0]
    assert before <= now <= after

    assert jobs == [with_attempt(fresh, 1), with_attempt(again, 3)]
    assert leases(redis_client, k) == {
        b"fresh": with_attempt(fresh, 1),
        b"again": with_attempt(again, 3),
    }
    deadline = now + 45_000
    assert dict(redis_client.zrange(k.reserved, 0, -1, withscores=True)) == {
        b"fresh:1": float(deadline),
        b"again:3": float(deadline),
    }
    assert before + 45_000 <= deadline <= after + 45_000
    # the returned entries decode into the job that was enqueued, attempt included
    job = codec.decode_entry(jobs[0], "q")
    assert (job.id, job.attempt, job.max_attempts, job.task, job.args, job.kwargs) == (
        "fresh", 1, 5, "t", ["fresh"], {"k": 1})
    assert job.lease == b"fresh:1"


def test_want_zero_is_maintenance_only(redis_client, s, k):
    es = [entry("a"), entry("b")]
    redis_client.rpush(k.ready_for(0), *es)
    meta, jobs = pop(s, k, 0)
    assert jobs == []
    assert meta[1:] == [-1, -1, 0, 0, 0, 0]
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es
    assert redis_client.exists(k.reserved, k.inflight, k.wake) == 0


def test_empty_queue_returns_meta_only_and_writes_nothing(redis_client, s, k, namespace):
    before = server_ms(redis_client)
    meta, jobs = pop(s, k, 10)
    after = server_ms(redis_client)
    assert jobs == []
    assert before <= meta[0] <= after
    assert meta[1:] == [-1, -1, 0, 0, 0, 0]
    assert ns_keys(redis_client, namespace) == set()


# --- wake token ------------------------------------------------------------------------


def test_full_batch_leaves_one_wake_token(redis_client, s, k):
    es = [entry(f"j{i}") for i in range(8)]
    redis_client.rpush(k.ready_for(0), *es)
    _, jobs = pop(s, k, 5)
    assert len(jobs) == 5
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]
    # another full batch with a token already there: still exactly one
    _, jobs = pop(s, k, 3)
    assert len(jobs) == 3
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]


def test_partial_batch_leaves_no_wake_token(redis_client, s, k):
    redis_client.rpush(k.ready_for(0), *[entry(f"j{i}") for i in range(3)])
    _, jobs = pop(s, k, 10)
    assert len(jobs) == 3
    assert redis_client.exists(k.wake) == 0


# --- promotion of delayed jobs -----------------------------------------------------------


def test_promotes_only_due_jobs_to_the_tail_of_their_level(redis_client, s, k):
    now = server_ms(redis_client)
    waiting = entry("waiting", prio=7)
    due_hi = entry("due-hi", prio=7)
    due_lo = entry("due-lo", prio=2)
    later = entry("later", prio=7)
    redis_client.rpush(k.ready_for(7), waiting)
    redis_client.zadd(k.delayed, {due_hi: now - 2000, due_lo: now - 1000,
                                  later: now + 600_000})

    meta, jobs = pop(s, k, 0)
    assert jobs == []
    assert meta[3:] == [2, 0, 0, 0]
    assert meta[1] == now + 600_000  # next_due: the job still waiting
    assert redis_client.lrange(k.ready_for(7), 0, -1) == [waiting, due_hi]
    assert redis_client.lrange(k.ready_for(2), 0, -1) == [due_lo]
    assert dict(redis_client.zrange(k.delayed, 0, -1, withscores=True)) == {
        later: float(now + 600_000)}
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]


def test_promoted_jobs_are_popped_in_the_same_call(redis_client, s, k):
    now = server_ms(redis_client)
    d = entry("d", prio=3)
    redis_client.zadd(k.delayed, {d: now - 1})
    meta, jobs = pop(s, k, 10)
    assert meta[3] == 1
    assert jobs == [with_attempt(d, 1)]
    assert redis_client.exists(k.delayed) == 0
    assert redis_client.zrange(k.reserved, 0, -1) == [b"d:1"]


def test_promotion_moves_at_most_chunk_jobs_per_call_earliest_first(redis_client, s, k):
    now = server_ms(redis_client)
    es = [entry(f"d{i:03d}") for i in range(250)]
    redis_client.zadd(k.delayed, {e: now - 100_000 + i for i, e in enumerate(es)})

    meta, _ = pop(s, k, 0, chunk=100)
    assert meta[3] == 100
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es[:100]
    assert redis_client.zcard(k.delayed) == 150
    assert meta[1] == now - 100_000 + 100  # next_due: the earliest left

    meta, _ = pop(s, k, 0, chunk=100)
    assert meta[3] == 100
    meta, _ = pop(s, k, 0, chunk=100)
    assert meta[3] == 50
    assert meta[1] == -1
    assert redis_client.lrange(k.ready_for(0), 0, -1) == es
    assert redis_client.exists(k.delayed) == 0


# --- the reaper --------------------------------------------------------------------------


def test_reaper_returns_expired_lease_to_the_head_with_attempt_refunded(redis_client, s, k):
    job = entry("expired", prio=4, max_attempts=3)
    redis_client.rpush(k.ready_for(4), job)
    # a real pop reserves the job, another job arrives meanwhile...
    _, jobs = pop(s, k, 1)
    assert jobs == [with_attempt(job, 1)]
    queued = entry("queued", prio=4)
    redis_client.rpush(k.ready_for(4), queued)
    # ...and the worker dies: the deadline passes
    redis_client.zadd(k.reserved, {b"expired:1": 1}, xx=True)
    redis_client.delete(k.wake)

    meta, jobs = pop(s, k, 0)
    assert jobs == []
    assert meta[3:] == [0, 1, 0, 0]
    assert meta[2] == -1
    # not known to have started: refunded (max_attempts + 1) and marked recovered
    assert redis_client.lrange(k.ready_for(4), 0, -1) == [refunded(job, 1), queued]
    assert redis_client.hgetall(k.recovered) == {b"expired": b"1:0"}
    assert redis_client.exists(k.reserved, k.inflight, k.dead, k.dead_jobs) == 0
    assert redis_client.lrange(k.wake, 0, -1) == [b"1"]


def test_reaped_job_is_popped_again_with_the_next_attempt(redis_client, s, k):
    job = entry("again", max_attempts=3)
    reserve(redis_client, k, with_attempt(job, 1), deadline=1)
    redis_client.rpush(k.ready_for(0), entry("behind"))

    crashed, marks, jobs = pop_marks(s, k, 2)
    assert (crashed, marks) == (0, [])  # recovered once: runs like any other job
    assert jobs == [refunded(job, 2), with_attempt(entry("behind"), 1)]
    assert redis_client.zrange(k.reserved, 0, -1) == [b"again:2", b"behind:1"]


def test_a_job_held_by_two_dead_workers_is_flagged_to_run_alone(redis_client, s, k):
    job = entry("twice", max_attempts=3)
    reserve(redis_client, k, with_attempt(job, 1), deadline=1)
    redis_client.rpush(k.ready_for(0), entry("behind"))
    _, marks, _ = pop_marks(s, k, 2)
    assert marks == []
    redis_client.zadd(k.reserved, {b"twice:2": 1, b"behind:1": 1}, xx=True)  # died again
    _, marks, jobs = pop_marks(s, k, 2)
    # "twice" was in both dead workers' hands, "behind" only in the second one's
    assert redis_client.hgetall(k.recovered) == {b"twice": b"2:0", b"behind": b"1:0"}
    assert [jobs[i - 1].split(b":")[3] for i in marks] == [b"twice"]


def test_reaper_never_dead_letters_a_job_not_known_to_have_started(redis_client, s, k):
    raw = entry("neighbour", prio=6, max_attempts=2, attempt=2)
    reserve(redis_client, k, raw, deadline=5)
    meta, _ = pop(s, k, 0)
    assert meta[3:] == [0, 1, 0, 0]
    assert redis_client.lrange(k.ready_for(6), 0, -1) == [refunded(raw, 2)]
    assert redis_client.exists(k.dead, k.dead_jobs) == 0


def test_started_lease_is_charged_and_dead_lettered_as_crashed_worker(redis_client, s, k):
    raw = entry("poison", prio=6, max_attempts=2, attempt=1)
    member = reserve(redis_client, k, raw, deadline=5)
    redis_client.hset(k.recovered, "poison", "2:0")
    assert s.call(calls.start(k, [member])) == 1
    keep = with_attempt(entry("alive", max_attempts=2), 2)
    keep_member = reserve(redis_client, k, keep, deadline=server_ms(redis_client) + 600_000)

    # charged: attempt 1 stays used, back to ready; the crash is counted
    meta, jobs = pop(s, k, 0)
    assert meta[3:] == [0, 1, 0, 0]
    assert redis_client.lrange(k.ready_for(6), 0, -1) == [raw]
    assert redis_client.hgetall(k.recovered) == {b"poison": b"3:1"}
    assert redis_client.hlen(k.started) == 0

    # its next run (attempt 2 of 2) starts and its worker dies again: crashed_worker
    crashed, marks, jobs = pop_marks(s, k, 1)
    assert (crashed, marks, jobs) == (0, [1], [with_attempt(raw, 2)])
    assert s.call(calls.start(k, [b"poison:2"])) == 1
    redis_client.zadd(k.reserved, {b"poison:2": 5}, xx=True)
    before = server_ms(redis_client)
    crashed, _, _ = pop_marks(s, k, 0)
    after = server_ms(redis_client)
    assert crashed == 1
    assert redis_client.zrange(k.reserved, 0, -1) == [keep_member]
    assert leases(redis_client, k) == {b"alive": keep}
    assert redis_client.exists(k.recovered, k.started) == 0
    died = redis_client.zrange(k.dead, 0, -1, withscores=True)
    assert [m for m, _ in died] == [b"poison"]
    assert before <= died[0][1] <= after
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, "poison"))
    assert (rec["id"], rec["reason"], rec["raw"]) == ("poison", "crashed_worker",
                                                       with_attempt(raw, 2))
    assert "2 times; 4 workers died holding it" in rec["error_message"]
    assert set(rec) == {"id", "reason", "error_message", "raw"}
    assert redis_client.hget(k.stats, "dead") == b"1"


def test_start_skips_a_lease_no_longer_reserved(redis_client, s, k):
    assert s.call(calls.start(k, [b"ghost:1"])) == 0
    assert redis_client.exists(k.started) == 0


def test_ack_and_nack_forget_the_crash_marks(redis_client, s, k):
    for jid in ("a", "r", "d"):
        reserve(redis_client, k, with_attempt(entry(jid), 1), deadline=1)
    pop(s, k, 0)  # all three recovered...
    redis_client.hset(k.recovered, mapping={"a": "2:0", "r": "2:0", "d": "2:0"})  # twice
    _, marks, _ = pop_marks(s, k, 3)
    assert marks == [1, 2, 3]
    assert s.call(calls.start(k, [b"a:2", b"r:2", b"d:2"])) == 3
    assert s.call(calls.ack(k, [b"a:2"])) == []
    assert s.call(calls.nack(k, [(b"r:2", 10)], [(b"d:2", b"rec")])) == []
    assert redis_client.exists(k.recovered, k.started) == 0


def test_reaper_dead_record_keeps_large_raw_bytes_intact(redis_client, s, k):
    # bodies above 255 and 65535 bytes exercise the bin16 / bin32 writers
    for n, size in enumerate((300, 70_000)):
        jid = f"big{n}"
        raw = (codec.header(0, 1) + jid.encode() + b":"
               + codec.encode_body("t", ["x" * size], {}, 1))
        raw = with_attempt(raw, 1)
        member = reserve(redis_client, k, raw, deadline=1)
        s.call(calls.start(k, [member]))
        crashed, _, _ = pop_marks(s, k, 0)
        assert crashed == 1
        rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, jid))
        assert rec["raw"] == raw
        assert rec["id"] == jid


@pytest.mark.parametrize("bad", [b"0:1:1e+14:id:body", b"0:1:123456789012345:id:body",
                                 b"0:1234567890123:3:id:body"])
def test_a_malformed_in_flight_entry_is_dead_lettered_when_its_lease_expires(
        redis_client, s, k, bad):
    redis_client.hset(k.inflight, "id", bad)
    redis_client.zadd(k.reserved, {b"id:1": 1})
    meta, _ = pop(s, k, 0)
    assert meta[5] == 1
    assert redis_client.exists(k.reserved, k.inflight) == 0
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, "id"))
    assert (rec["reason"], rec["raw"]) == ("lease_expired", bad)


def test_reaper_drops_a_reservation_without_inflight_entry(redis_client, s, k, namespace):
    redis_client.zadd(k.reserved, {b"ghost:1": 1})
    meta, jobs = pop(s, k, 5)
    assert jobs == []
    assert meta[3:] == [0, 0, 0, 0]
    assert ns_keys(redis_client, namespace) == set()


def test_reaper_handles_at_most_chunk_leases_per_call(redis_client, s, k):
    members = [reserve(redis_client, k, entry(f"r{i:03d}", attempt=1), deadline=1000 + i)
               for i in range(150)]
    meta, _ = pop(s, k, 0, chunk=100)
    assert meta[4] == 100
    assert redis_client.zrange(k.reserved, 0, -1) == members[100:]
    assert redis_client.llen(k.ready_for(0)) == 100
    assert len(leases(redis_client, k)) == 50
    assert meta[2] == 1100  # next_deadline: earliest left
    meta, _ = pop(s, k, 0, chunk=100)
    assert meta[4] == 50
    assert redis_client.exists(k.reserved, k.inflight) == 0
    assert redis_client.llen(k.ready_for(0)) == 150


def test_live_leases_are_not_reaped(redis_client, s, k):
    now = server_ms(redis_client)
    e = entry("live", attempt=1)
    m = reserve(redis_client, k, e, deadline=now + 60_000)
    meta, _ = pop(s, k, 0)
    assert meta[3:] == [0, 0, 0, 0]
    assert meta[2] == now + 60_000
    assert redis_client.zrange(k.reserved, 0, -1) == [m]
    assert leases(redis_client, k) == {b"live": e}


# --- paused queue --------------------------------------------------------------------------


def test_paused_queue_promotes_and_reaps_but_pops_nothing(redis_client, s, k):
    now = server_ms(redis_client)
    redis_client.set(k.paused, "1")
    ready = entry("ready")
    due = entry("due")
    reaped = entry("reaped", attempt=1)
    redis_client.rpush(k.ready_for(0), ready)
    redis_client.zadd(k.delayed, {due: now - 1})
    reserve(redis_client, k, reaped, deadline=1)

    meta, jobs = pop(s, k, 10)
    assert jobs == []
    assert meta[1:] == [-1, -1, 1, 1, 0, 0]
    assert redis_client.lrange(k.ready_for(0), 1, -1) == [ready, due]
    assert redis_client.exists(k.reserved, k.inflight, k.delayed) == 0
    assert redis_client.get(k.paused) == b"1"

    assert redis_client.lrange(k.ready_for(0), 0, 0) == [refunded(reaped, 1)]

    redis_client.delete(k.paused)
    _, jobs = pop(s, k, 10)
    assert jobs == [refunded(reaped, 2), with_attempt(ready, 1), with_attempt(due, 1)]


# --- malformed entries -----------------------------------------------------------------------


def test_malformed_entry_is_dead_lettered_as_decode_error(redis_client, s, k):
    good1, good2 = entry("g1"), entry("g2")
    redis_client.rpush(k.ready_for(0), good1, b"garbage", good2)

    before = server_ms(redis_client)
    meta, jobs = pop(s, k, 10)
    after = server_ms(redis_client)
    assert jobs == [with_attempt(good1, 1), with_attempt(good2, 1)]
    assert meta[5:] == [0, 1]  # malformed, not expired
    assert redis_client.llen(k.ready_for(0)) == 0
    assert redis_client.zrange(k.reserved, 0, -1) == [b"g1:1", b"g2:1"]

    died = redis_client.zrange(k.dead, 0, -1, withscores=True)
    assert len(died) == 1
    dead_id = died[0][0].decode()
    assert dead_id.startswith("raw-")
    assert dead_id == "raw-" + hashlib.sha1(b"garbage").hexdigest()[:20] + "-1"
    assert before <= died[0][1] <= after
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, dead_id))
    assert rec["id"] == dead_id
    assert rec["reason"] == "decode_error"
    assert rec["raw"] == b"garbage"
    assert set(leases(redis_client, k)) == {b"g1", b"g2"}


@pytest.mark.parametrize("bad", [b"x:0:3:id:body", b"12:0:3:id:body", b"0:0:3::body",
                                 b"0:0:3:id", b"0:0:100000000000000:id:body",
                                 b"0:1000000000000:3:id:body", b"0:0:1e+14:id:body"])
def test_bad_headers_are_dead_lettered(redis_client, s, k, bad):
    redis_client.rpush(k.ready_for(0), bad)
    meta, jobs = pop(s, k, 1)
    assert jobs == []
    assert meta[5:] == [0, 1]
    assert redis_client.exists(k.reserved, k.inflight) == 0
    (dead_id,) = redis_client.zrange(k.dead, 0, -1)
    rec = codec.decode_dead_record(redis_client.hget(k.dead_jobs, dead_id))
    assert (rec["reason"], rec["raw"]) == ("decode_error", bad)


def test_identical_malformed_entries_each_keep_their_own_dead_record(redis_client, s, k):
    bad = b"0:0:100000000000000:same:body"
    redis_client.rpush(k.ready_for(0), bad, bad)
    meta, _ = pop(s, k, 1)  # one per call too: the ids must differ across calls
    meta2, _ = pop(s, k, 1)
    assert (meta[6], meta2[6]) == (1, 1)
    assert redis_client.zcard(k.dead) == redis_client.hlen(k.dead_jobs) == 2
    for rec in redis_client.hvals(k.dead_jobs):
        assert codec.decode_dead_record(rec)["raw"] == bad


def test_only_the_attempt_is_rewritten_when_counted(redis_client, s, k):
    # the counted entry keeps every other byte of the popped one, up to the 12-digit top
    redis_client.rpush(k.ready_for(0), b"0:007:3:lz:body", b"0:999999999999:010:top:b:o:dy")
    _, jobs = pop(s, k, 2)
    assert jobs == [b"0:8:3:lz:body", b"0:1000000000000:010:top:b:o:dy"]
    assert redis_client.zrange(k.reserved, 0, -1) == [b"lz:8", b"top:1000000000000"]
    assert redis_client.hget(k.inflight, "top") == jobs[1]


# --- meta ------------------------------------------------------------------------------------


def test_meta_reports_next_due_and_next_deadline(redis_client, s, k):
    now = server_ms(redis_client)
    redis_client.zadd(k.delayed, {entry("d1"): now + 50_000, entry("d2"): now + 20_000})
    redis_client.rpush(k.ready_for(0), entry("r"))
    before = server_ms(redis_client)
    meta, jobs = pop(s, k, 1, lease=7_000)
    after = server_ms(redis_client)
    assert len(jobs) == 1
    assert before <= meta[0] <= after
    assert meta[1] == now + 20_000
    assert meta[2] == meta[0] + 7_000
    assert meta[3:] == [0, 0, 0, 0]


def _seq_id(n: int) -> str:
    """An id as enqueue makes it: 17 characters, "-", the hex sequence number."""
    return f"{'a' * 17}-{n:x}"


def test_pop_clears_waiting_bits_per_run_and_only_its_own(redis_client, s, k):
    from batchq.store.scripts import calls

    r = redis_client
    assert int(s.call(calls.reserve(k, 200))) == 0
    # 3..62 enqueued in order (one run), then 90, 80, 81 (not consecutive in pop order)
    s.call(calls.enqueue(k, 0, [entry(_seq_id(i)) for i in range(3, 63)], check=False,
                         runs="3:60"))
    s.call(calls.enqueue(k, 0, [entry(_seq_id(i)) for i in (90, 80, 81)], check=False,
                         runs="80:2,90:1"))
    for i in (2, 79, 82, 89, 91):  # neighbours' bits (jobs of other producers)
        r.setbit(k.waiting0, i, 1)

    def bits() -> set[int]:
        return {i for i in range(200) if r.getbit(k.waiting0, i)}

    assert bits() == {2, 79, 82, 89, 91, *range(3, 63), 80, 81, 90}
    def popped(n: int) -> int:
        return len(decode_pop_reply(s.call(calls.pop(k, n, 30_000, 100))).jobs)

    assert popped(25) == 25  # 3..27: unaligned start and end
    assert bits() == {2, 79, 82, 89, 91, *range(28, 63), 80, 81, 90}
    assert popped(100) == 38  # 28..62, then 90, 80, 81
    assert bits() == {2, 79, 82, 89, 91}


def test_a_bundling_pop_clears_exactly_its_jobs_bits(redis_client, s, k):
    """The bundling pop reads each job's sequence number from the entry (no id made);
    its runs are cleared in one BITFIELD (32 bits a field) up to 32 whole bytes, with a
    SETRANGE beyond: runs of every length and alignment, neighbours kept."""
    from batchq.store.scripts import calls

    r = redis_client
    assert int(s.call(calls.reserve(k, 2000))) == 0
    s.call(calls.enqueue(k, 0, [entry(_seq_id(i)) for i in range(5, 905)], check=False,
                         runs="5:900"))
    keep = {4, 905, 1500}  # other producers' waiting jobs on either side
    for i in keep:
        r.setbit(k.waiting0, i, 1)

    def bits() -> set[int]:
        return {i for i in range(2000) if r.getbit(k.waiting0, i)}

    start = 5
    for n in (1, 7, 9, 31, 33, 64, 100, 300, 355):  # 900 in all
        res = decode_pop_reply(s.call(calls.pop(k, n, 30_000, 100, bundle=True)))
        assert len(res.jobs) == n
        start += n
        assert bits() == keep | set(range(start, 905)), n
    assert start == 905 and r.llen(k.ready_for(0)) == 0
