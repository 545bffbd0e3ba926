"""batchq.store.keys: one hash tag (one cluster slot) per queue, name checks, ready order."""

from __future__ import annotations

import dataclasses

import pytest

from batchq.store.keys import (
    MAX_PRIORITY,
    PRIORITIES,
    QueueKeys,
    queues_key,
    worker_info_key,
    workers_key,
)

pytestmark = pytest.mark.unit


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM) as the Redis Cluster specification defines it."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: bytes) -> int:
    """HASH_SLOT per the spec: the hash tag between the first '{' and the next '}'."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc16(key) % 16384


def hash_tag(key: str) -> str | None:
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    return key[start + 1 : end] if end > start + 1 else None


def test_crc16_matches_the_spec_check_value():
    assert crc16(b"123456789") == 0x31C3
    assert key_slot(b"123456789") == 12739
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers")
    assert key_slot(b"foo{}{bar}") == crc16(b"foo{}{bar}") % 16384
    assert key_slot(b"foo{{bar}}zap") == crc16(b"{bar") % 16384


def test_crc16_agrees_with_redis_py():
    crc = pytest.importorskip("redis.crc")
    for key in (b"a", b"batchq:{batchq:default}:ready:9", b"{x}y", b"\xff\x00"):
        assert key_slot(key) == crc.key_slot(key)


@pytest.mark.parametrize(("namespace", "queue"), [
    ("batchq", "default"),
    ("ns1", "emails"),
    ("prod-eu", "sms.high_priority"),
    ("n", "q"),
    ("ünï", "cödé"),
])
def test_all_keys_of_a_queue_share_one_hash_tag_and_slot(namespace, queue):
    k = QueueKeys(namespace, queue)
    keys = k.all()
    # every key attribute of the dataclass is listed by all(), each once, but the
    # periodic schedules (kept out so that Queue.clear does not reset them) and the
    # prefix of the per-job channels (not a key), the sequence counter (a reset could
    # hand out numbers twice), the waiters flag (it expires) and the limits (settings,
    # like the schedules), and the job events' config and stream
    named = {getattr(k, f.name) for f in dataclasses.fields(k)
             if f.name not in ("namespace", "queue", "prefix", "ready", "periodic", "done",
                               "seq", "waiters", "limits", "evconf", "events")}
    assert set(keys) == named | set(k.ready)
    assert k.periodic not in keys and hash_tag(k.periodic) == f"{namespace}:{queue}"
    assert k.limits not in keys and hash_tag(k.limits) == f"{namespace}:{queue}"
    # the job events' config and stream: a setting and a history, kept by clear
    for key in (k.evconf, k.events):
        assert key not in keys and hash_tag(key) == f"{namespace}:{queue}"
    assert len(keys) == len(set(keys)) == PRIORITIES + len(named)
    assert {hash_tag(key) for key in keys} == {f"{namespace}:{queue}"}
    assert len({key_slot(key.encode()) for key in keys}) == 1
    for key in keys:
        assert key.startswith(f"{namespace}:"), key


def test_different_queues_use_different_tags():
    a, b = QueueKeys("ns", "a"), QueueKeys("ns", "b")
    assert hash_tag(a.ready[0]) != hash_tag(b.ready[0])
    assert not set(a.all()) & set(b.all())
    assert not set(QueueKeys("ns1", "q").all()) & set(QueueKeys("ns2", "q").all())


def test_key_layout():
    k = QueueKeys("ns", "q")
    assert k.prefix == "ns:{ns:q}"
    assert k.delayed == "ns:{ns:q}:delayed"
    assert k.reserved == "ns:{ns:q}:reserved"
    assert k.inflight == "ns:{ns:q}:inflight"
    assert k.dead == "ns:{ns:q}:dead"
    assert k.dead_jobs == "ns:{ns:q}:dead:jobs"
    assert k.wake == "ns:{ns:q}:wake"
    assert k.paused == "ns:{ns:q}:paused"
    assert k.stats == "ns:{ns:q}:stats"


def test_ready_lists_are_ordered_9_down_to_0():
    k = QueueKeys("ns", "q")
    assert len(k.ready) == PRIORITIES == MAX_PRIORITY + 1
    assert k.ready == tuple(f"ns:{{ns:q}}:ready:{p}" for p in range(9, -1, -1))
    for p in range(PRIORITIES):
        assert k.ready_for(p) == f"ns:{{ns:q}}:ready:{p}"
        assert k.ready[MAX_PRIORITY - p] == k.ready_for(p)


@pytest.mark.parametrize("bad", ["", "a:b", "a{b", "a}b", "{q}", "a b", "a\tb", "a\nb",
                                 "a\rb", ":"])
def test_invalid_queue_names_are_rejected(bad):
    with pytest.raises(ValueError, match="invalid queue name"):
        QueueKeys("ns", bad)


def test_queue_keys_are_immutable():
    k = QueueKeys("ns", "q")
    with pytest.raises(AttributeError):
        k.delayed = "x"  # type: ignore[misc]


def test_cross_queue_keys_are_outside_any_tag():
    for key in (queues_key("ns"), workers_key("ns"), worker_info_key("ns", "w1")):
        assert hash_tag(key) is None
    assert queues_key("ns") == "ns:queues"
    assert workers_key("ns") == "ns:workers"
    assert worker_info_key("ns", "w1") == "ns:worker:w1"
