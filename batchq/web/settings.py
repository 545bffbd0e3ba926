"""Where and how the web console serves (``batchq web``, ``batchq worker --web``): its
settings and their defaults.

Here rather than in ``batchq.web`` because that package needs its extra (Starlette,
uvicorn): the command line and the supervisor read these without it installed, and
import ``batchq.web`` only once the console is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST = "127.0.0.1"
"""Loopback: any other address needs a token (``batchq.web.check_bind``)."""
PORT = 9181
REFRESH_S = 2.0
REFRESH_MIN_S, REFRESH_MAX_S = 1.0, 60.0
"""Seconds between the pages' live updates; a client-given interval is clamped to this
range (sidekiq#6045)."""


@dataclass(frozen=True)
class WebSettings:
    """One console: where it listens, the token clients must send (None: loopback
    only), whether actions are refused, and how often the pages refresh."""

    host: str = HOST
    port: int = PORT
    token: str | None = field(default=None, repr=False)  # never in a log line
    read_only: bool = False
    refresh_s: float = REFRESH_S
