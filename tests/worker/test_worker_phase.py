"""A worker's life as one phase: only ``State``'s methods change it, only forward
(``RUNNING`` and ``ALONE`` aside), and a move the table does not list raises."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import batchq
from batchq.worker import WorkerSettings
from batchq.worker.phase import MOVES, Phase, PhaseError, StopReason
from batchq.worker.state import State

pytestmark = pytest.mark.unit


@pytest.fixture
def st() -> Iterator[State]:
    app = batchq.App("redis://127.0.0.1:1/0", namespace="phase")  # never connected
    state = State(app, WorkerSettings(queues=("q",)), "w1")
    # what State.open makes on the loop, without the clients
    state.stop_event, state.room, state.closed = asyncio.Event(), asyncio.Event(), \
        asyncio.Event()
    yield state
    app.close()


def test_a_stop_drains_then_closes_and_keeps_its_first_reason(st: State) -> None:
    assert (st.phase, st.reason, st.stopping, st.closing) == (Phase.RUNNING, None, False,
                                                              False)
    assert st.stop(StopReason.RECYCLED) is True
    assert (st.phase, st.reason, st.recycled, st.stopping) == (
        Phase.DRAINING, StopReason.RECYCLED, True, True)
    assert st.stop_event.is_set() and st.room.is_set()
    assert st.stop(StopReason.ENDED) is False  # the loop's own end changes nothing
    assert (st.phase, st.reason) == (Phase.DRAINING, StopReason.RECYCLED)
    assert st.stop(StopReason.REQUESTED, fast=True) is False  # hurried, not begun again
    assert st.phase is Phase.HURRYING
    st.close()
    assert st.closing and st.closed.is_set()
    assert st.stop(StopReason.REQUESTED, fast=True) is False  # too late: nothing moves
    assert st.phase is Phase.CLOSING
    with pytest.raises(PhaseError):
        st.close()


def test_a_fast_stop_hurries_at_once(st: State) -> None:
    assert st.stop(StopReason.MEMORY, fast=True) is True
    assert (st.phase, st.reason) == (Phase.HURRYING, StopReason.MEMORY)


def test_a_recovered_job_runs_alone_and_a_stop_meanwhile_keeps_its_phase(st: State) -> None:
    st.run_alone()
    assert st.phase is Phase.ALONE and not st.stopping
    st.end_alone()
    assert st.phase is Phase.RUNNING
    with pytest.raises(PhaseError):
        st.end_alone()  # not begun
    st.run_alone()
    st.stop(StopReason.REQUESTED)
    st.end_alone()  # the job ends during the drain: the stop goes on
    assert st.phase is Phase.DRAINING
    with pytest.raises(PhaseError):
        st.run_alone()  # no job starts once draining


def test_illegal_moves_raise_and_the_flags_cannot_be_set(st: State) -> None:
    with pytest.raises(PhaseError):
        st.close()  # closing comes only after a stop
    assert st.phase is Phase.RUNNING
    for flag in ("phase", "stopping", "closing", "paused", "recycled"):
        with pytest.raises(AttributeError):
            setattr(st, flag, True)
    # the table: forward only, RUNNING and ALONE taking turns
    for frm, tos in MOVES.items():
        assert all(to > frm or {frm, to} == {Phase.RUNNING, Phase.ALONE} for to in tos)
    assert MOVES[Phase.CLOSING] == frozenset()


def test_pausing_is_a_flag_of_its_own(st: State) -> None:
    assert st.pause(True) is True and st.paused and st.room.is_set()
    st.room.clear()
    assert st.pause(True) is False and not st.room.is_set()  # no change, no wake-up
    st.stop(StopReason.REQUESTED)
    assert st.paused and st.pause(False) is True and not st.paused
