"""One job by its id, for the console's "Find a job" page: where it is, and everything
Redis still knows of it, read the way ``App.job_status`` reads it.

The id leads to its queue (``batchq.tasks.results``: the queue reference at its start), one
``status.lua`` call says where the job is (and hands back its result or dead record),
and one pipelined round trip reads what the other keys keep of it: its entry while it
is delayed (the pending index) or running (inflight), its campaign while it is not
settled (``jobmeta``), when it died or was cancelled, and whether a result is stored. A
job ready in a list has no index by id: its status, group and campaign are shown, its
attempts are not known until it runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..flow.limits import group_name, group_of
from ..ops.jobinfo import progress_queue, progress_record
from ..store import codec
from ..store.keys import split_shard
from ..tasks import results
from . import deadletters

if TYPE_CHECKING:
    from ..store.keys import QueueKeys
    from ..tasks.app import App


def _iso(ms: float | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") \
        .replace("+00:00", "Z")


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _entry(raw: Any, queue: str) -> codec.Job | None:
    if not isinstance(raw, bytes) or raw == b"r":
        return None
    try:
        return codec.decode_entry(raw, queue)
    except codec.DecodeError:
        return None


def find(app: App, jid: str) -> dict[str, Any]:
    """What is known of job ``jid``: ``state`` (one of ``results.STATES``) and, as far
    as Redis keeps them, its queue, task, attempts, last error, group, campaign, times
    (ISO 8601, UTC) and whether a result is stored. ``actions``: what the page may do
    with it now (``cancel`` while it waits, ``retry`` once dead)."""
    state, data, k = results.read_state(app, jid, payload=True)
    group_hex = group_of(jid)
    out: dict[str, Any] = {
        "id": jid, "state": state, "queue": None, "task": None, "attempts": None,
        "max_attempts": None, "priority": None,
        "group": group_name(group_hex) if group_hex else None, "campaign": None,
        "enqueued_at": None, "due_at": None, "died_at": None, "cancelled_at": None,
        "error": None, "result_stored": False, "result_bytes": None,
        "progress": None, "message": None, "progress_at": None, "started_at": None,
        "finished_at": None,
        "actions": [],
    }
    if k is None:
        k = progress_queue(app, jid)  # settled and forgotten, but its progress is kept
        if k is None:
            return out
    out["queue"] = split_shard(k.queue)[0]
    _details(app, k, jid, state, data, out)
    if state in ("ready", "delayed"):
        out["actions"] = ["cancel"]
    elif state == "dead":
        out["actions"] = ["retry"]
    return out


def _details(app: App, k: QueueKeys, jid: str, state: str, data: bytes | None,
             out: dict[str, Any]) -> None:
    pipe = app.redis.pipeline(transaction=False)
    pipe.hget(k.pending, jid)
    pipe.hget(k.inflight, jid)
    pipe.hget(k.jobmeta, jid)
    pipe.zscore(k.cancelled, jid)
    pipe.strlen(k.result(jid))
    pipe.get(k.progress(jid))
    pending, inflight, meta, cancelled_ms, result_len, progress = \
        pipe.execute(raise_on_error=False)
    _progress(progress_record(progress), out)
    job = _entry(inflight, k.queue) or _entry(pending, k.queue)
    if job is not None:
        out.update(task=job.task, attempts=job.attempt, max_attempts=job.max_attempts,
                   priority=job.priority, enqueued_at=_iso(job.enqueued_ms))
        if job.ready_ms != job.enqueued_ms:
            out["due_at"] = _iso(job.ready_ms)
    if isinstance(meta, bytes):
        campaign = _text(meta).split("\n", 1)[0]
        out["campaign"] = campaign or None
    if isinstance(cancelled_ms, int | float) and not isinstance(cancelled_ms, bool):
        out["cancelled_at"] = _iso(float(cancelled_ms))
    if isinstance(result_len, int) and result_len > 0:
        out["result_stored"] = True
        out["result_bytes"] = result_len
    if state == "dead":
        dead = deadletters.job(app.queue(split_shard(k.queue)[0]), jid)
        if dead is not None:
            out.update(task=dead["task"], attempts=dead["attempts"], died_at=dead["died_at"],
                       error={"type": dead["error_type"], "message": dead["error_message"],
                              "reason": dead["reason"]})
            raw = _raw_of(data)
            if raw is not None:
                entry = _entry(raw, k.queue)
                if entry is not None:
                    out.update(max_attempts=entry.max_attempts, priority=entry.priority,
                               enqueued_at=_iso(entry.enqueued_ms))


def _progress(rec: dict[str, Any], out: dict[str, Any]) -> None:
    """What the job's handler reported (``current_job().progress``), shown as text."""
    if not rec:
        return
    value, message = rec.get("v"), rec.get("m")
    if isinstance(value, int | float) and not isinstance(value, bool):
        out["progress"] = value
    if isinstance(message, str):
        out["message"] = message
    for name, key in (("progress_at", "at"), ("started_at", "st"), ("finished_at", "end")):
        ms = rec.get(key)
        if isinstance(ms, int) and not isinstance(ms, bool):
            out[name] = _iso(ms)
    attempt = rec.get("a")
    if isinstance(attempt, int) and out["attempts"] is None:
        out["attempts"] = attempt


def _raw_of(data: bytes | None) -> bytes | None:
    if data is None:
        return None
    raw = codec.decode_dead_record(data).get("raw")
    return raw if isinstance(raw, bytes) else None


def cancel(app: App, jid: str) -> dict[str, Any]:
    """Cancel ``jid`` (``App.cancel``): True when it was waiting and will not run."""
    done = results.cancel(app, jid)
    return {"id": jid, "cancelled": done, "state": results.job_status(app, jid)}


def retry(app: App, jid: str) -> dict[str, Any]:
    """Run dead job ``jid`` again (``Queue.retry_dead``); refused when it is not dead."""
    state, _, k = results.read_state(app, jid)
    if state != "dead" or k is None:
        raise ValueError(f"job {jid!r} is {state}, not dead: only a dead job is retried")
    moved = app.queue(split_shard(k.queue)[0]).retry_dead([jid])
    return {"id": jid, "retried": moved, "state": results.job_status(app, jid)}
