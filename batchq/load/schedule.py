"""Open-loop load generation and latency histograms.

The engine sends job ``i`` at its *intended* time ``start + i / rate``, computed from the
schedule and never from when the previous send returned. A producer that stalls does
not slow the schedule down: the jobs that fell due meanwhile go out together as soon as
it can send again, and each keeps its intended time. Latencies measured from the
intended time therefore include the stall (no coordinated omission), and the lateness
of every send (actual minus intended) is recorded on its own.

``Histogram`` is an HDR-style log-linear histogram: exact below 256 µs, then 128 linear
sub-buckets per power of two (relative error below 0.8 %), sparse, mergeable and
serialisable, so millions of samples cost a few kilobytes.

A ``Profile`` is the offered rate over time, piecewise linear: constant, steps or a
ramp. Job ``i`` is due when the profile's cumulative count reaches ``i`` (closed form,
no drift). A schedule can be split between ``parts`` producers (part ``k`` sends jobs
``k, k + parts, ...``) and stopped early (``LoadState.stopped``).

This module imports nothing outside the standard library at module level: the benchmark
harness loads it by path into other interpreters (the peer queues' virtualenvs) that
do not have batchq installed. ``batchq bench load`` (``batchq.cli_bench``) drives it
against a user's own task.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PERCENTILES",
    "Histogram",
    "LoadState",
    "Profile",
    "aopen_loop",
    "open_loop",
    "percentile_keys",
]

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
"""The percentiles every latency report shows, followed by the maximum."""

_SUB_BITS = 7
_SUB = 1 << _SUB_BITS  # linear sub-buckets per power of two
_EXACT = 2 * _SUB  # values below this (in µs) have a bucket each


def percentile_keys() -> list[str]:
    """Column names of a latency report: ``p50``, ``p90``, ``p99``, ``p99.9``, ``max``."""
    return [f"p{p:g}" for p in PERCENTILES] + ["max"]


def _index(us: int) -> int:
    if us < _EXACT:
        return us
    shift = us.bit_length() - _SUB_BITS - 1
    return shift * _SUB + (us >> shift)


def _bounds(index: int) -> tuple[int, int]:
    """The lowest and highest value (µs) that fall in bucket ``index``."""
    if index < _EXACT:
        return index, index
    shift = index // _SUB - 1
    m = index - shift * _SUB
    return m << shift, ((m + 1) << shift) - 1


class Histogram:
    """Log-linear histogram of durations, recorded in seconds, stored in microseconds.

    Negative inputs (clock skew between processes) count as zero. Percentiles report
    the upper bound of the bucket that holds them, clamped to the exact maximum, so a
    reported value is never below the true one by more than the bucket width.
    """

    __slots__ = ("count", "counts", "max_us", "min_us", "sum_us")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.min_us = 0
        self.max_us = 0
        self.sum_us = 0

    def record(self, value_s: float, n: int = 1) -> None:
        us = max(0, round(value_s * 1e6))
        i = _index(us)
        self.counts[i] = self.counts.get(i, 0) + n
        if self.count == 0 or us < self.min_us:
            self.min_us = us
        if us > self.max_us:
            self.max_us = us
        self.count += n
        self.sum_us += us * n

    def record_many(self, values_s: Iterable[float]) -> None:
        for v in values_s:
            self.record(v)

    def merge(self, other: Histogram) -> None:
        if other.count == 0:
            return
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        if self.count == 0 or other.min_us < self.min_us:
            self.min_us = other.min_us
        self.max_us = max(self.max_us, other.max_us)
        self.count += other.count
        self.sum_us += other.sum_us

    def percentile_s(self, p: float) -> float:
        """The ``p``-th percentile (0..100) in seconds; 0.0 when empty."""
        if self.count == 0:
            return 0.0
        rank = max(1, math.ceil(p / 100.0 * self.count))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                hi = _bounds(i)[1]
                return min(max(hi, self.min_us), self.max_us) / 1e6
        return self.max_us / 1e6

    @property
    def max_s(self) -> float:
        return self.max_us / 1e6

    @property
    def mean_s(self) -> float:
        return self.sum_us / self.count / 1e6 if self.count else 0.0

    def summary_ms(self) -> dict[str, float]:
        """``{"p50": ms, ..., "max": ms}`` (see ``percentile_keys``)."""
        out = {f"p{p:g}": self.percentile_s(p) * 1000 for p in PERCENTILES}
        out["max"] = self.max_s * 1000
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "min_us": self.min_us, "max_us": self.max_us,
                "sum_us": self.sum_us, "buckets": {str(i): c for i, c in self.counts.items()}}

    @classmethod
    def from_buckets(cls, counts: dict[int, int], max_us: int | None = None,
                     sum_us: int = 0) -> Histogram:
        """A histogram from bucket counts alone (merged elsewhere): the minimum is its
        lowest bucket's lower bound, the maximum ``max_us`` or its highest bucket's upper
        bound."""
        h = cls()
        h.counts = {i: c for i, c in counts.items() if c > 0}
        h.count = sum(h.counts.values())
        if h.count:
            h.min_us = _bounds(min(h.counts))[0]
            top = _bounds(max(h.counts))[1]
            h.max_us = top if max_us is None else min(max_us, top)
            h.sum_us = sum_us
        return h

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        h = cls()
        h.count = int(data["count"])
        h.min_us = int(data["min_us"])
        h.max_us = int(data["max_us"])
        h.sum_us = int(data["sum_us"])
        h.counts = {int(i): int(c) for i, c in data["buckets"].items()}
        return h


@dataclass(frozen=True)
class Profile:
    """The offered rate over time: segments ``(seconds, rate at start, rate at end)``
    with the rate linear within each (constant: equal ends)."""

    segments: tuple[tuple[float, float, float], ...]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a rate profile needs at least one segment")
        for d, r0, r1 in self.segments:
            if not (math.isfinite(d) and d > 0):
                raise ValueError(f"a profile segment lasts a positive time, got {d!r} s")
            if not (math.isfinite(r0) and math.isfinite(r1)) or r0 < 0 or r1 < 0:
                raise ValueError(f"rates are finite and not negative, got {r0!r}:{r1!r}")
        if self.total < 1:
            raise ValueError("the profile sends no job (rate times duration is below 1)")

    @classmethod
    def constant(cls, rate: float, duration_s: float) -> Profile:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        return cls(((duration_s, rate, rate),))

    @classmethod
    def steps(cls, rates: Sequence[float], step_s: float) -> Profile:
        if any(not r > 0 for r in rates):
            raise ValueError(f"every step rate must be positive, got {list(rates)!r}")
        return cls(tuple((step_s, r, r) for r in rates))

    @classmethod
    def ramp(cls, start: float, end: float, duration_s: float) -> Profile:
        return cls(((duration_s, start, end),))

    @property
    def duration_s(self) -> float:
        return sum(d for d, _, _ in self.segments)

    @property
    def boundaries_s(self) -> list[float]:
        """Start offsets of every segment after the first (the steps, for plots)."""
        out, t = [], 0.0
        for d, _, _ in self.segments[:-1]:
            t += d
            out.append(t)
        return out

    def _cum(self) -> list[float]:
        out, c = [0.0], 0.0
        for d, r0, r1 in self.segments:
            c += (r0 + r1) / 2 * d
            out.append(c)
        return out

    @property
    def total(self) -> int:
        """Jobs in the schedule: those due before its end."""
        return int(self._cum()[-1] + 1e-9)

    @property
    def mean_rate(self) -> float:
        return self.total / self.duration_s

    def rate_at(self, t: float) -> float:
        for d, r0, r1 in self.segments:
            if t < d:
                return r0 + (r1 - r0) * max(0.0, t) / d
            t -= d
        return self.segments[-1][2]

    def count_at(self, t: float) -> float:
        """The cumulative (fractional) number of jobs due by ``t`` s after the start."""
        c = 0.0
        for d, r0, r1 in self.segments:
            if t < d:
                tau = max(0.0, t)
                return c + r0 * tau + (r1 - r0) / (2 * d) * tau * tau
            c += (r0 + r1) / 2 * d
            t -= d
        return c

    def time_of(self, i: int) -> float:
        """Seconds after the start at which job ``i`` (from 0) is due."""
        start, c = 0.0, 0.0
        for d, r0, r1 in self.segments:
            step = (r0 + r1) / 2 * d
            if i < c + step:
                x = i - c
                if x <= 0:
                    return start
                a = (r1 - r0) / (2 * d)
                # the root of a tau^2 + r0 tau = x in its stable form (any sign of a)
                return start + 2 * x / (r0 + math.sqrt(max(0.0, r0 * r0 + 4 * a * x)))
            c += step
            start += d
        return start


@dataclass
class LoadState:
    """What an open-loop run has done so far; read live by progress displays."""

    rate: float
    duration_s: float
    start_s: float = 0.0
    """Wall-clock time (``time.time()``) of the first intended send."""
    total: int = 0
    sent: int = 0
    errors: int = 0
    first_error: str = ""
    last_send_s: float = 0.0
    lateness: Histogram = field(default_factory=Histogram)
    """Actual minus intended send time of every job sent."""
    finished: bool = False
    stopped: bool = False
    """Set to end the schedule early (an abort): no job is sent after it is set."""
    profile: Profile | None = None
    """The offered rate over time (None: constant ``rate`` for ``duration_s``)."""
    part: int = 0
    parts: int = 1
    """This producer sends the jobs ``part, part + parts, ...`` of the profile."""
    deadline_s: float | None = None  # nothing is sent after it (``aopen_loop``)

    def global_index(self, i: int) -> int:
        return self.part + i * self.parts

    def intended_s(self, i: int) -> float:
        if self.profile is None:
            return self.start_s + i / self.rate
        return self.start_s + self.profile.time_of(self.global_index(i))

    @property
    def achieved_rate(self) -> float:
        """Jobs sent per second, over the schedule's span."""
        span = max(self.last_send_s - self.start_s, (self.total - 1) / self.rate)
        return self.sent / span if span > 0 else float(self.sent)

    def as_dict(self) -> dict[str, Any]:
        return {
            "offered_rate": self.rate,
            "duration_s": self.duration_s,
            "scheduled": self.total,
            "sent": self.sent,
            "errors": self.errors,
            "first_error": self.first_error,
            "achieved_send_rate": self.achieved_rate,
            "send_lateness_ms": self.lateness.summary_ms(),
        }


def _plan(rate: float, duration_s: float, lead_s: float,
          clock: Callable[[], float], profile: Profile | None = None,
          part: tuple[int, int] = (0, 1), start_s: float | None = None) -> LoadState:
    k, n = part
    if not 0 <= k < n:
        raise ValueError(f"part {k} of {n}: need 0 <= part < parts")
    if profile is None:
        if rate <= 0 or duration_s <= 0:
            raise ValueError("rate and duration must be positive")
        if n > 1:
            profile = Profile.constant(rate, duration_s)
    else:
        rate, duration_s = profile.mean_rate, profile.duration_s
    st = LoadState(rate=rate, duration_s=duration_s, profile=profile, part=k, parts=n)
    everything = profile.total if profile is not None else max(1, int(rate * duration_s))
    st.total = max(0, -(-(everything - k) // n))
    st.start_s = start_s if start_s is not None else clock() + lead_s
    return st


def _due(st: LoadState, now: float, max_batch: int) -> int:
    """How many of the next jobs are due at ``now`` (at most ``max_batch``)."""
    if st.profile is None:
        due = min(st.total, math.floor((now - st.start_s) * st.rate) + 1)
    else:
        everything = math.floor(st.profile.count_at(now - st.start_s) + 1e-9) + 1 \
            if now >= st.start_s else 0
        due = min(st.total, max(0, -(-(everything - st.part) // st.parts)))
    return max(0, min(due - st.sent - st.errors, max_batch))


def _account(st: LoadState, intended: Sequence[float], sent_at: float,
             exc: BaseException | None) -> None:
    if exc is None:
        for t in intended:
            st.lateness.record(sent_at - t)
        st.sent += len(intended)
        st.last_send_s = sent_at
    else:
        st.errors += len(intended)
        if not st.first_error:
            st.first_error = f"{type(exc).__name__}: {exc}"


PRECISE_S = 0.0015
"""The last part of a wait before a send, slept with ``time.sleep`` for precision."""


@dataclass(frozen=True)
class _Wait:
    gap_s: float
    """Until the next job's intended time (0 or less: due now)."""


@dataclass(frozen=True)
class _Send:
    intended: list[float]
    sent_at: float


def _schedule(st: LoadState, clock: Callable[[], float], max_batch: int
              ) -> Generator[_Wait | _Send, BaseException | None, None]:
    """The open-loop schedule without I/O: yields what to do next (wait, or send these
    jobs) and takes back the send's exception (None when it went through). Both shells,
    ``open_loop`` and ``aopen_loop``, drive it."""
    while st.sent + st.errors < st.total and not st.stopped:
        now = clock()
        if st.deadline_s is not None and now > st.deadline_s:
            break
        n = _due(st, now, max_batch)
        if n == 0:
            yield _Wait(st.intended_s(st.sent + st.errors) - now)
            continue
        first = st.sent + st.errors
        intended = [st.intended_s(i) for i in range(first, first + n)]
        exc = yield _Send(intended, now)
        _account(st, intended, now, exc)
    st.finished = True


def _step(steps: Generator[_Wait | _Send, BaseException | None, None],
          result: BaseException | None) -> _Wait | _Send | None:
    """The next step after a send's ``result`` (None at the end of the schedule)."""
    try:
        return steps.send(result)
    except StopIteration:
        return None


def _start(rate: float, duration_s: float, lead_s: float, state: LoadState | None,
           clock: Callable[[], float], profile: Profile | None = None,
           part: tuple[int, int] = (0, 1), start_s: float | None = None) -> LoadState:
    st = _plan(rate, duration_s, lead_s, clock, profile, part, start_s)
    if state is not None:
        st.stopped = state.stopped
        state.__dict__.update(st.__dict__)
        st = state
    return st


async def aopen_loop(
    send: Callable[[list[float], float], Awaitable[object]],
    rate: float,
    duration_s: float,
    *,
    max_batch: int = 1000,
    lead_s: float = 0.05,
    state: LoadState | None = None,
    clock: Callable[[], float] = time.time,
    profile: Profile | None = None,
    part: tuple[int, int] = (0, 1),
    start_s: float | None = None,
    deadline_s: float | None = None,
) -> LoadState:
    """Send ``rate * duration_s`` jobs on an open-loop schedule (asyncio).

    With a ``profile`` its rates and duration replace ``rate`` and ``duration_s``;
    ``part`` ``(k, n)`` sends only the jobs ``k, k + n, ...``; ``start_s`` fixes the
    first intended send (Unix seconds; else ``lead_s`` from now); ``deadline_s`` ends
    the sending even with the schedule not through.

    ``send(intended, sent_at)`` writes one job per intended time (Unix seconds) and
    ``sent_at`` is when this call began. Jobs that fell due while a send was in
    progress go out together in the next call (at most ``max_batch`` per call). A
    send that raises counts its jobs as errors; the schedule goes on. Pass ``state``
    (from ``LoadState``-creating code) to read progress live.
    """
    st = _start(rate, duration_s, lead_s, state, clock, profile, part, start_s)
    st.deadline_s = deadline_s
    # below ~1,000 jobs/s a send is rare enough to block the loop for its last stretch
    precise = st.rate / st.parts <= 1000
    steps = _schedule(st, clock, max_batch)
    step = _step(steps, None)
    while step is not None:
        result: BaseException | None = None
        if isinstance(step, _Wait):
            if step.gap_s > PRECISE_S:
                # event-loop timers are coarse (libuv: 1 ms); sleep most of the gap there
                await asyncio.sleep(step.gap_s - PRECISE_S)
            elif step.gap_s > 0 and precise:
                time.sleep(step.gap_s)  # the last stretch at the kernel's timer resolution
            else:
                await asyncio.sleep(0)
        else:
            try:
                await send(step.intended, step.sent_at)
            except Exception as exc:
                result = exc
        step = _step(steps, result)
    return st


def open_loop(
    send: Callable[[list[float], float], object],
    rate: float,
    duration_s: float,
    *,
    max_batch: int = 1000,
    lead_s: float = 0.05,
    state: LoadState | None = None,
    clock: Callable[[], float] = time.time,
) -> LoadState:
    """``aopen_loop`` for a blocking ``send`` (same schedule, same accounting)."""
    st = _start(rate, duration_s, lead_s, state, clock)
    steps = _schedule(st, clock, max_batch)
    step = _step(steps, None)
    while step is not None:
        result: BaseException | None = None
        if isinstance(step, _Wait):
            time.sleep(max(0.0, step.gap_s))
        else:
            try:
                send(step.intended, step.sent_at)
            except Exception as exc:
                result = exc
        step = _step(steps, result)
    return st
