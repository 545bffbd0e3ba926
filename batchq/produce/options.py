"""Enqueue options: ``EnqueueOptions`` (what ``task.options(...)`` binds), ``Call`` (one
job's arguments for ``enqueue_many``) and the checks that refuse, naming the option, any
value the scripts or the worker could not handle. Split from ``producer`` (which
re-exports these names) to keep each module small.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..flow import windows
from ..flow.limits import check_group
from ..store import codec
from ..store.keys import MAX_PRIORITY, QueueKeys
from ..tasks.durations import MAX_DURATION_S, check_seconds
from . import tracked

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
    not_before: datetime | float | None = None
    window: str | None = None
    tz: str | None = None
    expires_s: float | None = None
    expires_at: datetime | float | None = None
    keep_expired: bool | None = None

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
        if (self.expires_s is not None or self.expires_at is not None
                or self.keep_expired is not None):
            check_expiry(self.expires_s, self.expires_at, self.keep_expired)
        if self.not_before is not None or self.window is not None or self.tz is not None:
            self._send_time()

    def _send_time(self) -> None:
        """``not_before`` is ``eta``; a per-job ``window`` (``"09:00-20:00"``, optionally
        followed by days: ``"09:00-20:00 mon-fri"``) in ``tz`` becomes the ``eta`` of its
        next opening from now (or from ``eta`` / ``delay_s``): the job is a delayed one,
        resolved by this process's clock when the options are made."""
        if self.not_before is not None:
            if self.eta is not None or self.delay_s is not None:
                raise ValueError("give one of not_before, eta, delay_s")
            object.__setattr__(self, "eta", eta_seconds(self.not_before))
            object.__setattr__(self, "not_before", None)
        if self.window is None:
            if self.tz is not None:
                raise ValueError("tz needs window=...")
            return
        start = (eta_seconds(self.eta) if self.eta is not None
                 else time.time() + (self.delay_s or 0.0))
        object.__setattr__(self, "eta", windows.next_opening(self.window, self.tz, start))
        object.__setattr__(self, "delay_s", None)

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
            window=other.window if other.window is not None else self.window,
            tz=other.tz if other.tz is not None else self.tz,
            expires_s=other.expires_s if other.expires_s is not None
            else (None if other.expires_at is not None else self.expires_s),
            expires_at=other.expires_at if other.expires_at is not None
            else (None if other.expires_s is not None else self.expires_at),
            keep_expired=other.keep_expired if other.keep_expired is not None
            else self.keep_expired,
        )


def check_on_conflict(value: object) -> str:
    """One of ``ON_CONFLICT``, else an error naming the value."""
    if value not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, got "
                         f"{value!r}")
    return str(value)


def check_expiry(expires_s: object, expires_at: object, keep_expired: object) -> None:
    """``expires_s`` (seconds from the write, > 0) or ``expires_at`` (a ``datetime`` or
    Unix seconds, not in the past by this process's clock), not both; ``keep_expired`` a
    bool that needs one of them. Errors name the option; nothing is written."""
    if expires_s is not None and expires_at is not None:
        raise ValueError("give expires_s or expires_at, not both")
    if expires_s is not None:
        check_seconds("expires_s", expires_s, positive=True, max_s=MAX_DELAY_S)
    if expires_at is not None:
        try:
            at = eta_seconds(expires_at)
        except (TypeError, ValueError) as exc:
            raise type(exc)(str(exc).replace("eta", "expires_at")) from None
        if at <= time.time():
            raise ValueError(f"expires_at {expires_at!r} is in the past: the job could "
                             "never run")
    if keep_expired is not None:
        if not isinstance(keep_expired, bool):
            raise TypeError(f"keep_expired must be a bool, got {keep_expired!r}")
        if expires_s is None and expires_at is None:
            raise ValueError("keep_expired needs expires_s or expires_at")


def expiry_spec(expires_s: float | None, expires_at: datetime | float | None,
                keep: bool | None) -> str:
    """The expiry as enqueue_tracked.lua reads it: ``"r<ms>"`` (from the server's now at
    the write) or ``"a<Unix ms>"``, then ``"k"`` to keep the job in dead once expired;
    "" for none."""
    if expires_s is not None:
        spec = f"r{max(1, round(expires_s * 1000))}"
    elif expires_at is not None:
        spec = f"a{round(eta_seconds(expires_at) * 1000)}"
    else:
        return ""
    return spec + ("k" if keep else "")
