"""What an operator sees of flow control (``batchq/flow/limits.py``): a queue's limits, how
much of each is used, and the groups that wait now. Read for ``batchq info``, ``batchq
limit list``, the web console (through ``overview.snapshot``) and ``/metrics``.

Bounded whatever the producers do: never a scan over all the groups of a queue. For
any number of queues it is two pipelined round trips (the second only when some queue
has limits or waiting groups):

1. ``TIME``, and per queue the queue's own limit and the default one (``"*"``), one
   ``HSCAN`` page of the limits hash (at most ``limits`` group limits kept), its size,
   the running count of the queue (leases), the ``groups + 1`` groups of ``gwait``
   that wait longest (blocked ones, at a concurrency limit, first; then the longest
   holds), and the queue's own hold and its reason;
2. per queue the counters and hold reasons of those groups and of the limited ones
   (``gstate``) and whether each limited group waits or is in the rotation now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis

from ..ops.stats import BUNDLE_COUNTS, QueueStats, reserved_jobs
from ..store.keys import QueueKeys
from . import calendars, windows
from .limits import (
    BLOCKED,
    CAL_SUFFIX,
    DEFAULT_FIELD,
    DEFAULT_GROUP,
    QUEUE_FIELD,
    GroupState,
    Limit,
    group_name,
    is_limit_field,
    why_of,
    with_calendar,
)
from .windows import WindowUse

WAITING_SHOWN = 10
"""Groups that wait, listed per queue by ``batchq info`` (held or blocked first)."""

LIMITS_SHOWN = 50
"""Group limits read per queue (one ``HSCAN`` page): the cap on ``group`` label values
of the ``batchq_limit_*`` metrics."""


@dataclass(frozen=True)
class LimitUse:
    """One limit and how much of it is used now: ``running`` jobs leased (the queue's
    own limit: every lease of the queue; ``"*"``: None, it applies to each group on its
    own); ``state`` of a group with a limit of its own: ``ready`` (in the rotation),
    ``waiting`` (for a rate token or the end of a hold, ``until_s`` from now),
    ``blocked`` (at its concurrency limit) or ``idle`` (no ready job); ``pending``: its
    jobs not finished (the quota count)."""

    limit: Limit
    running: int | None = None
    pending: int | None = None
    state: str = ""
    until_s: float = 0.0
    windows: tuple[WindowUse, ...] = ()
    """The use of its calendar quotas in their current periods (``"*"``: none, each
    group counts its own)."""

    @property
    def used_ratio(self) -> float | None:
        """``running / concurrency``, None without a concurrency limit or a count."""
        if self.limit.concurrency is None or self.running is None:
            return None
        return self.running / self.limit.concurrency

    def as_dict(self) -> dict[str, Any]:
        lim = self.limit
        row: dict[str, Any] = {
            "group": lim.group, "rate_per_s": lim.rate_per_s, "burst": lim.burst,
            "concurrency": lim.concurrency, "max_pending": lim.max_pending,
            "weight": lim.weight}
        if self.running is not None:
            row["running"] = self.running
        if self.pending is not None:
            row["pending"] = self.pending
        if self.state:
            row["state"] = self.state
            row["until_s"] = round(self.until_s, 3)
        for kind, n in lim.calendar.items():
            row[f"max_per_{kind}"] = n
        if lim.calendar:
            row["tz"] = lim.tz or "UTC"
        if self.windows:
            row["window_used"] = {u.window: u.used for u in self.windows}
            row["window_reset_s"] = {u.window: round(u.reset_s, 3) for u in self.windows}
        return row


@dataclass(frozen=True)
class Flow:
    """The flow control of one queue: its limits (the queue's own first, then ``"*"``,
    then groups by name; at most ``LIMITS_SHOWN`` group limits, ``limits_total`` in
    all) and up to ``WAITING_SHOWN`` groups that wait now (``GroupState``)."""

    queue: str
    limits: list[LimitUse] = field(default_factory=list)
    limits_total: int = 0
    waiting: list[GroupState] = field(default_factory=list)
    held_why: str = ""
    """Why the whole queue is held (``"operator"``, ``"RateLimited"``), when it is."""

    @property
    def used(self) -> bool:
        return bool(self.limits_total or self.waiting)


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int:
    try:
        return max(0, int(v or 0))
    except (TypeError, ValueError):
        return 0


def _limit(fieldname: str, value: Any) -> Limit | None:
    """A stored limit, or None when it does not decode (written by hand)."""
    try:
        return Limit.decode(fieldname, _text(value))
    except (TypeError, ValueError):
        return None


def all_limits(client: redis.Redis, k: QueueKeys) -> tuple[list[Limit], list[str]]:
    """Every limit of a queue, ordered as ``limits.limits`` orders them, and apart the
    fields whose value is not a valid limit (written by hand): ``batchq limit list``
    shows those instead of failing."""
    raw = {_text(f): _text(v) for f, v in client.hgetall(k.limits).items()}
    good: list[Limit] = []
    bad: list[str] = []
    for f, v in raw.items():
        if not is_limit_field(f):
            continue
        lim = _limit(f, v)
        lim = None if lim is None else with_calendar(lim, raw.get(f + CAL_SUFFIX))
        if lim is None:
            bad.append(group_name(_text(f)))
        else:
            good.append(lim)
    good.sort(key=lambda x: (x.group is not None, x.group != DEFAULT_GROUP,
                             x.group or ""))
    return good, sorted(bad)


def read(client: redis.Redis, queues: Sequence[QueueKeys], *, groups: int = WAITING_SHOWN,
         limits: int = LIMITS_SHOWN) -> dict[str, Flow]:
    """The ``Flow`` of each queue, by name (see the module docstring for the cost).
    An error reply (a key of the wrong type, written by hand) reads as empty."""
    if not queues:
        return {}
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
    for k in queues:
        pipe.hget(k.limits, QUEUE_FIELD)
        pipe.hget(k.limits, DEFAULT_FIELD)
        pipe.hscan(k.limits, 0, count=limits)
        pipe.hlen(k.limits)
        pipe.zcard(k.reserved)
        pipe.hmget(k.stats, list(BUNDLE_COUNTS))
        pipe.zrevrange(k.gwait, 0, groups, withscores=True)
        pipe.zscore(k.gwait, QUEUE_FIELD)
        pipe.hget(k.gstate, f"{QUEUE_FIELD}:why")
        pipe.hget(k.limits, windows.FLAG)
    res = pipe.execute(raise_on_error=False)
    if isinstance(res[0], Exception):
        raise res[0]
    now_ms = int(res[0][0]) * 1000 + int(res[0][1]) // 1000
    firsts: list[tuple[QueueKeys, list[LimitUse], list[tuple[str, Limit]], int,
                       list[tuple[str, float]], str, bool]] = []
    for j, k in enumerate(queues):
        qlim, dlim, page, total, members, bc, waiting, qheld, qwhy, extra = \
            res[1 + _FIRST * j : 1 + _FIRST * (j + 1)]
        total = _int(total) - _int(extra) if isinstance(total, int) else 0
        held_why = why_of(qwhy, qheld) if _state(qheld, now_ms)[1] > 0 else ""
        reserved = reserved_jobs(members, *(bc if isinstance(bc, list) else (0,)))
        uses: list[LimitUse] = []
        own = _limit(QUEUE_FIELD, qlim) if isinstance(qlim, bytes | str) else None
        if own is not None:
            uses.append(LimitUse(own, running=_int(reserved)))
        glims: list[tuple[str, Limit]] = []
        default = _limit(DEFAULT_FIELD, dlim) if isinstance(dlim, bytes | str) else None
        if isinstance(page, list | tuple) and len(page) == 2 and isinstance(page[1], dict):
            for f, v in page[1].items():
                name = _text(f)
                lim = None if name in (QUEUE_FIELD, DEFAULT_FIELD) or not is_limit_field(
                    name) else _limit(name, v)
                if lim is not None:
                    glims.append((name, lim))
        glims = sorted(glims, key=lambda x: x[1].group or "")[:limits]
        if default is not None:
            uses.append(LimitUse(default))
        rows = []
        if isinstance(waiting, list):
            rows = [(_text(g), float(s)) for g, s in waiting if _text(g) != QUEUE_FIELD]
        firsts.append((k, uses, glims, _int(total), rows[:groups], held_why,
                       _int(extra) > 0))

    pipe = client.pipeline(transaction=False)
    asked = []
    for k, _, glims, _, rows, _, cal in firsts:
        names = list(dict.fromkeys([g for g, _ in rows] + [g for g, _ in glims]))
        asked.append(names)
        if cal:
            asked[-1] = names or [""]
            cal_names = [QUEUE_FIELD, DEFAULT_FIELD] + [g for g, _ in glims]
            pipe.hmget(k.limits, [g + CAL_SUFFIX for g in cal_names])
            pipe.hmget(k.gstate, [f"{g}|{c}" for g in cal_names for c in _CODES])
        if names:
            pipe.hmget(k.gstate, [f"{g}:{c}" for g in names for c in ("n", "run", "why")])
        if glims:
            pipe.zmscore(k.gwait, [g for g, _ in glims])
            pipe.zmscore(k.groups, [g for g, _ in glims])
    res2 = pipe.execute(raise_on_error=False) if any(asked) else []
    out: dict[str, Flow] = {}
    i = 0
    for (k, uses, glims, total, rows, held_why, cal), names in zip(firsts, asked,
                                                                    strict=True):
        counts: dict[str, tuple[int, int]] = {}
        whys: dict[str, str] = {}
        quotas: dict[str, tuple[Limit | None, tuple[WindowUse, ...]]] = {}
        if cal:
            quotas = _quotas([QUEUE_FIELD, DEFAULT_FIELD] + [g for g, _ in glims],
                             res2[i], res2[i + 1], now_ms)
            i += 2
            uses[:] = [_with_quota(u, quotas.get(u.limit.field)) for u in uses]
            names = [n for n in names if n]
        if names:
            vals = res2[i]
            i += 1
            if not isinstance(vals, list):
                vals = [None] * (3 * len(names))
            counts = {g: (_int(vals[3 * n]), _int(vals[3 * n + 1]))
                      for n, g in enumerate(names)}
            whys = {g: vals[3 * n + 2] for n, g in enumerate(names)}
        waits: list[Any] = [None] * len(glims)
        inturn: list[Any] = [None] * len(glims)
        if glims:
            w, t = res2[i], res2[i + 1]
            i += 2
            waits = w if isinstance(w, list) else waits
            inturn = t if isinstance(t, list) else inturn
        for (g, lim), score, rot in zip(glims, waits, inturn, strict=True):
            pending, running = counts.get(g, (0, 0))
            state, until = _state(score, now_ms)
            if not state:
                state = "ready" if rot is not None else "idle"
            uses.append(_with_quota(LimitUse(lim, running=running, pending=pending,
                                             state=state, until_s=until), quotas.get(g)))
        waiting = []
        for g, score in rows:
            pending, running = counts.get(g, (0, 0))
            state, until = _state(score, now_ms)
            why = why_of(whys.get(g), score) if state == "waiting" else ""
            waiting.append(GroupState(group_name(g), pending, running, state, until, why))
        out[k.queue] = Flow(k.queue, uses, total, waiting, held_why)
    return out


_FIRST = 10
"""Replies per queue in the first round trip."""

_CODES = ("m", "h", "d", "M")


def _quotas(names: list[str], cals: Any, counts: Any, now_ms: int
            ) -> dict[str, tuple[Limit | None, tuple[WindowUse, ...]]]:
    """Per limit field: its calendar quotas (a ``Limit`` holding only them) and their
    use now, from its ``#c`` field and its ``gstate`` count fields."""
    out: dict[str, tuple[Limit | None, tuple[WindowUse, ...]]] = {}
    if not isinstance(cals, list) or not isinstance(counts, list):
        return out
    for n, (g, raw) in enumerate(zip(names, cals, strict=True)):
        if raw is None:
            continue
        lim = with_calendar(Limit(rate_per_s=1.0), _text(raw))
        if not lim.calendar:
            continue
        rows = []
        for kind, most in lim.calendar.items():
            code = calendars.KIND_CODE[kind]
            used, end = windows.use_of(counts[4 * n + _CODES.index(code)], now_ms)
            if end is None:
                try:
                    end = calendars.period_end(calendars.zone(lim.tz or "UTC"), code, now_ms)
                except ValueError:
                    continue
            rows.append(WindowUse(None if g == QUEUE_FIELD else group_name(g), kind, used,
                                  most, max(0.0, (end - now_ms) / 1000)))
        out[g] = (lim, tuple(rows) if g != DEFAULT_FIELD else ())
    return out


def _with_quota(u: LimitUse, q: tuple[Limit | None, tuple[WindowUse, ...]] | None
                ) -> LimitUse:
    if q is None or q[0] is None:
        return u
    c = q[0]
    lim = Limit(u.limit.group, u.limit.rate_per_s, u.limit.burst, u.limit.concurrency,
                u.limit.max_pending, u.limit.weight, c.max_per_minute, c.max_per_hour,
                c.max_per_day, c.max_per_month, c.tz)
    return LimitUse(lim, u.running, u.pending, u.state, u.until_s, q[1])


def _state(score: Any, now_ms: int) -> tuple[str, float]:
    """A ``gwait`` score as ``(state, seconds left)``; ``("", 0)`` when not waiting."""
    if score is None:
        return "", 0.0
    try:
        s = float(score)
    except (TypeError, ValueError):
        return "", 0.0
    if s >= BLOCKED:
        return "blocked", 0.0
    return "waiting", max(0.0, (s - now_ms) / 1000)



def info(flow: Flow | None, st: QueueStats) -> dict[str, Any] | None:
    """The ``flow`` entry of a queue in ``batchq info --json`` (and ``/api/info``), or
    None for a queue that uses no flow control (no limit, group, nor hold)."""
    if not (st.grouped or st.groups_active or st.groups_waiting or st.held_s
            or (flow is not None and flow.used)):
        return None
    flow = flow or Flow("")
    return {
        "grouped": st.grouped,
        "groups_ready": st.groups_active,
        "groups_waiting": st.groups_waiting,
        "held_s": round(st.held_s, 3),
        "limits": [u.as_dict() for u in flow.limits],
        "limits_total": flow.limits_total,
        "held_why": flow.held_why or None,
        "waiting_groups": [{"group": g.group, "state": g.state,
                            "until_s": round(g.until_s, 3), "why": g.why or None,
                            "pending": g.pending, "running": g.running}
                           for g in flow.waiting],
    }


_STATE_RANK = {"blocked": 3, "waiting": 2, "ready": 1, "idle": 0, "": -1}
"""Which state of a group limit a merged view shows when shards disagree: a group lives
in one shard, so the others see it idle."""


def read_shards(client: redis.Redis, queues: dict[str, Sequence[QueueKeys]], *,
                groups: int = WAITING_SHOWN, limits: int = LIMITS_SHOWN) -> dict[str, Flow]:
    """``read`` for queues given as their shards (``batchq.store.shards``: a queue name -> the
    keys of each of its shards, shard 0 first), each reported as one queue: the same
    two round trips for all of them."""
    flat = [k for ks in queues.values() for k in ks]
    flows = read(client, flat, groups=groups, limits=limits)
    return {name: merge(name, [flows[k.queue] for k in ks if k.queue in flows], groups)
            for name, ks in queues.items()}


def merge(name: str, parts: Sequence[Flow], groups: int = WAITING_SHOWN) -> Flow:
    """The ``Flow`` of a sharded queue from its shards': every shard has the same limits
    (``Queue.limit`` writes them to all), so a limit's running and pending counts are
    summed and its state is the busiest shard's; the waiting groups of all shards (one
    row per group, its counts summed), blocked first, then the longest held, at most
    ``groups``."""
    if len(parts) == 1:
        only = parts[0]
        return only if only.queue == name else Flow(name, only.limits, only.limits_total,
                                                    only.waiting, only.held_why)
    uses: dict[str | None, LimitUse] = {}
    for part in parts:
        for u in part.limits:
            had = uses.get(u.limit.group)
            if had is None:
                uses[u.limit.group] = u
                continue
            keep = _busier(had, u)
            uses[u.limit.group] = LimitUse(
                had.limit, running=_add(had.running, u.running),
                pending=_add(had.pending, u.pending), state=keep.state, until_s=keep.until_s,
                windows=had.windows or u.windows)
    by_group: dict[str, GroupState] = {}
    for part in parts:
        for gs in part.waiting:  # a hold of a sharded queue's group is set on every shard
            seen = by_group.get(gs.group)
            if seen is not None:
                top = _busier(seen, gs)
                gs = GroupState(gs.group, seen.pending + gs.pending,
                                seen.running + gs.running, top.state,
                                max(seen.until_s, gs.until_s), seen.why or gs.why)
            by_group[gs.group] = gs
    waiting = sorted(by_group.values(), key=lambda w: (w.state != "blocked", -w.until_s))
    return Flow(name, list(uses.values()), max((p.limits_total for p in parts), default=0),
                waiting[:groups], next((p.held_why for p in parts if p.held_why), ""))


_S = TypeVar("_S", LimitUse, GroupState)


def _busier(seen: _S, other: _S) -> _S:
    """Of two shards' views of one limit or group, the one whose state ranks higher
    (``_STATE_RANK``); the first on a tie."""
    if _STATE_RANK.get(other.state, -1) > _STATE_RANK.get(seen.state, -1):
        return other
    return seen


def _add(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else a + b
