"""The job envelope and its bytes; the only module that imports msgpack.

An encoded job ("entry") is ``<priority>:<attempt>:<max_attempts>:<id>:<body>`` where
``body`` is msgpack ``[task, args, kwargs, enqueued_at_ms]``, plus ``due_ms`` (the
producer's estimate of the due time) for delayed jobs, then a map of per-job options
(``{"timeout_s": 0.2}``) when any is set (``due_ms`` is then the enqueue time for a
ready job); a traced producer (``batchq.ops.otel``) adds its trace context to that map.
The short text header lets the Lua scripts reserve, count attempts and route by
priority without decoding msgpack; the body is opaque to Redis. No pickle, ever: a
value msgpack cannot encode is a ``TypeError`` at enqueue time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import msgpack

from ..tasks.context import JobContext, context_of
from .ids import MIN_ID_LEN, REF_LEN, TRACKED_MARK, new_id, queue_ref, ref_of, seq_of

__all__ = [
    "HEADER_NUMBER_MAX",
    "MAX_ATTEMPTS",
    "MIN_ID_LEN",
    "REF_LEN",
    "TRACKED_MARK",
    "DecodeError",
    "Job",
    "check_int",
    "decode_dead_record",
    "decode_entry",
    "decode_result",
    "encode_body",
    "encode_dead_record",
    "encode_result",
    "header",
    "new_id",
    "parse_header",
    "queue_ref",
    "ref_of",
    "reset_attempt",
    "seq_of",
    "trace_of",
]


class DecodeError(ValueError):
    """An entry whose bytes are not a batchq job."""


class Job:
    """One job as a handler (or a batch handler) sees it."""

    __slots__ = (
        "args",
        "attempt",
        "enqueued_ms",
        "id",
        "kwargs",
        "lease",
        "max_attempts",
        "priority",
        "queue",
        "raw",
        "ready_ms",
        "recovered",
        "task",
        "timeout_s",
    )

    def __init__(
        self,
        id: str,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        attempt: int = 1,
        max_attempts: int = 1,
        priority: int = 0,
        queue: str = "",
        enqueued_ms: int = 0,
        raw: bytes = b"",
        lease: bytes = b"",
    ) -> None:
        self.id = id
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.priority = priority
        self.queue = queue
        self.enqueued_ms = enqueued_ms
        self.raw = raw
        # the reservation this run holds, "<id>:<attempt>", as the scripts name it
        self.lease = lease or b"%s:%d" % (id.encode(), attempt)
        # when the job became runnable (enqueue time, or its due time if delayed)
        self.ready_ms = enqueued_ms
        # taken back from a worker that died holding it (the worker runs it alone)
        self.recovered = False
        # the job's own timeout (options(timeout_s=...)), over its task's; None: the task's
        self.timeout_s: float | None = None

    def __repr__(self) -> str:
        return (
            f"Job(id={self.id!r}, task={self.task!r}, args={self.args!r}, "
            f"kwargs={self.kwargs!r}, attempt={self.attempt})"
        )

    @property
    def context(self) -> JobContext:
        """This job's ``batchq.JobContext`` while its handler runs (in a batch handler,
        each job of the list has its own); ``RuntimeError`` elsewhere."""
        return context_of(self)


# --- entries ---------------------------------------------------------------------------

HEADER_NUMBER_MAX = 999_999_999_999
"""The largest attempt / max_attempts a header may carry (12 digits). The scripts count
in Lua doubles written back with 14 significant digits: a longer number would come back
as ``1e+14`` and the job would vanish. The scripts and ``decode_entry`` treat a longer
one as malformed (``decode_error``); the producer refuses it."""

MAX_ATTEMPTS = 1_000_000_000
"""The largest ``max_attempts`` the producer accepts: far below ``HEADER_NUMBER_MAX``, so
the refunds the reaper grants a job whose worker died (each raises ``max_attempts`` by
one) can never push the header past what the scripts count exactly."""


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) in ``lo..hi``; else a ``TypeError``
    or ``ValueError`` naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value!r}")
    return int(value)


def header(priority: int, max_attempts: int) -> bytes:
    """The header prefix shared by every fresh job of one enqueue call (id follows).

    Refuses what the scripts could not route or count: a priority outside 0..9, a
    ``max_attempts`` below 1 or above ``MAX_ATTEMPTS``, a ``bool`` or a non-int."""
    p = check_int("priority", priority, 0, 9)
    m = check_int("max_attempts", max_attempts, 1, MAX_ATTEMPTS)
    return b"%d:0:%d:" % (p, m)


_local = threading.local()


def _pack(value: Any) -> bytes:
    """``msgpack.packb`` with this thread's reused packer (packb makes one per call; a
    packer resets itself after each value, also after a refused one)."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer()
    out: bytes = packer.pack(value)
    return out


TRACE: ContextVar[dict[str, Any] | None] | None = None
"""The trace context the jobs encoded in this context carry (keys of their options map),
set by ``batchq.ops.otel`` around a traced enqueue. None until an app of this process is
instrumented: encoding a job then checks nothing more than that."""


def encode_body(
    task: str, args: Sequence[Any], kwargs: Mapping[str, Any], enqueued_ms: int,
    due_ms: int | None = None, opts: Mapping[str, Any] | None = None,
) -> bytes:
    """msgpack of the job body; raises ``TypeError`` naming the argument that failed.

    Besides what msgpack refuses, a dict key that would not decode back into a dict key
    (a tuple comes back as an unhashable list) is refused here, since the worker could
    only dead-letter the job."""
    if TRACE is not None and (trace := TRACE.get()) is not None:
        opts = {**opts, **trace} if opts else trace
    try:
        fields = (task, args, kwargs, enqueued_ms) if due_ms is None and not opts else \
            (task, args, kwargs, enqueued_ms, due_ms) if not opts else \
            (task, args, kwargs, enqueued_ms, enqueued_ms if due_ms is None else due_ms,
             opts)
        body = _pack(fields)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _explain(task, args, kwargs, exc) from None
    # a key the worker could not decode can only sit in a container argument; scalar
    # arguments (the common case) cost one isinstance each, and the message is built
    # only for a refusal
    for value in args:
        if isinstance(value, _CONTAINERS) and _bad_key(value) is not _OK:
            _refuse_keys(task, args, kwargs)
    if kwargs:
        for key, value in kwargs.items():
            if not isinstance(key, str):
                # a mapping row of enqueue_many is the keyword arguments: a worker
                # could never call the handler with a key that is not a name
                raise TypeError(f"cannot enqueue {task}: keyword {key!r} "
                                f"({type(key).__name__}) is not a string")
            if isinstance(value, _CONTAINERS) and _bad_key(value) is not _OK:
                _refuse_keys(task, args, kwargs)
    return body


_CONTAINERS = (dict, list, tuple)
_KEY_TYPES = (str, bytes, int, float, bool, type(None))
_OK = object()


def _bad_key(value: Any) -> Any:
    """The first dict key in ``value`` that a worker could not decode (any type but the
    scalars msgpack hands back as themselves: a tuple comes back as an unhashable list),
    or ``_OK``. Iterative, and run after packb, which refuses nesting deeper than 512."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if type(k) is not str and not isinstance(k, _KEY_TYPES):
                    return k
                if isinstance(x, _CONTAINERS):
                    stack.append(x)
        else:
            for x in v:
                if isinstance(x, _CONTAINERS):
                    stack.append(x)
    return _OK


def _refuse_keys(task: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Raise the ``TypeError`` naming the argument that holds the bad key."""
    named = [(f"positional argument {i}", v) for i, v in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for where, value in named:
        if isinstance(value, _CONTAINERS) and (k := _bad_key(value)) is not _OK:
            raise TypeError(
                f"cannot enqueue {task}: {where} has a dict key {k!r} of type "
                f"{type(k).__name__}; keys must be str, bytes, int, float, bool or None "
                "(a worker could not decode it)")


def _explain(
    task: str, args: Sequence[Any], kwargs: Mapping[str, Any], exc: Exception
) -> TypeError:
    for i, value in enumerate(args):
        try:
            msgpack.packb(value)
        except Exception as inner:
            return TypeError(
                f"cannot enqueue {task}: positional argument {i} ({type(value).__name__}) "
                f"cannot be encoded with msgpack: {inner}"
            )
    for key, value in kwargs.items():
        if not isinstance(key, str):
            return TypeError(f"cannot enqueue {task}: keyword {key!r} is not a string")
        try:
            msgpack.packb(value)
        except Exception as inner:
            return TypeError(
                f"cannot enqueue {task}: keyword argument {key!r} ({type(value).__name__}) "
                f"cannot be encoded with msgpack: {inner}"
            )
    return TypeError(f"cannot enqueue {task}: {exc}")


_HEADER_DIGITS = len(str(HEADER_NUMBER_MAX))


def _header_int(field: bytes, what: str) -> int:
    # the scripts' own rule (_lib.lua parse): ASCII digits only, at most 12 of them;
    # int() alone would take "+1", " 1", "1_0" and arbitrarily long numbers
    if not field.isdigit() or len(field) > _HEADER_DIGITS:
        raise ValueError(f"{what} {field[:20]!r} is not a number of 1..{_HEADER_DIGITS} "
                         "digits")
    return int(field)


_SMALL = {str(i).encode(): i for i in range(1001)}
"""The header numbers nearly every entry carries (attempt and max_attempts 0..1000),
already parsed: a dict lookup instead of ``_header_int``'s checks. Only canonical
digit strings are keys, so what it takes ``_header_int`` takes too."""
_DIGIT = {str(i).encode(): i for i in range(10)}


def parse_header(raw: bytes) -> tuple[int, int, int, str, bytes]:
    """``(priority, attempt, max_attempts, id, body)`` of an entry; ``DecodeError`` if bad.
    The same rule as ``decode_entry``, which inlines it."""
    try:
        p, a, m, jid, body = raw.split(b":", 4)
        priority = _DIGIT.get(p)
        if priority is None:
            raise ValueError("priority is one digit")
        if not jid:
            raise ValueError("empty id")
        return (priority, _SMALL[a] if a in _SMALL else _header_int(a, "attempt"),
                _SMALL[m] if m in _SMALL else _header_int(m, "max_attempts"),
                jid.decode("ascii"), body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"malformed job header: {exc}") from None


_new_job = Job.__new__
_unpackb = msgpack.unpackb


def decode_entry(raw: bytes, queue: str) -> Job:
    """The ``Job`` in an entry; raises ``DecodeError`` with the reason when it is not one.

    Every field is checked here, before the job is accepted: a job that reaches a
    handler (and the metrics code) has a str task, a list of args, a str-keyed dict of
    kwargs and integer times. On the worker's hot path (about a microsecond): the fields
    are set directly rather than through ``Job.__init__``."""
    try:
        p, a, m, jid, body = raw.split(b":", 4)
        priority = _DIGIT.get(p)
        if priority is None or not jid:
            raise ValueError("priority is one digit and the id is not empty")
        job = _new_job(Job)
        job.id = jid.decode("ascii")
        job.attempt = _SMALL[a] if a in _SMALL else _header_int(a, "attempt")
        job.max_attempts = _SMALL[m] if m in _SMALL else _header_int(m, "max_attempts")
        job.priority = priority
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"malformed job header: {exc}") from None
    job.lease = jid + b":" + a
    job.queue = queue
    job.raw = raw
    job.recovered = False
    job.timeout_s = None
    try:
        fields = _unpackb(body, strict_map_key=False)
    except Exception as exc:
        raise DecodeError(
            f"cannot decode job {job.id} body: {type(exc).__name__}: {exc}") from None
    if type(fields) is not list or not 4 <= len(fields) <= 6:
        raise DecodeError(f"job {job.id} body is not [task, args, kwargs, enqueued_at"
                          f"(, due(, options))]: {type(fields).__name__} {_short(fields)}")
    if len(fields) == 6:
        _options(job, fields[5])
    job.task, job.args, job.kwargs, job.enqueued_ms = fields[0], fields[1], fields[2], \
        fields[3]
    due = fields[4] if len(fields) > 4 else job.enqueued_ms
    job.ready_ms = due
    # type() is, not isinstance: a bool is not a time, and msgpack gives exact types
    if type(job.task) is not str or type(job.args) is not list or \
            type(job.kwargs) is not dict or type(job.enqueued_ms) is not int or \
            type(due) is not int:
        raise DecodeError(f"job {job.id} body has a field of the wrong type: "
                          f"{_bad_field(fields)}")
    if job.kwargs:
        for key in job.kwargs:
            if not isinstance(key, str):
                raise DecodeError(f"job {job.id} body: keyword {_short(key)} is not a "
                                  "string")
    return job


def retask(body: bytes, task: str) -> bytes:
    """``body`` (a job's msgpack body) for another task: the same arguments, times and
    options (a job re-routed to its task's fallback)."""
    fields = _unpackb(body, strict_map_key=False)
    fields[0] = task
    return _pack(fields)


def _options(job: Job, opts: Any) -> None:
    """Set the per-job options of a body's options map on ``job``."""
    t = opts.get("timeout_s") if type(opts) is dict else None
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < 1e12:
            raise DecodeError(f"job {job.id} body: timeout_s {_short(t)} is not a "
                              "positive number of seconds")
        job.timeout_s = float(t)
    elif type(opts) is not dict:
        raise DecodeError(f"job {job.id} body: options {_short(opts)} is not a map")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad_field(fields: list[Any]) -> str:
    names = ("task", "args", "kwargs", "enqueued_at", "due")
    want = (str, list, dict, int, int)
    for name, kind, value in zip(names, want, fields, strict=False):
        if type(value) is not kind:
            return (f"{name} should be {kind.__name__}, not {type(value).__name__} "
                    f"{_short(value)}")
    return "?"


def trace_of(raw: bytes) -> dict[str, Any] | None:
    """The options map of an entry (its body's sixth field, where a traced producer puts
    its trace context), None when it has none. Only a traced worker reads it (never
    ``decode_entry``)."""
    try:
        fields = _unpackb(raw.split(b":", 4)[-1], strict_map_key=False)
    except Exception:
        return None
    opts = fields[5] if type(fields) is list and len(fields) == 6 else None
    return opts if type(opts) is dict else None


def lease_of(raw: bytes) -> tuple[str, bytes]:
    """``(id, lease)`` of an entry whose header the pop script accepted, even when its
    body (or the id's encoding) is bad: enough to dead-letter it."""
    parts = raw.split(b":", 4)
    if len(parts) < 5:
        raise DecodeError("malformed job header")
    return parts[3].decode("latin-1"), parts[3] + b":" + parts[1]


def counted(raw: bytes, attempt: int) -> bytes:
    """``raw`` with its attempt set to ``attempt``: a bundle job's entry as run (pop.lua)."""
    p, _, rest = raw.split(b":", 2)
    return b"%s:%d:%s" % (p, attempt, rest)


def reset_attempt(raw: bytes) -> bytes | None:
    """The entry with its attempt count set back to 0 (for redrive); None if malformed."""
    try:
        p, _, m, jid, body = parse_header(raw)
    except DecodeError:
        return None
    return b"%d:0:%d:%s:%s" % (p, m, jid.encode(), body)


# --- results ---------------------------------------------------------------------------


def encode_result(task: str, value: Any, limit: int) -> bytes:
    """msgpack of a handler's return value (tasks with ``result_ttl_s``); a ``TypeError``
    naming the task when msgpack cannot encode it, a ``ValueError`` when it is larger
    than ``limit`` bytes (the app's ``max_payload_bytes``)."""
    try:
        data: bytes = msgpack.packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"the result of {task} ({type(value).__name__}) cannot be encoded "
                        f"with msgpack: {exc}") from None
    if len(data) > limit:
        raise ValueError(f"the result of {task} is {len(data)} bytes encoded, above the "
                         f"limit of {limit} (App(max_payload_bytes=...))")
    return data


def decode_result(data: bytes) -> Any:
    """The value in a stored result."""
    return msgpack.unpackb(data, strict_map_key=False)


# --- dead records ----------------------------------------------------------------------


def encode_dead_record(
    job_id: str,
    reason: str,
    raw: bytes,
    *,
    error_type: str = "",
    error_message: str = "",
    traceback: str = "",
) -> bytes:
    """A dead-letter record, the same shape the Lua scripts write for lease_expired."""
    rec: bytes = msgpack.packb(
        {
            "id": job_id,
            "reason": reason,
            "error_type": error_type,
            "error_message": error_message,
            "traceback": traceback,
            "raw": raw,
        }
    )
    return rec


def decode_dead_record(data: bytes) -> dict[str, Any]:
    """The dict in a dead record; unknown or missing fields are tolerated."""
    try:
        rec = msgpack.unpackb(data, strict_map_key=False)
    except Exception as exc:
        return {"reason": "corrupt_record", "error_message": str(exc), "raw": data}
    return rec if isinstance(rec, dict) else {"reason": "corrupt_record", "raw": data}
