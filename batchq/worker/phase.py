"""The life of one worker process as one value: its phase, and why it stops.

``State.phase`` says at once whether the worker fetches and starts jobs, runs a recovered
job alone, drains, hurries or closes; ``State.reason`` why it stops. Whether fetching is
paused is a flag of its own (``State.paused``): a worker may be paused in any phase.
The phase only moves forward, ``RUNNING`` and ``ALONE`` aside (they take turns), and only
through ``State``'s methods, which raise ``PhaseError`` on a change ``MOVES`` does not
list: ``RUNNING``/``ALONE`` -> ``DRAINING`` (a stop) or ``HURRYING`` (a fast stop);
``DRAINING`` -> ``HURRYING`` (a second request); either -> ``CLOSING`` (stop step 4).
"""

from __future__ import annotations

import enum


class Phase(enum.IntEnum):
    """Where one worker process is in its life. It only moves forward (``RUNNING`` and
    ``ALONE`` aside, which take turns), through the ``State`` methods that change it."""

    RUNNING = 0
    """Fetching (unless paused) and starting jobs."""
    ALONE = 1
    """As ``RUNNING``, but a recovered job waits for, or runs in, a process of its own:
    no runner starts another job meanwhile (``run.Runners``)."""
    DRAINING = 2
    """A stop began (stop step 1): nothing is fetched or started; running jobs may
    finish within ``shutdown_timeout_s``."""
    HURRYING = 3
    """A fast stop (or a second stop request): running jobs are cancelled now."""
    CLOSING = 4
    """Stop step 4: the helper loops end, their pauses cut short."""


class StopReason(enum.Enum):
    """Why a worker stops (``State.reason``: the first reason given wins)."""

    REQUESTED = "requested"
    """A signal, ``Worker.request_stop``, or the supervisor gone."""
    RECYCLED = "recycled"
    """``max_jobs`` jobs ran (exit ``EXIT_RECYCLED``)."""
    MEMORY = "memory"
    """The RSS passed ``max_memory_mb`` (exit ``EXIT_MEMORY``)."""
    ENDED = "ended"
    """The fetch loop ended by itself: a burst run done, or a crash."""


MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.RUNNING: frozenset({Phase.ALONE, Phase.DRAINING, Phase.HURRYING}),
    Phase.ALONE: frozenset({Phase.RUNNING, Phase.DRAINING, Phase.HURRYING}),
    Phase.DRAINING: frozenset({Phase.HURRYING, Phase.CLOSING}),
    Phase.HURRYING: frozenset({Phase.CLOSING}),
    Phase.CLOSING: frozenset(),
}
"""The legal changes of ``State.phase``."""


class PhaseError(RuntimeError):
    """A change of ``State.phase`` the worker's life does not allow (a bug)."""
