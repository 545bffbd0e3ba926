"""Job events: an opt-in, bounded stream of every job's state changes, per queue.

The Lua scripts that change a job's state (pop, ack, ack_result, nack, cancel, hold,
release, reroute) also append to the queue's stream ``T:events`` while the queue's
config hash ``T:evconf`` says events are on (``_lib.lua`` "Job events"): the event and
the change are one atomic step, so a settled job's event is never missing nor written
twice for one change. Every script reads the config on each call, so
``Queue.events(...)`` takes effect on the workers' next call, without a restart.

Ids are ``"<ms>-<n>"``: ``n`` numbers the queue's events 1, 2, 3... (the config hash
keeps the last one), so a reader that resumes from an id the trim has removed knows
exactly how many events it missed: the first kept event's ``n`` minus its own, minus
one. It gets them as one ``Event(kind="gap", missed=N)`` before the next event, never
silently. The stream is trimmed by count (``XADD ... MAXLEN ~ max_len``, every event)
and by age (``XTRIM ... MINID ~ now - max_age``, once per script call that wrote).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ..store import codec
from ..store.keys import QueueKeys

__all__ = [
    "KINDS",
    "Event",
    "EventsConfig",
    "Since",
    "aread",
    "config",
    "configure",
    "read",
]

KINDS = ("started", "succeeded", "retried", "dead", "cancelled", "expired", "held",
         "hold_lifted", "rerouted", "campaign_done", "gap")
"""Every ``Event.kind``; ``gap`` is made by the reader (events it could not read)."""

DEFAULT_MAX_LEN = 100_000
DEFAULT_MAX_AGE_S = 86_400.0
READ_COUNT = 500
"""Events read per round trip."""
POLL_S = 0.2
"""Follow mode over several queues: the pause between rounds that found nothing (one
queue blocks on the server instead)."""

Since = str | datetime | Mapping[str, str]
"""Where a read starts: an event id (exclusive: the events after it), ``"0"`` (the
oldest kept), ``"$"`` (only new ones), a ``datetime`` (the events at or after it), or a
mapping queue -> id (resuming a read of several queues)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One state change of one job (or of a group's hold, or a campaign).

    ``id`` the stream id (resume after it); ``at_ms`` server time (Unix ms);
    ``attempt`` the run it is about (``None`` when unknown); ``group`` the job's group
    (a hold's: ``None`` for the whole queue); ``error`` the error of ``retried``, the
    reason (and error) of ``dead``, the fallback task of ``rerouted``, why a hold was
    set; ``until_ms`` the end of a hold; ``missed`` the events lost to the trim (kind
    ``gap``; ``-1``: a count unknown, when reading from a ``datetime`` older than what
    is kept)."""

    id: str
    kind: str
    job_id: str
    task: str
    queue: str
    group: str | None = None
    campaign: str | None = None
    attempt: int | None = None
    at_ms: int = 0
    error: str | None = None
    until_ms: int | None = None
    missed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """A queue's events setting (``Queue.events_config``)."""

    enabled: bool
    max_len: int
    max_age_s: float
    last_id: str | None
    """The id of the queue's last event (``None``: none written yet)."""


# --- the setting -----------------------------------------------------------------------


def _check(max_len: object, max_age_s: object) -> tuple[int, int]:
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a whole number >= 1, got {max_len!r}")
    if isinstance(max_age_s, bool) or not isinstance(max_age_s, int | float) \
            or not max_age_s >= 0 or max_age_s == float("inf"):
        raise ValueError(f"max_age_s must be a number of seconds >= 0 (0: no age limit), "
                         f"got {max_age_s!r}")
    return max_len, round(max_age_s * 1000)


def configure(r: Any, k: QueueKeys, enabled: bool, max_len: int = DEFAULT_MAX_LEN,
              max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
    """Turn a queue's events on (``max_len`` events kept at most, roughly; and none
    older than ``max_age_s``, 0: no age limit) or off (the stream stays readable; the
    event counter stays, so ids go on from where they were). ``r``: a sync client."""
    if not isinstance(enabled, bool):
        raise ValueError(f"events(...) takes True/False or the limits, got {enabled!r}")
    if not enabled:
        r.hdel(k.evconf, "len", "age")
        return
    n_len, age_ms = _check(max_len, max_age_s)
    if not r.hexists(k.evconf, "n"):
        # the counter was lost (the hash deleted by hand): go on from the stream's last
        # id, or the scripts' next XADD would be refused as not after it
        last = r.xrevrange(k.events, count=1)
        if last:
            ms, n = _id_parts(last[0][0])
            r.hset(k.evconf, mapping={"n": n, "ms": ms})
    r.hset(k.evconf, mapping={"len": n_len, "age": age_ms})


def config(r: Any, k: QueueKeys) -> EventsConfig:
    """A queue's events setting, read with a sync client."""
    v = r.hmget(k.evconf, "len", "age", "n", "ms")
    n_len, age, n, ms = (int(x) if x is not None else None for x in v)
    return EventsConfig(n_len is not None, n_len or 0, (age or 0) / 1000,
                        f"{ms}-{n}" if n else None)


# --- reading ---------------------------------------------------------------------------


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _id_parts(eid: Any) -> tuple[int, int]:
    ms, _, n = _text(eid).partition("-")
    return int(ms), int(n or 0)


def _group_name(hexname: str) -> str | None:
    try:
        return bytes.fromhex(hexname).decode("utf-8")
    except ValueError:
        return hexname


def _job_group(jid: str) -> str | None:
    _, sep, tail = jid.partition("~")
    return _group_name(tail.removesuffix(codec.TRACKED_MARK)) if sep else None


def decode(queue: str, eid: Any, fields: Mapping[Any, Any]) -> list[Event]:
    """One stream entry as its ``Event`` s: one per item (the jobs of one kind that one
    script call changed share an entry, their fields joined by ``"\\0"``), each with
    its own id ``"<ms>-<n>"``, n its number among the queue's events."""
    raw = {_text(a): b for a, b in fields.items()}
    f = {k: _text(v) for k, v in raw.items() if k not in ("b", "p")}
    ms, last = _id_parts(eid)
    kind = f.get("k", "")
    if raw.get("b"):
        return _bundle(queue, kind, ms, last, raw["b"], raw.get("p") or b"")
    jids = f.get("j", "").split("\0")
    count = len(jids)

    def items(name: str) -> list[str]:
        v = f.get(name, "")
        parts = v.split("\0") if v else []
        return parts + [""] * (count - len(parts))

    attempts, tasks, cids, errs = items("a"), items("t"), items("c"), items("e")
    g = f.get("g") or None
    until = f.get("u", "")
    out = []
    for i, jid in enumerate(jids):
        out.append(Event(
            id=f"{ms}-{last - count + 1 + i}", kind=kind, job_id=jid, task=tasks[i],
            queue=queue,
            group=(None if g == "~q" else _group_name(g)) if g else _job_group(jid),
            campaign=cids[i] or None,
            attempt=int(attempts[i]) if attempts[i].isdigit() else None,
            at_ms=ms, error=errs[i] or None,
            until_ms=int(until) if until.isdigit() else None))
    return out


def _bundle(queue: str, kind: str, ms: int, last: int, blob: Any,
            pos: Any) -> list[Event]:
    """The events of a bundle's entry: its jobs' packed entries (as popped: the attempt
    not counted yet) and the positions (two bytes each; none: all) of those it is about."""
    entries: list[Any] = []  # (stays empty when it is not one: only how many is known)
    with contextlib.suppress(Exception):
        # msgpack through codec (the one module that imports it); strings kept as bytes
        v = codec._unpackb(blob if isinstance(blob, bytes) else blob.encode(), raw=True)
        if isinstance(v, list) and all(isinstance(e, bytes) for e in v):
            entries = v
    pb = pos if isinstance(pos, bytes) else str(pos).encode("latin-1")
    at = [pb[i] * 256 + pb[i + 1] for i in range(0, len(pb) - 1, 2)] if pb \
        else list(range(1, len(entries) + 1))
    out = []
    for i, p in enumerate(at):
        jid, task, attempt = "", "", None
        if 0 < p <= len(entries):
            with contextlib.suppress(codec.DecodeError, TypeError):
                job = codec.decode_entry(entries[p - 1], queue)
                jid, task, attempt = job.id, job.task, job.attempt + 1
        out.append(Event(id=f"{ms}-{last - len(at) + 1 + i}", kind=kind, job_id=jid,
                         task=task, queue=queue, group=_job_group(jid), attempt=attempt,
                         at_ms=ms))
    return out


class _Cursor:
    """One queue's read position: ``start`` the XRANGE start of the next read, ``n`` the
    number of the last event read (None: unknown, no gap check until the first event)."""

    __slots__ = ("first", "k", "n", "since_ms", "start")

    def __init__(self, k: QueueKeys, since: str | datetime) -> None:
        self.k = k
        self.first = False  # the next read is the first: check the start for a gap
        self.since_ms: int | None = None
        self.n: int | None = None
        if isinstance(since, datetime):
            self.since_ms = round(since.timestamp() * 1000)
            self.start = f"{self.since_ms}-0"
            self.first = True
        elif since == "0":
            self.start = "-"
        elif since == "$":
            self.start = "$"
        else:
            if not isinstance(since, str):
                raise ValueError(f"since must be an event id, '0', '$' or a datetime, "
                                 f"got {since!r}")
            try:
                ms, n = _id_parts(since)
            except ValueError:
                raise ValueError(f"since {since!r} is not an event id ('<ms>-<n>'), '0', "
                                 "'$' or a datetime") from None
            # the entry holding event n has an id >= "<ms>-<n>": read from there, skip
            # the events up to n
            self.start, self.n = f"{ms}-{n}", n

    def take(self, entries: Sequence[Any], info: Mapping[Any, Any] | None) -> list[Event]:
        """The events of one read, a ``gap`` first when the trim took some the reader
        had not seen."""
        out: list[Event] = []
        if not entries:
            return out
        queue = self.k.queue
        evs = [e for eid, fields in entries for e in decode(queue, eid, fields)]
        if self.n is not None:
            evs = [e for e in evs if _id_parts(e.id)[1] > self.n]
        if evs:
            n0 = _id_parts(evs[0].id)[1]
            if self.n is not None and n0 > self.n + 1:
                out.append(Event(id=f"{_id_parts(evs[0].id)[0]}-{self.n}", kind="gap",
                                 job_id="", task="", queue=queue, missed=n0 - self.n - 1))
            elif self.first and self.since_ms is not None and n0 > 1:
                # from a datetime: a gap only when something at or after it was trimmed
                deleted = _text((info or {}).get("max-deleted-entry-id", "0-0"))
                if _id_parts(deleted)[0] >= self.since_ms:
                    out.append(Event(id=f"{self.since_ms}-0", kind="gap", job_id="",
                                     task="", queue=queue, missed=-1))
            self.n = _id_parts(evs[-1].id)[1]
        self.first = False
        out.extend(evs)
        self.start = "(" + _text(entries[-1][0])
        return out


def _cursors(keys: Sequence[QueueKeys], since: Since) -> list[_Cursor]:
    if isinstance(since, Mapping):
        return [_Cursor(k, since.get(k.queue, "0")) for k in keys]
    return [_Cursor(k, since) for k in keys]


def _resolve(c: _Cursor, top: Any) -> None:
    """Resolve ``"$"`` from the newest entry now (new events come after it)."""
    c.start = "(" + _text(top[0][0]) if top else "-"
    c.n = _id_parts(top[0][0])[1] if top else None


def read(r: Any, keys: Sequence[QueueKeys], since: Since = "0", follow: bool = False,
         block_ms: int = 1000, count: int = READ_COUNT,
         stop: Any = None) -> Iterator[Event]:
    """The events of ``keys``' queues after ``since``, with a sync client; ``follow``:
    wait for new ones forever (or until ``stop()`` is true, checked between reads)."""
    cursors = _cursors(keys, since)
    for c in cursors:
        if c.start == "$":
            _resolve(c, r.xrevrange(c.k.events, count=1))
    while True:
        got = False
        for c in cursors:
            while True:
                info = _info(r, c)
                entries = r.xrange(c.k.events, c.start, "+", count=count)
                yield from c.take(entries, info)
                got = got or bool(entries)
                if len(entries) < count:
                    break
        if not follow or (stop is not None and stop()):
            return
        if not got:
            if len(cursors) == 1:
                c = cursors[0]
                r.xread({c.k.events: _after(c)}, count=1, block=block_ms)
            else:
                time.sleep(POLL_S)


def _after(c: _Cursor) -> str:
    """The id XREAD waits for entries after (the next read's start, exclusive)."""
    if c.start == "-":
        return "0-0"
    return c.start[1:] if c.start.startswith("(") else _before(c.start)


def _before(start: str) -> str:
    """An id just before an inclusive start ``"<ms>-<n>"``."""
    ms, n = _id_parts(start)
    return f"{ms}-{n - 1}" if n > 0 else f"{ms - 1}-18446744073709551615"


def _info(r: Any, c: _Cursor) -> Mapping[Any, Any] | None:
    if not c.first:
        return None
    try:
        return r.xinfo_stream(c.k.events)  # type: ignore[no-any-return]
    except Exception:  # no stream yet
        return None


async def aread(r: Any, keys: Sequence[QueueKeys], since: Since = "0",
                follow: bool = False, block_ms: int = 1000,
                count: int = READ_COUNT) -> AsyncIterator[Event]:
    """``read`` with an asyncio client."""
    cursors = _cursors(keys, since)
    for c in cursors:
        if c.start == "$":
            _resolve(c, await r.xrevrange(c.k.events, count=1))
    while True:
        got = False
        for c in cursors:
            while True:
                info = None
                if c.first:
                    try:
                        info = await r.xinfo_stream(c.k.events)
                    except Exception:  # no stream yet
                        info = None
                entries = await r.xrange(c.k.events, c.start, "+", count=count)
                for e in c.take(entries, info):
                    yield e
                got = got or bool(entries)
                if len(entries) < count:
                    break
        if not follow:
            return
        if not got:
            if len(cursors) == 1:
                c = cursors[0]
                await r.xread({c.k.events: _after(c)}, count=1, block=block_ms)
            else:
                await asyncio.sleep(POLL_S)
