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
from typing import Any, NamedTuple, NoReturn
from urllib.parse import urlsplit

import redis.connection

from ..store.connection import CLUSTER_SCHEMES, check_url, plain_url, redact
from ..store.sentinel import SENTINEL_SCHEMES, is_sentinel_url
from ..worker.exitcodes import EXIT_USAGE
from ..worker.selection import MAX_WEIGHT, ORDERS

URL_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)


class UsageError(Exception):
    """A bad setting found outside argparse (an environment variable): exit 2."""


class Parser(argparse.ArgumentParser):
    """The parser of every ``batchq`` command and subcommand (``add_subparsers`` makes
    its children of the parent's class): a usage error is one line on stderr, the error
    first, and exit 2. argparse's own prints the whole usage block before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


MAX_INT = 2**31 - 1
"""The largest count a flag takes unless it says otherwise: a C ``int`` (what
``gc.set_threshold`` accepts), far below the 2^63 past which Redis refuses a count."""
MAX_SECONDS = 365 * 86400.0
"""The longest duration a flag takes unless it says otherwise: a year."""


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


class Numeric:
    """A numeric flag type: parses a value, checks it against its bounds and names them
    in the message. The bounds are attributes, so tests read them from the parser:
    every numeric flag of every command has a ``Numeric`` as its ``type``."""

    def __init__(self, name: str, *, integer: bool, low: float, high: float,
                 low_open: bool = False, unit: str = "", bounds_text: str = "") -> None:
        self.__name__ = name  # argparse names a type by it in its own messages
        self.integer = integer
        self.low = low
        self.high = high
        self.low_open = low_open
        """``low`` itself is refused: a number above ``low``."""
        self.unit = unit
        self.bounds_text = bounds_text

    def __repr__(self) -> str:
        return f"<{self.__name__}: {self.bounds()}>"

    def bounds(self) -> str:
        """The accepted range in words, e.g. ``1 to 10000``."""
        if self.bounds_text:
            return self.bounds_text
        unit = f" {self.unit}" if self.unit else ""
        if self.low_open:
            return f"above {_shown(self.low)} and at most {_shown(self.high)}{unit}"
        return f"{_shown(self.low)} to {_shown(self.high)}{unit}"

    def accepts(self, v: float) -> bool:
        if not math.isfinite(v) or v > self.high:
            return False
        return v > self.low if self.low_open else v >= self.low

    def value(self, raw: str) -> float:
        """The number ``raw`` holds, before its bounds are checked."""
        try:
            return int(raw.strip()) if self.integer else float(raw.strip())
        except ValueError:
            name = "an integer" if self.integer else "a number"
            raise argparse.ArgumentTypeError(f"expected {name}, got {raw!r}") from None

    def __call__(self, raw: str) -> Any:
        v = self.value(raw)
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(
                f"must be a finite number ({self.bounds()}), got {raw.strip()!r}")
        if not self.accepts(v):
            got = str(v) if self.integer else repr(raw.strip())
            raise argparse.ArgumentTypeError(f"must be {self.bounds()}, got {got}")
        return v


def int_at_least(low: int, high: int = MAX_INT) -> Numeric:
    """An integer from ``low`` to ``high``."""
    return Numeric(f"int>={low}", integer=True, low=low, high=high)


def count_between(low: int, high: int, *, bounds_text: str = "") -> Numeric:
    """An integer from ``low`` to ``high``."""
    return Numeric("count", integer=True, low=low, high=high, bounds_text=bounds_text)


port = Numeric("port", integer=True, low=0, high=65535, bounds_text="a port number 0..65535")
"""A TCP port, 0..65535 (0: the caller decides, e.g. "disabled")."""


def seconds(*, zero_ok: bool, high: float = MAX_SECONDS) -> Numeric:
    """A finite number of seconds up to ``high``, positive (or ``>= 0`` with
    ``zero_ok``)."""
    return Numeric("seconds", integer=False, low=0.0, high=high, low_open=not zero_ok,
                   unit="seconds")


def seconds_between(low: float, high: float) -> Numeric:
    """A number of seconds from ``low`` to ``high``."""
    return Numeric("seconds", integer=False, low=low, high=high, unit="seconds")


def positive_number(high: float) -> Numeric:
    """A finite number in ``(0, high]``."""
    return Numeric("number", integer=False, low=0.0, high=high, low_open=True)


RATE_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class Rate(Numeric):
    """A rate per second: ``100``, ``100/s``, ``600/m`` or ``36000/h``, in ``(0, high]``
    per second once converted."""

    def __init__(self, high: float) -> None:
        super().__init__("rate", integer=False, low=0.0, high=high, low_open=True,
                         unit="per second")

    def value(self, raw: str) -> float:
        number, slash, unit = raw.strip().partition("/")
        per = RATE_UNITS.get(unit.strip().lower()) if slash else 1.0
        if per is None:
            raise argparse.ArgumentTypeError(
                f"expected N, N/s, N/m or N/h, got {raw.strip()!r}")
        return super().value(number) / per


def rate(high: float) -> Rate:
    """See ``Rate``."""
    return Rate(high)


def queue_name(raw: str) -> str:
    """One queue name: not empty (an empty name would mean "every queue" to some
    commands)."""
    if not raw.strip():
        raise argparse.ArgumentTypeError(f"a queue name cannot be empty, got {raw!r}")
    return raw


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
    a queue without one weighs 1); no queue twice, no empty name."""
    names: list[str] = []
    weights: list[int] = []
    weighted = False
    if not raw.strip():
        # "" would read as no queue given, that is every queue of the app
        raise argparse.ArgumentTypeError(
            f"a queue name cannot be empty, got {raw!r} (leave -q out to serve every "
            "queue of the app's tasks)")
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            raise argparse.ArgumentTypeError(f"a queue name is missing in {raw!r}")
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
    if is_sentinel_url(url):  # several hosts and a service name: its own parser
        try:
            check_url(url)
        except ValueError as exc:
            return str(exc)
        return None
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
    # nothing to show for a switch, an empty list or no value: "default False" and
    # "default ]" said nothing
    empty = kind is boolean or default is None or default == "" or default == ()
    text = f"{help} [env {var}]" if empty else f"{help} [env {var}; default {default}]"
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
