"""The audit log: every action an operator takes on a namespace (pause, resume, limit set
and remove, hold and release, cancel, retry, purge), from the CLI or the web console, with
who took it, on what, when (the server's clock) and how it ended.

Kept in one Redis stream per namespace (``<namespace>:audit``, outside every queue's hash
tag: plain commands only, legal on Redis Cluster), bounded by count and by age: each
write adds one entry with an exact ``MAXLEN`` and then trims entries older than the
maximum age (``XTRIM MINID``, from the new entry's id, which is the server's time). A
reader also leaves out entries past the age, so the bound holds even when nothing has
been written for a long time.

Public surface (stable; the console and the CLI code against it)::

    record(client, namespace, *, who, action, target, result="ok", detail="") -> None
    await arecord(client, namespace, *, who, action, target, result="ok", detail="")
    read(client, namespace, limit=100, *, before=None) -> list[AuditEntry]
    await aread(client, namespace, limit=100, *, before=None) -> list[AuditEntry]
    cli_who() -> str                        # "cli:<os user>"
    audit_key(namespace) -> str

``record`` and ``read`` take the app's synchronous client (``app.redis``), ``arecord``
and ``aread`` an asyncio one (``app.clients.async_redis()``). The bounds come from
``$BATCHQ_AUDIT_MAX_COUNT`` (default 10,000 entries) and ``$BATCHQ_AUDIT_MAX_AGE_S``
(default 30 days), or the ``max_count`` / ``max_age_s`` keywords.
"""

from __future__ import annotations

import getpass
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis

__all__ = [
    "ACTIONS",
    "AuditEntry",
    "aread",
    "arecord",
    "audit_key",
    "cli_who",
    "read",
    "record",
    "retention",
]

ACTIONS = ("pause", "resume", "limit_set", "limit_rm", "hold", "release",
           "campaign_cancel", "job_cancel", "dead_retry", "dead_purge", "dead_trim",
           "breaker_open", "breaker_close")
"""The actions batchq itself records (a caller may record others: any short name)."""

DEFAULT_MAX_COUNT = 10_000
DEFAULT_MAX_AGE_S = 30 * 86400.0
MAX_COUNT_ENV = "BATCHQ_AUDIT_MAX_COUNT"
MAX_AGE_ENV = "BATCHQ_AUDIT_MAX_AGE_S"
FIELD_MAX_CHARS = 2000
"""Longer texts (an error message, a list of ids) are cut to this with a mark."""
READ_MAX = 10_000


def audit_key(namespace: str) -> str:
    """The stream of the namespace's audit log."""
    return f"{namespace}:audit"


@dataclass(frozen=True)
class AuditEntry:
    """One recorded action: ``id`` (the stream id, ``"<ms>-<n>"``: pass it as
    ``before`` to read older entries), ``ts_ms`` when it was recorded (server clock,
    ms), ``who`` (the console's user, or ``"cli:<os user>"``), ``action`` (``ACTIONS``),
    ``target`` (``queue sms``, ``queue sms group cust03``, ``campaign spring``, ``job
    <id>``), ``result`` (``"ok"`` or the error) and ``detail`` (what was set: ``"rate
    100/s"``, ``"3600s"``, ``"12 jobs"``)."""

    id: str
    ts_ms: int
    who: str
    action: str
    target: str
    result: str = "ok"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.result == "ok"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cli_who() -> str:
    """Who the CLI acts as: ``"cli:<os user>"`` (the uid when the name is unknown)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no passwd entry (a container's uid)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"cli:{user}"


def retention(max_count: int | None = None, max_age_s: float | None = None) -> tuple[int, int]:
    """``(max entries, max age in ms)``: the given values, else the environment's, else
    the defaults; a bad value is a ``ValueError`` naming it."""
    if max_count is None:
        env = os.environ.get(MAX_COUNT_ENV)
        try:
            max_count = DEFAULT_MAX_COUNT if env is None else int(env)
        except ValueError:
            raise ValueError(f"{MAX_COUNT_ENV} must be an integer, got {env!r}") from None
    if max_age_s is None:
        env = os.environ.get(MAX_AGE_ENV)
        try:
            max_age_s = DEFAULT_MAX_AGE_S if env is None else float(env)
        except ValueError:
            raise ValueError(f"{MAX_AGE_ENV} must be a number, got {env!r}") from None
    if isinstance(max_count, bool) or not isinstance(max_count, int) \
            or not 1 <= max_count <= 10_000_000:
        raise ValueError(f"audit max_count must be an int in [1, 10000000], got {max_count!r}")
    if isinstance(max_age_s, bool) or not isinstance(max_age_s, int | float) \
            or not math.isfinite(max_age_s) or not 0 < max_age_s <= 10 * 365 * 86400:
        raise ValueError(f"audit max_age_s must be in (0, 10 years], got {max_age_s!r}")
    return max_count, max(1, round(max_age_s * 1000))


# --- the I/O-free core -----------------------------------------------------------------


def _cut(value: object, name: str) -> str:
    s = value if isinstance(value, str) else str(value)
    if name in ("who", "action") and not s:
        raise ValueError(f"audit {name} must not be empty")
    return s if len(s) <= FIELD_MAX_CHARS else s[: FIELD_MAX_CHARS - 1] + "…"


def _fields(who: str, action: str, target: str, result: str, detail: str) -> dict[str, str]:
    out = {"who": _cut(who, "who"), "action": _cut(action, "action"),
           "target": _cut(target, "target"), "result": _cut(result, "result")}
    if detail:
        out["detail"] = _cut(detail, "detail")
    return out


def _ms(entry_id: Any) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    try:
        return int(text.split("-", 1)[0])
    except ValueError:
        return 0


def _min_id(newest_ms: int, max_age_ms: int) -> str:
    return str(max(0, newest_ms - max_age_ms))


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _entry(entry_id: Any, raw: dict[Any, Any]) -> AuditEntry:
    f = {_text(k): _text(v) for k, v in raw.items()}
    return AuditEntry(id=_text(entry_id), ts_ms=_ms(entry_id), who=f.get("who", ""),
                      action=f.get("action", ""), target=f.get("target", ""),
                      result=f.get("result", ""), detail=f.get("detail", ""))


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= READ_MAX:
        raise ValueError(f"limit must be an int in [1, {READ_MAX}], got {limit!r}")
    return limit


def _range(before: str | None) -> str:
    return "+" if before is None else f"({before}"


def _entries(now: Sequence[Any], rows: Any, max_age_ms: int) -> list[AuditEntry]:
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    oldest = now_ms - max_age_ms
    return [e for e in (_entry(i, f) for i, f in rows or []) if e.ts_ms >= oldest]


# --- the shells ------------------------------------------------------------------------


def record(client: redis.Redis, namespace: str, *, who: str, action: str, target: str,
           result: str = "ok", detail: str = "", max_count: int | None = None,
           max_age_s: float | None = None) -> None:
    """Add one entry to the namespace's audit log and apply the bounds (two commands)."""
    count, age_ms = retention(max_count, max_age_s)
    key = audit_key(namespace)
    new_id = client.xadd(key, _fields(who, action, target, result, detail),  # type: ignore[arg-type]
                         maxlen=count, approximate=False)
    client.xtrim(key, minid=_min_id(_ms(new_id), age_ms), approximate=False)


async def arecord(client: AsyncRedis, namespace: str, *, who: str, action: str,
                  target: str, result: str = "ok", detail: str = "",
                  max_count: int | None = None, max_age_s: float | None = None) -> None:
    """``record`` over an asyncio client."""
    count, age_ms = retention(max_count, max_age_s)
    key = audit_key(namespace)
    new_id = await client.xadd(key, _fields(who, action, target, result, detail),  # type: ignore[arg-type]
                               maxlen=count, approximate=False)
    await client.xtrim(key, minid=_min_id(_ms(new_id), age_ms), approximate=False)


def read(client: redis.Redis, namespace: str, limit: int = 100, *,
         before: str | None = None, max_age_s: float | None = None) -> list[AuditEntry]:
    """Up to ``limit`` entries, newest first; ``before``: only entries older than that
    entry id (the next page). Entries past the maximum age are left out."""
    _check_limit(limit)
    _, age_ms = retention(None, max_age_s)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
    pipe.xrevrange(audit_key(namespace), max=_range(before), min="-", count=limit)
    now, rows = pipe.execute()
    return _entries(now, rows, age_ms)


async def aread(client: AsyncRedis, namespace: str, limit: int = 100, *,
                before: str | None = None, max_age_s: float | None = None
                ) -> list[AuditEntry]:
    """``read`` over an asyncio client."""
    _check_limit(limit)
    _, age_ms = retention(None, max_age_s)
    pipe = client.pipeline(transaction=False)
    pipe.execute_command("TIME")
    pipe.xrevrange(audit_key(namespace), max=_range(before), min="-", count=limit)
    now, rows = await pipe.execute()
    return _entries(now, rows, age_ms)
