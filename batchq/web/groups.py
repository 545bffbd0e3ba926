"""Customers (groups) and limits of one queue, for the console's "Customers" page; and
the actions on them (set and remove a limit, hold and release a group or the queue).

The read is bounded whatever the producers do, and reuses what ``batchq info`` and
``batchq limit list`` read (``batchq.flow.view``, ``Queue.groups``): the queue's own
limit, ``"*"`` and up to ``flow_view.LIMITS_SHOWN`` group limits with their use, up to
``GROUPS_SHOWN`` groups with ready jobs (in the rotation first, then those that wait),
and per group shown one more pipelined round trip: its ready jobs (a ``ZLEXCOUNT`` of
its range of ``gready``) and the reason of its hold. A group's limits are its own or,
without one, those of ``"*"`` (``source`` says which). "Share" is the group's part of
the jobs the groups shown have leased now: the split the scheduler is making between
them at this moment (weights, limits and holds included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..flow import view as flow_view
from ..flow.limits import DEFAULT_GROUP, Limit, group_hex
from .params import BadRequest

if TYPE_CHECKING:
    from ..ops.queue import Queue
    from ..tasks.app import App

GROUPS_SHOWN = 100
"""Groups with ready jobs listed per queue at most (the longest rotation first)."""

LIMIT_FIELDS = ("rate_per_s", "burst", "concurrency", "max_pending", "weight")
SHOWN_FIELDS = (*LIMIT_FIELDS, "max_per_minute", "max_per_hour", "max_per_day",
                "max_per_month", "tz")
"""A limit as the view shows it: the form's fields and its calendar quotas."""


def _limit_dict(lim: Limit | None) -> dict[str, Any] | None:
    if lim is None:
        return None
    return {f: getattr(lim, f) for f in SHOWN_FIELDS}


def _hold(q: Queue) -> dict[str, Any]:
    """The hold of the whole queue (``Queue.holds``: the longest over its shards)."""
    h = q.holds()
    return {"held": h.queue_s > 0, "until_s": round(h.queue_s, 3),
            "why": h.queue_why or None, "groups_held": h.groups}


def view(app: App, q: Queue) -> dict[str, Any]:
    """The groups and limits of queue ``q`` (see the module docstring)."""
    parts = q.shards()
    flow = flow_view.read_shards(app.redis, {q.name: [s.keys for s in parts]},
                                 groups=0)[q.name]
    own: Limit | None = None
    default: Limit | None = None
    queue_running: int | None = None
    group_limits: dict[str, Any] = {}
    for use in flow.limits:
        g = use.limit.group
        if g is None:
            own, queue_running = use.limit, use.running
        elif g == DEFAULT_GROUP:
            default = use.limit
        else:
            group_limits[g] = use
    rows: dict[str, dict[str, Any]] = {}
    for gs in q.groups(GROUPS_SHOWN):
        rows[gs.group] = {"group": gs.group, "pending": gs.pending, "running": gs.running,
                          "state": gs.state, "until_s": round(gs.until_s, 3),
                          "why": gs.why or None}
    for g, use in group_limits.items():
        row = rows.setdefault(g, {"group": g, "pending": use.pending or 0,
                                  "running": use.running or 0, "state": use.state,
                                  "until_s": round(use.until_s, 3), "why": None})
        row["own_limit"] = True
        if use.windows:  # its calendar quotas' use in the current periods
            row["window_used"] = {w.window: w.used for w in use.windows}
    names = list(rows)
    ready = _ready_counts(app, q, names)
    total_running = sum(r["running"] for r in rows.values())
    for g, row in rows.items():
        own_use = group_limits.get(g)
        lim = own_use.limit if own_use is not None else default
        row["ready"] = ready.get(g, 0)
        row["limit"] = _limit_dict(lim)
        row["source"] = "own" if own_use is not None else "*" if default is not None else None
        row["held"] = row["state"] == "waiting" and row["until_s"] > 0
        if row["held"] and row["why"] is None:
            row["why"] = "rate" if lim is not None and lim.rate_per_s else None
        row["share"] = round(row["running"] / total_running, 4) if total_running else None
        row.setdefault("own_limit", False)
    ordered = sorted(rows.values(), key=lambda r: (-r["running"], -r["ready"], r["group"]))
    return {"queue": q.name, "shards": len(parts), "paused": q.is_paused(),
            "limit": _limit_dict(own), "running": queue_running, "hold": _hold(q),
            "default_limit": _limit_dict(default), "limits_total": flow.limits_total,
            "groups": ordered, "groups_shown": GROUPS_SHOWN,
            "windows": [{"group": w.group, "window": w.describe()} for w in q.windows()]}


def _ready_counts(app: App, q: Queue, names: list[str]) -> dict[str, int]:
    if not names:
        return {}
    parts = q.shards()
    pipe = app.redis.pipeline(transaction=False)
    for g in names:
        h = group_hex(g)
        for s in parts:
            pipe.zlexcount(s.keys.gready, f"[{h}~", f"({h}\x7f")
    res = pipe.execute(raise_on_error=False)
    out: dict[str, int] = {}
    for i, g in enumerate(names):
        vals = res[i * len(parts) : (i + 1) * len(parts)]
        out[g] = sum(v for v in vals if isinstance(v, int))
    return out


# --- actions ---------------------------------------------------------------------------


def target(q: Queue, group: str | None) -> str:
    """An audit entry's target: ``queue sms`` or ``queue sms group cust03``."""
    return f"queue {q.name}" if group is None else f"queue {q.name} group {group}"


def set_limit(q: Queue, group: str | None, values: dict[str, Any]) -> dict[str, Any]:
    """Store a limit (``Queue.limit``); ``values`` holds ``LIMIT_FIELDS`` (None: unset)."""
    if all(values.get(f) is None for f in ("rate_per_s", "concurrency", "max_pending",
                                           "weight")):
        raise BadRequest("give at least one of rate_per_s, concurrency, max_pending, weight")
    try:
        stored = q.limit(group, **{f: values.get(f) for f in LIMIT_FIELDS})
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from None
    return {"queue": q.name, "group": group, "limit": _limit_dict(stored),
            "describe": stored.describe()}


def remove_limit(q: Queue, group: str | None) -> dict[str, Any]:
    return {"queue": q.name, "group": group, "removed": q.remove_limit(group)}


def hold(q: Queue, group: str | None, seconds: float) -> dict[str, Any]:
    if group == DEFAULT_GROUP:
        raise BadRequest('hold a group by its name, or the queue (no "group"); "*" is '
                         "not a group")
    in_force = q.hold(seconds, group)
    return {"queue": q.name, "group": group, "held_s": seconds,
            "in_force_s": round(in_force, 3)}


def release(q: Queue, group: str | None) -> dict[str, Any]:
    if group == DEFAULT_GROUP:
        raise BadRequest('release a group by its name, or the queue (no "group")')
    left = q.release(group)
    return {"queue": q.name, "group": group, "released": bool(left), "left_s": left}

