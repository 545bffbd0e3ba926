"""Issue 10: handlers that raise a BaseException that is not an Exception.

``GeneratorExit``, a custom ``BaseException`` subclass, ``KeyboardInterrupt``,
``SystemExit`` (``sys.exit(0)`` and ``sys.exit(3)``) and a ``CancelledError`` nobody
asked for, from async, sync (thread pool) and batch handlers. Decided: each is a failed
attempt (retried, then dead-lettered as ``failed`` with its type), and the runner keeps
serving; a handler cannot stop the worker. Every job ends succeeded, retried or dead, a
burst run (single process and ``-p 1``) exits 0 only with its queues empty.
"""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet

pytestmark = pytest.mark.fault

KINDS = ("generator_exit", "custom", "keyboard", "exit0", "exit3", "cancelled")


def _enqueue(fleet: Fleet, always: bool) -> tuple[list[str], list[str]]:
    """Hostile jobs of every kind through every handler shape, and healthy ones around
    them; returns (hostile tokens, healthy tokens)."""
    app = fleet.app
    hostile: list[str] = []
    for kind in KINDS:
        for shape in ("async", "sync", "batch"):
            tok = f"{shape}-{kind}"
            hostile.append(tok)
            if shape == "batch":
                mode = f"raise:{kind}:always" if always else f"raise:{kind}"
                app.tasks["work"].options(max_attempts=2).enqueue(tok, 0.0, mode)
            else:
                app.tasks[f"hostile_{shape}"].enqueue(tok, kind, always)
    healthy = [f"h{i}" for i in range(40)]
    app.tasks["work"].enqueue_many([(t, 0.01) for t in healthy])
    return hostile, healthy


@pytest.mark.parametrize("flags", [("-c", "2"), ("-p", "1", "-c", "2")],
                         ids=["single", "p1"])
def test_hostile_handlers_fail_their_attempt_and_the_worker_keeps_serving(
        fleet: Fleet, flags: tuple[str, ...]) -> None:
    """Fixed: such a handler killed its runner coroutine without a log line; the job
    stayed reserved with its lease extended for ever, ``-c 2`` wedged the worker and
    ``--burst`` never exited; ``sys.exit(0)`` made a burst run exit 0 with jobs still
    reserved."""
    hostile, healthy = _enqueue(fleet, always=False)
    proc = fleet.drain(*flags, "--lease-s", "5", timeout_s=40)
    report = fleet.check(hostile + healthy)
    print(f"\nchecker: {report.summary()}")
    assert report.valid, report.details()
    assert report.dead == 0, fleet.app.queue("default").dead_jobs()[:3]  # failed, then ok
    runs = fleet.runs()
    for tok in hostile:
        mine = [r for r in runs if r.token == tok]
        assert [r.completed for r in mine] == [False, True], (tok, mine)
    assert fleet.leftovers(allow_dead=False) == []
    log = proc.read_log()
    assert "a handler cannot stop the worker" in log


def test_a_handler_that_always_exits_is_dead_lettered_with_its_type(fleet: Fleet) -> None:
    """Fixed (as above): now every attempt fails and the jobs end dead as ``failed``,
    the error type kept; the burst run exits 0 once the queue is really empty."""
    hostile, healthy = _enqueue(fleet, always=True)
    fleet.drain("-c", "2", "--lease-s", "5", timeout_s=40)
    dead = {d.args[0]: d for d in fleet.app.queue("default").dead_jobs()}
    assert set(dead) == set(hostile)
    for tok, d in dead.items():
        kind = tok.split("-", 1)[1]
        want = {"generator_exit": "GeneratorExit", "custom": "HandlerBaseException",
                "keyboard": "KeyboardInterrupt", "exit0": "SystemExit",
                "exit3": "SystemExit", "cancelled": "CancelledError"}[kind]
        assert (d.reason, d.error_type, d.attempts) == ("failed", want, 2), d
    report = fleet.check(hostile + healthy)
    assert report.valid, report.details()
    assert report.dead == len(hostile) and not report.lost
    assert fleet.leftovers() == []
