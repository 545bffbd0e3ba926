"""``batchq web``: serve the web console until SIGINT or SIGTERM; and the check that
``batchq worker --web`` shares with it before anything starts.

The console is an extra (``pip install 'batchq[web]'``: Starlette and uvicorn), so
``batchq.web`` is imported only once a console is asked for: every other command works
without it, and a missing extra is a one-line message (exit 2), not a traceback.
``python -m batchq.web`` is this command. The token comes from ``--token`` or, better (a
flag shows in ``ps``), ``$BATCHQ_WEB_TOKEN``.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..web.settings import HOST, PORT, REFRESH_MAX_S, REFRESH_MIN_S, REFRESH_S, WebSettings
from ..worker import exitcodes
from .common import Fail, add_common, guarded, target, usage
from .flags import opt, port, seconds_between


def check_web(web: WebSettings) -> None:
    """Refuse a console that cannot be served or would be unsafe, before anything
    starts (exit 2): the web extra missing, a token too short, or an address other than
    loopback without a token."""
    try:
        from ..web import check_bind
    except ImportError as exc:
        raise usage(f"the web console needs its extra: pip install 'batchq[web]' "
                    f"({exc.__cause__ or exc})") from None
    try:
        check_bind(web.host, web.token)
    except ValueError as exc:  # InsecureBindError
        raise usage(str(exc)) from None


def cmd_web(args: argparse.Namespace) -> int:
    web = WebSettings(args.host, args.port, args.token, args.read_only, args.refresh)
    check_web(web)
    t = target(args)
    t.app.redis.ping()  # unreachable: exit 4 (``guarded``) before listening
    from ..ops.logs import setup_logging
    from ..web import serve

    setup_logging("INFO", "plain", "web")
    try:
        serve(t.app, web.host, web.port, web.token, web.read_only, app_queues=t.app_queues,
              refresh_s=web.refresh_s)
    except OSError as exc:  # the address is taken, or not one of this machine's
        raise Fail(exitcodes.EXIT_ERROR, f"cannot listen on {web.host}:{web.port}: {exc}") \
            from None
    return exitcodes.EXIT_OK


def add_token(p: argparse.ArgumentParser, *flags: str, what: str) -> None:
    """The console's token flag, falling back to ``$BATCHQ_WEB_TOKEN``."""
    opt(p, *flags, env="WEB_TOKEN", default=None,
        help=f"require this token from every client of {what} (at least 16 characters; "
        "needed on any address but loopback). Prefer the variable: a flag shows in ps")


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "web", help="serve the web console (needs: pip install 'batchq[web]')",
        description="Serve the web console: queues, dead letters (retry, purge), campaigns "
        "(cancel), customers and their limits (set, remove, hold, release), single jobs "
        "(cancel, retry), workers, periodic tasks and the audit log in a browser, and the "
        "same data as JSON under /api/. Every action is recorded in the audit log. "
        "It listens on loopback by default; any other address needs a token.")
    add_common(p)
    p.add_argument("--host", default=HOST,
                   help=f"address to listen on [default {HOST}; any other needs a token]")
    p.add_argument("--port", type=port, default=PORT,
                   help=f"port to listen on [default {PORT}; 0: any free port]")
    add_token(p, "--token", what="the console")
    p.add_argument("--read-only", action="store_true",
                   help="hide every action (retry, purge, pause, cancel, limits, holds); "
                   "the server refuses them")
    p.add_argument("--refresh", type=seconds_between(REFRESH_MIN_S, REFRESH_MAX_S),
                   default=REFRESH_S, metavar="SECONDS",
                   help=f"seconds between the pages' live updates, {REFRESH_MIN_S:g} to "
                   f"{REFRESH_MAX_S:g} [default {REFRESH_S:g}]")
    p.set_defaults(handler=guarded("web", cmd_web))
