"""What every ``batchq`` command shares: output, secret scrubbing, exit-code mapping and
resolving where a command works (app, Redis URL, namespace).

Every command reaches Redis either through an app (``MODULE:APP``) or through
``--redis-url`` / ``--namespace``. The URL is resolved as ``--redis-url`` > the app's URL >
``$BATCHQ_REDIS_URL`` > ``redis://127.0.0.1:6379/0``; the namespace as ``--namespace`` >
the app's > ``$BATCHQ_NAMESPACE`` > ``batchq``. A password is never printed: URLs are
shown redacted, and any text written goes through a last scrub of the known passwords.

An app is ``MODULE:APP``, or a bare ``MODULE`` whose ``app`` is the App, wherever a
command takes one. Every command takes the app first (``batchq dead list MODULE:APP
QUEUE``); the older order with the app last (``dead list QUEUE MODULE:APP``) still works,
told apart by the ``:`` that queue and task names cannot contain. Data read from Redis is
shown escaped: control characters and bytes that are not UTF-8 never reach the terminal
raw.

Exit codes come from ``batchq.worker.exitcodes``: 0 ok, 1 error, 2 usage, 3 cannot import the
app, 4 cannot reach Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

from ..ops.queue import Queue
from ..store.connection import RedisSettings, redact, resolve_url
from ..tasks.app import App
from ..tasks.loading import AppImportError, load_app
from ..worker import exitcodes
from .flags import add_redis_url

Handler = Callable[[argparse.Namespace], int]

DEFAULT_NAMESPACE = "batchq"
NAMESPACE_ENV = "BATCHQ_NAMESPACE"

# --- output --------------------------------------------------------------------------------

_secrets: set[str] = set()


def remember_url(url: str | None) -> None:
    """Note the password of ``url`` so that no output ever shows it."""
    if not url:
        return
    with contextlib.suppress(ValueError):
        pw = urlsplit(url).password
        if pw:
            _secrets.update(s for s in (pw, unquote(pw)) if len(s) >= 3)


def scrub(text: str) -> str:
    for s in sorted(_secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def _encodable(text: str) -> str:
    # a lone surrogate (a name that was not UTF-8) would make the write raise
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def out(text: str = "", *, end: str = "\n") -> None:
    sys.stdout.write(_encodable(scrub(text) + end))
    sys.stdout.flush()


def err(text: str, *, end: str = "\n") -> None:
    sys.stderr.write(_encodable(scrub(text) + end))
    sys.stderr.flush()


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def text(v: Any) -> str:
    """A value read from Redis as one printable line: bytes that are not UTF-8, control
    characters (a terminal escape in a job id) and lone surrogates shown escaped. A
    ``surrogateescape`` string (an id that was not UTF-8, as ``Queue`` lists it) shows
    its bytes: ``bad-\\xff``, what a shell's ``$'bad-\\xff'`` gives back."""
    if isinstance(v, str):
        with contextlib.suppress(UnicodeEncodeError):  # another lone surrogate: below
            v = v.encode("utf-8", "surrogateescape")
    s = v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape",
                                                   "backslashreplace").decode("ascii"), s)


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


def dumps(obj: Any, *, indent: int | None = None) -> str:
    return json.dumps(obj, default=_json_default, indent=indent, ensure_ascii=False)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(s: float) -> str:
    """A short human duration: ``0s``, ``4.2s``, ``5m02s``, ``3h07m``, ``2d04h``."""
    if s < 10:
        return f"{s:.1f}s" if s else "0s"
    n = int(s)
    if n < 60:
        return f"{n}s"
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s"
    if n < 86400:
        return f"{n // 3600}h{n % 3600 // 60:02d}m"
    return f"{n // 86400}d{n % 86400 // 3600:02d}h"


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """Columns padded to their widest cell; ``right``: column indexes aligned right."""
    right = right or set()
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        cols = [c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(cols).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


# --- errors and exit codes -----------------------------------------------------------------


class Fail(Exception):
    """Stop the command: print ``message`` on stderr and exit with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def usage(message: str) -> Fail:
    return Fail(exitcodes.EXIT_USAGE, message)


def unreachable(url: str | None, exc: BaseException) -> str:
    where = redact(url) if url else "the configured URL"
    return f"cannot reach Redis at {where}: {type(exc).__name__}: {exc}"


def guarded(name: str, fn: Handler) -> Handler:
    """Run a command: map failures to exit codes and messages (passwords scrubbed)."""

    def handler(args: argparse.Namespace) -> int:
        remember_url(os.environ.get("BATCHQ_REDIS_URL"))
        remember_url(getattr(args, "redis_url", None))
        try:
            return fn(args)
        except Fail as exc:
            err(f"batchq {name}: {exc}")
            return exc.code
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            err(f"batchq {name}: {unreachable(getattr(args, 'resolved_url', None), exc)}")
            return exitcodes.EXIT_REDIS
        except redis.RedisError as exc:
            err(f"batchq {name}: Redis error: {type(exc).__name__}: {exc}")
            return exitcodes.EXIT_ERROR
        except KeyboardInterrupt:
            err(f"batchq {name}: interrupted")
            return exitcodes.EXIT_ERROR
        except BrokenPipeError:
            # output piped into `head` and the like: stop quietly
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            return exitcodes.EXIT_ERROR

    return handler


# --- which argument is the app -------------------------------------------------------------


def load(ref: str, taken: str = "") -> App:
    """Import the app ``ref``; ``taken`` says how the arguments were read, for the
    message when it does not import."""
    if "://" in ref:
        remember_url(ref)
        raise usage(f"{redact(ref)!r} looks like a URL, not MODULE:APP; pass a Redis URL "
                    "with --redis-url")
    try:
        return load_app(ref)
    except AppImportError as exc:
        raise Fail(exitcodes.EXIT_IMPORT, f"{exc}{taken}") from None


def app_only(values: list[str], hint: str = "") -> str | None:
    """The app reference of a command whose only positional is the optional app
    (``campaign list``), read as ``info`` and ``worker`` read theirs: ``MODULE:APP``, or
    a bare ``MODULE`` whose ``app`` is the App. ``hint`` is added to the message when
    more than one value is given."""
    if len(values) > 1:
        extra = f" ({hint})" if hint else ""
        raise usage(f"too many arguments {values!r}: expected [MODULE:APP]{extra}")
    return values[0] if values else None


def app_and(values: list[str], role: str) -> tuple[str | None, App | None, str]:
    """``(app ref, loaded app, value)`` from the positionals ``[MODULE:APP] ROLE`` or the
    older ``ROLE MODULE:APP``. ``role`` (QUEUE, TASK) names cannot contain ``:``, so an
    argument with one is the app; with neither holding one (a bare module name), the
    first that imports is the app."""
    if len(values) > 2:
        raise usage(f"too many arguments {values!r}: expected [MODULE:APP] {role}")
    if len(values) == 1:
        (v,) = values
        if ":" in v:
            raise usage(f"{v!r} was taken as MODULE:APP ({role} names cannot contain ':'), "
                        f"and no {role} was given")
        return None, None, v
    a, b = values
    if ":" in a and ":" in b:
        raise usage(f"both {a!r} and {b!r} contain ':'; give MODULE:APP and a {role} "
                    "(which cannot contain ':')")

    def taken(app: str, value: str) -> str:
        return f" (took {app!r} as MODULE:APP and {value!r} as {role})"

    if ":" in a or ":" in b:
        app, value = (a, b) if ":" in a else (b, a)
        return app, load(app, taken(app, value)), value
    try:
        return a, load_app(a), b
    except AppImportError as first:
        try:
            return b, load_app(b), a
        except AppImportError:
            raise Fail(exitcodes.EXIT_IMPORT, f"neither {a!r} nor {b!r} imports as an app; "
                       f"{first}{taken(a, b)}") from None


# --- where a command works -----------------------------------------------------------------


@dataclass
class Target:
    """Where a command works: ``app`` reaches the queues; ``loaded`` is the user's app."""

    app: App
    loaded: App | None
    url: str
    app_queues: list[str] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.app.namespace

    def where(self) -> str:
        return f"namespace {self.namespace} at {redact(self.url)}"

    def queue(self, name: str) -> Queue:
        try:
            self.app.keys(name)
        except ValueError as exc:
            raise usage(str(exc)) from None
        return self.app.queue(name)


def target(args: argparse.Namespace, loaded: App | None = None) -> Target:
    """Resolve the app, URL and namespace of a command (see the module docstring).
    ``loaded``: the app already imported while telling the positionals apart."""
    ref: str | None = getattr(args, "app", None)
    if loaded is None and ref:
        loaded = load(ref, " (taken as MODULE:APP)")
    if loaded is not None:
        remember_url(loaded.redis_url)
    url: str = args.redis_url or (loaded.redis_url if loaded else resolve_url(None))
    remember_url(url)
    args.resolved_url = url
    ns_flag: str | None = getattr(args, "namespace", None)
    ns = ns_flag or (loaded.namespace if loaded else None) \
        or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    if loaded is not None and ns == loaded.namespace:
        if url != loaded.redis_url:
            loaded.redis_settings = RedisSettings(url)
        return Target(loaded, loaded, url, loaded.queues())
    try:
        app = App(url, ns)
        if loaded is not None:
            # the same tasks under another namespace (``enqueue --namespace``)
            app.max_payload_bytes = loaded.max_payload_bytes
            for task in loaded.tasks.values():
                app.task(**asdict(task.config))(task.fn)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise usage(str(exc)) from None
    return Target(app, loaded, url, loaded.queues() if loaded else [])


def add_common(p: argparse.ArgumentParser, *, app: bool = True,
               namespace: bool = True) -> None:
    """The optional app reference and the Redis options every command shares."""
    if app:
        p.add_argument("app", nargs="?", default=None, metavar="MODULE:APP",
                       help="the app (its Redis URL, namespace and queues); optional")
    add_redis_url(p)
    if namespace:
        p.add_argument("--namespace", default=None,
                       help=f"key namespace [default the app's, else ${NAMESPACE_ENV}, "
                       f"else {DEFAULT_NAMESPACE}]")
