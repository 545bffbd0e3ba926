"""The batchq web console: an operator's page over the same data as ``batchq info``.

Install with ``pip install 'batchq[web]'`` (Starlette + uvicorn). Serve it with
``batchq.web.serve(app)`` (blocks), :func:`start_in_thread` (from another process's
thread), or mount :func:`create_app`'s ASGI app yourself. Modules, in the order a
request meets them: ``security`` (bind rule, auth, host, CSRF, headers), ``params``
(every parameter and body checked: a 400 naming it), ``routes`` (pages and the ``/api/``
JSON; every action recorded in the audit log, ``act``), ``operate`` (campaigns,
customers and limits, one job, the audit log) over ``campaigns``, ``groups`` and
``jobs``, ``deadletters`` (paged, searched and chunked dead-letter work), ``rates``
(jobs/s from the scripts' counters, sampled in the background), ``server`` (uvicorn in a
thread); the data itself comes from :mod:`batchq.ops.overview`, :mod:`batchq.produce.campaign`,
:mod:`batchq.flow.view` and :mod:`batchq.tasks.results`. ``batchq web`` (or ``python -m
batchq.web``) runs it. The package imports its modules on first use, so its
``settings`` need no extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .routes import create_app
    from .security import InsecureBindError, check_bind, is_loopback
    from .server import DEFAULT_HOST, DEFAULT_PORT, WebServer, serve, start_in_thread

_HOME = {"create_app": "routes", "InsecureBindError": "security", "check_bind": "security",
         "is_loopback": "security", "DEFAULT_HOST": "server", "DEFAULT_PORT": "server",
         "WebServer": "server", "serve": "server", "start_in_thread": "server"}


def __getattr__(name: str) -> object:
    """The console's names, imported on first use: importing the package (or its
    ``settings``) needs no extra; using the console needs Starlette and uvicorn."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:  # depends on the installed extras
        raise ImportError("the batchq web console needs its extra: pip install "
                          f"'batchq[web]' ({exc})") from exc
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "InsecureBindError",
    "WebServer",
    "check_bind",
    "create_app",
    "is_loopback",
    "serve",
    "start_in_thread",
]
