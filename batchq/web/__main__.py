"""``python -m batchq.web [MODULE:APP] [--redis-url] [--namespace] [--host] [--port]
[--token] [--read-only]``: serve the console until SIGINT or SIGTERM.

The URL resolves as ``--redis-url`` > the app's > ``$BATCHQ_REDIS_URL`` > the local
default, the namespace as ``--namespace`` > the app's > ``$BATCHQ_NAMESPACE`` >
``batchq`` (as every ``batchq`` command). The token comes from ``--token`` or, better (a
flag shows in ``ps``), ``$BATCHQ_WEB_TOKEN``. Exit codes are ``batchq.exitcodes``'s: 2
for a bad flag or an unsafe bind, 3 for an app that cannot be imported, 4 when Redis
cannot be reached.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

import redis

from .. import exitcodes
from ..app import App
from ..connection import redact, resolve_url
from .routes import REFRESH_MAX_S, REFRESH_MIN_S, REFRESH_S
from .security import InsecureBindError
from .server import DEFAULT_HOST, DEFAULT_PORT, serve

TOKEN_ENV = "BATCHQ_WEB_TOKEN"
NAMESPACE_ENV = "BATCHQ_NAMESPACE"
DEFAULT_NAMESPACE = "batchq"


class _Fail(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def load_app(ref: str) -> App:
    """Import ``module:attribute`` (attribute defaults to ``app``) and return the App."""
    if "://" in ref:
        raise _Fail(exitcodes.EXIT_USAGE, f"{redact(ref)!r} looks like a URL, not "
                    "MODULE:APP; pass a Redis URL with --redis-url")
    module_name, _, attr = ref.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise _Fail(exitcodes.EXIT_IMPORT,
                    f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        raise _Fail(exitcodes.EXIT_IMPORT,
                    f"{ref!r} is not a batchq.App (found {type(obj).__name__})")
    return obj


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {raw!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range (0-65535): {value}")
    return value


def _refresh(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {raw!r}") from None
    if not REFRESH_MIN_S <= value <= REFRESH_MAX_S:
        raise argparse.ArgumentTypeError(
            f"refresh must be {REFRESH_MIN_S:g}-{REFRESH_MAX_S:g} seconds, not {raw}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m batchq.web",
                                description="Serve the batchq web console.")
    p.add_argument("app", nargs="?", default=None, metavar="MODULE:APP",
                   help="the app (its Redis URL, namespace and queues); optional")
    p.add_argument("--redis-url", default=None,
                   help="Redis URL [default the app's, else $BATCHQ_REDIS_URL]")
    p.add_argument("--namespace", default=None,
                   help=f"key namespace [default the app's, else ${NAMESPACE_ENV}, "
                   f"else {DEFAULT_NAMESPACE}]")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to bind [default {DEFAULT_HOST}; any other needs a token]")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"port [default {DEFAULT_PORT}; 0: any free port]")
    p.add_argument("--token", default=None,
                   help=f"require this token from every client [default ${TOKEN_ENV}]")
    p.add_argument("--read-only", action="store_true",
                   help="hide every action; the server refuses them")
    p.add_argument("--refresh", type=_refresh, default=REFRESH_S,
                   help=f"seconds between live updates [default {REFRESH_S:g}]")
    return p


def build_app(ref: str | None, redis_url: str | None,
              namespace: str | None) -> tuple[App, list[str]]:
    """The app to serve (the user's, or one built from the URL and namespace) and the
    queues to list even before they are used (the user's app's)."""
    loaded = load_app(ref) if ref else None
    url = redis_url or (loaded.redis_url if loaded else resolve_url(None))
    ns = namespace or (loaded.namespace if loaded else None) \
        or os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    if loaded is not None and ns == loaded.namespace and url == loaded.redis_url:
        return loaded, loaded.queues()
    try:
        app = App(url, ns)
    except ValueError as exc:
        raise _Fail(exitcodes.EXIT_USAGE, str(exc)) from None
    return app, loaded.queues() if loaded is not None else []


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        app, queues = build_app(args.app, args.redis_url, args.namespace)
        try:
            app.redis.ping()
        except redis.RedisError as exc:
            raise _Fail(exitcodes.EXIT_REDIS, f"cannot reach Redis at "
                        f"{redact(app.redis_url)}: {type(exc).__name__}: {exc}") from None
        serve(app, args.host, args.port, token, args.read_only, app_queues=queues,
              refresh_s=args.refresh)
    except _Fail as exc:
        print(f"batchq web: {exc}", file=sys.stderr)
        return exc.code
    except InsecureBindError as exc:
        print(f"batchq web: {exc}", file=sys.stderr)
        return exitcodes.EXIT_USAGE
    except OSError as exc:
        print(f"batchq web: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return exitcodes.EXIT_ERROR
    return exitcodes.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
