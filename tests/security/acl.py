"""The least-privileged ACL user of batchq: the commands it sends (and those its Lua
scripts run: ACLs apply inside scripts too), on the keys of one namespace."""

from __future__ import annotations

BATCHQ_COMMANDS = (
    # connection and health check (HELLO and AUTH need no permission)
    "+ping", "+info", "+client|setinfo",
    # scripts: EVALSHA, and SCRIPT LOAD after a NOSCRIPT
    "+evalsha", "+script|load",
    # commands the scripts run (ACLs apply inside scripts too)
    "+time", "+exists", "+lpush", "+rpush", "+lpop", "+llen", "+lpos",
    "+lmpop",  # pop.lua on Redis 7.0+ (without it, pops take the ten lists one by one)
    "+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore", "+zmscore",
    "+zcount",  # trim_dead.lua: the worker applies the dead-letter retention
    "+hset", "+hsetnx", "+hget", "+hdel", "+hexists", "+hincrby", "+hlen",
    # the lock scripts (app.lock, and the periodic scheduler's leader lock)
    "+get", "+pttl", "+pexpire", "+incr",
    # commands sent directly (worker, producer, Queue, CLI, metrics)
    "+blpop", "+lindex", "+sadd", "+smembers", "+zcard", "+zremrangebyscore",
    "+hmget", "+hgetall", "+set", "+del", "+expire", "+multi", "+exec",
    # campaigns: listing them (app.campaigns, the CLI, the metrics); flow control: one
    # bounded page of a queue's limits and the groups that wait longest (info, metrics)
    "+zrevrange", "+hscan",
    # the hand-off: enqueue.lua takes idle workers' registrations, pop.lua removes a
    # reaped handed-off job from the wake list
    "+zpopmin", "+lrem",
    # results, status, cancel: job sequence numbers (reserve.lua), the ready-job bitmaps,
    # the per-job channels (scripts publish, result() subscribes)
    "+incrby", "+setbit", "+getbit", "+bitfield", "+setrange", "+publish", "+subscribe",
    "+unsubscribe",
    # flow control: the ready jobs of each group, ordered in one sorted set (pop.lua,
    # the grouped counts of stats)
    "+zrangebylex", "+zremrangebylex", "+zrevrangebylex", "+zlexcount",
    # the audit log of operator actions (a capped stream)
    "+xadd", "+xtrim", "+xrevrange",
    # job events (batchq.events): the scripts write a per-queue stream, readers page it,
    # follow it and look at its trim
    "+xrange", "+xread", "+xinfo|stream",
    # replace / debounce: a waiting job's entry swapped in its ready list (LPOS, LSET)
    "+lset",
    # App(min_replicas=...): the replicas confirm a write (WAITAOF with replica_fsync)
    "+wait", "+waitaof",
)


def acl_setuser_args(user: str, password: str, namespace: str) -> list[str]:
    """``ACL SETUSER`` arguments of the least-privileged batchq user of ``namespace``."""
    return [user, "reset", "on", f">{password}", f"~{namespace}:*", "resetchannels",
            f"&{namespace}:*", "-@all", *BATCHQ_COMMANDS]
