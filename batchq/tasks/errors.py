"""Exceptions batchq raises or understands."""

from __future__ import annotations

from typing import Any

from .durations import check_seconds


class BatchqError(Exception):
    """Base class of batchq's own errors."""


class EnqueueError(BatchqError):
    """An enqueue that could not be written (completely).

    ``written`` counts the jobs that Redis confirmed; ``ids`` are their ids. ``unknown``
    counts jobs whose outcome could not be confirmed because the connection broke while
    their command was in flight: they may or may not have been written.
    """

    def __init__(self, message: str, *, written: int = 0, ids: list[str] | None = None,
                 unknown: int = 0) -> None:
        super().__init__(message)
        self.written = written
        self.ids = ids or []
        self.unknown = unknown


class PayloadTooLarge(BatchqError, ValueError):
    """An encoded job above the app's ``max_payload_bytes``. Raised by ``enqueue_many``
    mid-stream, ``written`` and ``ids`` tell which jobs before it are in Redis."""

    written: int = 0
    ids: list[str] = []


class Retry(Exception):
    """Raise from a handler to retry the job after ``delay_s`` seconds (default: backoff).

    The attempt still counts towards ``max_attempts``. ``delay_s``: None, or 0 up to
    ten years (``durations.MAX_DURATION_S``); a value changed to anything else after
    construction falls back to the task's backoff.
    """

    def __init__(self, delay_s: float | None = None, message: str = "") -> None:
        if delay_s is not None:
            check_seconds("Retry(delay_s=...)", delay_s)
        super().__init__(message or (f"retry requested in {delay_s}s" if delay_s else "retry"))
        self.delay_s = delay_s


DEFAULT_HOLD_S = 1.0
"""The hold of a ``RateLimited`` that carries no usable ``retry_after_s`` (a subclass that
skipped ``super().__init__()``, or a value changed to nan, a string, a negative number);
also ``RateLimited()``'s default."""

MIN_HOLD_S = 0.1
"""The shortest hold a ``RateLimited`` sets: ``RateLimited(0)`` holds this long, so a job
that always says "too many" cannot spin through its queue."""

DEFAULT_MAX_HOLD_S = 300.0
"""The longest hold a handler's ``RateLimited`` sets unless its task allows more
(``@app.task(max_hold_s=...)``, up to a day): a longer ``retry_after_s`` is cut to it.
An operator's ``Queue.hold`` is not bound by it."""

DEFAULT_MAX_REFUNDS = 20
"""``RateLimited`` runs in a row a job gets with its attempt refunded, unless its task
says otherwise (``@app.task(max_refunds=...)``); the next one counts as a failed
attempt: retried after the hold, or dead-lettered on its last attempt."""

MAX_REFUNDS = 10_000
"""The largest ``max_refunds`` a task may set."""


class RateLimited(Exception):
    """Raise from a handler when the provider says "too many" (an HTTP 429 with
    ``Retry-After``): the job goes back to the head of its group with its attempt
    refunded, and its group (or, for a job without a group, the whole queue) starts no
    job for ``retry_after_s`` seconds. Every worker honours the hold: it lives in Redis.

    The worker bounds what a handler can do with it: the hold is at least
    ``MIN_HOLD_S`` (0.1 s) and at most the task's ``max_hold_s`` (default
    ``DEFAULT_MAX_HOLD_S``, 300 s); a missing or unusable ``retry_after_s`` holds
    ``DEFAULT_HOLD_S`` (1 s); after the task's ``max_refunds`` (default 20) refunded
    runs in a row of one job in one worker process, the next counts as a failed attempt.
    """

    def __init__(self, retry_after_s: float = DEFAULT_HOLD_S, message: str = "") -> None:
        if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int | float) \
                or not 0 <= retry_after_s <= 86400 or retry_after_s != retry_after_s:
            raise ValueError(f"RateLimited(retry_after_s=...) takes 0..86400 seconds, got "
                             f"{retry_after_s!r}")
        super().__init__(message or f"rate limited: hold for {retry_after_s}s")
        self.retry_after_s = float(retry_after_s)


class QuotaExceeded(BatchqError):
    """An enqueue would take a group past its ``max_pending`` (``Queue.limit``); nothing
    of that call (for ``enqueue_many``: of that chunk and after it) was written.
    ``written`` / ``ids``: the jobs of an ``enqueue_many`` written before it."""

    def __init__(self, queue: str, group: str, message: str, *, written: int = 0,
                 ids: list[str] | None = None) -> None:
        super().__init__(message)
        self.queue = queue
        self.group = group
        self.written = written
        self.ids = ids or []


class JobDead(BatchqError):
    """``app.result`` of a job that was dead-lettered. ``job_id``; ``record``: the dead
    record (``reason``, ``error_type``, ``error_message``, ``traceback``, ``raw``)."""

    def __init__(self, job_id: str, record: dict[str, Any]) -> None:
        self.job_id = job_id
        self.record = record
        self.reason = str(record.get("reason", ""))
        self.error_type = str(record.get("error_type", ""))
        self.error_message = str(record.get("error_message", ""))
        super().__init__(f"job {job_id} is dead ({self.reason}): {self.error_type}: "
                         f"{self.error_message}")


class ResultNotKept(BatchqError, KeyError):
    """``app.result`` of a job whose task keeps no result (no ``result_ttl_s``): there
    is nothing to wait for. ``job_id``; ``state``: the job's state when asked (see
    ``App.job_status``). A ``KeyError``, as an unknown or expired result is."""

    def __init__(self, job_id: str, message: str, state: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0])


class JobCancelled(BatchqError):
    """``app.result`` of a job that was cancelled before it ran."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id


class JobExpired(BatchqError):
    """``app.result`` of a job dropped unrun at its deadline (``options(expires_s=)``,
    ``expires_at``, or its campaign's ``expires_at``), not kept in dead."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} expired before it ran")
        self.job_id = job_id


class LockNotAcquired(BatchqError):
    """``app.lock(...)`` could not take the lock within ``blocking_timeout_s``: another
    holder had it. ``name`` is the lock's name."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class LockLost(BatchqError):
    """A lock this process held expired or was taken over before it was released or
    extended: the protected section did not run under the lock to its end."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class CampaignClosed(BatchqError):
    """Jobs were added to a campaign that is sealed or cancelled (``campaign`` names it);
    nothing of that call was written."""

    def __init__(self, campaign: str, message: str) -> None:
        super().__init__(message)
        self.campaign = campaign


class CampaignNotFound(BatchqError, LookupError):
    """No campaign has this id (never created, or its record expired)."""

    def __init__(self, campaign: str) -> None:
        super().__init__(f"no campaign {campaign!r} (never created, or finished more than "
                         "campaign_ttl_s ago); create it with app.campaign(...)")
        self.campaign = campaign


class NotReplicated(EnqueueError):
    """An enqueue was written on the primary but fewer than ``min_replicas`` replicas
    confirmed it within ``replica_timeout_ms`` (``WAIT``). ``ids``: the jobs that may or
    may not survive a failover (they are in Redis now; enqueue them again, with dedup
    keys a second enqueue of one that survived is a no-op). ``replicated``: the jobs of
    the same ``enqueue_many`` confirmed before them. ``confirmed``: replicas that
    confirmed; ``wanted``: ``min_replicas``."""

    def __init__(self, message: str, *, ids: list[str], confirmed: int, wanted: int,
                 replicated: list[str] | None = None) -> None:
        super().__init__(message, written=len(ids), ids=ids)
        self.confirmed = confirmed
        self.wanted = wanted
        self.replicated = replicated or []
