"""Flag types of the ``batchq`` command: every value is checked where it is parsed.

A flag falls back to its ``BATCHQ_*`` environment variable, then to its default; the
same check applies to all three, so a bad value from the environment is refused with the
variable's name exactly as a bad flag is refused with the flag's name (exit 2, one line,
never a traceback). Numbers that make no sense for a setting (``nan``, ``inf``, zero or
negative counts) are refused here rather than found later as a loop or a crash.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import redis.connection

from ..connection import CLUSTER_SCHEMES, plain_url, redact
from ..worker.selection import MAX_WEIGHT, ORDERS

URL_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)


class UsageError(Exception):
    """A bad setting found outside argparse (an environment variable): exit 2."""


def _number(raw: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(raw.strip())
    except ValueError:
        name = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {name}, got {raw!r}") from None


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer ``>= low``."""

    def parse(raw: str) -> int:
        v: int = _number(raw, int)
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {v}")
        return v

    parse.__name__ = f"int>={low}"
    return parse


def port(raw: str) -> int:
    """A TCP port, 0..65535 (0: the caller decides, e.g. "disabled")."""
    v: int = _number(raw, int)
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {v}")
    return v


def seconds(*, zero_ok: bool) -> Callable[[str], float]:
    """A finite number of seconds, positive (or ``>= 0`` with ``zero_ok``)."""

    def parse(raw: str) -> float:
        v: float = _number(raw, float)
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {raw.strip()!r}")
        if v < 0 or (v == 0 and not zero_ok):
            what = "zero or positive" if zero_ok else "positive"
            raise argparse.ArgumentTypeError(f"must be {what}, got {raw.strip()!r}")
        return v

    parse.__name__ = "seconds"
    return parse


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """A number of seconds from ``low`` to ``high``."""
    check = seconds(zero_ok=True)

    def parse(raw: str) -> float:
        v = check(raw)
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(
                f"must be {low:g} to {high:g} seconds, got {raw.strip()!r}")
        return v

    parse.__name__ = "seconds"
    return parse


def count_between(low: int, high: int) -> Callable[[str], int]:
    """An integer from ``low`` to ``high``."""

    def parse(raw: str) -> int:
        v: int = _number(raw, int)
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, got {v}")
        return v

    parse.__name__ = "count"
    return parse


def positive_number(high: float) -> Callable[[str], float]:
    """A finite number in ``(0, high]``."""

    def parse(raw: str) -> float:
        v: float = _number(raw, float)
        if not math.isfinite(v) or not 0 < v <= high:
            raise argparse.ArgumentTypeError(
                f"must be a number above 0 and at most {high:g}, got {raw.strip()!r}")
        return v

    parse.__name__ = "number"
    return parse


RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def rate(high: float) -> Callable[[str], float]:
    """A rate per second: ``100``, ``100/s``, ``600/m`` or ``36000/h``, in ``(0, high]``
    per second once converted."""

    def parse(raw: str) -> float:
        value, slash, unit = raw.strip().partition("/")
        per = RATE_UNITS.get(unit.strip().lower()) if slash else 1.0
        if per is None:
            raise argparse.ArgumentTypeError(
                f"expected N, N/s, N/m or N/h, got {raw.strip()!r}")
        v: float = _number(value, float)
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(
                f"must be a number of jobs per second above 0, got {raw.strip()!r}")
        v /= per
        if v > high:
            raise argparse.ArgumentTypeError(
                f"must be at most {high:g}/s, got {raw.strip()!r}")
        return v

    parse.__name__ = "rate"
    return parse


def boolean(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {raw!r}")


class QueueSpec(NamedTuple):
    """``-q a,b`` or ``-q a=3,b=1``: the queue names, and their weights (empty when none
    was given)."""

    names: tuple[str, ...]
    weights: tuple[int, ...]


def queue_spec(raw: str) -> QueueSpec:
    """Comma-separated queue names, each optionally ``=WEIGHT`` (an integer 1..1000;
    a queue without one weighs 1); no queue twice."""
    names: list[str] = []
    weights: list[int] = []
    weighted = False
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        name, eq, w = (x.strip() for x in item.partition("="))
        if not name:
            raise argparse.ArgumentTypeError(f"a queue name is missing in {item!r}")
        if name in names:
            raise argparse.ArgumentTypeError(f"queue {name!r} is listed twice")
        weight = 1
        if eq:
            weighted = True
            try:
                weight = int(w)
            except ValueError:
                weight = 0
            if not 1 <= weight <= MAX_WEIGHT:
                raise argparse.ArgumentTypeError(
                    f"the weight in {item!r} must be an integer 1..{MAX_WEIGHT}, "
                    f"got {w!r}")
        names.append(name)
        weights.append(weight)
    return QueueSpec(tuple(names), tuple(weights) if weighted else ())


def queue_order(raw: str) -> str:
    v = raw.strip().lower()
    if v not in ORDERS:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(ORDERS)}, got {raw!r}")
    return v


def redis_url(raw: str) -> str:
    """A Redis URL that redis-py can parse; the message shows it redacted."""
    problem = url_problem(raw)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return raw


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a usable Redis URL (password redacted), or None."""
    shown = _safe_redact(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in URL_SCHEMES:
            return (f"invalid Redis URL {shown!r}: the scheme must be one of "
                    f"{', '.join(s + '://' for s in URL_SCHEMES)}")
        if scheme != "unix" and not parts.hostname:
            return f"invalid Redis URL {shown!r}: no host"
        parts.port  # noqa: B018 - raises ValueError for a bad or out-of-range port
        db = parts.path.strip("/")
        if scheme != "unix" and db and not db.isdigit():
            return f"invalid Redis URL {shown!r}: the database {db!r} is not a number"
        redis.connection.parse_url(plain_url(url))  # type: ignore[no-untyped-call]
    except ValueError as exc:
        # redis-py's and urllib's messages name the part, never the password
        return f"invalid Redis URL {shown!r}: {exc}"
    return None


def _safe_redact(url: str) -> str:
    try:
        return redact(url)
    except ValueError:
        # unparseable: show only the scheme, the rest may hold a password
        return url.partition("://")[0] + "://…" if "://" in url else "…"


def env_default(env: str, default: Any, kind: Callable[[str], Any]) -> Any:
    """``$env`` parsed with ``kind`` (the flag's own check), else ``default``."""
    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        shown = _safe_redact(raw) if "URL" in env else raw
        detail = str(exc).replace(raw, shown)
        raise UsageError(f"bad value for {env}: {detail}") from None


def opt(p: argparse.ArgumentParser, *flags: str, env: str, default: Any,
        kind: Callable[[str], Any] = str, help: str, **kw: Any) -> None:
    """A flag that falls back to ``BATCHQ_<env>`` and then to ``default``."""
    var = f"BATCHQ_{env}"
    shown = "unset" if default is None else default
    text = f"{help} [env {var}; default {shown}]"
    if kind is boolean:
        p.add_argument(*flags, action="store_true", default=env_default(var, default, kind),
                       help=text, **kw)
    else:
        p.add_argument(*flags, type=kind, default=env_default(var, default, kind),
                       help=text, **kw)


def add_redis_url(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", default=None, type=redis_url,
                   help="Redis URL [env BATCHQ_REDIS_URL; default the app's, else "
                   "redis://127.0.0.1:6379/0]. A password here is moved out of the "
                   "process list at start; BATCHQ_REDIS_URL keeps it out entirely")


def check_env_url() -> None:
    """``$BATCHQ_REDIS_URL`` is read by apps and by every command: refuse a bad one
    before anything imports the app (which would fail with a less clear message)."""
    raw = os.environ.get("BATCHQ_REDIS_URL")
    if raw:
        problem = url_problem(raw)
        if problem:
            raise UsageError(f"bad value for BATCHQ_REDIS_URL: {problem}")
