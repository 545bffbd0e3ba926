"""Redis connection settings and client construction (sync and asyncio).

Clients are built lazily and per process: a forked child never reuses its parent's
sockets. Commands are not retried blindly by redis-py: a retried write could apply twice.
batchq's callers retry themselves where the operation is idempotent (acks, lease
extension) or made safe (enqueue checks whether its first try landed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def resolve_url(url: str | None) -> str:
    """``url``, else ``$BATCHQ_REDIS_URL``, else the local default."""
    return url or os.environ.get("BATCHQ_REDIS_URL") or DEFAULT_URL


_SECRET_PARAMS = ("password", "pass", "pwd", "auth")


def redact(url: str) -> str:
    """The URL with any password (in the user info or the query) replaced by ``***``,
    for logs and reprs. Host, port and IPv6 brackets are kept as given."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            query = urlencode([(k, "***" if k.lower() in _SECRET_PARAMS else v)
                               for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. ``repr`` never shows the password."""

    url: str
    socket_timeout_s: float = 15.0
    connect_timeout_s: float = 5.0
    health_check_interval_s: int = 10

    def __repr__(self) -> str:
        return f"RedisSettings(url={redact(self.url)!r})"

    def _kwargs(self, socket_timeout_s: float | None) -> dict[str, Any]:
        return {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "socket_keepalive": True,
            "health_check_interval": self.health_check_interval_s,
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": False,
        }

    def sync_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, **self._kwargs(self.socket_timeout_s))

    def async_client(self, *, socket_timeout_s: float | None = None) -> redis.asyncio.Redis:
        timeout = self.socket_timeout_s if socket_timeout_s is None else socket_timeout_s
        return redis.asyncio.Redis.from_url(self.url, **self._kwargs(timeout))
