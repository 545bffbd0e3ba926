"""Job sequence numbers: the producer side of the ready-job bitmaps (keys.py T:seq).

An id made by enqueue ends with ``-<hex seq>``, a number the producer reserved from its
queue in blocks (``reserve.lua``: one round trip per block, 256 first, doubling up to
65,536 per process and queue). enqueue.lua sets the bits of a chunk's numbers in a few
commands; pop.lua clears a popped job's bit; ``cancel``/``job_status`` read it. A number
the producer could not reserve (Redis unreachable) is ``None``: that job's id has no
sequence number, it runs normally but ``cancel`` cannot reach it while it is ready.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis

from ..store import codec
from ..store.keys import WAIT_GEN_BITS, QueueKeys
from ..store.scripts import calls

if TYPE_CHECKING:
    from ..store.clients import Clients

__all__ = ["SeqSource", "areserve", "entry_runs", "runs_text"]

FIRST_BLOCK = 256
MAX_BLOCK = 65_536
assert MAX_BLOCK <= 1 << WAIT_GEN_BITS

_lock = threading.Lock()
# (url, seq key) -> [next, end, next block size]
_blocks: dict[tuple[str, str], list[int]] = {}
# (event loop, url, seq key) -> the reservation under way: the coroutines of one loop
# wait for it in turn instead of each reserving (their jobs keep their order)
_pending: dict[tuple[int, str, str], asyncio.Future[None]] = {}


def _reset() -> None:
    # a forked child must never hand out its parent's numbers
    global _lock
    _lock = threading.Lock()
    _blocks.clear()
    _pending.clear()


os.register_at_fork(after_in_child=_reset)


def _take(key: tuple[str, str], n: int) -> tuple[int, int] | None:
    """Up to ``n`` numbers from the cached block: (first, count), or None if empty."""
    with _lock:
        b = _blocks.get(key)
        if b is None or b[0] >= b[1]:
            return None
        count = min(n, b[1] - b[0])
        first = b[0]
        b[0] += count
        return first, count


def _size(key: tuple[str, str], n: int) -> int:
    with _lock:
        b = _blocks.setdefault(key, [0, 0, FIRST_BLOCK])
        size = max(b[2], min(n, MAX_BLOCK))
        b[2] = min(MAX_BLOCK, b[2] * 2)
        return size


def _store(key: tuple[str, str], first: int, size: int) -> None:
    with _lock:
        b = _blocks.setdefault(key, [0, 0, FIRST_BLOCK])
        b[0], b[1] = first, first + size


class SeqSource:
    """Hands out numbers one by one, reserving blocks synchronously as needed."""

    def __init__(self, c: Clients, k: QueueKeys, runs: list[tuple[int, int]] | None = None,
                 want: int = 1) -> None:
        # want: how many numbers to take from the process's block at a time (the ones a
        # call leaves unused are lost: 0 bits)
        self._c, self._k, self._want = c, k, want
        self._key = (c.settings.url, k.seq)
        self._runs: Iterator[tuple[int, int]] = iter(runs or ())
        self._sync = runs is None
        self._next = self._end = 0

    def __call__(self) -> int | None:
        if self._next >= self._end and not self._refill():
            return None
        s = self._next
        self._next += 1
        return s

    def _refill(self) -> bool:
        run = next(self._runs, None)
        for _ in range(3 if run is None and self._sync else 0):
            run = _take(self._key, self._want)
            if run is not None:
                break
            size = _size(self._key, self._want)
            try:
                first = int(self._c.sync_scripts.call(calls.reserve(self._k, size)))
            except (redis.RedisError, OSError):
                return False
            _store(self._key, first, size)
        if run is None:
            return False
        self._next, self._end = run[0], run[0] + run[1]
        return True


async def areserve(c: Clients, k: QueueKeys, n: int) -> list[tuple[int, int]]:
    """Runs (first, count) covering up to ``n`` numbers (fewer if Redis failed)."""
    key = (c.settings.url, k.seq)
    loop = asyncio.get_running_loop()
    under_way = (id(loop), *key)
    out: list[tuple[int, int]] = []
    while n > 0:
        run = _take(key, n)
        if run is None:
            other = _pending.get(under_way)
            if other is not None:
                await asyncio.shield(other)
                continue
            mine: asyncio.Future[None] = loop.create_future()
            _pending[under_way] = mine
            try:
                size = _size(key, n)
                first = int(await c.async_scripts().call(calls.reserve(k, size)))
                _store(key, first, size)
            except (redis.RedisError, OSError):
                return out
            finally:
                del _pending[under_way]
                mine.set_result(None)
            continue
        out.append(run)
        n -= run[1]
    return out


def runs_text(seqs: list[int]) -> str:
    """``"first:count,..."`` of a set of numbers (sorted, consecutive ones grouped)."""
    parts: list[str] = []
    first = prev = -2
    for s in sorted(seqs):
        if s != prev + 1:
            if first >= 0:
                parts.append(f"{first}:{prev - first + 1}")
            first = s
        prev = s
    if first >= 0:
        parts.append(f"{first}:{prev - first + 1}")
    return ",".join(parts)


def _entry_seq(head: bytes, entry: bytes) -> int | None:
    start = len(head)
    return codec.seq_of(entry[start:entry.index(b":", start)].decode())


def run_first(head: bytes, first: bytes, last: bytes, n: int) -> int | None:
    """The number of ``first`` when the ``n`` entries from ``first`` to ``last`` have
    consecutive numbers (read from those two only), else None."""
    a, b = _entry_seq(head, first), _entry_seq(head, last)
    return a if a is not None and b is not None and b - a + 1 == n else None


def entry_runs(head: bytes, entries: list[bytes]) -> str:
    """The sequence numbers of ``entries`` (all starting with ``head``) as runs for
    enqueue.lua; one run when they are consecutive (the common case, read from the
    first and last entry only)."""
    first, last = _entry_seq(head, entries[0]), _entry_seq(head, entries[-1])
    if first is not None and last is not None and last - first + 1 == len(entries):
        return f"{first}:{len(entries)}"
    return runs_text([s for e in entries if (s := _entry_seq(head, e)) is not None])
