"""Tracked jobs: campaign members and jobs with a dedup key, as the producer writes them.

A tracked job's id ends in ``TRACKED_SUFFIX``; ``enqueue_tracked.lua`` writes it with a
jobmeta entry (its campaign, dedup key and key ttl) and the settling scripts (ack, nack,
pop) look that entry up only for ids with the suffix, so plain jobs cost them one string
compare. This module checks campaign ids and dedup keys, joins a campaign to a queue
before the first write there (``campaign_join.lua`` on the campaign's slot, then the
queue's flag, ``campaign_queue.lua``), and reads ``enqueue_tracked.lua``'s replies.
It sits below ``producer`` (which calls it) and above ``clients``.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

from . import codec
from .clients import Clients
from .errors import CampaignClosed, CampaignNotFound
from .keys import campaign_keys
from .scripts import calls

TRACKED_SUFFIX = codec.TRACKED_MARK
"""Ends the id of every tracked job (base-62 ids never contain ``_``)."""

MAX_KEY_BYTES = 512
"""The longest dedup key (UTF-8 bytes)."""

DEFAULT_KEY_TTL_S = 24 * 3600.0
"""How long a dedup key stays held after its job finished, unless set per task or call."""

TRIM_CHUNK = 100
"""Lapsed dedup keys dropped per ``enqueue_tracked.lua`` call, at most."""

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


def _joined_reply(campaign: str, reply: Any) -> str:
    status, generation = int(reply[0]), reply[1]
    if status == -1:
        raise CampaignNotFound(campaign)
    if status == 0:
        raise CampaignClosed(campaign, f"campaign {campaign!r} is sealed or cancelled: "
                             "no jobs can be added to it")
    return generation.decode() if isinstance(generation, bytes) else str(generation)


def _opened(campaign: str, queue: str, reply: Any) -> None:
    if reply[0] != b"open":
        raise CampaignClosed(campaign, f"campaign {campaign!r} is closed on queue "
                             f"{queue!r} ({reply[0].decode() or 'gone'}): no jobs can be "
                             "added to it")


def join(c: Clients, campaign: str, queue: str) -> None:
    """Make ``queue`` part of ``campaign`` (once per process); raises
    ``CampaignClosed`` / ``CampaignNotFound``."""
    done = _joined.setdefault(c, set())
    if (campaign, queue) in done:
        return
    s = c.sync_scripts
    gen = _joined_reply(campaign, s.call(calls.campaign_join(
        campaign_keys(c.namespace, campaign), queue)))
    _opened(campaign, queue, s.call(calls.campaign_queue(c.keys(queue), campaign, "open",
                                                         gen)))
    done.add((campaign, queue))


async def ajoin(c: Clients, campaign: str, queue: str) -> None:
    """``join`` for asyncio code."""
    done = _joined.setdefault(c, set())
    if (campaign, queue) in done:
        return
    s = c.async_scripts()
    gen = _joined_reply(campaign, await s.call(calls.campaign_join(
        campaign_keys(c.namespace, campaign), queue)))
    _opened(campaign, queue, await s.call(calls.campaign_queue(c.keys(queue), campaign,
                                                               "open", gen)))
    done.add((campaign, queue))


class NotJoined(Exception):
    """``enqueue_tracked.lua`` found the campaign not open on the queue: join, retry."""


def ids_of(campaign: str | None, ids: list[str], reply: Any) -> list[str]:
    """The ids an ``enqueue_tracked.lua`` call stands for: ``ids`` with each job that
    was not written (its dedup key held) replaced by the id holding the key."""
    status = int(reply[0])
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
