"""Jobs per second in and out of each queue, from the counters the scripts keep in Redis.

``T:stats`` counts ``enqueued`` (enqueue, schedule, redrive) and the outcomes Redis
applied (``succeeded``, ``dead``); they are cumulative and exact even when workers are
killed. The console samples them whenever it reads a queue (at most once a second per
queue) and turns the samples of the last minutes into rates. Memory is bounded: a few
hundred samples per queue, and the least recently read queues are forgotten first.

So that a page shows rates from its first paint (not a dash until it has polled twice), a
``Sampler`` thread keeps the samples of the first ``MAX_SAMPLED`` queues fresh: twice
at once when the console starts, then every ``SAMPLE_EVERY_S`` while a page is open and
every ``IDLE_EVERY_S`` (one pipelined read) when nobody looks.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

log = logging.getLogger("batchq.web")

SAMPLE_EVERY_S = 1.0
KEEP_S = 300.0
"""Samples older than this are dropped (the longest window shown is 5 minutes)."""
MAX_QUEUES = 10_000
IDLE_EVERY_S = 10.0
"""Seconds between background samples while no page is open."""
WATCH_S = KEEP_S
"""A page counts as open this long after its last request."""
MAX_SAMPLED = 500
"""Queues the background sampler reads (the first ones by name: the overview's pages)."""


class RateTracker:
    """Samples of (time, in, out) per queue; ``rates`` over a window of seconds."""

    def __init__(self) -> None:
        self._clock = time.monotonic
        self._lock = threading.Lock()
        self._samples: OrderedDict[str, deque[tuple[float, int, int]]] = OrderedDict()

    def record(self, queue: str, jobs_in: int, jobs_out: int, now: float | None = None) -> None:
        t = self._clock() if now is None else now
        with self._lock:
            samples = self._samples.get(queue)
            if samples is None:
                samples = self._samples[queue] = deque()
                while len(self._samples) > MAX_QUEUES:
                    self._samples.popitem(last=False)
            self._samples.move_to_end(queue)
            if samples and (jobs_in < samples[-1][1] or jobs_out < samples[-1][2]):
                samples.clear()  # the counters were reset (queue cleared): start over
            if samples and t - samples[-1][0] < SAMPLE_EVERY_S:
                return
            samples.append((t, jobs_in, jobs_out))
            while samples and t - samples[0][0] > KEEP_S:
                samples.popleft()

    def rates(self, queue: str, window_s: float = 60.0,
              now: float | None = None) -> tuple[float, float] | None:
        """(in/s, out/s) over the last ``window_s`` seconds (or as long as the queue has
        been watched, at least one second); ``None`` before that."""
        t = self._clock() if now is None else now
        with self._lock:
            samples = self._samples.get(queue)
            if not samples:
                return None
            last = samples[-1]
            first = next((s for s in samples if t - s[0] <= window_s), last)
        dt = last[0] - first[0]
        if dt < SAMPLE_EVERY_S:
            return None
        return (last[1] - first[1]) / dt, (last[2] - first[2]) / dt


class Sampler:
    """Calls ``sample`` from a daemon thread: twice at start (one ``SAMPLE_EVERY_S``
    apart, so every rate is known before the first page asks), then every
    ``SAMPLE_EVERY_S`` while ``watched`` was called within ``WATCH_S``, else every
    ``IDLE_EVERY_S``. An error (Redis away) is logged at debug level and tried again
    at the next turn. ``stop`` ends the thread."""

    def __init__(self, sample: Callable[[], None], *, busy_s: float = SAMPLE_EVERY_S,
                 idle_s: float = IDLE_EVERY_S) -> None:
        self._sample = sample
        self._busy_s = busy_s
        self._idle_s = idle_s
        self._stop = threading.Event()
        self._watched_at = -math.inf
        self.samples = 0
        self._thread = threading.Thread(target=self._run, name="batchq-web-rates",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watched(self) -> None:
        """A page asked for data: sample every second for the next ``WATCH_S``."""
        self._watched_at = time.monotonic()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception as exc:  # Redis away or a bad name: the next turn retries
                log.debug("rate sample failed: %s: %s", type(exc).__name__, exc)
            self.samples += 1
            busy = self.samples < 2 or time.monotonic() - self._watched_at < WATCH_S
            self._stop.wait(self._busy_s if busy else self._idle_s)
