"""``RateLimited`` misused by a handler: no ``retry_after_s``, a hold of 0, a hold of an
hour.

Fixed:

* a subclass whose ``__init__`` skipped ``super().__init__()``: the hold code read
  ``exc.retry_after_s`` outside its guard, the ``AttributeError`` burned the attempt and
  the job went dead with no hold applied. Now a missing or unusable ``retry_after_s``
  holds ``DEFAULT_HOLD_S`` (1 s), the attempt refunded;
* ``RateLimited(0)``: one job ran 2,947 times in 5 s and was never dead-lettered. Now a
  hold is at least ``MIN_HOLD_S`` (0.1 s), and after the task's ``max_refunds`` refunded
  runs in a row the next run counts as an attempt (dead as ``rate_limited`` on the last);
* ``RateLimited(3600)`` without a group held the queue for an hour. Now a handler's hold
  is at most the task's ``max_hold_s`` (300 s by default), and the log line says how to
  end it early (``batchq release``).
"""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from fixtures.misuse import misuse  # noqa: F401 - the fixture

from batchq.tasks.errors import DEFAULT_MAX_HOLD_S

pytestmark = pytest.mark.fault


def test_a_subclass_without_retry_after_holds_the_default_and_keeps_the_attempt(
        misuse: Fleet) -> None:  # noqa: F811
    """``max_attempts=1``: a burned attempt would make the job dead."""
    app = misuse.app
    app.tasks["rl_nosuper"].enqueue_many([("n0",), ("n1",)])
    proc = misuse.drain("-q", "rl", "-c", "2", timeout_s=30)
    assert app.queue("rl").dead_jobs() == []
    runs = [r for r in misuse.runs() if r.token == "n0"]
    assert [(r.attempt, r.completed) for r in runs] == [(1, False), (1, True)], runs
    assert "retry_after_s '<missing>' is not a number of seconds: the default hold" \
        in proc.read_log()
    report = misuse.check(["n0", "n1"], queues=("rl",))
    assert report.valid and not report.lost and report.dead == 0, report.details()
    assert misuse.leftovers(("rl",)) == []


def test_rate_limited_zero_is_held_and_its_refunds_run_out(misuse: Fleet) -> None:  # noqa: F811
    """``max_attempts=2, max_refunds=3``: 3 refunded runs, then one that counts, twice:
    8 runs, then dead as ``rate_limited`` (before: thousands, never dead)."""
    app = misuse.app
    jid = app.tasks["rl_zero"].enqueue("z0")
    proc = misuse.drain("-q", "rl", "-c", "1", timeout_s=30)
    (dead,) = app.queue("rl").dead_jobs()
    assert (dead.id, dead.reason, dead.error_type, dead.attempts) == \
        (jid, "rate_limited", "RateLimited", 2)
    runs = [r for r in misuse.runs() if r.token == "z0"]
    assert len(runs) == 8, runs
    assert [r.attempt for r in runs] == [1, 1, 1, 1, 2, 2, 2, 2]
    log = proc.read_log()
    assert log.count("(asked 0s; the shortest hold is 0.1s)") == 6
    assert log.count("rate limited 4 times in a row (max_refunds=3)") == 2
    report = misuse.check(["z0"], queues=("rl",))
    assert report.valid and not report.lost and report.dead == 1, report.details()
    assert misuse.leftovers(("rl",)) == []


def test_an_hour_long_hold_is_cut_to_max_hold_and_says_how_to_release_it(
        misuse: Fleet) -> None:  # noqa: F811
    app = misuse.app
    q = app.queue("rl")
    app.tasks["rl_long"].enqueue("hold0")
    proc = misuse.start("-q", "rl", "-c", "1", wait_ready=True)
    misuse.until(lambda: any(r.token == "hold0" for r in misuse.runs()), 20, "the first run")
    misuse.until(lambda: q.holds().queue_s > 0, 10, "the queue held")
    assert DEFAULT_MAX_HOLD_S - 30 < q.holds().queue_s <= DEFAULT_MAX_HOLD_S
    misuse.until(lambda: "to end the hold early" in proc.read_log(), 10, "the log line")
    assert ("its queue 'rl' is held for 300.0s (asked 3600s; the task's max_hold_s is "
            "300s); to end the hold early: batchq release MODULE:APP rl") in proc.read_log()
    app.tasks["rl_long"].enqueue("l1")  # held too
    assert q.release() > 0
    misuse.wait_completed(["hold0", "l1"])
    report = misuse.check(["hold0", "l1"], queues=("rl",))
    assert report.valid and not report.lost and report.dead == 0, report.details()
