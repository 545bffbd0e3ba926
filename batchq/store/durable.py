"""The producer's replica-acknowledged writes: one script call followed by ``WAIT`` on
its connection (``replicas.py``), and the ``NotReplicated`` that names the jobs when
fewer than ``min_replicas`` replicas confirmed them."""

from __future__ import annotations

from typing import Any

from ..produce.plan import Plan
from ..tasks.errors import NotReplicated
from . import replicas
from .clients import Clients


def unconfirmed(p: Plan, d: replicas.Durability, acked: int, present: int | None
                 ) -> NotReplicated:
    """A write that fewer than ``min_replicas`` replicas confirmed (its callers name the
    ids: ``_named``)."""
    return NotReplicated(f"enqueue of {p.task}: {replicas.shortfall(d, acked, present)}; "
                         f"the jobs are on the primary but may not survive a failover",
                         ids=[], confirmed=acked, wanted=d.min_replicas)


def named(exc: NotReplicated, ids: list[str], replicated: list[str] | None = None
           ) -> NotReplicated:
    """``exc`` naming the jobs it is about."""
    exc.ids, exc.written = list(ids), len(ids)
    exc.replicated = list(replicated or [])
    return exc


def durability(c: Clients, p: Plan) -> replicas.Durability:
    d = c.durability.with_min(p.min_replicas)
    if d.min_replicas and c.settings.cluster:
        raise ValueError("min_replicas is not supported on Redis Cluster (a WAIT must go "
                         "to the node that took the write); use min_replicas=0")
    return d


def _landed(res: Any) -> bool:
    """A write's reply that says something was stored (not a refused quota, -2)."""
    return not (isinstance(res, int) and res == -2)


def write_sync(c: Clients, p: Plan, keys: list[str], args: list[Any]) -> Any:
    """One script call; with ``min_replicas``, followed by ``WAIT`` on its connection."""
    script = c.sync_scripts.by_name[p.script]
    d = durability(c, p)
    if not d.min_replicas:
        return script(keys, args)
    (res,), acked = replicas.run_sync(c.redis, [(script, keys, args)], d)
    if isinstance(res, BaseException):
        raise res
    if acked < d.min_replicas and _landed(res):
        raise unconfirmed(p, d, acked, replicas.replicas_present(c.redis))
    return res


async def write_async(c: Clients, p: Plan, keys: list[str], args: list[Any]) -> Any:
    script = c.async_scripts().by_name[p.script]
    d = durability(c, p)
    if not d.min_replicas:
        return await script(keys, args)
    (res,), acked = await replicas.run_async(c.async_redis(), [(script, keys, args)], d)
    if isinstance(res, BaseException):
        raise res
    if acked < d.min_replicas and _landed(res):
        raise unconfirmed(p, d, acked, await replicas.areplicas_present(c.async_redis()))
    return res
