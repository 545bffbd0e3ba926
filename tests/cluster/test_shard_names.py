"""Sharded queues without Redis: shard names, stable routing, the per-process table, and
how a fetch round plans its pops over a sharded queue's shards."""

from __future__ import annotations

import pytest

from batchq.store import shards
from batchq.store.keys import MAX_SHARDS, QueueKeys, shard_name, split_shard
from batchq.worker.selection import Selector

pytestmark = pytest.mark.unit


def test_shard_names_round_trip_and_never_collide_with_queue_names() -> None:
    assert shard_name("emails", 0) == "emails"
    assert shard_name("emails", 3) == "emails:s3"
    assert split_shard("emails:s3") == ("emails", 3)
    assert split_shard("emails") == ("emails", 0)
    # a user's queue name has no colon, so it is never a shard name
    for bad in ("emails:s0", "emails:s01", f"emails:s{MAX_SHARDS}", "emails:x1", "a:b",
                "emails:s", "e{x}:s1", ":s1"):
        with pytest.raises(ValueError):
            split_shard(bad)
    k = QueueKeys("ns", "emails:s3")
    assert k.prefix == "ns:{ns:emails:s3}"
    assert QueueKeys("ns", "emails").prefix == "ns:{ns:emails}"  # shard 0: today's keys


def test_stable_routing_is_the_same_everywhere() -> None:
    assert shards.stable("tenant-a", 8) == shards.stable("tenant-a", 8)
    assert shards.stable("anything", 1) == 0
    spread = {shards.stable(f"g{i}", 8) for i in range(200)}
    assert spread == set(range(8))


def test_a_table_keeps_one_count_per_queue_and_rotates() -> None:
    t = shards.ShardTable()
    t.configure("emails", 4)
    t.configure("emails", 4)
    with pytest.raises(ValueError, match="already configured"):
        t.configure("emails", 8)
    with pytest.raises(ValueError):
        t.configure("emails", MAX_SHARDS + 1)
    assert t.count("emails") == 4 and t.count("other") == 1
    turns = [t.turn("emails", 4) for _ in range(8)]
    assert sorted(turns) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert shards.expand(["emails", "other", "x:s2"], t, {"other": 2}) == [
        "emails", "emails:s1", "emails:s2", "emails:s3", "other", "other:s1", "x:s2"]


def _plan(sel: Selector, free: int, among: list[int] | None = None) -> dict[int, int]:
    return dict(sel.plan(free, among))


def test_a_round_asks_as_few_shards_as_carry_the_share_in_turn() -> None:
    sel = Selector(1, "rotate", (), 100, shards=[[0, 1, 2, 3]])
    # whole pops of fetch_batch: 250 jobs of room ask two shards for 100 each, as an
    # unsharded queue would pop 100 at a time; the 50 left are the next round's
    first = _plan(sel, 250)
    assert sorted(first.values()) == [100, 100]
    for s, want in first.items():
        sel.came_back(s, want, want)
    second = _plan(sel, 80)
    assert len(second) == 1 and sum(second.values()) == 80
    # the turn moved on: over a few rounds every shard is asked
    seen = set(first) | set(second)
    for _ in range(4):
        seen |= set(_plan(sel, 80))
    assert seen == {0, 1, 2, 3}


def test_an_empty_shard_is_probed_not_waited_for() -> None:
    sel = Selector(1, "rotate", (), 100, shards=[[0, 1, 2, 3]])
    for s in (0, 1, 2):
        sel.came_back(s, 10, 10)
    sel.came_back(3, 10, 0)  # shard 3 came back short
    for _ in range(4):
        plan = _plan(sel, 100)
        assert sum(plan.values()) == 100
        # the full shards carry the round; the short one gets a probe of one job
        assert plan.get(3, 0) <= 1
    plans = [_plan(sel, 100) for _ in range(4)]
    assert any(p.get(3) == 1 for p in plans)


def test_when_every_shard_came_back_short_all_are_asked_at_once() -> None:
    sel = Selector(1, "rotate", (), 100, shards=[[0, 1, 2, 3]])
    for s in range(4):
        sel.came_back(s, 10, 0)
    assert sorted(_plan(sel, 100)) == [0, 1, 2, 3]
    # a retry after a round that found nothing asks only those not asked yet
    assert set(_plan(sel, 100, among=[2, 3])) == {2, 3}


def test_a_sharded_queue_is_one_queue_among_others() -> None:
    # queue 0: 4 shards (sub-queues 0..3), queue 1: plain (sub-queue 4)
    sel = Selector(2, "rotate", (), 100, shards=[[0, 1, 2, 3], [4]])
    plan = _plan(sel, 200)
    assert plan[4] == 100
    assert sum(v for s, v in plan.items() if s != 4) == 100
    # beside another queue its share stands, whole pops or not: 350 of 700 over its shards
    plan = _plan(Selector(2, "rotate", (), 100, shards=[[0, 1, 2, 3], [4]]), 700)
    assert sum(v for s, v in plan.items() if s != 4) == 350 and plan[4] == 100
    # weights are per queue, not per shard
    wsel = Selector(2, "rotate", (3, 1), 100, shards=[[0, 1, 2, 3], [4]])
    totals = [0, 0]
    for _ in range(50):
        for s, want in wsel.plan(40):
            totals[0 if s < 4 else 1] += want
            wsel.came_back(s, want, want)
    assert 2.7 < totals[0] / totals[1] < 3.3, totals


def test_strict_order_takes_each_queue_s_shards_in_turn() -> None:
    sel = Selector(2, "strict", (), 100, shards=[[0, 1], [2]])
    assert sel.strict_order() == [0, 1, 2]
    assert sel.strict_order() == [1, 0, 2]
