"""Calendar quotas and send windows as they are kept in Redis for the pop script.

Both live in the queue's ``limits`` hash, beside the limits (``batchq/flow/limits.py``), so
``pop.lua`` reads them with the limits it reads anyway; ``Queue.clear`` keeps them:

- ``<f>#c`` (``f``: ``~q``, ``*`` or a group's hex name): the calendar quotas of the
  limit ``f``, ``"<tz>|<per minute>|<per hour>|<per day>|<per month>"`` (empty: none).
  They belong to the limit: a group with a limit of its own does not take ``*``'s.
- ``<f>#w``: the send window of the queue, of every group without one (``*``) or of a
  group: ``"<list field>|<the rule as JSON>"``.
- ``@h:<tz>``, ``@d:<tz>``, ``@M:<tz>``: the ends of the zone's hours, days and months,
  ``@w:<id>``: a window's open / close instants (``calendars.encode_list``), written
  here from server time for ``calendars.HORIZON_MS`` ahead, and again by ``refresh``
  (each ``limit``, ``window``, ``limits`` or ``windows`` call) once half is used.
- ``#``: present while any quota or window is set, so a pop without them reads no
  more than before; its value counts the fields of the hash that are not limits.

The counts are ``gstate`` fields ``<f>|<m|h|d|M>`` = ``"<period end ms>:<starts>"``,
written by the pop that starts the jobs: a count whose period has ended reads as 0.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import redis

from ..store.keys import QueueKeys
from . import calendars, limits
from .limits import (
    CAL_SUFFIX,
    DEFAULT_FIELD,
    DEFAULT_GROUP,
    QUEUE_FIELD,
    Limit,
    _release_all_waiting,
    _text,
    check_group,
    group_hex,
    group_name,
)

WIN_SUFFIX = "#w"
FLAG = "#"
MAX_SPANS = 20


@dataclass(frozen=True)
class Window:
    """The send window of the queue (``group`` None), of every group without one
    (``"*"``) or of one group: jobs start only inside one of ``spans`` (weekly rules),
    in the time zone ``tz``, on no ``holidays`` (local dates)."""

    group: str | None
    spans: tuple[calendars.Span, ...]
    tz: str = "UTC"
    holidays: tuple[date, ...] = ()

    @property
    def field(self) -> str:
        return _field(self.group)

    def spec(self) -> str:
        return json.dumps({"tz": self.tz, "spans": [[s.start, s.end, sorted(s.days)]
                                                   for s in self.spans],
                           "holidays": [d.isoformat() for d in self.holidays]},
                          separators=(",", ":"), sort_keys=True)

    def list_field(self) -> str:
        return "@w:" + hashlib.sha1(self.spec().encode()).hexdigest()[:16]

    def describe(self) -> str:
        text = "; ".join(s.text() for s in self.spans) + f" {self.tz}"
        if self.holidays:
            text += f" ({len(self.holidays)} holidays)"
        return text

    def next_open(self, after_ms: int) -> int:
        return calendars.next_open(self.spans, calendars.zone(self.tz), self.holidays,
                                   after_ms)


def make_window(group: str | None, hours: str | Sequence[str], days: str | Sequence[str],
                tz: str | None, holidays: Iterable[object] | None) -> Window:
    """A ``Window`` from ``Queue.window``'s arguments; a ValueError naming the bad one.
    ``hours`` and ``days`` may be lists of the same length (one span each), or ``days``
    one value for every ``hours``."""
    if group is not None and group != DEFAULT_GROUP:
        check_group(group)
    hs = [hours] if isinstance(hours, str) else list(hours)
    ds = [days] if isinstance(days, str) else list(days)
    if not hs or len(hs) > MAX_SPANS:
        raise ValueError(f"hours: give 1..{MAX_SPANS} ranges")
    if len(ds) == 1:
        ds = ds * len(hs)
    if len(ds) != len(hs):
        raise ValueError("days: one value, or one per hours range")
    spans = tuple(calendars.Span(*calendars.parse_hours(h), calendars.parse_days(d))
                  for h, d in zip(hs, ds, strict=True))
    name = tz or "UTC"
    calendars.zone(name)
    return Window(group, spans, name, calendars.parse_holidays(holidays))


def next_opening(window: str, tz: str | None = None, after: float | None = None) -> float:
    """When a job for a recipient with send window ``window`` (``"09:00-20:00"``,
    optionally followed by days: ``"09:00-20:00 mon-fri"``) in ``tz`` may start: the
    next opening at or after ``after`` (Unix seconds, default now, by this process's
    clock), as Unix seconds for ``options(eta=...)``."""
    if not isinstance(window, str):
        raise ValueError(f"window must be a str like '09:00-20:00 mon-fri', got {window!r}")
    hours, _, days = window.strip().partition(" ")
    w = make_window(None, hours, days.strip() or "daily", tz, None)
    start = time.time() if after is None else after
    return w.next_open(round(start * 1000)) / 1000


def _field(group: str | None) -> str:
    return (QUEUE_FIELD if group is None else DEFAULT_FIELD if group == DEFAULT_GROUP
            else group_hex(group))


def decode_window(f: str, raw: str) -> Window | None:
    """The ``Window`` stored as ``<f>#w`` (None when it does not decode)."""
    try:
        spec = json.loads(raw.partition("|")[2])
        spans = tuple(calendars.Span(int(a), int(b), frozenset(int(x) for x in d))
                      for a, b, d in spec["spans"])
        group = (None if f == QUEUE_FIELD else DEFAULT_GROUP if f == DEFAULT_FIELD
                 else group_name(f))
        return Window(group, spans, str(spec["tz"]),
                      tuple(date.fromisoformat(x) for x in spec["holidays"]))
    except (ValueError, KeyError, TypeError):
        return None


def server_ms(r: redis.Redis) -> int:
    s, us = r.execute_command("TIME")  # type: ignore[no-untyped-call]
    return int(s) * 1000 + int(us) // 1000


def _tz_lists(tz: str, codes: Iterable[str], now_ms: int) -> dict[str, str]:
    z = calendars.zone(tz)
    out = {}
    for code in codes:
        if code == "m":
            calendars.check_minutes(z, now_ms, now_ms + 400 * calendars.DAY_MS)
            continue
        ends = calendars.period_ends(z, code, now_ms - calendars.CYCLE_MS[code],
                                     now_ms + calendars.HORIZON_MS[code])
        out[f"@{code}:{tz}"] = calendars.encode_list(calendars.CYCLE_MS[code], ends)
    return out


def _window_list(w: Window, now_ms: int) -> str:
    edges = calendars.window_edges(w.spans, calendars.zone(w.tz), w.holidays,
                                   now_ms - calendars.WEEK_MS,
                                   now_ms + calendars.HORIZON_MS["w"])
    if not edges:
        raise ValueError(f"the window {w.describe()} never opens")
    return calendars.encode_list(calendars.WEEK_MS, edges)


def calendar_writes(r: redis.Redis, k: QueueKeys, limit: Limit) -> dict[str, str | None]:
    """The ``limits`` fields to write (None: delete) with ``limit``: its ``#c`` field,
    the boundary lists of its zone and the flag. Computed before anything is written,
    so a zone that cannot be used writes nothing."""
    f = limit.field + CAL_SUFFIX
    cal = limit.calendar
    if not cal:
        return {f: None}
    tz = limit.tz or "UTC"
    codes = [calendars.KIND_CODE[kind] for kind in cal]
    out: dict[str, str | None] = dict(_tz_lists(tz, codes, server_ms(r)))
    out[f] = "|".join([tz] + [str(cal.get(kind, "")) for kind in calendars.KINDS])
    out[FLAG] = "1"
    return out


def set_limit(r: redis.Redis, k: QueueKeys, limit: Limit) -> Limit:
    """``limits.set_limit`` with the limit's calendar quotas and their boundary lists."""
    out = limits.set_limit(r, k, limit, calendar_writes(r, k, limit))
    tidy(r, k)
    return out


def remove_limit(r: redis.Redis, k: QueueKeys, group: str | None = None) -> bool:
    """``limits.remove_limit``, its calendar quotas and lists no longer used too."""
    out = limits.remove_limit(r, k, group)
    tidy(r, k)
    return out


def set_window(r: redis.Redis, keys: Sequence[QueueKeys], w: Window) -> Window:
    """Store ``w`` (replacing the window of the same queue or group) and its boundary
    list in each queue of ``keys`` (a sharded queue's shards); groups waiting on the old
    one are looked at again at once, so the change applies to jobs already queued."""
    lst = _window_list(w, server_ms(r))
    for k in keys:
        pipe = r.pipeline(transaction=False)
        pipe.hset(k.limits, mapping={w.list_field(): lst, FLAG: "1",
                                     w.field + WIN_SUFFIX: f"{w.list_field()}|{w.spec()}"})
        _recheck(pipe, r, k, w.group)
        tidy(r, k)
    return w


def _recheck(pipe: Any, r: redis.Redis, k: QueueKeys, group: str | None) -> None:
    if group is None:
        pipe.zadd(k.gwait, {QUEUE_FIELD: 0}, xx=True)
    elif group != DEFAULT_GROUP:
        pipe.zadd(k.gwait, {group_hex(group): 0}, xx=True)
    pipe.rpush(k.wake, "1")
    pipe.execute()
    if group == DEFAULT_GROUP:
        _release_all_waiting(r, k)


def remove_window(r: redis.Redis, k: QueueKeys, group: str | None = None) -> bool:
    """Drop the window of the queue, of ``"*"`` or of a group; True if there was one.
    Jobs held by it start on the next pop."""
    if group is not None and group != DEFAULT_GROUP:
        check_group(group)
    pipe = r.pipeline(transaction=False)
    pipe.hdel(k.limits, _field(group) + WIN_SUFFIX)
    removed = bool(pipe.execute()[0])
    tidy(r, k)
    _recheck(r.pipeline(transaction=False), r, k, group)
    return removed


def read(r: redis.Redis, k: QueueKeys) -> tuple[dict[str, str], list[Window]]:
    """The ``limits`` hash as text and the windows in it; boundary lists running low
    are written again first (``refresh``)."""
    raw = {_text(f): _text(v) for f, v in r.hgetall(k.limits).items()}
    if FLAG in raw:
        refresh(r, k, raw)
    wins = [w for f, v in raw.items() if f.endswith(WIN_SUFFIX)
            for w in [decode_window(f[:-len(WIN_SUFFIX)], v)] if w is not None]
    wins.sort(key=lambda w: (w.group is not None, w.group != DEFAULT_GROUP, w.group or ""))
    return raw, wins


def tidy(r: redis.Redis, k: QueueKeys) -> None:
    """Drop the boundary lists no quota or window names any more, and the flag when
    none is left (a limits hash holds what operators set: HKEYS is bounded by it)."""
    raw = {_text(f): _text(v) for f, v in r.hgetall(k.limits).items()}
    wanted = _wanted(raw)
    stale = [f for f in raw if f.startswith("@") and f not in wanted]
    if not any(f.endswith((CAL_SUFFIX, WIN_SUFFIX)) for f in raw) and FLAG in raw:
        stale.append(FLAG)
    if stale:
        r.hdel(k.limits, *stale)
    if FLAG in raw and FLAG not in stale:
        # the flag holds how many fields are not limits (itself too): flow_view counts
        # the limits as HLEN minus it
        extra = sum(1 for f in raw if not limits.is_limit_field(f) and f not in stale)
        r.hset(k.limits, FLAG, str(extra))


def _wanted(raw: dict[str, str]) -> dict[str, tuple[str, Any]]:
    """Each boundary list the quotas and windows of ``raw`` need, and what builds it."""
    out: dict[str, tuple[str, Any]] = {}
    for f, v in raw.items():
        if f.endswith(CAL_SUFFIX):
            parts = (v.split("|") + [""] * 5)[:5]
            for code, n in zip(("m", "h", "d", "M"), parts[1:], strict=True):
                if n and code != "m":
                    out[f"@{code}:{parts[0] or 'UTC'}"] = ("tz", (parts[0] or "UTC", code))
        elif f.endswith(WIN_SUFFIX):
            w = decode_window(f[:-len(WIN_SUFFIX)], v)
            if w is not None:
                out[v.partition("|")[0]] = ("w", w)
    return out


def refresh(r: redis.Redis, k: QueueKeys, raw: dict[str, str] | None = None) -> int:
    """Write again every boundary list with less than half its horizon left (or
    missing); returns how many were written."""
    if raw is None:
        raw = {_text(f): _text(v) for f, v in r.hgetall(k.limits).items()}
    now = server_ms(r)
    writes: dict[str, str] = {}
    for name, (kind, what) in _wanted(raw).items():
        cur = raw.get(name)
        code = "w" if kind == "w" else what[1]
        if cur:
            _, edges = calendars.decode_list(cur)
            if edges and edges[-1] - now > calendars.HORIZON_MS[code] / 2:
                continue
        try:
            writes.update(_tz_lists(what[0], [what[1]], now) if kind == "tz"
                          else {name: _window_list(what, now)})
        except ValueError:
            continue  # a rule that no longer builds (a zone removed): left as it is
    if writes:
        r.hset(k.limits, mapping=writes)  # type: ignore[arg-type]
    return len(writes)


@dataclass(frozen=True)
class WindowUse:
    """A calendar quota's use now: ``used`` of ``limit`` starts in the ``window``
    (``"minute"``..``"month"``) ending in ``reset_s`` seconds."""

    group: str | None
    window: str
    used: int
    limit: int
    reset_s: float


def use_of(raw_count: Any, now_ms: int) -> tuple[int, int | None]:
    """The starts counted in the current period from a ``gstate`` count field
    (``"<period end>:<n>"``) and that period's end; (0, None) when it counts a period
    that has ended (or there is none)."""
    if raw_count is None:
        return 0, None
    end, _, n = _text(raw_count).partition(":")
    try:
        stop = int(float(end))
        return (max(0, int(float(n))), stop) if stop > now_ms else (0, None)
    except ValueError:
        return 0, None


def pin_list(r: redis.Redis, k: QueueKeys, name: str, edges: Sequence[int],
             cycle_ms: int) -> None:
    """Overwrite boundary list ``name`` (``"@d:UTC"``, ``Window.list_field()``) with
    ``edges`` (UTC ms, sorted): for tests and the bench, a period that ends or a window
    that opens a few seconds from now. ``refresh`` leaves it while it reaches far
    enough ahead."""
    r.hset(k.limits, name, calendars.encode_list(cycle_ms, sorted(edges)))
