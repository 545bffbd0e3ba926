"""``App.job_info``: everything Redis still knows of one job, by its id alone.

The id leads to its queue (``results.candidates``: the queue reference at its start);
one ``status.lua`` call says where the job is (and hands back its dead record), and one
pipelined round trip reads what the other keys keep of it: its entry while it is
delayed (the pending index) or running (inflight), its campaign and dedup key while it
is not settled (``jobmeta``), when it died or was cancelled, and its progress record
(``T:progress:<id>``, written by the worker: ``batchq.worker.context``). What a key no
longer holds is None: a job ready in a list has no index by id (its attempts are known
once it runs), and a succeeded job leaves only its result and its progress record.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from ..store import codec
from ..store.keys import QueueKeys, split_shard
from ..tasks import results

__all__ = ["JobInfo", "ajob_info", "job_info", "progress_queue", "progress_record"]

EXPIRED_KEEP_MS = 3_600_000
"""How long an expired job (dropped unrun at its deadline) reads "expired": the "X" mark
``_pop_reserve.lua``'s ``settle_dropped`` writes lives this long (EXPIRED_KEEP_MS there)."""


@dataclass(frozen=True)
class JobInfo:
    """What ``App.job_info`` returns. Times are Unix ms: ``enqueued_ms``, ``ready_ms``
    (its due time; a periodic job's tick), ``started_ms`` (the run that last reported
    progress), ``finished_ms`` (dead, cancelled, expired, or the end of a run that
    reported progress), ``progress_at_ms`` (the last progress write)."""

    id: str
    state: str
    """One of ``results.STATES``, as ``App.job_status`` returns it."""
    queue: str | None = None
    task: str | None = None
    attempt: int | None = None
    max_attempts: int | None = None
    priority: int | None = None
    group: str | None = None
    campaign: str | None = None
    key: str | None = None
    progress: float | None = None
    message: str | None = None
    error: dict[str, str] | None = None
    """The last error: ``{"type", "message", "reason"}`` of a dead job."""
    enqueued_ms: int | None = None
    ready_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    progress_at_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return int(v)


def _entry(raw: Any, queue: str) -> codec.Job | None:
    if not isinstance(raw, bytes) or raw == b"r":
        return None
    try:
        return codec.decode_entry(raw, queue)
    except codec.DecodeError:
        return None


def _group(jid: str) -> str | None:
    _, sep, tail = jid.partition("~")
    if not sep:
        return None
    tail = tail.removesuffix(codec.TRACKED_MARK)
    try:
        return bytes.fromhex(tail).decode("utf-8")
    except ValueError:
        return tail


def _reads(pipe: Any, k: QueueKeys, jid: str) -> Any:
    """Queue the reads on ``pipe`` (a sync or an asyncio pipeline: both buffer)."""
    pipe.hget(k.pending, jid)
    pipe.hget(k.inflight, jid)
    pipe.hget(k.jobmeta, jid)
    pipe.zscore(k.cancelled, jid)
    pipe.zscore(k.dead, jid)
    pipe.get(k.progress(jid))
    pipe.zscore(k.expires, "~" + jid)
    return pipe


def progress_record(raw: Any) -> dict[str, Any]:
    """The JSON record of a ``T:progress:<id>`` key ({} when missing or not one)."""
    if not isinstance(raw, bytes | str):
        return {}
    try:
        rec = json.loads(raw)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _build(jid: str, state: str, data: bytes | None, k: QueueKeys | None,
           replies: list[Any]) -> JobInfo:
    """The ``JobInfo`` from ``status.lua``'s answer and the pipeline's replies."""
    f: dict[str, Any] = {"id": jid, "state": state, "group": _group(jid)}
    if k is None:
        return JobInfo(**f)
    f["queue"] = split_shard(k.queue)[0]
    pending, inflight, meta, cancelled_ms, died_ms, progress, unmark_ms = \
        [None if isinstance(r, Exception) else r for r in replies]
    job = _entry(inflight, k.queue) or _entry(pending, k.queue)
    if state == "dead" and data is not None:
        rec = codec.decode_dead_record(data)
        f["error"] = {"type": _text(rec.get("error_type", "")),
                      "message": _text(rec.get("error_message", "")),
                      "reason": _text(rec.get("reason", ""))}
        job = job or _entry(rec.get("raw"), k.queue)
        f["finished_ms"] = _int(died_ms)
    if job is not None:
        f.update(task=job.task, attempt=job.attempt, max_attempts=job.max_attempts,
                 priority=job.priority, enqueued_ms=job.enqueued_ms, ready_ms=job.ready_ms)
    if isinstance(meta, bytes):
        parts = _text(meta).split("\n", 2)
        f["campaign"] = parts[0] or None
        f["key"] = parts[2] or None if len(parts) > 2 else None
    if state == "cancelled":
        f["finished_ms"] = _int(cancelled_ms)
    if state == "expired" and unmark_ms is not None:  # the drop's time + the mark's life
        f["finished_ms"] = int(unmark_ms) - EXPIRED_KEEP_MS
    rec = progress_record(progress)
    if rec:
        value = rec.get("v")
        f["progress"] = value if isinstance(value, int | float) and \
            not isinstance(value, bool) else None
        message = rec.get("m")
        f["message"] = message if isinstance(message, str) else None
        f["progress_at_ms"] = _int(rec.get("at"))
        f["started_ms"] = _int(rec.get("st"))
        attempt = _int(rec.get("a"))
        if attempt is not None and (f.get("attempt") or 0) < attempt:
            f["attempt"] = attempt
        if f.get("finished_ms") is None:
            f["finished_ms"] = _int(rec.get("end"))
    return JobInfo(**f)


def progress_queue(app: results.ResultsOwner, jid: str) -> QueueKeys | None:
    """The queue holding ``jid``'s progress record: for a job whose state is no longer
    kept (a success without ``result_ttl_s``), its progress outlives it."""
    for cand in results.candidates(app, jid):
        if app.clients.redis.exists(cand.progress(jid)):
            return cand
    return None


def job_info(app: results.ResultsOwner, job_id: str) -> JobInfo:
    """See ``App.job_info``."""
    jid = results._check_id(job_id)
    state, data, k = results.read_state(app, jid, payload=True)
    if k is None:
        k = progress_queue(app, jid)
        if k is None:
            return _build(jid, state, data, None, [])
    pipe = _reads(app.clients.redis.pipeline(transaction=False), k, jid)
    return _build(jid, state, data, k, pipe.execute(raise_on_error=False))


async def ajob_info(app: results.ResultsOwner, job_id: str) -> JobInfo:
    """See ``App.ajob_info``."""
    jid = results._check_id(job_id)
    state, data, k = await results.aread_state(app, jid, payload=True)
    r = app.clients.async_redis()
    if k is None:
        for cand in await results.acandidates(app, jid):
            if await r.exists(cand.progress(jid)):
                k = cand
                break
        if k is None:
            return _build(jid, state, data, None, [])
    pipe = _reads(r.pipeline(transaction=False), k, jid)
    return _build(jid, state, data, k, await pipe.execute(raise_on_error=False))
