"""Job ids: ``<queue ref><13 random characters><hex counter or -seq>[mark]``
(``codec`` re-exports them, where the rest of batchq has always found them)."""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets

# "<queue ref><13 random characters><hex counter>". The queue ref (REF_LEN characters, a
# hash of the queue name) lets ``job_status`` / ``cancel`` / ``result`` go from a job id
# to its queue's keys without a scan (on a Cluster: to the right slot). The random part
# (72 bits per process, drawn again in a forked child) plus the counter keeps ids unique
# without coordination, short and cheap. Letters and digits only: an id never starts
# with "-" (a command line would read it as a flag).

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

REF_LEN = 4
"""Characters of the queue reference at the start of an id (62**4, about 14.8 million
values: two queues of one namespace rarely share one, and when they do the readers look
in both)."""
MIN_ID_LEN = REF_LEN + 14
"""The shortest job id: the queue ref, 13 random characters and at least one more."""


def _base62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(_ALPHABET[r])
    return "".join(out)


def queue_ref(queue: str) -> str:
    """The short reference of ``queue`` that starts its jobs' ids."""
    digest = hashlib.blake2b(queue.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return _base62(int.from_bytes(digest, "big"), REF_LEN)


def ref_of(job_id: str) -> str:
    """The queue reference in a job id ("" for an id too short to carry one)."""
    return job_id[:REF_LEN] if len(job_id) > REF_LEN + 13 else ""


_prefix = ""
_counter = itertools.count()


def _reseed() -> None:
    global _prefix, _counter
    _prefix = _base62(secrets.randbits(72), 13)
    _counter = itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)


TRACKED_MARK = "_m"
"""The end of a tracked job's id (``tracked.TRACKED_SUFFIX``): ``<ref><13 random>`` then
``-<hex seq>`` (ready) or a hex counter (delayed), then this mark."""


def new_id(ref: str = "0000", seq: int | None = None, mark: str = "") -> str:
    """A new job id: the queue reference ``ref``, 13 random base-62 characters, then
    ``-`` and the hex sequence number ``seq`` (see ``seqs``), or a hex counter when the
    job has none (delayed and periodic jobs); then ``mark`` (``TRACKED_MARK`` or "")."""
    if seq is not None:
        return f"{ref}{_prefix}-{seq:x}{mark}"
    return f"{ref}{_prefix}{next(_counter):x}{mark}"


def seq_of(job_id: str) -> int | None:
    """The sequence number in an id made by ``new_id(ref, seq)``, else None."""
    if len(job_id) > REF_LEN + 14 and job_id[REF_LEN + 13] == "-":
        # a tracked job (campaign or dedup key) carries its mark after the number
        # (and a grouped one its group, "~<hex>", before that)
        end = -len(TRACKED_MARK) if job_id.endswith(TRACKED_MARK) else None
        tail = job_id[REF_LEN + 14:end]
        try:
            return int(tail.split("~", 1)[0], 16)
        except ValueError:
            return None
    return None
