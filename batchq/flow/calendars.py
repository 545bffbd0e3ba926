"""Calendar arithmetic for calendar quotas and send windows, done here, never in Lua.

Lua has no time zones, so the scripts never convert a time: Python turns a time zone
and a rule (``max_per_day`` in ``America/New_York``, "09:00-20:00 mon-fri in
Europe/Paris") into *boundary lists*, the UTC instants (ms) where a period ends or a
window opens or closes, and stores them in the queue's ``limits`` hash
(``batchq/flow/windows.py``); the pop script looks up the first boundary after the server's
``now`` (a binary search over fixed-width numbers, ``_windows.lua``).

Periods follow the wall clock of the zone, daylight saving included: a period starts at
the first instant whose local time reaches the start of its hour, day or month. So the
day of a spring-forward change is 23 hours long and that of a fall-back change 25; on
the fall-back night the repeated hour is one period of two hours, and a skipped hour
(spring forward) is no period at all. A minute is a UTC minute (every zone's offset is
a whole number of minutes; a zone whose offset is not is refused).

A send window's hours belong to the day it opens: ``"22:00-06:00"`` on ``mon-fri``
opens Monday 22:00 and closes Tuesday 06:00. A holiday is a local date on which no
window opens. Windows that overlap merge. An opening or closing time that does not
exist on a spring-forward day is the first instant after the gap.
"""

from __future__ import annotations

import bisect
import re
import zoneinfo
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS

KINDS = ("minute", "hour", "day", "month")
"""The calendar windows a quota may count over, shortest first."""
KIND_CODE = {"minute": "m", "hour": "h", "day": "d", "month": "M"}

CYCLE_MS = {"h": HOUR_MS, "d": DAY_MS, "M": 31 * DAY_MS, "w": WEEK_MS}
"""How the script extends a list past its last boundary (the lists are refreshed long
before: ``HORIZON_MS``): by whole cycles of this length. Exact for hours and windows
but across a daylight-saving change, near enough for days; months are stored ten
years ahead."""
HORIZON_MS = {"h": 40 * DAY_MS, "d": 400 * DAY_MS, "M": 3650 * DAY_MS, "w": 120 * DAY_MS}
"""How far ahead each list is written; it is written again when less than half is
left (``windows.refresh``)."""

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOURS = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def zone(tz: object) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``tz`` (``"UTC"``, ``"Europe/Paris"``); a ValueError naming it
    when it is not one."""
    if not isinstance(tz, str) or not tz or len(tz) > 64 or not re.fullmatch(
            r"[A-Za-z0-9_+\-/]+", tz):
        raise ValueError(f"tz must be an IANA time zone name such as 'Europe/Paris', got "
                         f"{tz!r}")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {tz!r} (an IANA name such as "
                         "'America/New_York' or 'UTC')") from None


def parse_hours(text: object) -> tuple[int, int]:
    """``"09:00-20:00"`` as minutes of the day (540, 1200); an end at or before the
    start runs overnight (``"22:00-06:00"``), ``"24:00"`` is the end of the day."""
    if not isinstance(text, str):
        raise ValueError(f"hours must be a str like '09:00-20:00', got {text!r}")
    m = _HOURS.match(text)
    if not m:
        raise ValueError(f"hours must look like '09:00-20:00', got {text!r}")
    h1, m1, h2, m2 = (int(x) for x in m.groups())
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if h1 > 23 or m1 > 59 or m2 > 59 or end > 24 * 60:
        raise ValueError(f"hours {text!r}: not a time of day (00:00..24:00)")
    if start == end % (24 * 60) and end != 24 * 60:
        raise ValueError(f"hours {text!r}: opens and closes at the same time")
    return start, end


def parse_days(text: object) -> frozenset[int]:
    """``"mon-fri"``, ``"sat,sun"``, ``"fri-mon"`` (wraps), ``"*"`` or ``"daily"`` as
    weekday numbers (Monday 0)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"days must be a str like 'mon-fri' or 'sat,sun', got {text!r}")
    t = text.strip().lower()
    if t in ("*", "daily", "all"):
        return frozenset(range(7))
    out: set[int] = set()
    for part in t.split(","):
        a, sep, b = part.strip().partition("-")
        try:
            i = DAYS.index(a.strip()[:3]) if len(a.strip()) >= 3 else -1
            j = DAYS.index(b.strip()[:3]) if sep and len(b.strip()) >= 3 else i
        except ValueError:
            i = j = -1
        if i < 0 or j < 0 or a.strip()[:3] != a.strip()[:3].lower() or (sep and not b):
            raise ValueError(f"days {text!r}: use mon..sun, ranges like 'mon-fri' and "
                             "commas")
        k = i
        while True:
            out.add(k)
            if k == j:
                break
            k = (k + 1) % 7
    return frozenset(out)


def parse_holidays(items: Iterable[object] | None) -> tuple[date, ...]:
    """Holidays as dates (``date`` objects or ``"YYYY-MM-DD"``), sorted, at most 1000."""
    if items is None:
        return ()
    if isinstance(items, str | bytes):
        raise ValueError("holidays must be a list of dates, not one string")
    out = set()
    for it in items:
        if isinstance(it, datetime):
            raise ValueError(f"holiday {it!r}: give a date, not a datetime")
        if isinstance(it, date):
            out.add(it)
            continue
        try:
            out.add(date.fromisoformat(str(it)))
        except ValueError:
            raise ValueError(f"holiday {it!r} is not a date 'YYYY-MM-DD'") from None
    if len(out) > 1000:
        raise ValueError("at most 1000 holidays")
    return tuple(sorted(out))


@dataclass(frozen=True)
class Span:
    """One weekly rule of a send window: open from ``start`` to ``end`` (minutes of the
    day; ``end <= start``: the next day) on the weekdays ``days`` (Monday 0)."""

    start: int
    end: int
    days: frozenset[int]

    def text(self) -> str:
        def hm(m: int) -> str:
            return f"{m // 60:02d}:{m % 60:02d}"
        return f"{hm(self.start)}-{hm(self.end)} {days_text(self.days)}"


def days_text(days: frozenset[int]) -> str:
    if len(days) == 7:
        return "daily"
    return ",".join(DAYS[d] for d in sorted(days))


def to_ms(dt: datetime) -> int:
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int, tz: zoneinfo.ZoneInfo) -> datetime:
    return (_EPOCH + timedelta(milliseconds=ms)).astimezone(tz)


def local_start(naive: datetime, tz: zoneinfo.ZoneInfo) -> int:
    """The first instant (UTC ms) whose wall-clock time in ``tz`` reaches ``naive``: the
    first of two for a repeated time, the end of the gap for a skipped one."""
    t0 = to_ms(naive.replace(tzinfo=tz, fold=0))
    if from_ms(t0, tz).replace(tzinfo=None) == naive:
        return t0
    # skipped (spring forward): the gap ends at the change, between the two readings
    lo = to_ms(naive.replace(tzinfo=tz, fold=1))
    hi = t0
    while hi - lo > 1000:
        mid = (lo + hi) // 2
        if from_ms(mid, tz).replace(tzinfo=None) >= naive:
            hi = mid
        else:
            lo = mid
    return hi - hi % 1000


def _unit_floor(local: datetime, code: str) -> datetime:
    if code == "h":
        return local.replace(minute=0, second=0, microsecond=0)
    if code == "d":
        return local.replace(hour=0, minute=0, second=0, microsecond=0)
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _unit_next(local: datetime, code: str) -> datetime:
    if code == "h":
        return local + timedelta(hours=1)
    if code == "d":
        return local + timedelta(days=1)
    return (local.replace(day=28) + timedelta(days=4)).replace(day=1)


def period_ends(tz: zoneinfo.ZoneInfo, code: str, start_ms: int, end_ms: int) -> list[int]:
    """The boundaries (UTC ms) of the ``code`` periods (``"h"``, ``"d"``, ``"M"``) of
    ``tz`` after ``start_ms`` up to and including the first at or after ``end_ms``."""
    local = _unit_floor(from_ms(start_ms, tz).replace(tzinfo=None), code)
    out: list[int] = []
    while True:
        local = _unit_next(local, code)
        t = local_start(local, tz)
        if t <= start_ms or (out and t <= out[-1]):
            continue  # a unit skipped whole by a change (no period of its own)
        out.append(t)
        if t >= end_ms:
            return out


def period_end(tz: zoneinfo.ZoneInfo, code: str, now_ms: int) -> int:
    """The end of the period that holds ``now_ms`` (the first boundary after it)."""
    if code == "m":
        return (now_ms // MINUTE_MS + 1) * MINUTE_MS
    return period_ends(tz, code, now_ms, now_ms + 1)[0]


def check_minutes(tz: zoneinfo.ZoneInfo, start_ms: int, end_ms: int) -> None:
    """Refuse a zone whose UTC offset is not whole minutes (its minutes would not be
    UTC minutes, which the script counts)."""
    t = start_ms
    while t <= end_ms:
        off = from_ms(t, tz).utcoffset()
        if off is not None and off.total_seconds() % 60:
            raise ValueError(f"time zone {tz.key!r} has an offset of {off} at that time: "
                             "minute quotas need whole-minute offsets")
        t += 30 * DAY_MS


def window_edges(spans: Sequence[Span], tz: zoneinfo.ZoneInfo, holidays: Sequence[date],
                 start_ms: int, end_ms: int) -> list[int]:
    """The send window as alternating open, close instants (UTC ms), merged and sorted,
    for the openings from the local day before ``start_ms`` to past ``end_ms`` (an
    interval entirely before ``start_ms`` is left out)."""
    hol = set(holidays)
    first = from_ms(start_ms, tz).date() - timedelta(days=1)
    last = from_ms(end_ms, tz).date() + timedelta(days=1)
    ivs: list[tuple[int, int]] = []
    d = first
    while d <= last:
        if d not in hol:
            base = datetime(d.year, d.month, d.day)
            for s in spans:
                if d.weekday() not in s.days:
                    continue
                o = local_start(base + timedelta(minutes=s.start), tz)
                close_day = base if s.end > s.start else base + timedelta(days=1)
                c = local_start(close_day + timedelta(minutes=s.end), tz)
                if c > o and c > start_ms:
                    ivs.append((o, c))
        d += timedelta(days=1)
    ivs.sort()
    merged: list[list[int]] = []
    for o, c in ivs:
        if merged and o <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], c)
        else:
            merged.append([o, c])
    return [t for iv in merged for t in iv]


def window_state(edges: Sequence[int], now_ms: int) -> tuple[bool, int | None]:
    """(open now, the next change) from alternating open/close ``edges``; ``None``: no
    change within the list."""
    i = bisect.bisect_right(edges, now_ms)
    if i >= len(edges):
        return False, None
    return i % 2 == 1, edges[i]


def next_open(spans: Sequence[Span], tz: zoneinfo.ZoneInfo, holidays: Sequence[date],
              after_ms: int) -> int:
    """The first instant at or after ``after_ms`` inside the window (``after_ms`` itself
    when it is open then); a ValueError when it never opens within a year."""
    edges = window_edges(spans, tz, holidays, after_ms, after_ms + 370 * DAY_MS)
    is_open, change = window_state(edges, after_ms)
    if is_open:
        return after_ms
    if change is None:
        raise ValueError("the window does not open within a year")
    return change


def encode_list(cycle_ms: int, edges: Sequence[int]) -> str:
    """A boundary list as the scripts read it: ``<cycle ms>|`` and the instants, 13
    digits each, comma-separated (fixed width: the script bisects it by position)."""
    return f"{cycle_ms}|" + ",".join(f"{e:013d}" for e in edges)


def decode_list(text: str) -> tuple[int, list[int]]:
    head, _, body = text.partition("|")
    return int(head), [int(x) for x in body.split(",") if x]


def list_next(cycle_ms: int, edges: Sequence[int], now_ms: int) -> tuple[int, int] | None:
    """What ``_windows.lua`` computes: (the first boundary after ``now_ms``, its 1-based
    position); past the list, whole cycles are added (the position is then that in the
    list of the boundary the cycle repeats)."""
    if not edges:
        return None
    shift = 0
    if now_ms >= edges[-1]:
        k = (now_ms - edges[-1]) // cycle_ms + 1
        shift = k * cycle_ms
    i = bisect.bisect_right(edges, now_ms - shift)
    if i >= len(edges):
        return None
    return edges[i] + shift, i + 1
