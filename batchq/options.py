"""Enqueue options: ``EnqueueOptions`` (what ``task.options(...)`` binds), ``Call`` (one
job's arguments for ``enqueue_many``) and the checks that refuse, naming the option, any
value the scripts or the worker could not handle. Split from ``producer`` (which
re-exports these names) to keep each module small.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import codec, tracked
from .durations import MAX_DURATION_S, check_seconds
from .keys import MAX_PRIORITY, QueueKeys
from .limits import check_group

MAX_DELAY_S = 100 * 365 * 86400
"""The longest ``delay_s`` accepted (about 100 years): due times stay exact integers in
the scripts' arithmetic and a typo (``delay_s=1e30``) is caught at enqueue."""

ON_CONFLICT = ("keep", "replace", "debounce")
"""What a keyed enqueue does when its key is held by a job still waiting: ``keep`` it
(the call writes nothing), ``replace`` its arguments in place (latest wins), or
``debounce``: replace them and push its start to ``delay_s`` after this call."""

MAX_ETA_S = 253402300799
"""The latest ``eta`` accepted (Unix seconds): the end of year 9999, as ``datetime``."""


def _check_seconds(name: str, value: object, hi: float) -> float:
    """A finite, non-negative number of seconds up to ``hi``, or an error naming it."""
    return check_seconds(name, value, max_s=hi)


def _check_queue(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    try:
        _valid_queue(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return value


@functools.lru_cache(maxsize=1024)
def _valid_queue(value: str) -> None:
    """Raise ``ValueError`` for a name ``QueueKeys`` refuses (each enqueue checks its
    queue: building the keys every time cost about 20 µs a call)."""
    QueueKeys("_", value)


def eta_seconds(eta: object) -> float:
    """``eta`` (a ``datetime``, naive meaning local time, or Unix seconds) as Unix
    seconds; a clear error for anything else (a string, nan, a year past 9999)."""
    if isinstance(eta, datetime):
        try:
            ts = eta.timestamp()
        except (OverflowError, ValueError, OSError) as exc:
            raise ValueError(f"eta {eta!r} cannot be turned into a time: {exc}") from None
    elif isinstance(eta, bool) or not isinstance(eta, int | float):
        raise TypeError(f"eta must be a datetime or Unix seconds (int or float), got "
                        f"{type(eta).__name__} {eta!r}")
    else:
        ts = float(eta)
    return _check_seconds("eta", ts, MAX_ETA_S)



class Call:
    """Positional and keyword arguments of one job, for ``enqueue_many``."""

    __slots__ = ("args", "kwargs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


def call(*args: Any, **kwargs: Any) -> Call:
    """One job's arguments for ``enqueue_many`` when it needs both args and kwargs."""
    return Call(*args, **kwargs)


@dataclass(frozen=True)
class EnqueueOptions:
    """Per-enqueue choices; ``None`` means the task's default."""

    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    delay_s: float | None = None
    eta: datetime | float | None = None
    campaign: str | None = None
    key: str | None = None
    key_ttl_s: float | None = None
    group: str | None = None
    timeout_s: float | None = None
    on_conflict: str | None = None
    min_replicas: int | None = None

    def __post_init__(self) -> None:
        # every check names the option: a wrong value must never reach the worker
        if self.queue is not None:
            _check_queue("queue", self.queue)
        if self.priority is not None:
            codec.check_int("priority", self.priority, 0, MAX_PRIORITY)
        if self.max_attempts is not None:
            codec.check_int("max_attempts", self.max_attempts, 1, codec.MAX_ATTEMPTS)
        if self.delay_s is not None and self.eta is not None:
            raise ValueError("give delay_s or eta, not both")
        if self.delay_s is not None:
            _check_seconds("delay_s", self.delay_s, MAX_DELAY_S)
        if self.eta is not None:
            eta_seconds(self.eta)
        if self.campaign is not None:
            tracked.check_campaign_id(self.campaign)
        if self.key is not None:
            tracked.check_key(self.key)
        if self.key_ttl_s is not None:
            _check_seconds("key_ttl_s", self.key_ttl_s, MAX_DURATION_S)
        if self.group is not None:
            check_group(self.group)
        if self.timeout_s is not None:
            check_seconds("timeout_s", self.timeout_s, positive=True)
        if self.min_replicas is not None:
            codec.check_int("min_replicas", self.min_replicas, 0, 100)
        if self.on_conflict is not None:
            check_on_conflict(self.on_conflict)

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with the fields ``other`` sets taking precedence."""
        return EnqueueOptions(
            queue=other.queue if other.queue is not None else self.queue,
            priority=other.priority if other.priority is not None else self.priority,
            max_attempts=other.max_attempts if other.max_attempts is not None
            else self.max_attempts,
            delay_s=other.delay_s if other.delay_s is not None
            else (None if other.eta is not None else self.delay_s),
            eta=other.eta if other.eta is not None
            else (None if other.delay_s is not None else self.eta),
            campaign=other.campaign if other.campaign is not None else self.campaign,
            key=other.key if other.key is not None else self.key,
            key_ttl_s=other.key_ttl_s if other.key_ttl_s is not None else self.key_ttl_s,
            group=other.group if other.group is not None else self.group,
            timeout_s=other.timeout_s if other.timeout_s is not None else self.timeout_s,
            on_conflict=other.on_conflict if other.on_conflict is not None
            else self.on_conflict,
            min_replicas=other.min_replicas if other.min_replicas is not None
            else self.min_replicas,
        )


def check_on_conflict(value: object) -> str:
    """One of ``ON_CONFLICT``, else an error naming the value."""
    if value not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, got "
                         f"{value!r}")
    return str(value)
