"""One typed call builder per Lua script: the only place that knows each script's KEYS.

``KEY_ORDER`` lists, per script, the name of every KEYS slot. The names are the Lua
locals each script binds at its top (``local reserved = KEYS[2]``), and the key a slot
takes is the ``QueueKeys`` attribute of that name (``ready9`` .. ``ready0``: the ready
lists by priority; ``ready``: the ready list of the call's priority).
``tests/scripts/test_script_headers.py`` reads the scripts and checks they agree.

A builder returns a :class:`Call` (script name, keys, args); ``SyncScripts.call`` /
``AsyncScripts.call`` run it, alone or queued on a pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import MAX_PRIORITY, QueueKeys

_READY_ALL = tuple(f"ready{p}" for p in range(MAX_PRIORITY, -1, -1))

KEY_ORDER: dict[str, tuple[str, ...]] = {
    "enqueue": ("ready", "wake", "inflight", "stats"),
    "schedule": ("delayed", "wake", "inflight", "ready", "stats"),
    "pop": ("delayed", "reserved", "inflight", "dead", "dead_jobs", "wake", "paused",
            *_READY_ALL, "stats", "recovered", "started"),
    "ack": ("reserved", "inflight", "stats", "recovered", "started"),
    "nack": ("reserved", "inflight", "delayed", "dead", "dead_jobs", "wake", "stats",
             "recovered", "started"),
    "release": ("reserved", "inflight", "wake", *_READY_ALL, "started"),
    "extend": ("reserved",),
    "start": ("reserved", "started"),
    "redrive": ("dead", "dead_jobs", "wake", *_READY_ALL, "stats"),
}
"""Script name -> the name of each KEYS slot, in order."""


@dataclass(frozen=True, slots=True)
class Call:
    """One script call: which script, its KEYS and its ARGV."""

    script: str
    keys: list[str]
    args: list[Any]


def _keys(script: str, k: QueueKeys, priority: int | None = None) -> list[str]:
    out = []
    for name in KEY_ORDER[script]:
        if name == "ready":
            assert priority is not None, f"{script} needs the jobs' priority"
            out.append(k.ready_for(priority))
        elif name.startswith("ready"):
            out.append(k.ready_for(int(name[5:])))
        else:
            out.append(getattr(k, name))
    return out


def enqueue(k: QueueKeys, priority: int, entries: Sequence[bytes], *, check: bool) -> Call:
    """Append ``entries`` (all of ``priority``) to their ready list; ``check``: the retry
    of a call whose reply was lost (write nothing if the first job is there)."""
    return Call("enqueue", _keys("enqueue", k, priority), ["1" if check else "0", *entries])


def schedule(k: QueueKeys, priority: int, mode: str, when_ms: int,
             entries: Sequence[bytes], *, check: bool) -> Call:
    """Add ``entries`` to the delayed set: ``mode`` ``"rel"`` (``when_ms`` from the
    server's now) or ``"abs"`` (Unix ms)."""
    return Call("schedule", _keys("schedule", k, priority),
                ["1" if check else "0", mode, when_ms, *entries])


def pop(k: QueueKeys, want: int, lease_ms: int, chunk: int) -> Call:
    """Promote, reap, then pop up to ``want`` jobs leased for ``lease_ms``."""
    return Call("pop", _keys("pop", k), [want, lease_ms, chunk])


def ack(k: QueueKeys, leases: Sequence[bytes | str]) -> Call:
    return Call("ack", _keys("ack", k), list(leases))


def nack(k: QueueKeys, retries: Sequence[tuple[bytes | str, int]] = (),
         dead: Sequence[tuple[bytes | str, bytes]] = ()) -> Call:
    """``retries``: (lease, delay ms); ``dead``: (lease, dead record)."""
    args: list[Any] = [len(retries)]
    for lease, delay_ms in retries:
        args += [lease, delay_ms]
    for lease, record in dead:
        args += [lease, record]
    return Call("nack", _keys("nack", k), args)


def release(k: QueueKeys, leases: Sequence[bytes | str]) -> Call:
    return Call("release", _keys("release", k), list(leases))


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
