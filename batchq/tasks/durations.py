"""Durations: the one check every TTL, lease, hold, delay and timeout of the API passes
before it can reach Redis or the worker.

Redis reads an expiry (``SET ... PX``, ``PEXPIRE``) as a signed 64-bit count of
milliseconds and refuses one whose deadline, now + ms, passes 2**63 - 1 ms
(``REDIS_MAX_PX_MS``): about 292 million years in theory, but a TTL of 1e17 s (1e20 ms) is
not an integer Redis reads at all, and every write carrying it is refused. A value
that size is a typo, so batchq refuses far earlier, where it is given (the decorator,
the option, the call): no duration may exceed ``MAX_DURATION_S``, ten years, which every
Redis accepts with room to spare, and which keeps every deadline an exact integer in
the scripts' arithmetic (doubles: exact to 2**53 ms, about 285,000 years).
"""

from __future__ import annotations

import math

MAX_DURATION_S = 10 * 365 * 86400
"""The longest TTL, lease, hold, timeout or retry delay accepted: ten years
(315,360,000 s)."""

REDIS_MAX_PX_MS = 2**63 - 1
"""What Redis compares now + PX against: a longer expiry is an error reply."""


def _span(hi: float) -> str:
    if hi == MAX_DURATION_S:
        return f"{MAX_DURATION_S} (10 years)"
    return f"{hi:g}"


def check_seconds(name: str, value: object, *, positive: bool = False,
                  min_s: float = 0.0, max_s: float = MAX_DURATION_S) -> float:
    """``value`` as float seconds: a finite number in ``min_s..max_s`` (above 0 too when
    ``positive``), else an error naming ``name`` and the value (``TypeError`` for what
    is not a number, ``ValueError`` for one out of range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} "
                        f"{value!r}")
    low = f"> {min_s:g}" if positive and min_s == 0 else f">= {min_s:g}"
    if not math.isfinite(value) or value < min_s or (positive and value <= 0) \
            or value > max_s:
        raise ValueError(f"{name} must be a finite number of seconds {low} and <= "
                         f"{_span(max_s)}, got {value!r}")
    return float(value)


def check_ms(name: str, value: object, *, max_s: float = MAX_DURATION_S) -> int:
    """A positive duration in seconds (``check_seconds``) as whole milliseconds, at least
    1: what a PX or PEXPIRE argument takes."""
    return max(1, round(check_seconds(name, value, positive=True, max_s=max_s) * 1000))
