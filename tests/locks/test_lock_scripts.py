"""lock_acquire.lua, lock_release.lua, lock_extend.lua: SET NX PX with a fencing counter,
compare-and-delete, compare-and-extend."""

from __future__ import annotations

import pytest
import redis
from fixtures.scripts import *  # noqa: F403

from batchq.store.keys import LockKeys, lock_keys
from batchq.store.scripts import SyncScripts, calls

pytestmark = pytest.mark.script


@pytest.fixture
def lk(namespace: str) -> LockKeys:
    return lock_keys(namespace, "job:export")


def acquire(r: redis.Redis, lk: LockKeys, token: str, ttl_ms: int) -> list[int]:
    return [int(x) for x in SyncScripts(r).call(calls.lock_acquire(lk, token, ttl_ms))]


def release(r: redis.Redis, lk: LockKeys, token: str) -> int:
    return int(SyncScripts(r).call(calls.lock_release(lk, token)))


def extend(r: redis.Redis, lk: LockKeys, token: str, ttl_ms: int) -> int:
    return int(SyncScripts(r).call(calls.lock_extend(lk, token, ttl_ms))[0])


def test_keys_share_the_lock_own_hash_tag(namespace):
    lk = lock_keys(namespace, "a:b")
    tag = f"{{{namespace}:lock:a:b}}"
    assert tag in lk.token and tag in lk.fence and lk.token != lk.fence
    for bad in ("", "x{y", "x}", "a b", "tab\t"):
        with pytest.raises(ValueError, match="invalid lock name"):
            lock_keys(namespace, bad)


def test_acquire_sets_token_with_server_lease_and_a_growing_fence(redis_client, lk):
    fence, now, ttl = acquire(redis_client, lk, "t1", 30_000)
    assert fence == 1 and now > 1_600_000_000_000 and ttl == 30_000
    assert redis_client.get(lk.token) == b"t1"
    assert 29_000 < redis_client.pttl(lk.token) <= 30_000

    # held: nothing changes, the holder's remaining lease comes back
    fence2, _, left = acquire(redis_client, lk, "t2", 30_000)
    assert fence2 == 0 and 0 < left <= 30_000
    assert redis_client.get(lk.token) == b"t1"
    assert redis_client.get(lk.fence) == b"1"

    # a retried acquire (its reply was lost) gets its own fence back, not a new one
    assert acquire(redis_client, lk, "t1", 30_000)[0] == 1

    assert release(redis_client, lk, "t1") == 1
    assert acquire(redis_client, lk, "t2", 30_000)[0] == 2
    assert release(redis_client, lk, "t2") == 1
    assert acquire(redis_client, lk, "t3", 30_000)[0] == 3


def test_release_only_deletes_the_callers_token(redis_client, lk):
    acquire(redis_client, lk, "mine", 30_000)
    assert release(redis_client, lk, "other") == 0
    assert redis_client.get(lk.token) == b"mine"
    assert release(redis_client, lk, "mine") == 1
    assert redis_client.exists(lk.token) == 0
    assert release(redis_client, lk, "mine") == 0  # a second release touches nothing
    assert redis_client.get(lk.fence) == b"1"  # the fence outlives the lock


def test_extend_by_another_token_is_refused(redis_client, lk):
    acquire(redis_client, lk, "mine", 5_000)
    assert extend(redis_client, lk, "thief", 60_000) == 0
    assert redis_client.pttl(lk.token) <= 5_000
    assert extend(redis_client, lk, "mine", 60_000) == 1
    assert 59_000 < redis_client.pttl(lk.token) <= 60_000


def test_extend_never_recreates_a_lost_lock(redis_client, lk):
    acquire(redis_client, lk, "mine", 5_000)
    redis_client.delete(lk.token)  # as if its lease ran out
    assert extend(redis_client, lk, "mine", 60_000) == 0
    assert redis_client.exists(lk.token) == 0
