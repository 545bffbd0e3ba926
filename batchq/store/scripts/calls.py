"""One typed call builder per Lua script: the only place that knows each script's KEYS.

``KEY_ORDER`` lists, per script, the name of every KEYS slot. The names are the Lua
locals each script binds at its top (``local reserved = KEYS[2]``), and the key a slot
takes is the ``QueueKeys`` attribute of that name (``ready9`` .. ``ready0``: the ready
lists by priority; ``ready``: the ready list of the call's priority).
``tests/layout/test_script_headers.py`` reads the scripts and checks they agree.

A builder returns a :class:`Call` (script name, keys, args); ``SyncScripts.call`` /
``AsyncScripts.call`` run it, alone or queued on a pipeline.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import MAX_PRIORITY, BreakerKeys, CampaignKeys, LoadKeys, LockKeys, QueueKeys

_WAIT = ("seq", "waiting0", "waiting1", "waiting2", "waiting3")  # the ready-job bitmaps
_READY_ALL = tuple(f"ready{p}" for p in range(MAX_PRIORITY, -1, -1))
_TRACKED = ("campaigns", "jobmeta", "dedup", "dedup_exp")
_GROUPS = ("gready", "groups", "gwait", "gstate")  # flow control (batchq/flow/limits.py)
_EVENTS = ("evconf", "events")  # job events (batchq/ops/events.py), always last

KEY_ORDER: dict[str, tuple[str, ...]] = {
    "enqueue": ("ready", "wake", "inflight", "stats", "pending", *_WAIT, "reserved",
                "paused", "idle", "limits", "gwait", *_EVENTS),
    "schedule": ("delayed", "wake", "inflight", "ready", "stats", "pending"),
    "pop": ("delayed", "reserved", "inflight", "dead", "dead_jobs", "wake", "paused",
            *_READY_ALL, "stats", "recovered", "started", *_TRACKED, "pending", "cancel",
            "done", *_WAIT, *_GROUPS, "limits", "idle", "bundles", *_EVENTS, "expires"),
    "ack": ("reserved", "inflight", "stats", "recovered", "started", *_TRACKED, "gwait",
            "gstate", "wake", "bundles", *_EVENTS),
    "ack_result": ("reserved", "inflight", "stats", "recovered", "started", "done",
                   "waiters", *_TRACKED, "gwait", "gstate", "wake", "bundles", *_EVENTS),
    "nack": ("reserved", "inflight", "delayed", "dead", "dead_jobs", "wake", "stats",
             "recovered", "started", *_TRACKED, "pending", "done", "gwait", "gstate",
             "bundles", *_EVENTS),
    "release": ("reserved", "inflight", "wake", *_READY_ALL, "started", "pending",
                *_GROUPS, "stats", "bundles", *_EVENTS),
    "enqueue_group": (*_GROUPS, "limits", "delayed", "wake", "inflight", "stats",
                      "pending", *_WAIT, "ready"),
    "enqueue_tracked": ("ready", "delayed", "wake", "inflight", "stats", *_TRACKED,
                        "pending", *_WAIT, *_GROUPS, "limits", "replace", "expires"),
    "campaign_queue": ("campaigns", "reserved", "jobmeta", "inflight", "bundles", *_EVENTS),
    "campaign_open": ("record",),
    "campaign_join": ("record", "queues"),
    "campaign_close": ("record", "queues"),
    "campaign_finish": ("record", "queues"),
    "extend": ("reserved", "bundles"),
    "start": ("reserved", "started"),
    "redrive": ("dead", "dead_jobs", "wake", *_READY_ALL, "stats", "pending", *_GROUPS),
    "trim_dead": ("dead", "dead_jobs"),
    "periodic_tick": ("periodic", "ready", "wake", "stats", "pending"),
    "cancel": ("pending", "cancel", "cancelled", "delayed", "stats", "done", *_WAIT,
               *_TRACKED, "gstate", *_EVENTS),
    "status": ("pending", "inflight", "dead_jobs", "cancelled", "cancel", *_WAIT),
    "reserve": _WAIT,
    "lock_acquire": ("token", "fence"),
    "lock_release": ("token",),
    "lock_extend": ("token",),
    "load_open": ("meta",),
    "load_merge": ("sum", "timeline", "meta"),
    "hold": ("groups", "gwait", "gstate", "wake", *_EVENTS),
    "gready_stats": ("gready",),
    "breaker_enter": ("state", "probes"),
    "breaker_failure": ("state", "failures", "probes"),
    "breaker_success": ("state", "failures", "probes"),
    "breaker_set": ("state", "failures", "probes"),
    "breaker_state": ("state", "failures", "probes"),
    "reroute": ("reserved", "inflight", "delayed", "pending", "wake", "started", "stats",
                "bundles", *_READY_ALL, *_GROUPS, "jobmeta", *_EVENTS),
}
"""Script name -> the name of each KEYS slot, in order."""


@dataclass(frozen=True, slots=True)
class Call:
    """One script call: which script, its KEYS and its ARGV."""

    script: str
    keys: list[str]
    args: list[Any]


_KEYS_CACHE: dict[tuple[str, object, int | None], tuple[str, ...]] = {}
KEYS_CACHE_SIZE = 4096
"""Key lists kept (script, keys, priority): a worker's pop names 40 keys, rebuilt on
every call it cost 13 µs; looked up, about one."""


def _keys(script: str, k: QueueKeys | LockKeys | LoadKeys | CampaignKeys | BreakerKeys,
          priority: int | None = None) -> list[str]:
    """The KEYS of one call of ``script`` (a new list each time: a Call owns its keys)."""
    cached = _KEYS_CACHE.get((script, k, priority))
    if cached is None:
        if len(_KEYS_CACHE) >= KEYS_CACHE_SIZE:
            _KEYS_CACHE.clear()  # many queues or locks: start over rather than grow
        cached = _KEYS_CACHE[(script, k, priority)] = tuple(_build_keys(script, k, priority))
    return list(cached)


def _build_keys(script: str, k: QueueKeys | LockKeys | LoadKeys | CampaignKeys | BreakerKeys,
                priority: int | None) -> list[str]:
    out = []
    for name in KEY_ORDER[script]:
        if name.startswith("ready"):
            assert isinstance(k, QueueKeys), f"{script} takes a queue's keys"
            if name == "ready":
                assert priority is not None, f"{script} needs the jobs' priority"
                out.append(k.ready_for(priority))
            else:
                out.append(k.ready_for(int(name[5:])))
        else:
            out.append(getattr(k, name))
    return out


def enqueue(k: QueueKeys, priority: int, entries: Sequence[bytes], *, check: bool,
            runs: str = "") -> Call:
    """Append ``entries`` (all of ``priority``) to their ready list; ``check``: the retry
    of a call whose reply was lost (write nothing if the first job is there); ``runs``:
    the jobs' sequence numbers as ``"first:count,..."`` (``producer.seq_runs``)."""
    return Call("enqueue", _keys("enqueue", k, priority),
                ["1" if check else "0", runs, *entries])


def enqueue_group(k: QueueKeys, group_hex: str, priority: int, mode: str, when_ms: int,
                  entries: Sequence[bytes], *, check: bool, runs: str = "") -> Call:
    """Write jobs of one group (``mode`` ``"ready"``, ``"rel"`` or ``"abs"`` as in
    ``enqueue_tracked``) within its quota; replies -2 when it would exceed it."""
    return Call("enqueue_group", _keys("enqueue_group", k, priority),
                ["1" if check else "0", mode, when_ms, group_hex, priority, runs, *entries])


def enqueue_groups(k: QueueKeys, groups: str, priority: int, mode: str, when_ms: int,
                   entries: Sequence[bytes], *, check: bool, runs: str = "") -> Call:
    """``enqueue_group`` for the rows of several groups in one call (``enqueue_many``'s
    ``group_fn``): ``groups`` gives the rows' groups as runs in row order,
    ``"<hex>:<count>,..."`` (``group_runs``; an empty hex: rows without a group, pushed
    to the ready list). Each group's quota is checked first; replies ``[-2, hex]``
    naming the first group it would exceed (nothing written), else the jobs written."""
    return Call("enqueue_group", _keys("enqueue_group", k, priority),
                ["1" if check else "0", mode, when_ms, groups, priority, runs, *entries])


def group_runs(groups: Sequence[str]) -> str:
    """The runs ``"<hex>:<count>,..."`` of the rows' groups (hex, "" for none), in row
    order, as ``enqueue_groups`` and ``enqueue_tracked(groups=...)`` take them."""
    return ",".join(f"{g}:{sum(1 for _ in run)}" for g, run in itertools.groupby(groups))


def reserve(k: QueueKeys, n: int) -> Call:
    """Reserve ``n`` job sequence numbers of the queue; replies the first."""
    return Call("reserve", _keys("reserve", k), [n])


def schedule(k: QueueKeys, priority: int, mode: str, when_ms: int,
             entries: Sequence[bytes], *, check: bool) -> Call:
    """Add ``entries`` to the delayed set: ``mode`` ``"rel"`` (``when_ms`` from the
    server's now) or ``"abs"`` (Unix ms)."""
    return Call("schedule", _keys("schedule", k, priority),
                ["1" if check else "0", mode, when_ms, *entries])


def enqueue_tracked(k: QueueKeys, priority: int, mode: str, when_ms: int, campaign: str,
                    key_ttl_ms: int, trim: int, pairs: Sequence[bytes | str], *,
                    check: bool, on_conflict: str = "keep", scan: int = 1000,
                    expiry: str = "", groups: str = "", first_seq: int | None = None
                    ) -> Call:
    """Write tracked jobs: ``pairs`` is (entry, dedup key or "") flattened; ``mode``
    ``"ready"``, ``"rel"`` or ``"abs"`` (then ``when_ms`` is the delay or due time);
    ``campaign`` "" for none; ``trim``: lapsed dedup keys dropped at most;
    ``on_conflict``: ``"keep"``, ``"replace"`` or ``"debounce"``; ``scan``: ready-list
    entries searched at most for a job to replace; ``expiry``: the jobs' deadline
    (``options.expiry_spec``), "" for none; ``groups``: the rows' groups as runs
    (``group_runs``) for a call of several groups, "" when all rows are of the group in
    their ids, or of none; ``first_seq``: the first row's sequence number when the
    rows' numbers run on one by one (``seqs.run_first``), so the script reads no id for
    the waiting bits."""
    return Call("enqueue_tracked", _keys("enqueue_tracked", k, priority),
                ["1" if check else "0", mode, when_ms, campaign, key_ttl_ms, trim,
                 on_conflict, scan, expiry, groups,
                 "" if first_seq is None else first_seq, *pairs])


def campaign_queue(k: QueueKeys, campaign: str, mode: str, generation: str = "",
                   scan: int = 100_000, expires: str = "") -> Call:
    """Read or change one campaign's flag on one queue (``campaign_queue.lua``);
    ``scan``: leases looked at, at most, to count the campaign's running jobs;
    ``expires``: ``"open"``: the campaign's deadline (Unix ms), "" for none."""
    return Call("campaign_queue", _keys("campaign_queue", k),
                [campaign, mode, generation, scan, expires])


def campaign_open(k: CampaignKeys, on_complete: str, queue: str, priority: int,
                  max_attempts: int, ttl_ms: int, expires_ms: int | None = None) -> Call:
    return Call("campaign_open", _keys("campaign_open", k),
                [on_complete, queue, priority, max_attempts, ttl_ms,
                 "" if expires_ms is None else expires_ms])


def campaign_join(k: CampaignKeys, queue: str) -> Call:
    return Call("campaign_join", _keys("campaign_join", k), [queue])


def campaign_close(k: CampaignKeys, mode: str) -> Call:
    """``mode`` ``"seal"`` or ``"cancel"``."""
    return Call("campaign_close", _keys("campaign_close", k), [mode])


def campaign_finish(k: CampaignKeys, total: int, succeeded: int, dead: int,
                    cancelled: int, expired: int = 0) -> Call:
    return Call("campaign_finish", _keys("campaign_finish", k),
                [total, succeeded, dead, cancelled, expired])


DROP_MAX = 1000
"""Cancelled jobs one pop may drop beyond the jobs it asked for (a few milliseconds of
the server's time); a pop that spent it and came back short leaves a wake token, so a
worker pops again at once."""


def pop(k: QueueKeys, want: int, lease_ms: int, chunk: int, idle: str = "",
        idle_ms: int = 0, bundle: bool = False, drop: int = DROP_MAX) -> Call:
    """Promote, reap, then pop up to ``want`` jobs leased for ``lease_ms``. ``idle``
    (a worker's name): when nothing comes back, register it for hand-off for
    ``idle_ms`` (``enqueue.lua``); when jobs do, drop its registration. ``bundle``:
    lease the plain jobs of the pop together (``_lib.lua`` "Bundles"; the reply's 11th
    item names the bundle and how many of the jobs, the last ones, it holds). ``drop``:
    at most this many cancelled jobs are dropped in the call, never counted against
    ``want`` or any limit."""
    return Call("pop", _keys("pop", k), [want, lease_ms, chunk,
                                         idle_member(lease_ms, idle) if idle else "",
                                         idle_ms, 1 if bundle else 0, drop])


def idle_member(lease_ms: int, worker: str) -> str:
    """A worker's hand-off registration in ``QueueKeys.idle``: the lease a job handed to
    it gets, and its name."""
    return f"{lease_ms}|{worker}"


def ack(k: QueueKeys, leases: Sequence[bytes | str]) -> Call:
    """Ack ``leases``; the reply's stale positions count them in this order."""
    return Call("ack", _keys("ack", k), _grouped(leases))


_LEASE_BUNDLE = operator.itemgetter(slice(None, -2))
"""A bundle job's lease without its position: the bundle (``_lib.lua`` "Bundles")."""
_BUNDLE_NAME = re.compile(rb":b\d+\.\d+")


def _grouped(leases: Sequence[bytes | str]) -> list[bytes | str]:
    """``leases``, each run of one bundle's jobs as one argument
    ``<bundle>#<position><position>...`` (``ack.lua``): in a drain, the script's cost per
    argument was most of an ack's. C-level per lease (grouped by a slice, the bundle's
    name taken out of the joined leases by ``bytes.replace``: a name starts ``:b``, which
    no run of positions below 14,946 and the next name's start can spell); anything not
    shaped like a bundle job's lease goes as it is, one argument a lease."""
    args: list[bytes | str] = []
    for name, run in itertools.groupby(leases, _LEASE_BUNDLE):
        if type(name) is bytes and name[:1] == b":" and _BUNDLE_NAME.fullmatch(name):
            args.append(name + b"#" + b"".join(run).replace(name, b""))  # type: ignore[arg-type]
        else:
            args.extend(run)
    return args


def ack_result(k: QueueKeys, items: Sequence[tuple[bytes | str, int, bytes]],
               ids: Sequence[str] | None = None) -> Call:
    """Ack jobs and keep their results: ``items`` are (lease, TTL ms, msgpack result);
    each job's result key follows the fixed KEYS. ``ids``: the jobs' ids, in order
    (needed for a bundle's jobs, whose leases do not name them; by default each id is
    read from its lease)."""
    keys = _keys("ack_result", k)
    args: list[Any] = []
    for i, (lease, ttl_ms, value) in enumerate(items):
        if ids is not None:
            keys.append(k.result(ids[i]))
        else:
            text = lease.decode() if isinstance(lease, bytes) else lease
            keys.append(k.result(text.rsplit(":", 1)[0]))
        args += [lease, ttl_ms, value]
    return Call("ack_result", keys, args)


def cancel(k: QueueKeys, job_id: str, keep_ms: int, chunk: int) -> Call:
    """Cancel ``job_id`` if it waits; cancelled records older than ``keep_ms`` go (at
    most ``chunk`` per call)."""
    return Call("cancel", _keys("cancel", k), [job_id, keep_ms, chunk])


def status(k: QueueKeys, job_id: str, *, payload: bool) -> Call:
    """Where ``job_id`` is; ``payload``: also its result value or dead record."""
    return Call("status", [*_keys("status", k), k.result(job_id)],
                [job_id, "1" if payload else "0"])


def nack(k: QueueKeys,
         retries: Sequence[tuple[bytes | str, int] | tuple[bytes | str, int, str]] = (),
         dead: Sequence[tuple[bytes | str, bytes]] = ()) -> Call:
    """``retries``: (lease, delay ms) or (lease, delay ms, error); ``dead``: (lease,
    dead record)."""
    args: list[Any] = [len(retries)]
    for lease, delay_ms, *error in retries:
        # the error rides after the delay, for the "retried" event (nack.lua)
        args += [lease, f"{delay_ms}\n{error[0][:500]}" if error else delay_ms]
    for lease, record in dead:
        args += [lease, record]
    return Call("nack", _keys("nack", k), args)


def release(k: QueueKeys, leases: Sequence[bytes | str], hold_ms: int = 0) -> Call:
    """Give jobs back; ``hold_ms``: their groups (or the queue) start nothing for that
    long (``RateLimited``)."""
    return Call("release", _keys("release", k), [hold_ms, *leases])


def hold(k: QueueKeys, member: str, hold_ms: int, why: str = "operator") -> Call:
    """Hold ``member`` (a group's hex name, or ``"~q"``: the whole queue) for
    ``hold_ms`` (keeping a longer hold), or release it (``hold_ms`` 0)."""
    return Call("hold", _keys("hold", k), [member, hold_ms, why])


def gready_stats(k: QueueKeys, max_groups: int) -> Call:
    """Read only: the grouped ready jobs by priority and the one first in line, visiting
    at most ``max_groups`` groups."""
    return Call("gready_stats", _keys("gready_stats", k), [max_groups])


def extend(k: QueueKeys, lease_ms: int, leases: Sequence[bytes | str]) -> Call:
    return Call("extend", _keys("extend", k), [lease_ms, *leases])


def start(k: QueueKeys, leases: Sequence[bytes | str]) -> Call:
    """Mark recovered jobs' handlers as started (see pop.lua's crash marks)."""
    return Call("start", _keys("start", k), list(leases))


def redrive(k: QueueKeys, pairs: Sequence[tuple[str | bytes, bytes]]) -> Call:
    """``pairs``: (dead id, entry with its attempt reset)."""
    args: list[Any] = []
    for jid, entry in pairs:
        args += [jid, entry]
    return Call("redrive", _keys("redrive", k), args)


def trim_dead(k: QueueKeys, max_age_ms: int, max_count: int, chunk: int) -> Call:
    """Delete up to ``chunk`` dead jobs older than ``max_age_ms`` or beyond the newest
    ``max_count``; replies ``{removed, more}``."""
    return Call("trim_dead", _keys("trim_dead", k), [max_age_ms, max_count, chunk])


def periodic_tick(k: QueueKeys, priority: int, task: str, tick_ms: int, next_ms: int,
                  grace_ms: int, catch_up: bool, entry: bytes, schedule: str,
                  lock_name: str) -> Call:
    """Enqueue ``entry`` for the tick ``tick_ms`` of ``task`` unless that tick (or a
    later one) was enqueued already (see ``periodic_tick.lua``)."""
    return Call("periodic_tick", _keys("periodic_tick", k, priority),
                [task, tick_ms, next_ms, grace_ms, "1" if catch_up else "0", entry, schedule,
                 lock_name])


def lock_acquire(k: LockKeys, token: str, ttl_ms: int) -> Call:
    return Call("lock_acquire", _keys("lock_acquire", k), [token, ttl_ms])


def lock_release(k: LockKeys, token: str) -> Call:
    return Call("lock_release", _keys("lock_release", k), [token])


def lock_extend(k: LockKeys, token: str, ttl_ms: int) -> Call:
    return Call("lock_extend", _keys("lock_extend", k), [token, ttl_ms])


def load_open(k: LoadKeys, mode: str, ttl_ms: int,
              fields: Sequence[tuple[str, str]] = ()) -> Call:
    """Create (``mode`` ``"new"``, with ``fields``) or join (``"join"``) a load run."""
    args: list[Any] = [mode, ttl_ms]
    for f, v in fields:
        args += [f, v]
    return Call("load_open", _keys("load_open", k), args)


def load_merge(k: LoadKeys, ttl_ms: int, ops: Sequence[tuple[str, int, str, Any]]) -> Call:
    """Merge ``ops`` ``(op, key 1..3, field, value)`` into a load run (see the script)."""
    args: list[Any] = [ttl_ms, len(ops)]
    for op in ops:
        args += op
    return Call("load_merge", _keys("load_merge", k), args)


# --- circuit breakers (batchq/flow/breaker.py) ----------------------------------------------


def breaker_enter(k: BreakerKeys, half_open_jobs: int, probe_ms: int, token: str) -> Call:
    return Call("breaker_enter", _keys("breaker_enter", k), [half_open_jobs, probe_ms, token])


def breaker_failure(k: BreakerKeys, failures: int, within_ms: int, open_ms: int,
                    token: str) -> Call:
    return Call("breaker_failure", _keys("breaker_failure", k),
                [failures, within_ms, open_ms, token])


def breaker_success(k: BreakerKeys, half_open_jobs: int, token: str) -> Call:
    return Call("breaker_success", _keys("breaker_success", k), [half_open_jobs, token])


def breaker_state(k: BreakerKeys, within_ms: int) -> Call:
    """Read only: the state, ms left open, failures in the window, probes, successes,
    trips."""
    return Call("breaker_state", _keys("breaker_state", k), [within_ms])


def breaker_set(k: BreakerKeys, mode: str, open_ms: int = 0) -> Call:
    """``mode`` "open" (for ``open_ms``) or "close"."""
    return Call("breaker_set", _keys("breaker_set", k), [mode, open_ms])


def reroute(k: QueueKeys, hold_ms: int, items: Sequence[tuple[bytes, str, bytes]]) -> Call:
    """Take leased jobs back: (lease, task, fallback body, or b"" to hold the job for
    ``hold_ms``) each (reroute.lua)."""
    args: list[Any] = [hold_ms]
    for lease, task, body in items:
        args += [lease, task, body]
    return Call("reroute", _keys("reroute", k), args)
