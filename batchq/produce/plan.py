"""One enqueue call resolved: the target keys, the header, and each job's id and entry.

``plan`` refuses (naming the option) any value the scripts or the worker could not
handle; ``Plan.body`` encodes a job and refuses one that is too large before a sequence
number is reserved for it; ``Plan.finish`` gives it its id; ``Plan.script_args`` is the
script call that writes a chunk of entries (through the builders in ``scripts.calls``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from ..flow.limits import check_group, group_hex
from ..store import codec
from ..store.keys import QueueKeys
from ..store.scripts import calls
from ..tasks.durations import check_seconds
from ..tasks.errors import PayloadTooLarge
from . import tracked
from .options import (
    MAX_DELAY_S,
    _check_queue,
    _check_seconds,
    check_expiry,
    check_on_conflict,
    eta_seconds,
    expiry_spec,
)
from .seqs import entry_runs, run_first


class PlanSource(Protocol):
    """What ``plan`` needs: key names and the payload limit (``Clients``; an ``App``)."""

    @property
    def max_payload_bytes(self) -> int: ...

    def keys(self, queue: str) -> QueueKeys: ...


@dataclass(frozen=True)
class Plan:
    """Everything one enqueue call needs, resolved once."""

    keys: QueueKeys
    head: bytes
    task: str
    due: tuple[str, int] | None  # ("rel", ms) or ("abs", unix ms) or None for ready
    max_payload: int
    ref: str = ""  # the queue reference every id of this plan starts with
    campaign: str | None = None
    key_ttl_ms: int = 0
    group: str = ""
    """The hex of the jobs' group (``limits.group_hex``), "" for none: ids end in
    ``~<group>`` (before a tracked job's mark), written by enqueue_group.lua."""
    tracked: bool = False
    """Written by enqueue_tracked.lua (a campaign or dedup keys): ids end in "_m", and
    ``entries`` lists alternate entry, dedup key ("" for none)."""
    opts: Mapping[str, Any] | None = None
    """Per-job options carried in each body (``{"timeout_s": ...}``), None for none."""
    on_conflict: str = "keep"
    """A held dedup key whose job still waits: ``keep``, ``replace`` or ``debounce``
    (``options.ON_CONFLICT``; enqueue_tracked.lua)."""
    min_replicas: int | None = None
    """Replicas that must confirm each write (``replicas.py``); None: the app's."""
    expiry: str = ""
    """The jobs' expiry (``options.expiry_spec``), "" for none: an expiring job is
    tracked, and its deadline is written to the queue's ``expires`` zset."""
    groups: str = ""
    """One chunk of ``enqueue_many(group_fn=...)``: its rows' groups as runs in row order
    (``calls.group_runs``: ``"<hex>:<count>,..."``, an empty hex for rows without a
    group); each row's id carries its own group. "" for any other write."""

    @property
    def target(self) -> str:
        return self.keys.ready_for(int(self.head[:1]))

    def body(self, args: Any, kwargs: Mapping[str, Any], now_ms: int) -> bytes:
        """The job's msgpack body; refuses a job too large even with the shortest id, so
        no sequence number is reserved for it."""
        due_ms = None
        if self.due is not None:
            due_ms = now_ms + self.due[1] if self.due[0] == "rel" else self.due[1]
        b = codec.encode_body(self.task, args, kwargs, now_ms, due_ms, self.opts)
        if len(self.head) + codec.MIN_ID_LEN + 1 + len(b) > self.max_payload:
            self._check_size(len(self.head) + codec.MIN_ID_LEN + 1 + len(b))
        return b

    def entry(self, args: Any, kwargs: Mapping[str, Any], now_ms: int,
              seq: Callable[[], int | None] | None = None) -> tuple[str, bytes]:
        return self.finish(self.body(args, kwargs, now_ms), seq)

    @property
    def mark(self) -> str:
        """What this plan's ids end with: the group ("~<hex>"), then a tracked job's
        mark."""
        return ("~" + self.group if self.group else "") + \
            (tracked.TRACKED_SUFFIX if self.tracked else "")

    def finish(self, body: bytes, seq: Callable[[], int | None] | None = None,
               mark: str | None = None) -> tuple[str, bytes]:
        """The id and the entry of a job whose body is ``body``; ``mark``: the id's end,
        when not this plan's (a row of ``group_fn``: its own group)."""
        # no number for a bad job; the id ends with its group ("~<hex>") then a tracked
        # job's mark, after the number
        if mark is None:
            mark = self.mark
        jid = codec.new_id(self.ref, seq() if seq else None, mark)
        e = b"%s%s:%s" % (self.head, jid.encode(), body)
        if len(e) > self.max_payload:
            self._check_size(len(e))
        return jid, e

    def _check_size(self, n: int) -> None:
        if n > self.max_payload:
            raise PayloadTooLarge(
                f"cannot enqueue {self.task}: encoded job is {n} bytes, above the "
                f"limit of {self.max_payload} (App(max_payload_bytes=...))"
            )

    @property
    def script(self) -> str:
        """The script that writes this plan's jobs."""
        if self.tracked:
            return "enqueue_tracked"
        if self.group or self.groups:
            return "enqueue_group"
        return "schedule" if self.due else "enqueue"

    def script_args(self, entries: list[bytes], check: bool) -> tuple[list[str], list[Any]]:
        p = int(self.head[:1])
        if self.tracked:
            mode, when = self.due or ("ready", 0)
            first = None if self.due is not None or not entries else \
                run_first(self.head, entries[0], entries[-2], len(entries) // 2)
            c = calls.enqueue_tracked(self.keys, p, mode, when, self.campaign or "",
                                      self.key_ttl_ms, tracked.TRIM_CHUNK, entries,
                                      check=check, on_conflict=self.on_conflict,
                                      scan=tracked.REPLACE_SCAN, expiry=self.expiry,
                                      groups=self.groups, first_seq=first)
            return c.keys, c.args
        runs = entry_runs(self.head, entries) if self.due is None else ""
        if self.groups:
            mode, when = self.due or ("ready", 0)
            c = calls.enqueue_groups(self.keys, self.groups, p, mode, when, entries,
                                     check=check, runs=runs)
            return c.keys, c.args
        if self.group:
            mode, when = self.due or ("ready", 0)
            c = calls.enqueue_group(self.keys, self.group, p, mode, when, entries,
                                    check=check, runs=runs)
            return c.keys, c.args
        c = (calls.enqueue(self.keys, p, entries, check=check, runs=runs) if self.due is None else
             calls.schedule(self.keys, p, self.due[0], self.due[1], entries, check=check))
        return c.keys, c.args


def plan(src: PlanSource, task: str, queue: str, priority: int, max_attempts: int,
         delay_s: float | None, eta: datetime | float | None, *,
         campaign: str | None = None, key_ttl_s: float | None = None,
         keyed: bool = False, group: str | None = None, timeout_s: float | None = None,
         on_conflict: str | None = None, expires_s: float | None = None,
         expires_at: datetime | float | None = None, keep_expired: bool | None = None,
         ) -> Plan:
    """Resolve one enqueue call's target and header; refuses (naming the option) any
    value the scripts or the worker could not handle. ``campaign`` / ``keyed`` (dedup
    keys given) make the jobs tracked; ``group``: the jobs' group (flow control);
    ``timeout_s``: each job's own timeout; ``on_conflict``: what a held key does
    (``options.ON_CONFLICT``); ``expires_s`` / ``expires_at``: a job not started by then
    never runs (tracked; ``keep_expired``: kept in dead as ``expired``)."""
    due: tuple[str, int] | None = None
    if delay_s is not None and _check_seconds("delay_s", delay_s, MAX_DELAY_S) > 0:
        due = ("rel", round(delay_s * 1000))
    elif eta is not None:
        # a naive datetime is local time, as datetime.timestamp() reads it
        due = ("abs", round(eta_seconds(eta) * 1000))
    ttl_s = tracked.DEFAULT_KEY_TTL_S if key_ttl_s is None else \
        _check_seconds("key_ttl_s", key_ttl_s, MAX_DELAY_S)
    mode = "keep" if on_conflict is None else check_on_conflict(on_conflict)
    if mode != "keep" and not keyed:
        raise ValueError(f"on_conflict={mode!r} needs a dedup key (options(key=...), or "
                         "key_fn for enqueue_many)")
    if mode == "debounce" and due is None:
        raise ValueError("on_conflict='debounce' needs delay_s (or eta): the job starts "
                         "that long after the latest call")
    check_expiry(expires_s, expires_at, keep_expired)
    expiry = expiry_spec(expires_s, expires_at, keep_expired)
    opts = None
    if timeout_s is not None:
        opts = {"timeout_s": check_seconds("timeout_s", timeout_s, positive=True)}
    return Plan(src.keys(_check_queue("queue", queue)), codec.header(priority, max_attempts),
                 task, due, src.max_payload_bytes, codec.queue_ref(queue),
                 None if campaign is None else tracked.check_campaign_id(campaign),
                 round(ttl_s * 1000), "" if group is None else group_hex(check_group(group)),
                 campaign is not None or keyed or expiry != "", opts, mode, expiry=expiry)
