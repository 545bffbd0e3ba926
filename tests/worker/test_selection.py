"""``worker.selection``: how a fetch round splits its free slots over several queues."""

from __future__ import annotations

from collections import Counter

import pytest

from batchq.worker import WorkerSettings
from batchq.worker.selection import Selector

pytestmark = pytest.mark.unit


def _take(sel: Selector, free: int, has_work: set[int], among: list[int] | None = None
          ) -> dict[int, int]:
    """One round against queues of which ``has_work`` always fill what they are asked."""
    got = {}
    for i, want in sel.plan(free, among):
        n = want if i in has_work else 0
        sel.came_back(i, want, n)
        got[i] = n
    return got


def test_rotation_splits_evenly_and_rotates() -> None:
    sel = Selector(2, "rotate", (), 100)
    plans = [sel.plan(10) for _ in range(2)]
    assert plans == [[(1, 5), (0, 5)], [(0, 5), (1, 5)]]
    assert sel.plan(1) in ([(0, 1), (1, 0)], [(1, 1), (0, 0)])


@pytest.mark.parametrize("free", [1, 3, 10, 64, 300])
def test_weights_hold_on_average_whatever_the_round_size(free: int) -> None:
    sel = Selector(2, "rotate", (3, 1), 100)
    total: Counter[int] = Counter()
    for _ in range(400):
        total.update(_take(sel, free, {0, 1}))
    share = total[0] / (total[0] + total[1])
    assert 0.72 <= share <= 0.78, total


def test_a_dry_heavy_queue_is_only_probed_and_comes_back_at_once() -> None:
    sel = Selector(2, "rotate", (9, 1), 100)
    _take(sel, 50, {1})  # queue 0 found empty: dry
    got = _take(sel, 50, {1})
    assert got[1] == 49  # everything but the probe goes to the queue with work
    got = _take(sel, 50, {0, 1})  # the probe comes back full: its share again
    got = _take(sel, 50, {0, 1})
    assert got[0] == 45 and got[1] == 5, got


def test_a_retry_asks_only_the_queues_not_asked_yet() -> None:
    sel = Selector(3, "rotate", (), 100)
    assert {i for i, _ in sel.plan(5, [2])} == {2}
    assert sel.plan(5, [2]) == [(2, 5)]
    sel = Selector(2, "rotate", (9, 1), 100)
    assert sel.plan(4, [1]) == [(1, 4)]


def test_settings_refuse_bad_orders_and_weights() -> None:
    with pytest.raises(ValueError, match="order"):
        WorkerSettings(queues=("a",), order="sideways")
    with pytest.raises(ValueError, match="one weight per queue"):
        WorkerSettings(queues=("a", "b"), weights=(1,))
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        WorkerSettings(queues=("a", "b"), weights=(0, 1))
    with pytest.raises(ValueError, match="strict"):
        WorkerSettings(queues=("a", "b"), order="strict", weights=(3, 1))
    WorkerSettings(queues=("a", "b"), order="strict")
    WorkerSettings(queues=("a", "b"), weights=(3, 1))
