"""Every Redis key name batchq uses, in one place.

All keys of one queue share the hash tag ``{<namespace>:<queue>}`` so that every Lua
script (which touches only one queue) is legal on Redis Cluster. Keys that span queues
(the queue registry, the worker registry) live outside any tag and are only touched by
plain commands, never from a script together with queue keys.

Layout of one queue ``Q`` in namespace ``NS`` (``T`` = ``NS:{NS:Q}``)::

    T:ready:9 .. T:ready:0   lists of encoded jobs, one per priority level (9 runs first)
    T:delayed                zset  encoded job -> due time (ms, server clock)
    T:reserved               zset  "<id>:<attempt>" -> lease deadline (ms, server clock)
    T:inflight               hash  id -> encoded job as reserved (attempt already counted);
                                   a bundle's name -> its entries, name~ -> its mask
    T:bundles                zset  bundle ":b<n>.<ms>" -> lease deadline: the plain jobs
                                   of one pop leased together (_lib.lua "Bundles")
    T:dead                   zset  id -> time it was dead-lettered (ms)
    T:dead:jobs              hash  id -> msgpack dead record (reason, error, raw job bytes)
    T:wake                   list  at most one token, and jobs handed off (leased by
                                   enqueue.lua); idle workers BLPOP it
    T:idle                   zset  "<lease ms>|<worker>" -> when the registration
                                   lapses (ms): workers blocked with nothing to do,
                                   each takes one job handed off by enqueue.lua
    T:paused                 string present while the queue is paused
    T:stats                  hash  counters kept by the scripts (enqueued, succeeded,
                                   retried, dead; malformed numbers bad entries)
    T:recovered              hash  id -> "<recoveries>:<crashes>" of jobs taken back from
                                   a worker whose lease expired (pop.lua); empty normally
    T:started                hash  id -> lease of a recovered job whose handler started
                                   (start.lua): if that worker dies, this job is charged
    T:seq                    string next free job sequence number; producers reserve
                                   blocks of them (reserve.lua); an id made by enqueue
                                   ends with "-<hex seq>"
    T:waiting0..3            bitmap bit (seq mod 2^23) of generation (seq >> 23) mod 4:
                                   set while a job enqueued ready has not been popped
                                   (enqueue sets a chunk's bits in <= 3 commands, pop
                                   clears them); a reservation entering a new generation
                                   deletes the slot of the generation 4 back
    T:pending                hash  id -> "r" or the entry: jobs waiting that are not in a
                                   bitmap: delayed (entry), and ready again after a
                                   promotion, release, reaping or redrive ("r")
    T:waiters                string flag (TTL) set by processes waiting for results;
                                   ack_result.lua publishes only while it exists
    T:cancel                 hash  id -> "1": cancelled ready jobs still in their list;
                                   pop.lua drops them (and the field) when it pops them
    T:expires                zset  "x<id>" / "k<id>" -> the deadline (ms) of a tracked job
                                   with an expiry ("k": kept in dead once expired);
                                   "~<id>" -> when to look again whether an expired
                                   job's tombstone in T:cancel can go (pop.lua sweeps)
    T:cancelled              zset  id -> when it was cancelled (ms): the "cancelled"
                                   status, kept ``CANCEL_KEEP_MS`` (cancel.lua trims)
    T:result:<id>            string the msgpack return value of a task with
                                   ``result_ttl_s``, expiring after it (ack_result.lua)
    T:progress:<id>          string a running job's last progress (JSON: value, message,
                                   times), expiring ``PROGRESS_KEEP_S`` after its last write
    T:done:<id>              pub/sub channel (not a key): the scripts publish "s"
                                   (succeeded), "d" (dead) or "c" (cancelled) on it
    T:campaigns              hash  per campaign C with jobs on this queue: "C:f" its flag
                                   here (open, sealed, cancelled, done) and its counters
                                   "C:t" total, "C:p" pending, "C:s" succeeded, "C:d" dead,
                                   "C:c" cancelled; "~cancelled" campaigns cancelled here
                                   (campaign.py)
    T:jobmeta                hash  id -> "<campaign>\n<key ttl ms>\n<dedup key>" of a
                                   tracked job (id ends in "_m") until it is settled; its
                                   presence is the job's campaign membership (counted once)
    T:dedup                  hash  dedup key -> id of the job that holds it
    T:dedup:exp              zset  dedup key -> when it lapses (ms): set when its job is
                                   settled; a pending key has no entry and never lapses
    T:gready                 zset  ready jobs of groups (flow control), all scored 0 and
                                   read by lex range: "<g>~<9-prio><13 hex pos><entry>",
                                   g the hex of the group name (``limits.group_hex``)
    T:groups                 zset  g -> virtual time: groups with ready jobs that may run
                                   now; pop.lua serves the lowest first (round-robin,
                                   weighted by the group's weight)
    T:gwait                  zset  g -> when to look again (ms): groups with ready jobs
                                   that wait for a rate token or a hold to end, or (score
                                   ``BLOCKED``) for a concurrency slot; "~q": the hold of
                                   the whole queue (``RateLimited`` without a group)
    T:gstate                 hash  flow-control counters: "<g>:n" jobs of the group not
                                   finished (the quota), "<g>:run" leased now, "<g>:t" /
                                   "<g>:ts" its token bucket, "~q:t" / "~q:ts" the queue's,
                                   "pos" the position counter of gready, "vt" the last
                                   virtual time served, "pturn" the plain lists' turn
                                   counter
    T:evconf                 hash  job events config: "len" (MAXLEN ~), "age" (ms), present
                                   while events are on; "n" / "ms" the last event's
                                   number and time (batchq/ops/events.py, _lib.lua)
    T:events                 stream the job events, ids "<ms>-<n>", written by the
                                   scripts that change a job's state while on
    T:limits                 hash  "~q" (the queue), "*" (every group without its own) or
                                   g -> "rate,burst,concurrency,max_pending,weight" (empty
                                   fields: none); written by ``Queue.limit``

A campaign's own record lives in its own slot (``campaign_keys``), so a campaign may span
queues on several Cluster nodes; see ``batchq/produce/campaign.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIORITIES = 10
"""Priority levels 0..9; a higher number runs first."""

MAX_PRIORITY = PRIORITIES - 1

WAIT_GEN_BITS = 23
"""A generation of job sequence numbers is 2^23 (one 1 MiB bitmap); four are live."""


MAX_SHARDS = 64
"""Sub-queues a sharded queue may have (``shards=``): shard 0 is the queue itself."""

SHARD_SEP = ":s"
"""Shard k > 0 of queue Q is the sub-queue ``Q:s<k>``: a user's queue name cannot hold a
colon, so no shard name collides with a queue name (``batchq/store/shards.py``)."""


def check_queue_name(queue: object) -> str:
    """A user's queue name: non-empty, no braces, colons or white space."""
    if not isinstance(queue, str) or not queue or \
            any(c in queue for c in "{}: \t\r\n"):
        raise ValueError(
            f"invalid queue name {queue!r}: use a non-empty name without "
            "braces, colons or white space"
        )
    return queue


def split_shard(name: str) -> tuple[str, int]:
    """``("emails", 3)`` for the sub-queue ``"emails:s3"``, ``("emails", 0)`` for the
    queue itself; ``ValueError`` for anything else."""
    base, sep, k = name.partition(SHARD_SEP) if isinstance(name, str) else (name, "", "")
    if sep:
        if not (k.isdigit() and k.isascii() and k[0] != "0" and int(k) < MAX_SHARDS):
            raise ValueError(f"invalid queue name {name!r}: a shard is '<queue>:s<1.."
                             f"{MAX_SHARDS - 1}>'")
        return check_queue_name(base), int(k)
    return check_queue_name(name), 0


def shard_name(base: str, k: int) -> str:
    """The name of shard ``k`` of queue ``base`` (shard 0: the queue itself)."""
    return base if k == 0 else f"{base}{SHARD_SEP}{k}"


def shards_key(namespace: str) -> str:
    """Zset queue name -> the highest shard count any process wrote with (set at a
    process's first write to a shard, or a worker's start; only raised, ``ZADD GT``):
    how workers find shards beyond the count they are configured with, so a lowered
    count still drains the old shards."""
    return f"{namespace}:shards"


def queues_key(namespace: str) -> str:
    """Set of every queue name that was ever enqueued to or served in ``namespace``."""
    return f"{namespace}:queues"


def workers_key(namespace: str) -> str:
    """Zset of live worker ids, scored by their last heartbeat (ms)."""
    return f"{namespace}:workers"


def worker_info_key(namespace: str, worker_id: str) -> str:
    """Hash with one worker's details; expires if the worker stops heart-beating."""
    return f"{namespace}:worker:{worker_id}"


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key names of one queue. Build once per queue and reuse."""

    namespace: str
    queue: str
    prefix: str = field(init=False)
    ready: tuple[str, ...] = field(init=False)
    """Ready lists ordered from the highest priority (9) to the lowest (0)."""
    delayed: str = field(init=False)
    reserved: str = field(init=False)
    bundles: str = field(init=False)
    """Bundles (``_lib.lua``): one lease for the plain jobs of a pop, apart from
    ``reserved`` so that a worker from before bundles never reaps one."""
    inflight: str = field(init=False)
    dead: str = field(init=False)
    dead_jobs: str = field(init=False)
    wake: str = field(init=False)
    paused: str = field(init=False)
    stats: str = field(init=False)
    recovered: str = field(init=False)
    started: str = field(init=False)
    campaigns: str = field(init=False)
    jobmeta: str = field(init=False)
    dedup: str = field(init=False)
    dedup_exp: str = field(init=False)
    replace: str = field(init=False)
    """Hash: dedup key -> the entry a replace / debounce enqueue wrote for its job, by
    which ``enqueue_tracked.lua`` finds it in its ready list (LPOS)."""
    gready: str = field(init=False)
    groups: str = field(init=False)
    gwait: str = field(init=False)
    gstate: str = field(init=False)
    limits: str = field(init=False)
    evconf: str = field(init=False)
    """Job events' config hash (``batchq/ops/events.py``); not in ``all()``, like the limits."""
    events: str = field(init=False)
    """Job events' stream (``batchq/ops/events.py``); not in ``all()``."""
    idle: str = field(init=False)
    """Hand-off: workers blocked on ``wake`` with nothing to do (``enqueue.lua``)."""
    """Flow control (``batchq/flow/limits.py``): the limits live here, so ``Queue.clear``
    (which deletes ``all()``) keeps them, like the periodic schedules."""
    periodic: str = field(init=False)
    pending: str = field(init=False)
    cancel: str = field(init=False)
    expires: str = field(init=False)
    cancelled: str = field(init=False)
    seq: str = field(init=False)
    """Counter handing out blocks of job sequence numbers (``reserve.lua``). Not in
    ``all()``: a reset would let two producers hand out the same numbers."""
    waiting0: str = field(init=False)
    waiting1: str = field(init=False)
    waiting2: str = field(init=False)
    waiting3: str = field(init=False)
    """Bitmaps, bit set = the job with that sequence number waits in a ready list since
    its enqueue (see ``WAIT_GEN_BITS``)."""
    waiters: str = field(init=False)
    """Flag (with a TTL) kept alive by result waiters; ack_result.lua publishes only
    while it exists."""
    done: str = field(init=False)
    """Prefix of the per-job pub/sub channels ``<done>:<id>`` (not a key; declared in
    the scripts' KEYS so the channel is named by the caller, never built from parts)."""
    """Periodic schedules' last ticks (``periodic_tick.lua``); not in ``all()``, so
    ``Queue.clear`` does not reset them."""

    def __post_init__(self) -> None:
        split_shard(self.queue)  # validates: a plain name, or "<name>:s<k>" (a shard)
        p = f"{self.namespace}:{{{self.namespace}:{self.queue}}}"
        object.__setattr__(self, "prefix", p)
        object.__setattr__(
            self, "ready", tuple(f"{p}:ready:{i}" for i in range(MAX_PRIORITY, -1, -1))
        )
        for name in ("delayed", "reserved", "bundles", "inflight", "dead", "wake", "paused",
                     "stats", "recovered", "started", "periodic", "pending", "cancel", "cancelled",
                     "expires", "done", "seq", "waiting0", "waiting1", "waiting2", "waiting3",
                     "waiters", "campaigns", "jobmeta", "dedup", "gready", "groups",
                     "gwait", "gstate", "limits", "idle", "replace", "evconf", "events"):
            object.__setattr__(self, name, f"{p}:{name}")
        object.__setattr__(self, "dead_jobs", f"{p}:dead:jobs")
        object.__setattr__(self, "dedup_exp", f"{p}:dedup:exp")

    def ready_for(self, priority: int) -> str:
        """The ready list of one priority level."""
        return self.ready[MAX_PRIORITY - priority]

    def all(self) -> tuple[str, ...]:
        """Every key of the queue (for deletion in tests and tooling)."""
        return (
            *self.ready,
            self.delayed,
            self.reserved,
            self.bundles,
            self.inflight,
            self.dead,
            self.dead_jobs,
            self.wake,
            self.paused,
            self.stats,
            self.recovered,
            self.started,
            self.pending,
            self.cancel,
            self.expires,
            self.cancelled,
            self.waiting0,
            self.waiting1,
            self.waiting2,
            self.waiting3,
            self.campaigns,
            self.jobmeta,
            self.dedup,
            self.dedup_exp,
            self.replace,
            self.gready,
            self.groups,
            self.gwait,
            self.gstate,
            self.idle,
        )

    def result(self, job_id: str) -> str:
        """The result key of one job (a string with a TTL)."""
        return f"{self.prefix}:result:{job_id}"

    def progress(self, job_id: str) -> str:
        """The progress record of one job (a string with a TTL, ``worker/context.py``)."""
        return f"{self.prefix}:progress:{job_id}"

    def done_channel(self, job_id: str) -> str:
        """The pub/sub channel a job's end is announced on."""
        return f"{self.done}:{job_id}"


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The two keys of one named lock (``batchq.tasks.lock``); both share the lock's own hash
    tag, so each lock script touches one slot."""

    token: str
    """The holder's random token; expires with the lease."""
    fence: str
    """The fencing counter: INCR on every acquisition, never expires."""


def lock_keys(namespace: str, name: str) -> LockKeys:
    """Key names of lock ``name``; raises ``ValueError`` for a name a key cannot carry."""
    if not isinstance(name, str) or not name or any(c in name for c in "{} \t\r\n"):
        raise ValueError(f"invalid lock name {name!r}: use a non-empty name without "
                         "braces or white space")
    prefix = f"{namespace}:{{{namespace}:lock:{name}}}"
    return LockKeys(f"{prefix}:token", f"{prefix}:fence")


@dataclass(frozen=True, slots=True)
class LoadKeys:
    """The keys of one load-test run (``batchq bench load``), under the run's own hash
    tag ``{NS:load:RUN}``; all expire (``batchq.load.merge.RUN_TTL_S``)."""

    meta: str
    """Hash: the run's description (task, profile, start) and status (``load_open.lua``)."""
    sum: str
    """Hash: totals merged by every producer and worker (``load_merge.lua``)."""
    timeline: str
    """Hash: per-second figures, ``<unix second>:<figure>`` (``load_merge.lua``)."""


def load_keys(namespace: str, run_id: str) -> LoadKeys:
    """Key names of load-test run ``run_id``; ``ValueError`` for an id a key cannot carry."""
    if not isinstance(run_id, str) or not 0 < len(run_id) <= 64 \
            or not all(c.isalnum() or c in "-_." for c in run_id):
        raise ValueError(f"invalid load run id {run_id!r}: use 1..64 letters, digits, "
                         "'-', '_' or '.'")
    prefix = f"{namespace}:{{{namespace}:load:{run_id}}}"
    return LoadKeys(f"{prefix}:meta", f"{prefix}:sum", f"{prefix}:timeline")


@dataclass(frozen=True, slots=True)
class BreakerKeys:
    """The keys of one circuit breaker (``batchq.flow.breaker``), in its own hash tag
    ``{NS:breaker:NAME}``: one slot, any node."""

    state: str
    """Hash: state (closed | open | half_open), until (ms), ok, trips, opened (ms)."""
    failures: str
    """Zset: failures within the window, by time (ms)."""
    probes: str
    """Zset: half-open probes in flight, by when each lapses (ms)."""


def breaker_keys(namespace: str, name: str) -> BreakerKeys:
    """Key names of breaker ``name`` (checked by ``breaker.check_name``)."""
    prefix = f"{namespace}:{{{namespace}:breaker:{name}}}"
    return BreakerKeys(prefix, f"{prefix}:failures", f"{prefix}:probes")


def campaigns_key(namespace: str) -> str:
    """Zset of campaign ids by creation time (ms): ``app.campaigns()`` and the CLI."""
    return f"{namespace}:campaigns"


def campaigns_open_key(namespace: str) -> str:
    """Zset of sealed campaigns not yet completed, scored by when a worker should look at
    them again (ms): the safety net of ``campaign.check_open``."""
    return f"{namespace}:campaigns:open"


@dataclass(frozen=True, slots=True)
class CampaignKeys:
    """The keys of one campaign, in the campaign's own hash tag (one slot, any node)."""

    record: str
    """Hash: created_ms, sealed, cancelled, closed, finished_ms, notified, on_complete
    (task name, queue, priority, max attempts), and the final counts once finished."""
    queues: str
    """Set of the queue names the campaign's jobs were written to."""


def campaign_keys(namespace: str, campaign_id: str) -> CampaignKeys:
    """Key names of campaign ``campaign_id`` (validated by ``campaign.check_id``)."""
    prefix = f"{namespace}:{{{namespace}:campaign:{campaign_id}}}"
    return CampaignKeys(prefix, f"{prefix}:queues")
