"""The stream of one ``enqueue_many``, without I/O: items encoded into chunks (one script
call each) and windows (one pipelined round trip each), and the exact count of what Redis
confirmed. With a sharded queue (``batchq/store/shards.py``) the chunks go to the shards in
turn, each chunk to one shard, so the batch fast path stays one script call per chunk.
With ``group_fn`` a chunk holds the rows of any groups, in input order, and its plan the
runs of their groups (``Plan.groups``): one enqueue_group.lua or enqueue_tracked.lua
call writes them all, as one call per group would. ``producer.py`` holds the I/O shells
(sync, asyncio) around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..flow import limits
from ..tasks.errors import CampaignClosed, EnqueueError, QuotaExceeded
from . import tracked
from .options import Call
from .plan import Plan
from .tracked import MAX_KEY_BYTES

CHUNK = 1000
"""Jobs per script call (Lua's unpack limit is about 8000 arguments)."""

WINDOW = 8
"""Script calls per pipeline round trip in ``enqueue_many``."""


_SCALARS = frozenset((int, str, bytes, float))


def split(item: Any) -> tuple[Any, Mapping[str, Any]]:
    t = type(item)
    if t is tuple or t is list:
        return item, {}
    if t in _SCALARS:  # the common one-argument rows, without the Mapping ABC check
        return (item,), {}
    if isinstance(item, tuple | list):
        return item, {}
    if isinstance(item, Call):
        return item.args, item.kwargs
    if isinstance(item, Mapping):
        return (), item
    return (item,), {}


KeyFn = Callable[[Any], "str | None"]

GroupFn = Callable[[Any], "str | None"]

Chunk = tuple[Plan, list[str], list[bytes]]
"""One script call: its plan (the shard it goes to), its ids and its entries."""


Seqs = Callable[[], "int | None"] | None


def _chunks(plans: list[tuple[Plan, Seqs]], items: Iterable[Any], key_fn: KeyFn | None = None
            ) -> Iterator[Chunk]:
    """Chunks of encoded jobs; with several plans (the shards of a queue) each chunk
    goes to the next one in turn."""
    ids: list[str] = []
    entries: list[bytes] = []
    now_ms = int(time.time() * 1000)
    turn = 0
    p, seqs = plans[0]
    entry, check_key, keyed = p.entry, tracked.check_key, p.tracked
    for n, item in enumerate(items, 1):
        args, kwargs = split(item)
        try:
            jid, e = entry(args, kwargs, now_ms, seqs)
            if keyed:
                key = key_fn(item) if key_fn is not None else None
                if key is None:
                    entries += (e, b"")
                elif type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
                    entries += (e, key.encode())  # check_key's fast path, inline
                else:
                    entries += (e, check_key(key).encode())
            else:
                entries.append(e)
        except (TypeError, ValueError) as exc:
            raise _at_item(exc, n - 1) from None
        ids.append(jid)
        if len(ids) == CHUNK:
            yield p, ids, entries
            ids, entries = [], []
            if n % (CHUNK * WINDOW) == 0:
                now_ms = int(time.time() * 1000)
            if len(plans) > 1:
                turn = (turn + 1) % len(plans)
                p, seqs = plans[turn]
                entry = p.entry
    if entries:
        yield p, ids, entries


def _grouped_chunks(p: Plan, seqs: Seqs, items: Iterable[Any], key_fn: KeyFn | None,
                    group_fn: GroupFn) -> Iterator[Chunk]:
    """Chunks of ``enqueue_many(group_fn=...)``: up to ``CHUNK`` rows in input order, of
    any groups; each row's id carries its own group (``group_fn(item)``; None: the
    plan's group, the options', or none), and the chunk's plan the runs of its rows'
    groups (``Plan.groups``), so one script call writes them all."""
    ids: list[str] = []
    entries: list[bytes] = []
    runs: list[str] = []
    run_g, run_n = "", 0
    now_ms = int(time.time() * 1000)
    body, finish, keyed, check_key = p.body, p.finish, p.tracked, tracked.check_key
    marks: dict[Any, tuple[str, str]] = {}  # group_fn's value -> (hex, the ids' end)
    for n, item in enumerate(items, 1):
        args, kwargs = split(item)
        try:
            g = group_fn(item)
            try:
                h, mark = marks[g]
            except (KeyError, TypeError):  # new, or unhashable (refused below)
                h, mark = _mark_of(p, marks, g, item)
            jid, e = finish(body(args, kwargs, now_ms), seqs, mark)
            if keyed:
                key = key_fn(item) if key_fn is not None else None
                if key is None:
                    entries += (e, b"")
                elif type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
                    entries += (e, key.encode())
                else:
                    entries += (e, check_key(key).encode())
            else:
                entries.append(e)
        except (TypeError, ValueError) as exc:
            raise _at_item(exc, n - 1) from None
        ids.append(jid)
        if h == run_g:
            run_n += 1
        else:
            if run_n:
                runs.append(f"{run_g}:{run_n}")
            run_g, run_n = h, 1
        if len(ids) == CHUNK:
            runs.append(f"{run_g}:{run_n}")
            yield replace(p, group="", groups=",".join(runs)), ids, entries
            ids, entries, runs, run_g, run_n = [], [], [], "", 0
            if n % (CHUNK * WINDOW) == 0:
                now_ms = int(time.time() * 1000)
    if entries:
        runs.append(f"{run_g}:{run_n}")
        yield replace(p, group="", groups=",".join(runs)), ids, entries


def _mark_of(p: Plan, marks: dict[Any, tuple[str, str]], g: Any, item: Any
             ) -> tuple[str, str]:
    """The group hex and the id's end of a row whose ``group_fn`` gave ``g`` (None: the
    plan's group), kept in ``marks``; a value that is not a str is refused."""
    tail = tracked.TRACKED_SUFFIX if p.tracked else ""
    if g is None:
        h = p.group
    elif type(g) is str:
        h = limits.group_hex(limits.check_group(g))
    else:
        shown = repr(item)
        raise TypeError(f"group_fn must return a str or None, got {type(g).__name__} "
                        f"{g!r} for {shown[:80]}{'...' if len(shown) > 80 else ''}")
    marks[g] = h, ("~" + h if h else "") + tail
    return marks[g]


def _at_item(exc: Exception, index: int) -> Exception:
    """``exc`` again, its message naming the item (the class kept: PayloadTooLarge)."""
    try:
        return type(exc)(f"item {index}: {exc}")
    except TypeError:  # an exception class with another constructor
        return (TypeError if isinstance(exc, TypeError) else ValueError)(
            f"item {index}: {exc}")


Window = list[Chunk]


class Stream:
    """The bookkeeping of one ``enqueue_many`` (no I/O): windows of chunks, and what
    Redis confirmed so far, for an exact ``EnqueueError``. ``plans``: the plan of each
    shard written to, in turn, with its sequence numbers (one plan: no sharding)."""

    def __init__(self, plans: Sequence[tuple[Plan, Callable[[], int | None]]],
                 key_fn: KeyFn | None = None, group_fn: GroupFn | None = None) -> None:
        self.p = plans[0][0]
        self.plans: list[tuple[Plan, Seqs]] = [
            (p, seqs if p.due is None else None) for p, seqs in plans]
        self.key_fn = key_fn
        self.group_fn = group_fn
        """Each row's group (``enqueue_many(group_fn=...)``; one plan: no sharding)."""
        self.written: list[str] = []
        self.stored = 0
        """Jobs of ``written`` this call stored (the others: holders of held keys)."""

    def windows(self, items: Iterable[Any]) -> Iterator[Window]:
        """Windows of chunks. An item that cannot be encoded (``TypeError``,
        ``PayloadTooLarge``) stops the stream; the error then carries ``written`` and
        ``ids`` of the jobs already in Redis, like ``EnqueueError``."""
        window: Window = []
        chunks = (_chunks(self.plans, items, self.key_fn) if self.group_fn is None else
                  _grouped_chunks(*self.plans[0], items, self.key_fn, self.group_fn))
        while True:
            try:
                chunk = next(chunks, None)
            except (TypeError, ValueError) as exc:
                exc.written, exc.ids = len(self.written), self.written  # type: ignore[union-attr]
                raise
            if chunk is None:
                break
            window.append(chunk)
            if len(window) == WINDOW:
                yield window
                window = []
        if window:
            yield window

    def steps(self, items: Iterable[Any]) -> Iterator[tuple[Chunk | None, Window]]:
        """What to send, window by window: ``(single, rest)``. ``single`` (or None) goes
        through the reconnect-safe single call: the first chunk (it also registers the
        queue) and a lone last chunk. ``rest`` goes in one pipeline."""
        for window in self.windows(items):
            single = window.pop(0) if not self.written or len(window) == 1 else None
            yield single, window

    def tracked(self, ids: list[str], got: list[str]) -> None:
        """Record a tracked write: ``got`` is ``ids`` with the rows whose key was held
        replaced by the holder's id (``tracked.ids_of``)."""
        self.written.extend(got)
        self.stored += sum(a == b for a, b in zip(ids, got, strict=True))

    def failed(self, exc: EnqueueError) -> EnqueueError:
        exc.written, exc.ids = len(self.written), self.written
        return exc

    def lost(self, window: Window, exc: Exception) -> EnqueueError:
        unknown = sum(len(ids) for _, ids, _ in window)
        return EnqueueError(
            f"connection lost during enqueue_many of {self.p.task}: {len(self.written)} jobs "
            f"written, {unknown} unknown: {exc}",
            written=len(self.written), ids=self.written, unknown=unknown)

    def record(self, window: Window, results: list[Any],
               closed: Mapping[str, CampaignClosed] | None = None) -> None:
        """Count what a pipelined window wrote; an error result raises ``EnqueueError``.
        ``closed``: queues whose campaign was closed before the window was sent
        (``tracked.join``): a refusal there raises that ``CampaignClosed`` itself."""
        first_error: BaseException | None = None
        quota: tuple[Plan, Any] | None = None
        for (cp, ids, _), res in zip(window, results, strict=True):
            if isinstance(res, BaseException):
                first_error = first_error or res
            elif refused_group(cp, res) is not None:
                # this chunk was not written (a smaller later one may be)
                quota = quota or (cp, res)
            elif self.p.tracked:
                shut = (closed or {}).get(cp.keys.queue)
                try:
                    self.tracked(ids, tracked.ids_of(self.p.campaign, ids, res, shut))
                except (CampaignClosed, tracked.NotJoined) as exc:
                    if first_error is None and isinstance(exc, CampaignClosed) \
                            and not self.stored:
                        raise  # nothing of the call was written (a run again, refused)
                    first_error = first_error or exc
            else:
                self.written.extend(ids)
        if first_error is None and quota is not None:
            quota_checked(*quota, self.written)
        if first_error is not None:
            raise EnqueueError(
                f"enqueue_many of {self.p.task} failed after writing {len(self.written)} "
                f"jobs: {first_error}", written=len(self.written), ids=self.written,
            ) from first_error



def refused_group(p: Plan, res: Any) -> str | None:
    """The group (its name) over whose quota a write's reply says it was refused (-2; a
    chunk of several groups: ``[-2, hex]``), else None."""
    if p.groups:
        if type(res) is list and len(res) == 2 and res[0] == -2:
            return limits.group_name(res[1])
    elif p.group and res == -2:
        return limits.group_name(p.group)
    return None


def quota_checked(p: Plan, res: Any, written: list[str] | None = None) -> Any:
    """``res`` of a write; ``QuotaExceeded`` when enqueue_group.lua or
    enqueue_tracked.lua refused it for a group's max_pending."""
    group = refused_group(p, res)
    if group is not None:
        raise quota_error(p, group, written)
    return res


def quota_error(p: Plan, group: str, written: list[str] | None = None) -> QuotaExceeded:
    """``QuotaExceeded`` of a write refused for ``group``; ``written``: the ids of the
    ``enqueue_many`` written before it."""
    done = written or []
    return QuotaExceeded(
        p.keys.queue, group,
        f"cannot enqueue {p.task}: group {group!r} of queue {p.keys.queue!r} would go "
        f"past its max_pending (Queue.limit); nothing of this write was stored"
        + (f" ({len(done)} jobs of this enqueue_many were, before it)" if done else ""),
        written=len(done), ids=done)
