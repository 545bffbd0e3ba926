"""Circuit breakers shared by the fleet: ``app.breaker("twilio", failures=20, within_s=10,
open_s=30, half_open_jobs=3)`` defines one, ``async with app.breaker("twilio"):`` (or
``with``) runs a provider call behind it.

The state lives in Redis under the breaker's own hash tag (``keys.breaker_keys``), so
every process of every machine sees one breaker: closed, open until a time of the
server's clock, or half-open. Each change is one script: ``breaker_enter.lua`` (a call
goes, is refused, or goes as a half-open probe), ``breaker_failure.lua`` (a failure
counted in the window; the trip), ``breaker_success.lua`` (a probe succeeded; the
close), ``breaker_set.lua`` (an operator opens or closes it) and the read
``breaker_state.lua``. An exception of the configured types raised inside the block
counts as a failure; a call refused raises ``BreakerOpen`` before the block runs.

A process keeps what it last saw: an open breaker refuses without a round trip until
its open time ends, and a closed one is read again at most every ``CLOSED_CACHE_S``, so
a call behind a closed breaker costs no round trip most of the time; only failures and
probes always write. Tasks bound to a breaker (``@app.task(breaker=...)``) are held or
re-routed by the worker while it is open (``batchq.worker.breakers``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..store import codec
from ..store.clients import Clients
from ..store.keys import BreakerKeys, breaker_keys
from ..store.scripts import calls
from ..tasks.errors import BatchqError

if TYPE_CHECKING:
    from ..tasks.task import Task

log = logging.getLogger("batchq.breaker")

MAX_NAME_BYTES = 64
"""The longest breaker name (it names keys and a metrics label)."""

CLOSED_CACHE_S = 0.1
"""A closed breaker is read from Redis at most this often per process."""

STATES = ("closed", "open", "half_open")
"""The states, as ``batchq_breaker_state`` numbers them (0, 1, 2)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]*")
_mono = time.monotonic


class BreakerOpen(BatchqError):
    """A call behind an open (or half-open, every probe place taken) circuit breaker
    was refused before it ran. Raised from a handler, the worker holds its job (or
    re-routes it to its task's fallback): no attempt is charged."""

    def __init__(self, name: str, retry_after_s: float, message: str = "") -> None:
        super().__init__(message or f"circuit breaker {name!r} is open: retry in "
                         f"{retry_after_s:.3f}s")
        self.name = name
        self.retry_after_s = retry_after_s


def check_name(value: object) -> str:
    """A breaker name: 1..64 letters, digits or ``_ . @ + -``, else a clear error."""
    if not isinstance(value, str):
        raise TypeError(f"breaker name must be a str, got {type(value).__name__} {value!r}")
    if not _NAME.fullmatch(value) or len(value.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"invalid breaker name {value[:80]!r}: use 1..{MAX_NAME_BYTES} "
                         "letters, digits or '_.@+-', starting with a letter or digit")
    return value


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise ValueError(f"{name} must be an int in 1..1000000, got {value!r}")
    return value


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0.001 <= value <= 86400:
        raise ValueError(f"{name} must be a number of seconds in 0.001..86400, got "
                         f"{value!r}")
    return float(value)


@dataclass(frozen=True)
class BreakerConfig:
    """What ``app.breaker(name, ...)`` declared."""

    name: str
    failures: int = 20
    """Failures within ``within_s`` that open it."""
    within_s: float = 10.0
    open_s: float = 30.0
    """How long it stays open before it half-opens."""
    half_open_jobs: int = 3
    """Probes let through at once while half-open, and successes that close it."""
    exceptions: tuple[type[BaseException], ...] = (Exception,)
    """Exceptions raised inside the block that count as failures."""

    def __post_init__(self) -> None:
        check_name(self.name)
        _count("failures", self.failures)
        _seconds("within_s", self.within_s)
        _seconds("open_s", self.open_s)
        _count("half_open_jobs", self.half_open_jobs)
        if not isinstance(self.exceptions, tuple) or not self.exceptions or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in self.exceptions):
            raise TypeError(f"exceptions must be a non-empty tuple of exception types, got "
                            f"{self.exceptions!r}")


@dataclass(frozen=True)
class BreakerState:
    """One breaker as Redis has it now."""

    name: str
    state: str
    """closed, open or half_open."""
    open_left_s: float
    failures: int
    """Failures in the window (closed)."""
    probes: int
    """Probes in flight (half-open)."""
    succeeded: int
    """Probes that succeeded since it half-opened."""
    trips: int
    config: BreakerConfig

    def as_dict(self) -> dict[str, Any]:
        c = self.config
        return {"name": self.name, "state": self.state,
                "open_left_s": round(self.open_left_s, 3), "failures": self.failures,
                "probes": self.probes, "succeeded": self.succeeded, "trips": self.trips,
                "threshold": c.failures, "within_s": c.within_s, "open_s": c.open_s,
                "half_open_jobs": c.half_open_jobs}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Breaker:
    """One breaker of an app, shared by every call in this process; ``guard()`` (what
    ``app.breaker(name)`` returns) is the context manager of one call."""

    def __init__(self, clients: Clients, config: BreakerConfig) -> None:
        self.clients = clients
        self.config = config
        self.name = config.name
        self.keys: BreakerKeys = breaker_keys(clients.namespace, config.name)
        self._open_until = 0.0  # monotonic: open until then, as last seen
        self._closed_until = 0.0  # monotonic: taken as closed until then
        self._reading: asyncio.Future[BreakerState] | None = None
        """The read in flight (``aopen_left_s``): concurrent gates share it."""

    def guard(self) -> Guard:
        return Guard(self)

    # --- what this process saw ----------------------------------------------------------

    def open_left_s(self) -> float:
        """Seconds it stays open as this process last saw it (0: not known open)."""
        return max(0.0, self._open_until - _mono())

    def known_closed(self) -> bool:
        """Closed, as this process saw it less than ``CLOSED_CACHE_S`` ago."""
        return self._closed_until > _mono()

    def _known_closed(self) -> bool:
        return self._closed_until > _mono()

    def _seen_open(self, left_ms: Any) -> float:
        left_s = max(0.001, int(left_ms) / 1000)
        self._open_until = _mono() + left_s
        self._closed_until = 0.0
        return left_s

    def _seen_closed(self) -> None:
        self._closed_until = _mono() + CLOSED_CACHE_S
        self._open_until = 0.0

    def _entered(self, reply: Any) -> bool:
        """Read ``breaker_enter.lua``'s reply: True for a probe; raises ``BreakerOpen``."""
        code = int(reply[0])
        if code == 0:
            self._seen_closed()
            return False
        if code == 2:
            self._closed_until = 0.0
            return True
        if code == 1:
            raise BreakerOpen(self.name, self._seen_open(reply[1]))
        raise BreakerOpen(self.name, max(0.001, int(reply[1]) / 1000),
                          f"circuit breaker {self.name!r} is half-open and every probe "
                          "place is taken")

    def _failed(self, reply: Any) -> None:
        if int(reply[0]) == 1:
            self._seen_open(reply[1])
            if len(reply) > 2 and int(reply[2]):
                log.warning("circuit breaker %r opened for %.1fs", self.name,
                            self.config.open_s)
        else:
            self._closed_until = 0.0

    def counts(self, exc: BaseException) -> bool:
        """Does ``exc``, raised inside the block, count as a failure?"""
        return isinstance(exc, self.config.exceptions) and not isinstance(exc, BreakerOpen)

    # --- script calls -------------------------------------------------------------------

    def _enter_call(self, token: str) -> calls.Call:
        c = self.config
        return calls.breaker_enter(self.keys, c.half_open_jobs, round(c.open_s * 1000), token)

    def _failure_call(self, token: str) -> calls.Call:
        c = self.config
        return calls.breaker_failure(self.keys, c.failures, round(c.within_s * 1000),
                                     round(c.open_s * 1000), token)

    def _success_call(self, token: str) -> calls.Call:
        return calls.breaker_success(self.keys, self.config.half_open_jobs, token)

    def _state_call(self) -> calls.Call:
        return calls.breaker_state(self.keys, round(self.config.within_s * 1000))

    def _state_of(self, reply: Any) -> BreakerState:
        state = _text(reply[0])
        left_s = int(reply[1]) / 1000
        if state == "open":
            self._seen_open(reply[1])
        elif state == "closed":
            self._seen_closed()
        return BreakerState(self.name, state, left_s, int(reply[2]), int(reply[3]),
                            int(reply[4]), int(reply[5]), self.config)

    def state(self) -> BreakerState:
        """Its state now (one read)."""
        return self._state_of(self.clients.sync_scripts.call(self._state_call()))

    async def astate(self) -> BreakerState:
        """``state`` for asyncio code."""
        return self._state_of(await self.clients.async_scripts().call(self._state_call()))

    async def aopen_left_s(self) -> float:
        """Seconds it stays open (0: closed or half-open): what this process saw, read
        again when that is older than ``CLOSED_CACHE_S`` (the worker's gate)."""
        left = self.open_left_s()
        if left > 0 or self._known_closed():
            return left
        reading = self._reading
        if reading is None:  # one read at a time per process, whatever the concurrency
            reading = self._reading = asyncio.ensure_future(self.astate())
            reading.add_done_callback(self._read_done)
        st = await asyncio.shield(reading)
        return st.open_left_s if st.state == "open" else 0.0

    def _read_done(self, fut: asyncio.Future[BreakerState]) -> None:
        self._reading = None
        if not fut.cancelled():
            fut.exception()  # retrieved: the waiters got it

    def open(self, open_s: float | None = None) -> tuple[str, float]:
        """Open it now for ``open_s`` (default: its ``open_s``); returns the state it
        was in and the seconds it had left open."""
        ms = round(_seconds("open_s", self.config.open_s if open_s is None else open_s)
                   * 1000)
        before = self.clients.sync_scripts.call(calls.breaker_set(self.keys, "open", ms))
        self._seen_open(ms)
        return _text(before[0]), int(before[1]) / 1000

    def close(self) -> tuple[str, float]:
        """Close it now (failure window emptied); returns the state it was in and the
        seconds it had left open."""
        before = self.clients.sync_scripts.call(calls.breaker_set(self.keys, "close"))
        self._seen_closed()
        return _text(before[0]), int(before[1]) / 1000


class Guard:
    """One call behind a breaker: ``with`` / ``async with``. Entering raises
    ``BreakerOpen`` when the breaker refuses; an exception of its types raised inside
    counts as a failure; a half-open probe's clean exit counts as a success."""

    __slots__ = ("breaker", "probe", "token")

    def __init__(self, breaker: Breaker) -> None:
        self.breaker = breaker
        self.token = ""
        self.probe = False

    def __enter__(self) -> Guard:
        b = self.breaker
        left = b.open_left_s()
        if left > 0:
            raise BreakerOpen(b.name, left)
        if not b._known_closed():
            self.token = secrets.token_hex(8)
            self.probe = b._entered(b.clients.sync_scripts.call(b._enter_call(self.token)))
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        b = self.breaker
        if exc is not None and b.counts(exc):
            b._failed(b.clients.sync_scripts.call(b._failure_call(self.token or
                                                                  secrets.token_hex(8))))
        elif exc is None and self.probe and \
                int(b.clients.sync_scripts.call(b._success_call(self.token))[0]) == 0:
            b._seen_closed()

    async def __aenter__(self) -> Guard:
        b = self.breaker
        left = b.open_left_s()
        if left > 0:
            raise BreakerOpen(b.name, left)
        if not b._known_closed():
            self.token = secrets.token_hex(8)
            self.probe = b._entered(await b.clients.async_scripts().call(
                b._enter_call(self.token)))
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        b = self.breaker
        s = b.clients.async_scripts()
        if exc is not None and b.counts(exc):
            b._failed(await s.call(b._failure_call(self.token or secrets.token_hex(8))))
        elif exc is None and self.probe and \
                int((await s.call(b._success_call(self.token)))[0]) == 0:
            b._seen_closed()


def check_binding(tasks: dict[str, Task[..., Any]], breakers: dict[str, Breaker],
                  breaker: object, fallback: object, queue: str) -> tuple[str | None,
                                                                           str | None]:
    """``@app.task(breaker=..., fallback=...)`` resolved to names: the breaker must be
    defined (``app.breaker(name, ...)``) and the fallback a registered task (a ``Task``
    or its name) of the same queue, since a job is re-routed within its queue in one
    script. Else a clear error; nothing is registered."""
    if breaker is None:
        if fallback is not None:
            raise ValueError("fallback needs a breaker: @app.task(breaker=..., fallback=...)")
        return None, None
    name = check_name(breaker)
    if name not in breakers:
        raise ValueError(f"no breaker named {name!r}: define it first with "
                         f"app.breaker({name!r}, failures=..., within_s=..., open_s=...)")
    if fallback is None:
        return name, None
    fname = fallback if isinstance(fallback, str) else getattr(fallback, "name", None)
    if not isinstance(fname, str) or fname not in tasks or (
            not isinstance(fallback, str) and tasks[fname] is not fallback):
        raise ValueError(f"fallback {fallback!r} is not a task registered on this app "
                         "(register the fallback task first)")
    if tasks[fname].config.queue != queue:
        raise ValueError(f"fallback {fname!r} is on queue {tasks[fname].config.queue!r}, "
                         f"not {queue!r}: a job is re-routed within its queue")
    return name, fname


def retask(raw: bytes, task: str) -> bytes:
    """The body of entry ``raw`` for ``task``: the same arguments and options."""
    return codec.retask(raw.split(b":", 4)[4], task)


class BreakerCollector:
    """``batchq_breaker_state{name}`` (0 closed, 1 open, 2 half-open) and
    ``batchq_breaker_trips_total{name}`` of the app's breakers, read at scrape time;
    ``batchq_jobs_rerouted_total{queue,task}`` of its bound tasks."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        breakers: dict[str, Breaker] = getattr(self.app, "breakers", {})
        if not breakers:
            return
        state = GaugeMetricFamily("batchq_breaker_state", "Circuit breaker state: 0 closed, "
                                  "1 open, 2 half-open", labels=["name"])
        trips = CounterMetricFamily("batchq_breaker_trips", "Times the breaker opened on "
                                    "its own", labels=["name"])
        moved = CounterMetricFamily("batchq_jobs_rerouted", "Jobs re-routed to their "
                                    "task's fallback while its breaker was open",
                                    labels=["queue", "task"])
        try:
            for b in breakers.values():
                st = b.state()
                state.add_metric([b.name], STATES.index(st.state))
                trips.add_metric([b.name], st.trips)
            bound = [t for t in self.app.tasks.values() if t.config.breaker]
            r = self.app.clients.redis
            for t in bound:
                n = r.hget(self.app.keys(t.config.queue).stats, f"rerouted:{t.name}")
                moved.add_metric([t.config.queue, t.name], int(n or 0))
        except Exception as exc:  # the other collectors still answer
            log.warning("cannot read circuit breakers from Redis: %s", exc)
            return
        yield from (state, trips, moved)


def states(breakers: dict[str, Breaker]) -> list[BreakerState]:
    """The state of each breaker (CLI, console), by name."""
    return [breakers[name].state() for name in sorted(breakers)]
