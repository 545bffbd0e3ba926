"""Reading a queue's state for operators: one pipelined read shared by ``Queue.stats``
(``batchq info``) and the metrics' ``QueueCollector`` (``/metrics``).

Operator tools never crash on data. Whatever was written into Redis by hand (an entry
whose body has the wrong types or is not msgpack, a key of the wrong type, a queue name
in the registry that is not UTF-8 or not a legal name), the reader returns what it can
read and flags the rest: ``QueueStats.malformed_heads`` lists the priorities whose head
entry is not a runnable job, and ``registered_queues`` sets malformed names apart
instead of failing the whole scrape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from ..store import codec, shards
from ..store.keys import MAX_PRIORITY, QueueKeys, queues_key
from ..store.scripts import SyncScript, calls, run_pipeline

OUTCOMES = ("enqueued", "succeeded", "dead", "retried", "handed", "cancelled", "expired")
"""The counters the scripts keep in a queue's ``stats`` hash, in the order read
(``handed``: jobs an enqueue leased straight to an idle worker, ``enqueue.lua``;
``cancelled``: jobs cancelled before they started, ``cancel.lua`` and ``pop.lua``;
``expired``: jobs past their ``expires_s`` / ``expires_at`` dropped unstarted, ``pop.lua``)."""

BUNDLE_COUNTS = ("bundled",)
"""The stats field that counts the running jobs of live bundles (``_lib.lua``
"Bundles"): a bundle is one member of its own zset for all its jobs."""

GROUPS_READ = 500
"""Groups with ready jobs visited per queue and read (``gready_stats.lua``) to count
grouped jobs by priority and find the first in line (about 10 µs of server time each);
past it the counts are shared out in the proportions seen."""


def reserved_jobs(leases: Any, bundled: Any) -> int:
    """Jobs reserved (running): ``ZCARD reserved`` (leases of their own) and the stats
    field ``bundled``."""
    return _int(leases) + max(0, _int(bundled))


@dataclass(frozen=True)
class QueueStats:
    """Job counts of one queue by state; ``oldest_age_s`` is how long the oldest ready job
    has been waiting since it was enqueued (or came due), 0 when none is waiting.

    ``malformed_heads``: the priorities (9..0) whose ready list starts with an entry that
    is not a runnable job (written by hand, or corrupted); a worker dead-letters it as
    ``decode_error`` when it reaches it. Empty when every head is fine.

    Flow control (``Queue.limit``): ``ready`` includes ``grouped``, the ready jobs of
    groups, and so do ``ready_by_priority`` and ``oldest_age_s`` (read per group, never
    per job: ``GROUPS_READ``); ``groups_active`` groups may start jobs now,
    ``groups_waiting`` wait for a rate token, a concurrency slot or the end of a hold;
    ``held_s``: seconds left of a hold of the whole queue (``RateLimited`` raised by a
    job without a group, or ``Queue.hold``). ``expired``: jobs dropped unstarted past
    their deadline (``options(expires_s=...)``), counted since the queue began."""

    ready: int
    delayed: int
    reserved: int
    dead: int
    paused: bool = False
    oldest_age_s: float = 0.0
    ready_by_priority: dict[int, int] = field(default_factory=dict)
    malformed_heads: tuple[int, ...] = ()
    grouped: int = 0
    groups_active: int = 0
    groups_waiting: int = 0
    held_s: float = 0.0
    expired: int = 0

    @property
    def pending(self) -> int:
        """Jobs not finished yet: ready + delayed + reserved."""
        return self.ready + self.delayed + self.reserved


@dataclass(frozen=True)
class Snapshot:
    """One queue as one scrape read it: its stats, plus what only metrics show."""

    name: str
    stats: QueueStats
    delayed_lag_s: float
    """Now minus the due time of the oldest delayed job not yet moved (0 if none due)."""
    outcomes: dict[str, int]
    """The scripts' own counters (``OUTCOMES``)."""
    shards: int = 1
    """Sub-queues read for it (a sharded queue: ``merge``)."""


_PER_QUEUE = 2 * (MAX_PRIORITY + 1) + 10


def _queue_commands(pipe: Any, k: QueueKeys) -> None:
    """Queue the ``_PER_QUEUE`` reads of one queue (parsed by ``_parse``)."""
    for key in k.ready:
        pipe.llen(key)
    for key in k.ready:
        pipe.lindex(key, 0)
    pipe.zcard(k.delayed)
    pipe.zcard(k.reserved)
    pipe.zcard(k.dead)
    pipe.exists(k.paused)
    pipe.zrange(k.delayed, 0, 0, withscores=True)
    pipe.hmget(k.stats, [*OUTCOMES, *BUNDLE_COUNTS])
    pipe.zcard(k.gready)
    pipe.zcard(k.groups)
    pipe.zcard(k.gwait)
    pipe.zscore(k.gwait, "~q")


def _int(value: Any) -> int:
    """A count from a reply; a key of the wrong type (an error reply) counts as 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0


def ready_ms(head: Any, queue: str) -> int | None:
    """When the entry ``head`` became runnable (ms), or None when it is not a runnable
    job: a bad header, a body that is not msgpack, or fields of the wrong type."""
    if not isinstance(head, bytes):
        return None
    try:
        job = codec.decode_entry(head, queue)
        ms = job.ready_ms
        enq = job.enqueued_ms
    except Exception:  # any bytes at all may sit here: never let one crash a reader
        return None
    for v in (ms, enq):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
    return int(ms)


def _parse(name: str, res: Sequence[Any], now_ms: int) -> Snapshot:
    n = MAX_PRIORITY + 1
    lens = [_int(x) for x in res[:n]]
    heads = res[n : 2 * n]
    delayed, reserved, dead, paused = (_int(x) for x in res[2 * n : 2 * n + 4])
    first_due, counts = res[2 * n + 4], res[2 * n + 5]
    grouped, active, waiting = (_int(x) for x in res[2 * n + 6 : 2 * n + 9])
    held = res[2 * n + 9]
    held_s = 0.0
    if isinstance(held, int | float) and not isinstance(held, bool):
        held_s = max(0.0, (float(held) - now_ms) / 1000)
        waiting -= 1  # the queue's own hold is not a group
    oldest_ms = 0
    malformed: list[int] = []
    for i, head in enumerate(heads):
        if head is None or isinstance(head, Exception):
            continue
        ms = ready_ms(head, name)
        if ms is None:
            malformed.append(MAX_PRIORITY - i)
        else:
            oldest_ms = max(oldest_ms, now_ms - ms)
    lag_s = 0.0
    if isinstance(first_due, list) and first_due:
        try:
            lag_s = max(0.0, (now_ms - float(first_due[0][1])) / 1000)
        except (TypeError, ValueError, IndexError):
            lag_s = 0.0
    if not isinstance(counts, list):
        counts = [None] * (len(OUTCOMES) + len(BUNDLE_COUNTS))
    reserved = reserved_jobs(reserved, *counts[len(OUTCOMES):])
    stats = QueueStats(
        ready=sum(lens) + grouped,
        delayed=delayed,
        reserved=reserved,
        dead=dead,
        paused=bool(paused),
        oldest_age_s=oldest_ms / 1000,
        ready_by_priority={MAX_PRIORITY - i: c for i, c in enumerate(lens) if c},
        malformed_heads=tuple(malformed),
        grouped=grouped,
        groups_active=active,
        groups_waiting=max(0, waiting),
        held_s=held_s,
    )
    outcomes = {o: _int(c) for o, c in zip(OUTCOMES, counts[:len(OUTCOMES)], strict=True)}
    return Snapshot(name, replace(stats, expired=outcomes["expired"]), lag_s, outcomes)


def read(client: redis.Redis, queues: Sequence[QueueKeys]) -> list[Snapshot]:
    """Every queue's state in one pipelined round trip (TIME from the server).

    Connection errors propagate; an error reply of one command (a key of the wrong type)
    only zeroes that value."""
    pipe = client.pipeline(transaction=False)
    # TIME by name: a cluster pipeline refuses pipe.time()
    pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
    for k in queues:
        _queue_commands(pipe, k)
    res = pipe.execute(raise_on_error=False)
    if isinstance(res[0], Exception):
        raise res[0]
    sec, usec = res[0]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    out = []
    for j, k in enumerate(queues):
        start = 1 + j * _PER_QUEUE
        out.append(_parse(k.queue, res[start : start + _PER_QUEUE], now_ms))
    with_groups = [(j, k) for j, k in enumerate(queues) if out[j].stats.grouped > 0]
    if with_groups:
        pipe = client.pipeline(transaction=False)
        for _, k in with_groups:
            c = calls.gready_stats(k, GROUPS_READ)
            SyncScript(c.script, client)(c.keys, c.args, client=pipe)
        for (j, _), reply in zip(with_groups, run_pipeline(pipe, client), strict=True):
            out[j] = _add_grouped(out[j], reply, now_ms)
    return out


def _add_grouped(snap: Snapshot, reply: Any, now_ms: int) -> Snapshot:
    """``snap`` with the grouped ready jobs (a ``gready_stats.lua`` reply) in its ready
    counts by priority and its oldest ready age. Past ``GROUPS_READ`` groups the jobs of
    the groups not visited are shared out in the proportions of those visited."""
    if not isinstance(reply, list) or len(reply) < 13:
        return snap  # an error reply (a key written by hand): the plain counts stand
    st = snap.stats
    counts = [_int(x) for x in reply[:10]]
    counted = sum(counts)
    left = st.grouped - counted
    if _int(reply[11]) and counted and left > 0:
        shares = [c * left // counted for c in counts]
        shares[counts.index(max(counts))] += left - sum(shares)
        counts = [c + x for c, x in zip(counts, shares, strict=True)]
    by_prio = dict(st.ready_by_priority)
    for i, c in enumerate(counts):
        if c:
            by_prio[MAX_PRIORITY - i] = by_prio.get(MAX_PRIORITY - i, 0) + c
    oldest_s = st.oldest_age_s
    first = reply[12]
    if isinstance(first, bytes) and b"~" in first:
        ms = ready_ms(first[first.index(b"~") + 15 :], snap.name)
        if ms is not None:
            oldest_s = max(oldest_s, (now_ms - ms) / 1000)
    return replace(snap, stats=replace(
        st, ready_by_priority=dict(sorted(by_prio.items(), reverse=True)),
        oldest_age_s=oldest_s))


def merge(name: str, parts: Sequence[Snapshot]) -> Snapshot:
    """The snapshots of a sharded queue's shards as one queue named ``name``: counts
    summed, ages and lags the largest, paused when any shard is."""
    if len(parts) == 1 and parts[0].name == name:
        return parts[0]
    ps = [p.stats for p in parts]
    by_prio: dict[int, int] = {}
    for x in ps:
        for prio, c in x.ready_by_priority.items():
            by_prio[prio] = by_prio.get(prio, 0) + c
    st = QueueStats(
        ready=sum(x.ready for x in ps), delayed=sum(x.delayed for x in ps),
        reserved=sum(x.reserved for x in ps), dead=sum(x.dead for x in ps),
        paused=any(x.paused for x in ps),
        oldest_age_s=max(x.oldest_age_s for x in ps),
        ready_by_priority=dict(sorted(by_prio.items(), reverse=True)),
        malformed_heads=tuple(sorted({m for x in ps for m in x.malformed_heads},
                                     reverse=True)),
        grouped=sum(x.grouped for x in ps), groups_active=sum(x.groups_active for x in ps),
        groups_waiting=sum(x.groups_waiting for x in ps),
        held_s=max(x.held_s for x in ps), expired=sum(x.expired for x in ps))
    outcomes = {o: sum(p.outcomes.get(o, 0) for p in parts) for o in OUTCOMES}
    return Snapshot(name, st, max(p.delayed_lag_s for p in parts), outcomes, len(parts))


def shard_names(client: redis.Redis, namespace: str, names: Sequence[str],
                configured: shards.ShardTable | None = None) -> dict[str, list[str]]:
    """Each queue's sub-queues that may hold jobs: max(configured, registered) shards
    (one ``ZMSCORE`` of the shard registry; a name that is a shard stays alone)."""
    table = configured or shards.ShardTable()
    bases = [n for n in names if not shards.split_shard(n)[1]]
    known = shards.known(client, namespace, bases) if bases else {}
    return {n: shards.expand([n], table, known) for n in names}


def read_queues(client: redis.Redis, namespace: str, names: Sequence[str],
                configured: shards.ShardTable | None = None) -> list[Snapshot]:
    """``read`` of the named queues, a sharded queue read shard by shard in the same
    pipeline and reported as one queue (``merge``)."""
    subs = shard_names(client, namespace, names, configured)
    flat = [QueueKeys(namespace, s) for n in names for s in subs[n]]
    snaps = read(client, flat)
    out, i = [], 0
    for n in names:
        m = len(subs[n])
        out.append(merge(n, snaps[i : i + m]))
        i += m
    return out


def registered_queues(client: redis.Redis, namespace: str) -> tuple[list[str], list[bytes]]:
    """The names in the namespace's registry of queues, sorted, and apart from them the
    members that are not usable queue names (not UTF-8, braces, colons, white space),
    as raw bytes: one bad member never hides the others."""
    good: list[str] = []
    bad: list[bytes] = []
    for member in client.smembers(queues_key(namespace)):
        raw = member if isinstance(member, bytes) else str(member).encode()
        try:
            name = shards.base_of(raw.decode("utf-8"))  # a shard is shown as its queue
        except ValueError:  # UnicodeDecodeError is one
            bad.append(raw)
            continue
        good.append(name)
    return sorted(set(good)), sorted(bad)
