"""Is Redis usable for batchq? Shared by ``batchq check`` and worker start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from .connection import RedisSettings, redact

SAFE_POLICIES = ("noeviction",)


@dataclass(frozen=True)
class Health:
    reachable: bool
    eviction_policy: str | None
    """None when the server does not let us read it (managed Redis, ACL)."""
    server: str
    reason: str

    @property
    def ok(self) -> bool:
        """Reachable, and the eviction policy is not known to drop keys (a managed Redis
        that hides CONFIG passes, with a warning in ``reason``)."""
        return self.reachable and (self.eviction_policy is None
                                   or self.eviction_policy in SAFE_POLICIES)


def check(settings: RedisSettings) -> Health:
    """Ping the server and read its eviction policy."""
    client = settings.sync_client()
    where = redact(settings.url)
    try:
        client.ping()
        info = client.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        version = str(info.get("valkey_version") or info.get("redis_version"))
        server = f"{name} {version}"
        try:
            cfg: dict[Any, Any] = dict(client.config_get("maxmemory-policy"))
            raw = cfg.get(b"maxmemory-policy", cfg.get("maxmemory-policy"))
            policy = raw.decode() if isinstance(raw, bytes) else (str(raw) if raw else None)
        except redis.ResponseError:
            policy = None
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        return Health(False, None, "", f"cannot reach Redis at {where}: {exc}")
    except redis.ResponseError as exc:
        return Health(False, None, "", f"Redis at {where} refused: {exc}")
    finally:
        client.close()
    if policy is None:
        reason = (f"{server} at {where} is reachable but its maxmemory-policy cannot be read; "
                  "make sure it is noeviction")
    elif policy not in SAFE_POLICIES:
        reason = (f"{server} at {where} has maxmemory-policy {policy}: Redis may evict queued "
                  "jobs under memory pressure; set it to noeviction")
    else:
        reason = f"{server} at {where} is reachable, maxmemory-policy {policy}"
    return Health(True, policy, server, reason)
