"""Durations Redis cannot take, and a result write Redis refuses.

Fixed: ``result_ttl_s=1e17`` was accepted; Redis refused the expiry (1e20 ms is not a
64-bit integer), every write of the result failed, the job stayed reserved for ever
while the worker re-sent the write for ever, and it ran again on every restart. Now
every TTL, lease, hold, timeout and retry delay of the API goes through one check
(``batchq.tasks.durations``: at most ten years) where it is given; and a result write that
Redis refuses ends its job dead as ``result_refused``, the other results of the same
write kept, the worker serving on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from fixtures.misuse import misuse  # noqa: F401 - the fixture

import batchq
from batchq.tasks.durations import MAX_DURATION_S

pytestmark = pytest.mark.fault

HUGE = 1e17


def _app() -> batchq.App:
    return batchq.App("redis://127.0.0.1:1/0", namespace="unit")  # never reached


def _task(**options: Any) -> Callable[[], object]:
    return lambda: _app().task(name="t", **options)(lambda: None)


def _periodic(**options: Any) -> Callable[[], object]:
    return lambda: _app().periodic(name="p", **options)(lambda: None)


REFUSED: list[tuple[str, Callable[[], object]]] = [
    ("result_ttl_s", _task(result_ttl_s=HUGE)),
    ("key_ttl_s", _task(key_ttl_s=HUGE)),
    ("timeout_s", _task(timeout_s=HUGE)),
    ("retry_backoff_s", _task(retry_backoff_s=HUGE)),
    ("retry_backoff_max_s", _task(retry_backoff_max_s=HUGE)),
    ("max_hold_s", _task(max_hold_s=86401)),
    ("max_hold_s", _task(max_hold_s=0.0)),
    ("max_refunds", _task(max_refunds=-1)),
    ("key_ttl_s", lambda: _app().task(name="t")(lambda: None).options(key_ttl_s=HUGE)),
    ("ttl_s", lambda: _app().lock("l", ttl_s=HUGE)),
    ("blocking_timeout_s", lambda: _app().lock("l", blocking_timeout_s=HUGE)),
    ("campaign_ttl_s", lambda: _app().campaign("c", campaign_ttl_s=1e9)),
    ("every_s", _periodic(every_s=HUGE)),
    ("grace_s", _periodic(every_s=5, grace_s=HUGE)),
    ("delay_s", lambda: batchq.Retry(delay_s=HUGE)),
    ("delay_s", lambda: batchq.Retry(delay_s=math.nan)),
    ("timeout_s", lambda: _app().result("x-0", timeout_s=HUGE)),
]


@pytest.mark.parametrize(("named", "make"), REFUSED,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(REFUSED)])
def test_a_duration_redis_cannot_take_is_refused_where_it_is_given(
        named: str, make: Callable[[], object]) -> None:
    with pytest.raises((TypeError, ValueError), match=named):
        make()


def test_ten_years_is_accepted_everywhere() -> None:
    app = _app()
    t = app.task(name="t", result_ttl_s=MAX_DURATION_S, key_ttl_s=MAX_DURATION_S,
                 timeout_s=MAX_DURATION_S, retry_backoff_max_s=MAX_DURATION_S)(lambda: None)
    t.options(key_ttl_s=MAX_DURATION_S, delay_s=MAX_DURATION_S)
    app.lock("l", ttl_s=MAX_DURATION_S, blocking_timeout_s=MAX_DURATION_S)
    batchq.Retry(delay_s=MAX_DURATION_S)
    assert t.result_ttl_ms == MAX_DURATION_S * 1000


def test_a_result_redis_refuses_ends_its_job_dead_and_the_rest_is_kept(
        misuse: Fleet) -> None:  # noqa: F811
    """``huge_ttl``'s TTL was changed past the decorator's check to 1e17 s. Before, the
    burst run never ended (the job reserved, the write re-sent for ever); now it is
    dead as ``result_refused`` with Redis's words, and the results written in the same
    flush are kept."""
    app = misuse.app
    kept = {f"k{i}": app.tasks["kept"].enqueue(f"k{i}") for i in range(20)}
    huge = app.tasks["huge_ttl"].enqueue("huge")
    proc = misuse.drain("-q", "kept", "-c", "30", timeout_s=30)
    dead = app.queue("kept").dead_jobs()
    assert [(d.id, d.reason) for d in dead] == [(huge, "result_refused")]
    assert "refused to keep the result" in dead[0].error_message
    assert dead[0].attempts == 1  # not run again: the refusal is final
    for tok, jid in kept.items():
        assert app.result(jid, timeout_s=5) == f"value-{tok}"
    with pytest.raises(batchq.JobDead, match="result_refused"):
        app.result(huge, timeout_s=5)
    report = misuse.check([*kept, "huge"], queues=("kept",))
    assert report.valid and not report.lost, report.details()
    assert report.dead == 1
    results = {app.keys("kept").result(jid).encode() for jid in kept.values()}
    assert [p for p in misuse.leftovers(("kept",))
            if not any(repr(k) in p for k in results)] == []  # the results, kept 60 s
    assert proc.read_log().count("writing results failed") == 0
