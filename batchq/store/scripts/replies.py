"""Typed readers of the Lua scripts' positional replies: one definition of each layout.

``pop.lua`` replies with a head of eleven items, then the popped jobs. ``PopReply`` names
them; ``decode_pop_reply`` reads a raw reply into one by slicing (the jobs stay the raw
entries, one list, no object per job), so the worker's fetch and the tests read the same
layout and a change to it is made here, next to the call builder (``calls.pop``).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class PopReply(NamedTuple):
    """``pop.lua``'s reply, in the order the script returns it."""

    now: int
    """The server's clock (ms)."""
    next_due: int
    """The earliest delayed job, rate token or hold end (ms), or -1."""
    next_deadline: int
    """The earliest lease deadline (ms), or -1."""
    promoted: int
    """Delayed jobs moved to ready."""
    reaped: int
    """Expired leases taken back to ready."""
    expired: int
    """Expired leases dead-lettered (``lease_expired``)."""
    malformed: int
    """Entries dead-lettered as undecodable (``decode_error``)."""
    crashed: int
    """Jobs dead-lettered after crashing their workers (``crashed_worker``)."""
    recovered: list[int]
    """1-based positions, among ``jobs``, of the jobs to run alone."""
    due_campaigns: list[bytes]
    """Ids of campaigns that became due (the worker tries to complete them)."""
    bundle: list[Any]
    """``[name, n]`` when the last ``n`` jobs are one bundle's (leased together, their
    attempt not counted yet: ``_lib.lua`` "Bundles"), else ``[]``."""
    jobs: list[bytes]
    """The popped entries, oldest first."""


HEAD = len(PopReply._fields) - 1
"""Items before the jobs in a raw ``pop.lua`` reply."""

_new = tuple.__new__


def decode_pop_reply(raw: list[Any]) -> PopReply:
    """Read a raw ``pop.lua`` reply (a list as the client returns it)."""
    if len(raw) < HEAD:
        raise ValueError(f"a pop.lua reply has at least {HEAD} items, not {len(raw)}")
    head = raw[:HEAD]
    head.append(raw[HEAD:])
    return _new(PopReply, head)
