"""The in-flight hash stays a hash table (``_lib.lua`` PIN): every script that leases
writes the pin with its entries, so even small entries (below hash-max-listpack-value)
never make it a listpack, whose HSET and HDEL scan it field by field; and the pin goes
with the last lease, whichever script ends it, so an idle queue keeps no such key."""

from __future__ import annotations

import pytest
import redis
from fixtures.lua import PIN, entry, leases, pop
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import QueueKeys
from batchq.store.scripts import SyncScripts, calls
from batchq.store.scripts.replies import decode_pop_reply

pytestmark = pytest.mark.script


def _table(r: redis.Redis, k: QueueKeys) -> bool:
    return r.object("encoding", k.inflight) == b"hashtable"


def _ready(r: redis.Redis, k: QueueKeys, n: int) -> list[bytes]:
    es = [entry(f"j{i}") for i in range(n)]  # about 50 bytes each: listpack-sized
    r.rpush(k.ready_for(0), *es)
    return es


@pytest.mark.parametrize("end", ["ack", "ack_result", "nack", "dead", "release", "reap"])
def test_a_popped_lease_is_in_a_table_and_the_pin_goes_with_the_last(
        redis_client: redis.Redis, s: SyncScripts, k: QueueKeys, end: str) -> None:
    r = redis_client
    _ready(r, k, 3)
    assert len(pop(s, k, 3)) == 3
    assert _table(r, k), r.object("encoding", k.inflight)
    assert len(r.hget(k.inflight, PIN) or b"") > 64 and set(leases(r, k)) == {
        b"j0", b"j1", b"j2"}
    r.delete(k.wake)
    lease = [b"j0:1", b"j1:1", b"j2:1"]
    if end == "ack":
        s.call(calls.ack(k, lease[:2]))
        assert _table(r, k) and set(leases(r, k)) == {b"j2"}  # others keep the pin
        s.call(calls.ack(k, lease[2:]))
    elif end == "ack_result":
        s.call(calls.ack_result(k, [(m, 60_000, b"\xc0") for m in lease]))
    elif end == "nack":
        s.call(calls.nack(k, retries=[(m, 1_000) for m in lease]))
    elif end == "dead":
        s.call(calls.nack(k, dead=[(m, b"\x80") for m in lease]))
    elif end == "release":
        assert int(s.call(calls.release(k, lease))) == 3
    else:
        r.zadd(k.reserved, {m: 1 for m in lease}, xx=True)  # the leases expired
        assert len(pop(s, k, 0)) == 0
    assert r.exists(k.inflight) == 0


def test_a_handed_lease_is_in_a_table(redis_client: redis.Redis, s: SyncScripts,
                                      k: QueueKeys) -> None:
    r = redis_client
    assert decode_pop_reply(  # registered
        s.call(calls.pop(k, 5, 30_000, 100, "w1", 6_000))).jobs == []
    one = entry("h")
    assert int(s.call(calls.enqueue(k, 0, [one], check=False))) == 0  # handed off
    assert leases(r, k).keys() == {b"h"} and _table(r, k)
    s.call(calls.ack(k, [b"h:1"]))
    assert r.exists(k.inflight) == 0


def test_many_leases_stay_a_table_as_they_come_and_go(redis_client: redis.Redis,
                                                      s: SyncScripts, k: QueueKeys) -> None:
    r = redis_client
    _ready(r, k, 600)
    for _ in range(3):
        assert len(pop(s, k, 100)) == 100
        assert _table(r, k)
    s.call(calls.ack(k, [f"j{i}:1".encode() for i in range(150)]))
    assert _table(r, k) and len(leases(r, k)) == 150
