"""Tracked jobs: campaign members and jobs with a dedup key, as the producer writes them.

A tracked job's id ends in ``TRACKED_SUFFIX``; ``enqueue_tracked.lua`` writes it with a
jobmeta entry (its campaign, dedup key and key ttl) and the settling scripts (ack, nack,
pop) look that entry up only for ids with the suffix, so plain jobs cost them one string
compare. This module checks campaign ids and dedup keys, joins a campaign to a queue
before the first write there (``campaign_join.lua`` on the campaign's slot, then the
queue's flag, ``campaign_queue.lua``), and reads ``enqueue_tracked.lua``'s replies.

A write to a closed campaign (sealed, cancelled, finished) raises ``CampaignClosed`` and
writes nothing, with one exception that makes a producer safe to run again after its
campaign finished: when every row has a dedup key and every key is still held, the
call would write nothing anyway, so it returns the holders' ids instead (the script
decides, atomically: ``join(keyed=True)``).

A keyed write's ``on_conflict`` (``options.ON_CONFLICT``) says what a held key does:
``keep`` (the call writes nothing), or, while the holder still waits, ``replace`` (it
takes the row's arguments: same id, place and due time) or ``debounce`` (also due
``delay_s`` from now); ``enqueue_tracked.lua`` decides it in the same call, so a pop
racing it takes either the old job or the new one, never both or neither.
It sits below ``producer`` (which calls it) and above ``clients``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from typing import Any

from ..store import _twins, codec
from ..store.clients import Clients
from ..store.keys import campaign_keys
from ..store.scripts import calls
from ..tasks.errors import CampaignClosed, CampaignNotFound

TRACKED_SUFFIX = codec.TRACKED_MARK
"""Ends the id of every tracked job (base-62 ids never contain ``_``)."""

MAX_KEY_BYTES = 512
"""The longest dedup key (UTF-8 bytes)."""

DEFAULT_KEY_TTL_S = 24 * 3600.0
"""How long a dedup key stays held after its job finished, unless set per task or call."""

TRIM_CHUNK = 100
"""Lapsed dedup keys dropped per ``enqueue_tracked.lua`` call, at most."""

REPLACE_SCAN = 10_000
"""Ready-list entries ``enqueue_tracked.lua`` searches (from the tail, where recent jobs
are) for a job to replace, at most: a job deeper in its list is kept, not replaced."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}")


def check_campaign_id(value: object) -> str:
    """A campaign id: 1..128 letters, digits or ``_ . @ + -`` (no ``:``, braces or
    spaces: it names Redis hash fields and a hash tag), else a clear error."""
    if not isinstance(value, str):
        raise TypeError(f"campaign id must be a str, got {type(value).__name__} {value!r}")
    if not _ID.fullmatch(value):
        raise ValueError(f"invalid campaign id {value!r}: use 1..128 letters, digits or "
                         "'_.@+-', starting with a letter or digit")
    return value


def check_key(value: object) -> str:
    """A dedup key: a non-empty str of at most 512 UTF-8 bytes, else a clear error."""
    if not isinstance(value, str):
        raise TypeError(f"dedup key must be a str, got {type(value).__name__} {value!r}")
    if value.isascii() and 0 < len(value) <= MAX_KEY_BYTES:  # the common case, no copy
        return value
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"dedup key {value[:40]!r} is not valid text: {exc}") from None
    if not 0 < n <= MAX_KEY_BYTES:
        raise ValueError(f"dedup key must be 1..{MAX_KEY_BYTES} bytes, got {n} bytes: "
                         f"{value[:40]!r}{'...' if len(value) > 40 else ''}")
    return value


# (campaign, queue) pairs this process joined, per Clients: a join is two round trips,
# paid once per campaign and queue; a stale entry (the queue was cleared) is caught by
# enqueue_tracked.lua's "not open here" reply, which forgets it and joins again
_joined: weakref.WeakKeyDictionary[Clients, set[tuple[str, str]]] = \
    weakref.WeakKeyDictionary()


def forget(c: Clients, campaign: str, queue: str) -> None:
    _joined.get(c, set()).discard((campaign, queue))


def _joined_reply(campaign: str, reply: Any) -> tuple[str, str]:
    """The campaign's generation and its deadline (Unix ms, "" for none)."""
    status, generation, expires = int(reply[0]), reply[1], reply[2]
    if status == -1:
        raise CampaignNotFound(campaign)
    if status == 0:
        raise CampaignClosed(campaign, f"campaign {campaign!r} is sealed or cancelled: "
                             "no jobs can be added to it")
    return (generation.decode() if isinstance(generation, bytes) else str(generation),
            expires.decode() if isinstance(expires, bytes) else str(expires))


def _opened(campaign: str, queue: str, reply: Any) -> None:
    if reply[0] != b"open":
        raise CampaignClosed(campaign, f"campaign {campaign!r} is closed on queue "
                             f"{queue!r} ({reply[0].decode() or 'gone'}): no jobs can be "
                             "added to it")


def keyed(entries: Sequence[bytes]) -> bool:
    """Every row of a tracked write (``[entry, key, entry, key, ...]``) has a dedup key."""
    return all(entries[1::2])


def join(c: Clients, campaign: str, queue: str, *, keyed: bool = False
         ) -> CampaignClosed | None:
    """Make ``queue`` part of ``campaign`` (once per process); raises
    ``CampaignClosed`` / ``CampaignNotFound``.

    ``keyed``: every row of the write has a dedup key. A closed campaign is then no
    error yet: the ``CampaignClosed`` is returned, and the write goes to
    ``enqueue_tracked.lua``, which writes nothing and answers the holders' ids when
    every key is held (a producer run again after the campaign finished) and refuses
    otherwise; pass the error to ``ids_of`` to raise it then."""
    return _twins.run(joining(c, campaign, queue, keyed=keyed))


async def ajoin(c: Clients, campaign: str, queue: str, *, keyed: bool = False
                ) -> CampaignClosed | None:
    """``join`` for asyncio code."""
    return await _twins.arun(joining(c, campaign, queue, keyed=keyed))


def joining(c: Clients, campaign: str, queue: str, *, keyed: bool = False
            ) -> _twins.Core[CampaignClosed | None]:
    """The core of ``join`` / ``ajoin``."""
    done = _joined.setdefault(c, set())
    if (campaign, queue) in done:
        return None
    try:
        gen, expires = _joined_reply(campaign, (yield _twins.Script(c, calls.campaign_join(
            campaign_keys(c.namespace, campaign), queue))))
        _opened(campaign, queue, (yield _twins.Script(c, calls.campaign_queue(
            c.keys(queue), campaign, "open", gen, expires=expires))))
    except CampaignClosed as exc:
        if keyed:
            return exc
        raise
    done.add((campaign, queue))
    return None


class NotJoined(Exception):
    """``enqueue_tracked.lua`` found the campaign not open on the queue: join, retry."""


def ids_of(campaign: str | None, ids: list[str], reply: Any,
           closed: CampaignClosed | None = None) -> list[str]:
    """The ids an ``enqueue_tracked.lua`` call stands for: ``ids`` with each job that
    was not written (its dedup key held) replaced by the id holding the key.
    ``closed``: the campaign is closed (``join`` said so): a refusal raises it."""
    status = int(reply[0])
    if closed is not None and status in (1, 2):
        raise closed
    if status == 1:
        raise NotJoined()
    if status == 2:
        flag = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        raise CampaignClosed(campaign or "", f"campaign {campaign!r} is {flag}: no jobs "
                             "can be added to it")
    if len(reply) > 2:
        ids = list(ids)
        for i in range(2, len(reply), 2):
            held = reply[i + 1]
            ids[int(reply[i]) - 1] = held.decode() if isinstance(held, bytes) else held
    return ids
