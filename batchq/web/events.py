"""The console's live feed of job events (``batchq.ops.events``): one page, ``/events``,
that polls the JSON API below and appends what is new, as text.

GET /api/events?queue=Q[&queue=Q2][&since=<JSON {queue: id}>][&limit=N]
    the events after ``since`` (without it: the last ``limit`` of each queue), at most
    ``limit`` (default 200, at most 1,000), and ``next``: the ``since`` of the next poll
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..ops import events as events_
from ..store.keys import check_queue_name
from .params import BadRequest

if TYPE_CHECKING:
    from ..tasks.app import App
    from .act import ConsoleLike

PAGES = {"/events": "events"}
LIMIT, LIMIT_MAX = 200, 1000


def _since(raw: str | None) -> dict[str, str] | None:
    if not raw:
        return None
    try:
        v = json.loads(raw)
    except ValueError:
        raise BadRequest("since must be a JSON object {queue: event id}") from None
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise BadRequest("since must be a JSON object {queue: event id}")
    return {str(k): x for k, x in v.items()}


def feed(app: App, queues: list[str], since: dict[str, str] | None,
         limit: int) -> dict[str, Any]:
    """Up to ``limit`` events of ``queues`` after ``since`` (None: the newest ones)."""
    keys = [q.keys for name in queues for q in app.queue(name).shards()]
    r = app.redis
    start: dict[str, str] = dict(since or {})
    for k in keys:
        if k.queue not in start:
            # a first look: from the entry ``limit`` back, so the page opens with the
            # newest events (whole entries: a pop's jobs share one)
            back: Any = r.xrevrange(k.events, count=limit)
            oldest = back[-1][0] if len(back) >= limit else None
            start[k.queue] = "0" if oldest is None else \
                (oldest.decode() if isinstance(oldest, bytes) else str(oldest))
    evs = list(itertools.islice(events_.read(r, keys, start), limit * len(keys)))
    evs = evs[-limit:] if since is None else evs[:limit]
    nxt = dict(start)
    for e in evs:
        if e.kind != "gap":
            nxt[e.queue] = e.id
    enabled = {k.queue: events_.config(r, k).enabled for k in keys}
    return {"events": [e.as_dict() for e in evs], "next": nxt, "enabled": enabled}


def routes(console: ConsoleLike) -> list[Route]:
    app = console.app

    async def api_events(request: Request) -> Response:
        qp = request.query_params

        def read() -> dict[str, Any]:
            names = qp.getlist("queue") or list(getattr(console, "app_queues", None)
                                                or app.queues())
            queues = [check_queue_name(n) for n in names]  # ValueError: a 400
            raw = qp.get("limit") or str(LIMIT)
            if not raw.isdigit() or not 1 <= int(raw) <= LIMIT_MAX:
                raise BadRequest(f"limit must be 1..{LIMIT_MAX}, not {raw[:20]!r}")
            return feed(app, queues, _since(qp.get("since")), int(raw))

        return await console.call(read)

    return [Route("/api/events", api_events)]
