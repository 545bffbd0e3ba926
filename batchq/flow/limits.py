"""Flow control: groups, rate and concurrency limits, quotas, holds.

A job enqueued with ``options(group="acme")`` belongs to group ``acme`` of its queue.
Its id carries the group (``~<hex of the name>``), so every script finds a job's group
from its id or lease alone; its ready copy waits in the queue's ``gready`` zset, and
``pop.lua`` serves the groups in turn (see ``_lib.lua`` "Groups" and ARCHITECTURE.md
"Flow control"). Limits are a hash in the queue's slot (``T:limits``), read by the
scripts on every pop: changing one takes effect on the next fetch of every worker, with
no redeploy.

A limit is kept as ``"rate,burst,concurrency,max_pending,weight"`` (an empty field:
none) under ``"~q"`` (the whole queue), ``"*"`` (every group without a limit of its own)
or the group's hex name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import redis

from ..store.keys import QueueKeys
from ..store.scripts import SyncScripts, calls
from . import calendars

MAX_GROUP_BYTES = 64
"""The longest group name (UTF-8 bytes); its hex form is part of every job id."""

QUEUE_FIELD = "~q"
DEFAULT_FIELD = "*"
DEFAULT_GROUP = "*"
"""``Queue.limit(group="*", ...)``: the limit of every group that has none of its own."""

BLOCKED = 1e15
"""``gwait`` score of a group waiting for a concurrency slot (``_lib.lua`` BLOCKED)."""

MAX_RATE = 1_000_000.0
MAX_COUNT = 10**12
MAX_WEIGHT = 1000.0


def check_group(group: object) -> str:
    """A group name: a non-empty str of at most 64 UTF-8 bytes; an error naming it."""
    if not isinstance(group, str):
        raise TypeError(f"group must be a str, got {type(group).__name__} {group!r}")
    try:
        n = len(group.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"group {group!r} is not valid text") from None
    if not 0 < n <= MAX_GROUP_BYTES:
        raise ValueError(f"group must be 1..{MAX_GROUP_BYTES} bytes of UTF-8, got {n} "
                         f"({group[:20]!r}...)" if n else "group must not be empty")
    if group == DEFAULT_GROUP:
        raise ValueError('group "*" is reserved: it names the default limit of every group')
    return group


def group_hex(group: str) -> str:
    """The group's name in ids and Redis: the hex of its UTF-8 bytes (no ``:``, ``~``
    or ``_``, so ids stay parseable and lex ranges exact)."""
    return group.encode("utf-8").hex()


def group_of(job_id: str) -> str:
    """The hex group in a job id ("" for a job without one)."""
    _, _, tail = job_id.partition("~")
    return tail.removesuffix("_m")


def group_name(hexname: str | bytes) -> str:
    """``group_hex`` undone (a malformed name comes back as it is)."""
    text = hexname.decode() if isinstance(hexname, bytes) else hexname
    try:
        return bytes.fromhex(text).decode("utf-8")
    except ValueError:
        return text


@dataclass(frozen=True)
class Limit:
    """The flow control of a queue (``group`` None), of one group, or (``group="*"``)
    of every group without a limit of its own.

    - ``rate_per_s``: job *starts* per second (a token bucket kept in Redis on the
      server's clock); ``burst``: how many may start at once after a quiet spell
      (default: a tenth of a second's worth, at least 1). In any 1 s window at most
      ``rate_per_s + burst`` jobs start.
    - ``concurrency``: jobs leased at once across every worker (running, or fetched and
      about to run); a slot comes back when its job settles or its lease is reaped.
    - ``max_pending``: a quota, groups only: jobs of the group not finished (waiting,
      delayed or running); an enqueue past it raises ``QuotaExceeded``.
    - ``weight``: a group's share of the turns (default 1; 3 = three times as many).
    - ``max_per_minute``, ``max_per_hour``, ``max_per_day``, ``max_per_month``: job
      starts per calendar period in the time zone ``tz`` (default UTC), counted exactly
      across the fleet; a group past one waits, its jobs ready, until the period ends
      (``batchq/flow/calendars.py``, ``batchq/flow/windows.py``).
    """

    group: str | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    concurrency: int | None = None
    max_pending: int | None = None
    weight: float | None = None
    max_per_minute: int | None = None
    max_per_hour: int | None = None
    max_per_day: int | None = None
    max_per_month: int | None = None
    tz: str | None = None

    def __post_init__(self) -> None:
        if self.group is not None and self.group != DEFAULT_GROUP:
            check_group(self.group)
        _number("rate_per_s", self.rate_per_s, MAX_RATE, integer=False)
        _number("burst", self.burst, MAX_COUNT)
        _number("concurrency", self.concurrency, MAX_COUNT)
        _number("max_pending", self.max_pending, MAX_COUNT)
        _number("weight", self.weight, MAX_WEIGHT, integer=False)
        for kind in ("minute", "hour", "day", "month"):
            _number(f"max_per_{kind}", getattr(self, f"max_per_{kind}"), MAX_COUNT)
        if self.tz is not None:
            calendars.zone(self.tz)
            if not self.calendar:
                raise ValueError("tz needs one of max_per_minute, max_per_hour, "
                                 "max_per_day, max_per_month")
        if self.burst is not None and self.rate_per_s is None:
            raise ValueError("burst needs rate_per_s")
        if self.group is None and (self.max_pending is not None or self.weight is not None):
            raise ValueError("max_pending and weight are per group: give group=...")

    @property
    def calendar(self) -> dict[str, int]:
        """The calendar quotas set, by window (``"minute"`` .. ``"month"``)."""
        out = {}
        for kind in calendars.KINDS:
            v = getattr(self, f"max_per_{kind}")
            if v is not None:
                out[kind] = int(v)
        return out

    @property
    def field(self) -> str:
        if self.group is None:
            return QUEUE_FIELD
        return DEFAULT_FIELD if self.group == DEFAULT_GROUP else group_hex(self.group)

    def encode(self) -> str:
        def f(v: float | int | None) -> str:
            if v is None:
                return ""
            return repr(float(v)) if isinstance(v, float) else str(v)
        return ",".join(f(v) for v in (self.rate_per_s, self.burst, self.concurrency,
                                        self.max_pending, self.weight))

    @classmethod
    def decode(cls, fieldname: str, text: str) -> Limit:
        group = (None if fieldname == QUEUE_FIELD else DEFAULT_GROUP
                 if fieldname == DEFAULT_FIELD else group_name(fieldname))
        parts = (text.split(",") + [""] * 5)[:5]

        def num(s: str, integer: bool) -> Any:
            if not s:
                return None
            try:
                return int(float(s)) if integer else float(s)
            except ValueError:
                return None
        return cls(group, num(parts[0], False), num(parts[1], True), num(parts[2], True),
                   num(parts[3], True), num(parts[4], False))

    def describe(self) -> str:
        """``rate 100/s burst 100 concurrency 5 max_pending 1000 weight 2``."""
        bits = []
        if self.rate_per_s is not None:
            bits.append(f"rate {self.rate_per_s:g}/s")
        if self.burst is not None:
            bits.append(f"burst {self.burst}")
        if self.concurrency is not None:
            bits.append(f"concurrency {self.concurrency}")
        if self.max_pending is not None:
            bits.append(f"max_pending {self.max_pending}")
        if self.weight is not None:
            bits.append(f"weight {self.weight:g}")
        for kind, n in self.calendar.items():
            bits.append(f"max {n}/{kind}")
        if self.calendar:
            bits.append(f"tz {self.tz or 'UTC'}")
        return " ".join(bits) or "no limit"


def _number(name: str, value: object, hi: float, integer: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)):
        kind = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or not 0 < value <= hi:
        raise ValueError(f"{name} must be in (0, {hi:g}], got {value!r}")


@dataclass(frozen=True)
class GroupState:
    """One group of a queue as ``Queue.groups`` reads it: ``pending`` jobs not finished
    (the quota count), ``running`` leased now, ``state`` ``"ready"`` (may start jobs),
    ``"waiting"`` (for a rate token or the end of a hold, until ``until_s`` seconds from
    now) or ``"blocked"`` (at its concurrency limit), or ``"idle"`` (no ready job)."""

    group: str
    pending: int
    running: int
    state: str
    until_s: float = 0.0
    why: str = ""
    """Why a held group waits: ``"operator"`` or ``"RateLimited"`` (``""``: a rate
    token, a slot, or unknown)."""


def set_limit(r: redis.Redis, k: QueueKeys, limit: Limit,
              extra: dict[str, str | None] | None = None) -> Limit:
    """Store ``limit`` (replacing the one of the same queue or group) and the ``extra``
    fields of ``limits`` (None: delete; its calendar quotas, ``windows.set_limit``); a
    worker's next pop applies it. A group that waits for a slot is looked at again."""
    if all(v is None for v in (limit.rate_per_s, limit.concurrency, limit.max_pending,
                               limit.weight)) and not limit.calendar:
        raise ValueError("give at least one of rate_per_s, concurrency, max_pending, weight, "
                         "max_per_minute, max_per_hour, max_per_day, max_per_month")
    pipe = r.pipeline(transaction=False)
    for f, v in (extra or {}).items():
        if v is None:
            pipe.hdel(k.limits, f)
        else:
            pipe.hset(k.limits, f, v)
    pipe.hset(k.limits, limit.field, limit.encode())
    if limit.group not in (None, DEFAULT_GROUP):
        pipe.zadd(k.gwait, {limit.field: 0}, xx=True)  # re-checked on the next pop
    pipe.rpush(k.wake, "1")
    pipe.execute()
    return limit


def limits(r: redis.Redis, k: QueueKeys) -> list[Limit]:
    """Every limit of the queue: the queue's first, then ``"*"``, then groups by name."""
    raw = {_text(f): _text(v) for f, v in r.hgetall(k.limits).items()}
    out = [with_calendar(Limit.decode(f, v), raw.get(f + CAL_SUFFIX))
           for f, v in raw.items() if is_limit_field(f)]
    return sorted(out, key=lambda x: (x.group is not None, x.group != DEFAULT_GROUP,
                                      x.group or ""))


def remove_limit(r: redis.Redis, k: QueueKeys, group: str | None = None) -> bool:
    """Drop the limit of the queue (``group`` None), of ``"*"`` or of one group; True
    when there was one. Groups waiting on it are looked at again at once."""
    f = (QUEUE_FIELD if group is None else DEFAULT_FIELD if group == DEFAULT_GROUP
         else group_hex(check_group(group)))
    pipe = r.pipeline(transaction=False)
    pipe.hdel(k.limits, f, f + CAL_SUFFIX)
    if group not in (None, DEFAULT_GROUP):
        pipe.zadd(k.gwait, {f: 0}, xx=True)
    pipe.rpush(k.wake, "1")
    removed = pipe.execute()[0]
    if group == DEFAULT_GROUP:
        _release_all_waiting(r, k)
    return bool(removed)


CAL_SUFFIX = "#c"
"""``<field>#c`` in ``limits``: that limit's calendar quotas, ``"<tz>|<m>|<h>|<d>|<M>"``."""


def is_limit_field(f: str) -> bool:
    """A field of ``limits`` that holds a limit (not a quota, window or boundary list)."""
    return "#" not in f and not f.startswith("@")


def with_calendar(lim: Limit, raw: str | None) -> Limit:
    """``lim`` with the calendar quotas of its ``#c`` field (``None``: none)."""
    if not raw:
        return lim
    parts = (raw.split("|") + [""] * 5)[:5]
    m, h, d, mo = (int(p) if p.isdigit() and int(p) > 0 else None for p in parts[1:])
    try:
        return Limit(lim.group, lim.rate_per_s, lim.burst, lim.concurrency, lim.max_pending,
                     lim.weight, m, h, d, mo, parts[0] or None)
    except (TypeError, ValueError):
        return lim


def _release_all_waiting(r: redis.Redis, k: QueueKeys, chunk: int = 1000) -> None:
    """Every group waiting on a slot or token is looked at again (bounded pages)."""
    start = 0
    while True:
        names: list[Any] = r.zrange(k.gwait, start, start + chunk - 1)
        if not names:
            return
        mapping: dict[Any, float] = {n: 0 for n in names if _text(n) != QUEUE_FIELD}
        if mapping:
            r.zadd(k.gwait, mapping, xx=True)
        start += chunk


HOLD_OPERATOR = "operator"
"""The reason of a hold set by ``Queue.hold`` (``batchq hold``, the console)."""
HOLD_RATE_LIMITED = "RateLimited"
"""The reason of a hold set by a handler raising ``RateLimited`` (``release.lua``)."""
MAX_HOLD_S = 86400.0


def _member(group: str | None) -> str:
    return QUEUE_FIELD if group is None else group_hex(check_group(group))


def hold(scripts: SyncScripts, k: QueueKeys, seconds: float, group: str | None = None,
         why: str = HOLD_OPERATOR) -> float:
    """Hold a group (or the whole queue) for ``seconds``, as ``RateLimited`` does, with
    its reason ``why``; a longer hold already set is kept. Returns the seconds left of
    the hold in force."""
    _number("seconds", seconds, MAX_HOLD_S, integer=False)
    left_ms, _ = scripts.call(calls.hold(k, _member(group), round(float(seconds) * 1000),
                                         why))
    return max(0.0, int(left_ms) / 1000)


def release(scripts: SyncScripts, k: QueueKeys, group: str | None = None) -> float:
    """End the hold of a group (or of the whole queue) now, whoever set it (an operator
    or a handler's ``RateLimited``), and wake an idle worker; the group goes back into
    the rotation on the next pop (or waits again for a slot or token it still lacks).
    Returns the seconds the hold had left (0.0: there was none)."""
    left_ms, lifted = scripts.call(calls.hold(k, _member(group), 0, ""))
    return max(0.0, int(left_ms) / 1000) if int(lifted) else 0.0


@dataclass(frozen=True)
class Holds:
    """What holds a queue now: a hold of the whole queue (``queue_s`` seconds left, 0:
    none; ``queue_why``: ``"operator"``, ``"RateLimited"`` or ``""`` when unknown) and
    how many groups are held (``groups``: holds of a second or more; a group waiting
    for its next rate token a few ms away is throttled, not held)."""

    queue_s: float = 0.0
    queue_why: str = ""
    groups: int = 0


def holds(r: redis.Redis, k: QueueKeys) -> Holds:
    """The ``Holds`` of one queue: two round trips, no scan (a ``ZCOUNT``)."""
    now_ms = _ms(r.execute_command("TIME"))  # type: ignore[no-untyped-call]
    pipe = r.pipeline(transaction=False)
    pipe.zscore(k.gwait, QUEUE_FIELD)
    pipe.hget(k.gstate, f"{QUEUE_FIELD}:why")
    pipe.zcount(k.gwait, now_ms + 1000, f"({BLOCKED:.0f}")
    until, why, n = pipe.execute()
    left = 0.0 if until is None or float(until) >= BLOCKED else \
        max(0.0, (float(until) - now_ms) / 1000)
    queue_long = 1 if left >= 1 else 0
    return Holds(left, why_of(why, until) if left else "", max(0, int(n) - queue_long))


def why_of(raw: Any, score: Any) -> str:
    """A hold's reason from its ``gstate`` field (``"<why>@<end ms>"``), or ``""``
    unless the hold it was written with is the one in force (its ``gwait`` score): a
    field left from an expired hold names no later wait."""
    if raw is None or score is None:
        return ""
    why, _, end = _text(raw).rpartition("@")
    try:
        return why if why and int(end) == int(float(score)) else ""
    except (TypeError, ValueError, OverflowError):
        return ""


def _ms(now: Any) -> int:
    return int(now[0]) * 1000 + int(now[1]) // 1000


def groups(r: redis.Redis, k: QueueKeys, limit: int = 100) -> list[GroupState]:
    """Up to ``limit`` groups with ready jobs: those that may start jobs (in turn order),
    then those that wait (soonest first). Bounded: two ranges and one hash read."""
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
    pipe.zrange(k.groups, 0, limit - 1)
    pipe.zrange(k.gwait, 0, limit - 1, withscores=True)
    now, active, waiting = pipe.execute()
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    rows: list[tuple[str, str, float]] = [(_text(g), "ready", 0.0) for g in active]
    scores: dict[str, float] = {}
    for g, score in waiting:
        name = _text(g)
        if name == QUEUE_FIELD:
            continue
        scores[name] = score
        if score >= BLOCKED:
            rows.append((name, "blocked", 0.0))
        else:
            rows.append((name, "waiting", max(0.0, (score - now_ms) / 1000)))
    rows = rows[:limit]
    if not rows:
        return []
    fields = [f for g, _, _ in rows for f in (f"{g}:n", f"{g}:run", f"{g}:why")]
    vals = r.hmget(k.gstate, fields)
    out = []
    for i, (g, state, until) in enumerate(rows):
        n, run = (int(v or 0) for v in vals[3 * i : 3 * i + 2])
        why = why_of(vals[3 * i + 2], scores.get(g)) if state == "waiting" else ""
        out.append(GroupState(group_name(g), max(n, 0), max(run, 0), state, until, why))
    return out


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)
