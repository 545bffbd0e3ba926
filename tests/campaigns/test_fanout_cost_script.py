"""What a bulk send's features cost the scripts per call rather than per job: a grouped
pop clears its jobs' waiting bits per run of sequence numbers (its turns interleave the
groups, the bits are cleared in order), a group's rows go into gready in one ZADD
without a table per job, and an ack settles tracked jobs of every jobmeta shape with
exact counts and lapse times."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import entry, server_ms
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.script

GROUPS = 10
PER = 20
GPOS0 = 1 << 51


def _id(n: int, g: str) -> str:
    """A grouped id as enqueue makes it: 17 characters, "-", the hex number, "~g"."""
    return f"{'a' * 17}-{n:x}~{g}"


def _fill(s: SyncScripts, k: QueueKeys) -> list[str]:
    """GROUPS groups of PER jobs, each group's numbers one run; returns the groups."""
    assert int(s.call(calls.reserve(k, GROUPS * PER))) == 0
    names = [f"{g + 10:x}" for g in range(GROUPS)]
    for g, name in enumerate(names):
        first = g * PER
        es = [entry(_id(n, name)) for n in range(first, first + PER)]
        got = s.call(calls.enqueue_group(k, name, 0, "ready", 0, es, check=False,
                                         runs=f"{first}:{PER}"))
        assert int(got) == PER
    return names


def _pop(s: SyncScripts, k: QueueKeys, want: int) -> list[bytes]:
    """The jobs of one bundling pop (a worker's)."""
    return decode_pop_reply(s.call(calls.pop(k, want, 30_000, 100, bundle=True))).jobs


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_grouped_pop_clears_its_bits_per_run_and_still_alternates(redis_client, s, k):
    r = redis_client
    names = _fill(s, k)
    r.setbit(k.waiting0, GROUPS * PER, 1)  # a neighbour's bit (another producer's job)
    assert all(r.getbit(k.waiting0, n) for n in range(GROUPS * PER))
    r.config_resetstat()
    jobs = _pop(s, k, GROUPS * PER)
    assert len(jobs) == GROUPS * PER
    # the turns alternate between the groups: the first GROUPS jobs are one of each
    first = [e.split(b":", 4)[3].decode().rsplit("~", 1)[1] for e in jobs[:GROUPS]]
    assert sorted(first) == sorted(names)
    assert not any(r.getbit(k.waiting0, n) for n in range(GROUPS * PER))
    assert r.getbit(k.waiting0, GROUPS * PER) == 1
    # one BITFIELD per group's run (each in one or two turns), not one per job
    assert _calls(r, "bitfield") <= 2 * GROUPS


def test_a_groups_rows_go_in_as_before_one_zadd(redis_client, s, k):
    r = redis_client
    es = [entry(_id(n, "ab"), prio=3) for n in range(5)]
    r.config_resetstat()
    s.call(calls.enqueue_group(k, "ab", 3, "ready", 0, es[:2], check=False, runs=""))
    s.call(calls.enqueue_group(k, "ab", 3, "ready", 0, es[2:], check=False, runs=""))
    assert _calls(r, "zadd") == 3  # one into gready a call, one as the group joins
    members = r.zrange(k.gready, 0, -1)
    # "<g>~<9 - priority><13 hex position><entry>", positions counting up from 2^51
    assert members == [b"ab~6" + b"%013x" % (GPOS0 + i + 1) + e for i, e in enumerate(es)]


def test_an_ack_settles_every_jobmeta_shape_once(redis_client, s, k):
    r = redis_client
    s.call(calls.campaign_queue(k, "c", "open", "1"))
    rows = [("a_m", "c", "ka"), ("b_m", "c", ""), ("c_m", "", "kc"), ("d_m", "c", "kd")]
    for jid, cid, key in rows:
        reply = s.call(calls.enqueue_tracked(k, 0, "ready", 0, cid, 60_000, 100,
                                             [entry(jid), key], check=False))
        assert reply[:2] == [0, 1]
    r.hset(k.jobmeta, "d_m", "c\n")  # an entry with no ttl and no key: counted, no lapse
    res = decode_pop_reply(s.call(calls.pop(k, 4, 30_000, 100, bundle=True)))
    name, n = res.bundle  # tracked jobs are bundled: leases "<bundle><position>"
    assert int(n) == 4 and len(res.jobs) == 4
    leases = [name + p.to_bytes(2, "big") for p in range(1, 5)]
    now = server_ms(r)
    assert s.call(calls.ack(k, leases)) == []
    assert s.call(calls.ack(k, leases)) == [1, 2, 3, 4]  # stale: nothing counted again
    assert {f: int(v) for f, v in r.hgetall(k.campaigns).items() if f.startswith(b"c:")
            and f != b"c:f" and f != b"c:g"} == {b"c:t": 3, b"c:p": 0, b"c:s": 3}
    assert r.hlen(k.jobmeta) == 0
    lapse = dict(r.zrange(k.dedup_exp, 0, -1, withscores=True))
    assert set(lapse) == {b"ka", b"kc"}
    assert all(now + 60_000 <= v <= server_ms(r) + 60_000 for v in lapse.values())
