"""``app.result`` of a job whose task keeps no result.

Fixed: ``app.result(jid, timeout_s=8)`` for a task without ``result_ttl_s`` waited the
full 8 s and raised ``TimeoutError`` "still ready" although the job had finished long
before: the plain ack announces nothing, the waiter read the state again only every
10 s, and it made no last read before giving up. Now a job whose queue's tasks keep no
result is refused at once (``ResultNotKept``, a ``KeyError``); one on a queue where some
tasks keep results and some do not is read again every 0.5 s; and the state is always
read once more at the deadline, so a settled job is never reported as still waiting.
"""

from __future__ import annotations

import asyncio

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from fixtures.misuse import misuse  # noqa: F401 - the fixture

import batchq

pytestmark = pytest.mark.fault

TIMEOUT_S = 8.0


def test_a_task_without_results_is_refused_at_once_not_after_the_timeout(
        misuse: Fleet) -> None:  # noqa: F811
    app = misuse.app
    waiting = app.tasks["plain"].enqueue("w0")
    # before any worker: refused at once too, naming the state and the remedy
    with pytest.raises(batchq.ResultNotKept, match=r"is ready: .*no result_ttl_s") as err:
        app.result(waiting, timeout_s=TIMEOUT_S)
    assert isinstance(err.value, KeyError) and err.value.state == "ready"

    done = [app.tasks["plain"].enqueue(f"p{i}") for i in range(3)]
    misuse.drain("-q", "plain", "-c", "4", timeout_s=30)
    for jid in done:
        with pytest.raises(batchq.ResultNotKept, match=r"unknown .*finished"):
            app.result(jid, timeout_s=TIMEOUT_S)
    with pytest.raises(batchq.ResultNotKept):
        asyncio.run(_aresult(app, done[0]))
    report = misuse.check(["w0", "p0", "p1", "p2"], queues=("plain",))
    assert report.valid and not report.lost, report.details()
    assert misuse.leftovers(("plain",)) == []


def test_a_job_that_may_keep_no_result_is_answered_once_it_is_settled(
        misuse: Fleet) -> None:  # noqa: F811
    """Queue ``mixed`` has a task of each kind: the waiter cannot tell, and reads the
    state again until the plain job is gone (KeyError "unknown"), well before the
    timeout; a kept result still comes through the channel."""
    app = misuse.app
    plain = app.tasks["mixed_plain"].enqueue("m0")
    kept = app.tasks["mixed_kept"].enqueue("m1")
    proc = misuse.start("-q", "mixed", "-c", "2", wait_ready=True)
    misuse.wait_completed(["m0", "m1"])
    with pytest.raises(KeyError, match="unknown") as err:
        app.result(plain, timeout_s=TIMEOUT_S)
    assert not isinstance(err.value, batchq.ResultNotKept)  # the app could not tell
    assert app.result(kept, timeout_s=TIMEOUT_S) == "m1"

    # enqueued while the waiter waits: it returns once the job is acked, long before
    # the timeout (a TimeoutError here is the old behaviour)
    later = app.tasks["mixed_plain"].options(delay_s=1).enqueue("m2")
    with pytest.raises(KeyError, match="unknown"):
        asyncio.run(_aresult(app, later))
    assert proc.poll() is None
    report = misuse.check(["m0", "m1", "m2"], queues=("mixed",))
    assert report.valid and not report.lost, report.details()


async def _aresult(app: batchq.App, jid: str) -> object:
    try:
        return await app.aresult(jid, timeout_s=TIMEOUT_S)
    finally:
        await app.aclose()
