"""Is Redis usable for batchq? Shared by ``batchq check`` and worker start-up.

Besides reachability and the eviction policy, the check asks the server for each
command batchq can do without (a managed Redis may rename or deny ``CONFIG``,
``SCRIPT`` or ``CLIENT``) and says what a refusal turns off: ``PROBES``. Nothing batchq
needs to move a job is among them, except that a server refusing both ``SCRIPT LOAD``
and ``EVAL`` cannot run a script again once its cache is flushed (or after a failover).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from ..store.connection import RedisSettings, redact

SAFE_POLICIES = ("noeviction",)

PROBES = {
    "INFO server": "the server's name and version are not shown",
    "CONFIG GET maxmemory-policy": "the eviction-policy check is skipped: make sure the "
    "policy is noeviction in the service's settings",
    "SCRIPT LOAD": "scripts are sent whole with EVAL after a NOSCRIPT (a flushed cache, "
    "a failover) instead of loaded; the ACL user needs +eval",
    "EVAL": "nothing while SCRIPT LOAD works; without both, a script the server forgot "
    "cannot run again",
    "CLIENT SETINFO": "connections are not labelled with the client library in CLIENT "
    "LIST (batchq names its workers in its own registry: info shows them anyway)",
}
"""The optional commands the check tries, and what batchq does without each."""

_PROBE_SCRIPT = "return 1"


@dataclass(frozen=True)
class Probe:
    """One optional command tried by the check."""

    command: str
    refusal: str
    """The server's error, empty when the command worked."""

    @property
    def ok(self) -> bool:
        return not self.refusal

    @property
    def without(self) -> str:
        """What is turned off without the command."""
        return PROBES[self.command]


@dataclass(frozen=True)
class Health:
    reachable: bool
    eviction_policy: str | None
    """None when the server does not let us read it (managed Redis, ACL)."""
    server: str
    reason: str
    probes: tuple[Probe, ...] = ()
    """The optional commands tried, in ``PROBES`` order (empty when unreachable)."""

    @property
    def scripts_run(self) -> bool:
        """Scripts can be (re)loaded: ``SCRIPT LOAD`` or ``EVAL`` works."""
        refused = {p.command for p in self.probes if not p.ok}
        return not {"SCRIPT LOAD", "EVAL"} <= refused

    @property
    def ok(self) -> bool:
        """Reachable, scripts can be loaded, and the eviction policy is not known to drop
        keys (a managed Redis that hides CONFIG passes, with a warning in ``reason``)."""
        return self.reachable and self.scripts_run and (
            self.eviction_policy is None or self.eviction_policy in SAFE_POLICIES)


def _try(probes: list[Probe], command: str, fn: Any) -> Any:
    """Run ``fn()``; a refusal (renamed command, NOPERM) is recorded, not raised."""
    try:
        res = fn()
    except redis.ResponseError as exc:
        probes.append(Probe(command, str(exc).strip() or type(exc).__name__))
        return None
    probes.append(Probe(command, ""))
    return res


def check(settings: RedisSettings) -> Health:
    """Ping the server, read its eviction policy and try the optional commands."""
    client = settings.sync_client()
    where = redact(settings.url)
    probes: list[Probe] = []
    try:
        client.ping()
        info = _try(probes, "INFO server", lambda: client.info("server")) or {}
        name = "valkey" if "valkey_version" in info else "redis"
        version = info.get("valkey_version") or info.get("redis_version")
        server = f"{name} {version}" if version else "the server"
        cfg: dict[Any, Any] = dict(_try(probes, "CONFIG GET maxmemory-policy",
                                        lambda: client.config_get("maxmemory-policy"))
                                   or {})
        raw = cfg.get(b"maxmemory-policy", cfg.get("maxmemory-policy"))
        policy = raw.decode() if isinstance(raw, bytes) else (str(raw) if raw else None)
        _try(probes, "SCRIPT LOAD", lambda: client.script_load(_PROBE_SCRIPT))
        if not probes[-1].ok:
            # tried only when needed: a least-privileged user without +eval is fine
            _try(probes, "EVAL", lambda: client.eval(_PROBE_SCRIPT, 0))
        # the value redis-py itself sends on connect: the probe changes nothing
        _try(probes, "CLIENT SETINFO", lambda: client.client_setinfo("LIB-NAME", "redis-py"))
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        return Health(False, None, "", f"cannot reach Redis at {where}: {exc}")
    except redis.ResponseError as exc:
        return Health(False, None, "", f"Redis at {where} refused: {exc}")
    finally:
        client.close()
    done = tuple(probes)
    if not Health(True, None, server, "", done).scripts_run:
        reason = (f"{server} at {where} refuses both SCRIPT LOAD and EVAL: batchq cannot "
                  "load its scripts (allow one of them to the batchq user)")
    elif policy is None:
        reason = (f"{server} at {where} is reachable but its maxmemory-policy cannot be read; "
                  "make sure it is noeviction")
    elif policy not in SAFE_POLICIES:
        reason = (f"{server} at {where} has maxmemory-policy {policy}: Redis may evict queued "
                  "jobs under memory pressure; set it to noeviction")
    else:
        reason = f"{server} at {where} is reachable, maxmemory-policy {policy}"
    return Health(True, policy, server, reason, done)


def probe_lines(h: Health) -> list[str]:
    """The optional commands tried and, for each refused one, what batchq turns off."""
    if not h.probes:
        return []
    width = max(len(p.command) for p in h.probes)
    lines = ["optional commands (a managed Redis may rename or deny them):"]
    for p in h.probes:
        state = "ok" if p.ok else f"refused ({p.refusal}); without it: {p.without}"
        lines.append(f"  {p.command:<{width}}  {state}")
    return lines
