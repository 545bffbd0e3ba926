"""Sentinel URLs: ``redis+sentinel://[user:pass@]host1:port1,host2:port2/SERVICE[/db]``.

The URL lists Sentinels, not the data server: the client asks them for the primary of
``SERVICE`` and connects there (redis-py's ``SentinelConnectionPool``). After a failover
its connections to the old primary fail (a killed server) or answer ``READONLY`` (a
demoted one, turned into ``ConnectionError`` by the Sentinel connection class and the
connection dropped); the next connection asks the Sentinels again. batchq's callers
already treat a lost connection as a pause and retry with backoff, so a producer, a
worker, the console and the scheduler follow a failover without a restart.

``rediss+sentinel://`` uses TLS to the data servers and to the Sentinels. The Sentinels'
own password (``requirepass`` of the Sentinel processes, often not the data password)
goes in the query: ``?sentinel_password=...`` (``sentinel_username`` likewise), or
``App(sentinel_password=...)``. Other query options (``ssl_ca_certs``, ...) are passed
to every connection, as for a plain URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
"""URL schemes that select a Sentinel-managed primary, and the plain scheme of each."""

DEFAULT_SENTINEL_PORT = 26379

_SSL_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                "ssl_check_hostname", "ssl_ca_path", "ssl_password")


def is_sentinel_url(url: str) -> bool:
    """True for ``redis+sentinel://`` and ``rediss+sentinel://`` URLs."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed Sentinel URL (``repr`` shows no password)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    tls: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_username: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()


def _host_port(item: str) -> tuple[str, int]:
    if item.startswith("["):  # [v6]:port
        host, _, rest = item[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad Sentinel address {item!r}")
    else:
        host, _, port_s = item.partition(":")
    if not host:
        raise ValueError(f"a Sentinel address without a host: {item!r}")
    if not port_s:
        return host, DEFAULT_SENTINEL_PORT
    if not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise ValueError(f"bad port in Sentinel address {item!r}")
    return host, int(port_s)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The parts of a Sentinel URL; a ``ValueError`` (without the URL: the caller quotes
    it redacted) saying what is missing or wrong."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"not a Sentinel URL scheme: {scheme!r}")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not hosts:
        raise ValueError("no Sentinel host")
    sentinels = tuple(_host_port(h.strip()) for h in hosts.split(",") if h.strip())
    if not sentinels:
        raise ValueError("no Sentinel host")
    parts = [unquote(p) for p in path.split("/") if p] if slash else []
    if not parts:
        raise ValueError("no service name: write redis+sentinel://host:26379,.../SERVICE "
                         "(the name the Sentinels monitor, as in `sentinel monitor NAME`)")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"the path must be /SERVICE or /SERVICE/DB, got {'/' + path!r}")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    options: list[tuple[str, str]] = []
    s_user = s_pass = None
    db = int(parts[1]) if len(parts) == 2 else 0
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "sentinel_password":
            s_pass = value
        elif key == "sentinel_username":
            s_user = value
        elif key == "db":
            if not value.isdigit():
                raise ValueError(f"db must be a number, got {value!r}")
            db = int(value)
        else:
            options.append((key, value))
    return SentinelUrl(sentinels, parts[0], db, scheme.lower() == "rediss+sentinel",
                       username, password, s_user, s_pass, tuple(options))


def _options(s: SentinelUrl) -> dict[str, Any]:
    """The query options a plain connection takes (TLS file names and checks)."""
    out: dict[str, Any] = {}
    for key, value in s.options:
        if key not in _SSL_OPTIONS:
            raise ValueError(f"unknown option {key!r} in a Sentinel URL (known: "
                             f"sentinel_password, sentinel_username, db, "
                             f"{', '.join(_SSL_OPTIONS)})")
        if key == "ssl_check_hostname":
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = value
    return out


def _split(url: str, kwargs: dict[str, Any], sentinel_password: str | None
           ) -> tuple[SentinelUrl, dict[str, Any], dict[str, Any]]:
    """(parsed URL, data-connection keywords, Sentinel-connection keywords)."""
    s = parse_sentinel_url(url)
    extra = _options(s)
    data = {**kwargs, **extra, "db": s.db, "username": s.username, "password": s.password}
    side = {k: v for k, v in kwargs.items() if k.startswith("socket_") or k == "retry"}
    side.update(extra)
    side["username"] = s.sentinel_username
    side["password"] = s.sentinel_password if s.sentinel_password is not None \
        else sentinel_password
    if s.tls:
        data["ssl"] = True
        side["ssl"] = True
    return s, data, side


class MasterNotFound(redis.sentinel.MasterNotFoundError):
    """No primary found through the Sentinels (a ``ConnectionError``: callers retry)."""


def _not_found(where: str, service: str, errors: list[str]) -> MasterNotFound:
    if errors:
        return MasterNotFound(f"no Sentinel reachable at {where} (service {service!r}): "
                              f"{'; '.join(errors)}")
    return MasterNotFound(f"the Sentinels at {where} know no primary for service "
                          f"{service!r} (a wrong service name, or no primary elected)")


def _address(sentinel: Any) -> str:
    kw = sentinel.connection_pool.connection_kwargs
    return f"{kw.get('host')}:{kw.get('port')}"


def _primary(sentinel: Any, masters: Any, service: str) -> tuple[str, int] | None:
    state = masters.get(service)
    if state and sentinel.check_master_state(state, service):
        ip = sentinel._force_master_ip if sentinel._force_master_ip is not None \
            else state["ip"]
        return ip, state["port"]
    return None


class _SyncSentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel, whose "no primary" error says which case it is without the
    clients' reprs (redis-py lists them), the URL redacted (``where``)."""

    where = ""

    def discover_master(self, service_name: str) -> Any:
        errors = []
        for i, sentinel in enumerate(self.sentinels):
            try:
                masters = sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                errors.append(f"{_address(sentinel)}: {exc}")
                continue
            found = _primary(self, masters, service_name)
            if found is not None:  # this Sentinel is asked first next time
                self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                return found
        raise _not_found(self.where, service_name, errors)


class _AsyncSentinel(redis.asyncio.sentinel.Sentinel):
    """``_SyncSentinel`` for asyncio."""

    where = ""

    async def discover_master(self, service_name: str) -> Any:
        errors = []
        for i, sentinel in enumerate(self.sentinels):
            try:
                masters = await sentinel.sentinel_masters()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                errors.append(f"{_address(sentinel)}: {exc}")
                continue
            found = _primary(self, masters, service_name)
            if found is not None:
                self.sentinels[0], self.sentinels[i] = sentinel, self.sentinels[0]
                return found
        raise _not_found(self.where, service_name, errors)


def sync_sentinel_client(url: str, kwargs: dict[str, Any], sentinel_password: str | None = None,
                         where: str = "the Sentinels") -> redis.Redis:
    """A client of the primary of the URL's service (found, and found again after a
    failover, through the Sentinels). ``kwargs``: the plain client's connection keywords;
    ``where``: the URL redacted, for messages."""
    s, data, side = _split(url, kwargs, sentinel_password)
    sentinel: Any = _SyncSentinel(  # type: ignore[no-untyped-call]
        list(s.sentinels), sentinel_kwargs=side)
    sentinel.where = where
    return cast(redis.Redis, sentinel.master_for(s.service, redis_class=redis.Redis, **data))


def async_sentinel_client(url: str, kwargs: dict[str, Any],
                          sentinel_password: str | None = None,
                          where: str = "the Sentinels") -> redis.asyncio.Redis:
    """``sync_sentinel_client`` for asyncio."""
    s, data, side = _split(url, kwargs, sentinel_password)
    sentinel: Any = _AsyncSentinel(  # type: ignore[no-untyped-call]
        list(s.sentinels), sentinel_kwargs=side)
    sentinel.where = where
    return cast(redis.asyncio.Redis,
                sentinel.master_for(s.service, redis_class=redis.asyncio.Redis, **data))

