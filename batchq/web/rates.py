"""Jobs per second in and out of each queue, from the counters the scripts keep in Redis.

``T:stats`` counts ``enqueued`` (enqueue, schedule, redrive) and the outcomes Redis
applied (``succeeded``, ``dead``); they are cumulative and exact even when workers are
killed. The console samples them whenever it reads a queue (at most once a second per
queue) and turns the samples of the last minutes into rates. Memory is bounded: a few
hundred samples per queue, and the least recently read queues are forgotten first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque

SAMPLE_EVERY_S = 1.0
KEEP_S = 300.0
"""Samples older than this are dropped (the longest window shown is 5 minutes)."""
MAX_QUEUES = 10_000


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
