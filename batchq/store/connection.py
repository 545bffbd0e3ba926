"""Redis connection settings and client construction (sync and asyncio).

Clients are built lazily and per process: a forked child never reuses its parent's
sockets. Commands are not retried blindly by redis-py: a retried write could apply twice.
batchq's callers retry themselves where the operation is idempotent (acks, lease
extension) or made safe (enqueue checks whether its first try landed).

``redis+cluster://host:port`` (``rediss+cluster://`` for TLS) selects redis-py's cluster
clients: one seed node is enough, the rest is discovered. Every key of one queue shares a
hash tag, so each script and per-queue command lands on one node; different queues spread
over the nodes. Query options (``ssl_ca_certs``, ``ssl_certfile``, ...) work as for a plain
URL. The cluster clients are returned under the plain client types: they answer the same
commands (cross-slot multi-key commands aside, which batchq does not send).

``redis+sentinel://[user:pass@]host1:port1,host2:port2/SERVICE[/db]`` (``rediss+sentinel``
for TLS) asks the Sentinels for the primary of ``SERVICE`` (``sentinel.py``): redis-py's
Sentinel pools find it again after a failover, on a lost connection or a ``READONLY``
reply from a demoted primary, and batchq's callers retry as for any lost connection.

Every client batchq builds packs its commands with hiredis in one C call (``packing``):
redis-py's asyncio connections pack in Python, about a microsecond and a half per
argument, and its sync ones copy the arguments in a Python loop before hiredis packs them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection as aconn
import redis.asyncio.retry
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from .sentinel import (
    SENTINEL_SCHEMES,
    async_sentinel_client,
    is_sentinel_url,
    parse_sentinel_url,
    sync_sentinel_client,
)

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _hiredis_pack = None

DEFAULT_URL = "redis://127.0.0.1:6379/0"

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""URL schemes that select the cluster client, and the plain scheme each stands for."""

ASYNC_CLUSTER_MAX_CONNECTIONS = 1 << 16
"""Per-node connection cap of an asyncio cluster client (redis-py's default, 100, raises
MaxConnectionsError under load; a plain asyncio client's pool is unbounded)."""


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://`` and ``rediss+cluster://`` URLs."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def plain_url(url: str) -> str:
    """The URL with ``+cluster`` dropped from the scheme (unchanged otherwise)."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return f"{plain}{sep}{rest}" if plain else url


_default_told: list[str] = []
"""Non-empty once this process said that it fell back to ``DEFAULT_URL``."""


def resolve_url(url: str | None) -> str:
    """``url``, else ``$BATCHQ_REDIS_URL``, else the local default (with one warning per
    process: whatever answers on the default port would silently get the jobs)."""
    chosen = url or os.environ.get("BATCHQ_REDIS_URL")
    if chosen:
        return chosen
    if not _default_told:
        _default_told.append(DEFAULT_URL)
        logging.getLogger("batchq.connection").warning(
            "no Redis URL given and BATCHQ_REDIS_URL is not set: using %s", DEFAULT_URL)
    return DEFAULT_URL


_SECRET_PARAMS = ("password", "pass", "pwd", "auth")


def _secret_param(name: str) -> bool:
    n = name.lower()
    return n in _SECRET_PARAMS or n.endswith("password")  # ssl_password: the key's


def redact(url: str) -> str:
    """The URL with any password (in the user info or the query, ``ssl_password``
    included) replaced by ``***``, for logs and reprs. Host, port and IPv6 brackets are
    kept as given."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_param(k) for k, _ in pairs):
            query = urlencode([(k, "***" if _secret_param(k) else v) for k, v in pairs],
                              safe="*/")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


URL_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)


def check_url(url: object) -> str:
    """``url`` if it is a Redis URL batchq can use; else a ``ValueError`` that quotes it
    (password redacted) and says what is wrong. No connection is made."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"invalid Redis URL {url!r}: expected a string such as "
                         f"{DEFAULT_URL}")
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme in SENTINEL_SCHEMES:
            parse_sentinel_url(url)
            return url
        if scheme not in URL_SCHEMES:
            raise ValueError(f"the scheme must be one of {', '.join(URL_SCHEMES)}")
        if scheme == "unix":
            if not parts.path:
                raise ValueError("a unix socket URL needs a path")
        else:
            if not parts.hostname:
                raise ValueError("no host")
            _ = parts.port  # raises ValueError for a port that is not 0..65535
            db = parts.path.strip("/")
            if db and not db.isdigit():
                raise ValueError(f"the path must be a database number, got {parts.path!r}")
            if scheme in CLUSTER_SCHEMES and db not in ("", "0"):
                raise ValueError("Redis Cluster has only database 0")
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key == "db" and not value.isdigit():
                raise ValueError(f"db must be a number, got {value!r}")
    except ValueError as exc:
        raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    return url


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. ``repr`` never shows the password. A malformed URL is a
    ``ValueError`` here, not a traceback from the first command."""

    url: str
    socket_timeout_s: float = 15.0
    connect_timeout_s: float = 5.0
    health_check_interval_s: int = 10
    sentinel_password: str | None = None
    """The Sentinels' own password when the URL does not carry ``sentinel_password``."""

    def __post_init__(self) -> None:
        check_url(self.url)

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

    @property
    def cluster(self) -> bool:
        """True when the URL selects Redis Cluster (``redis+cluster://``)."""
        return is_cluster_url(self.url)

    @property
    def sentinel(self) -> bool:
        """True when the URL names a Sentinel service (``redis+sentinel://``)."""
        return is_sentinel_url(self.url)

    def sync_client(self) -> redis.Redis:
        kwargs = self._kwargs(self.socket_timeout_s)
        if self.sentinel:
            client = sync_sentinel_client(self.url, kwargs, self.sentinel_password,
                                          redact(self.url))
            pool = client.connection_pool
            pool.connection_class = packing(pool.connection_class)
            return client
        if self.cluster:
            # health checks are per connection in redis-py's cluster client and not a
            # cluster option; it drops the keyword
            kwargs.pop("health_check_interval")
            cluster = redis.cluster.RedisCluster.from_url(plain_url(self.url), **kwargs)
            _sync_cluster_packing(cluster)
            return cast(redis.Redis, cluster)
        client = redis.Redis.from_url(self.url, **kwargs)
        pool = client.connection_pool
        pool.connection_class = packing(pool.connection_class)
        return client

    def async_client(self, *, socket_timeout_s: float | None = None) -> redis.asyncio.Redis:
        timeout = self.socket_timeout_s if socket_timeout_s is None else socket_timeout_s
        kwargs = self._kwargs(timeout)
        if self.sentinel:
            aclient = async_sentinel_client(self.url, kwargs, self.sentinel_password,
                                          redact(self.url))
            apool = aclient.connection_pool
            apool.connection_class = packing(apool.connection_class)
            return aclient
        if self.cluster:
            # the cluster client's own retry object counts re-tries of whole commands
            kwargs["retry"] = redis.asyncio.retry.Retry(NoBackoff(), 0)
            kwargs["max_connections"] = ASYNC_CLUSTER_MAX_CONNECTIONS
            cluster = redis.asyncio.cluster.RedisCluster.from_url(plain_url(self.url), **kwargs)
            _cluster_packing(cluster)
            return cast(redis.asyncio.Redis, cluster)
        client = redis.asyncio.Redis.from_url(self.url, **kwargs)
        pool = client.connection_pool
        pool.connection_class = packing(pool.connection_class)
        return client


class _HiredisPacking:
    """``pack_command`` by hiredis: one C call for the whole command (a one-job enqueue's
    ``EVALSHA`` of 15 keys and 3 arguments: 4 µs against 35 in redis-py's Python packer
    on the development machine), the same bytes. Anything hiredis does not take (a
    memoryview, or a bad type, which then raises redis-py's own ``DataError``) goes to
    redis-py's packer."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        # a command name with literal arguments ("CONFIG GET") is sent as separate words
        if isinstance(head, str):
            if " " in head:
                args = (*head.split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [_hiredis_pack(args)]  # type: ignore[misc]
        except TypeError:
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]


_PACKING: dict[type, type] = {}


def packing(cls: type[Any]) -> type[Any]:
    """``cls`` (a redis-py connection class, sync or asyncio) packing its commands with
    hiredis; ``cls`` itself when hiredis is missing."""
    if _hiredis_pack is None or issubclass(cls, _HiredisPacking):
        return cls
    fast = _PACKING.get(cls)
    if fast is None:
        fast = _PACKING[cls] = type(cls.__name__, (_HiredisPacking, cls), {})
    return fast


def _cluster_packing(cluster: redis.asyncio.cluster.RedisCluster) -> None:
    """The same for every node of an asyncio cluster client: the seed nodes made already
    and the ones it discovers (made from the shared connection keywords)."""
    nodes = cluster.nodes_manager
    kwargs = nodes.connection_kwargs
    kwargs["connection_class"] = packing(kwargs.get("connection_class", aconn.Connection))
    for node in nodes.startup_nodes.values():
        node.connection_class = packing(node.connection_class)


def _sync_cluster_packing(cluster: redis.cluster.RedisCluster) -> None:
    """``_cluster_packing`` for a synchronous cluster client: it has built its nodes'
    clients already (their pools make connections on demand, from the class set here)
    and builds the ones it discovers later from the shared connection keywords."""
    nodes = cluster.nodes_manager
    kwargs = nodes.connection_kwargs
    kwargs["connection_class"] = packing(kwargs.get("connection_class", redis.Connection))
    for node in nodes.nodes_cache.values():
        if node.redis_connection is not None:
            pool = node.redis_connection.connection_pool
            pool.connection_class = packing(pool.connection_class)
