"""Exceptions batchq raises or understands."""

from __future__ import annotations

from typing import Any


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

    The attempt still counts towards ``max_attempts``.
    """

    def __init__(self, delay_s: float | None = None, message: str = "") -> None:
        super().__init__(message or (f"retry requested in {delay_s}s" if delay_s else "retry"))
        self.delay_s = delay_s


class RateLimited(Exception):
    """Raise from a handler when the provider says "too many" (an HTTP 429 with
    ``Retry-After``): the job goes back to the head of its group with its attempt
    refunded, and its group (or, for a job without a group, the whole queue) starts no
    job for ``retry_after_s`` seconds. Every worker honours the hold: it lives in Redis.
    """

    def __init__(self, retry_after_s: float = 1.0, message: str = "") -> None:
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


class JobCancelled(BatchqError):
    """``app.result`` of a job that was cancelled before it ran."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled")
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
