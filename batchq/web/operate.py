"""The operator's pages of the console: campaigns, customers (groups) and limits, one
job by its id, and the audit log; their JSON API and their actions.

GET  /api/campaigns?limit            campaigns, newest first: counts, progress, rate, ETA
GET  /api/campaign?id                one campaign: its row, each queue's counts, groups
POST /api/campaign/cancel            {"id", "confirmed": true}
GET  /api/groups?queue               a queue's groups and limits (``groups.view``)
POST /api/limit/set                  {"queue", "group"?, "rate_per_s"?, "burst"?,
                                     "concurrency"?, "max_pending"?, "weight"?}
POST /api/limit/rm                   {"queue", "group"?}
POST /api/hold                       {"queue", "group"?, "seconds"}
POST /api/release                    {"queue", "group"?}
GET  /api/job?id                     one job (``jobs.find``)
POST /api/job/cancel|retry           {"id"}
GET  /api/audit?limit&before         the audit log, newest first

A ``"group"`` of null or absent means the whole queue; ``"*"`` (limits only) every group
without a limit of its own. Every action is recorded in the audit log by
``Console.action``; each names its target here as soon as it knows it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..flow.limits import DEFAULT_GROUP, MAX_HOLD_S, check_group
from ..ops import audit
from . import campaigns, groups, jobs, params
from .params import BadRequest

if TYPE_CHECKING:
    from ..ops.queue import Queue
    from .act import Act, ConsoleLike

PAGES = {"/campaigns": "campaigns", "/campaign": "campaign", "/groups": "groups",
         "/job": "find", "/audit": "audit"}
ACTIONS = frozenset({"/api/campaign/cancel", "/api/limit/set", "/api/limit/rm",
                     "/api/hold", "/api/release", "/api/job/cancel", "/api/job/retry"})
CAMPAIGNS_PAGE = 50
AUDIT_PAGE, AUDIT_PAGE_MAX = 100, 1000
_STREAM_ID = re.compile(r"[0-9]{1,15}-[0-9]{1,19}")


def _campaign_id(raw: str) -> str:
    from ..produce.tracked import check_campaign_id

    return check_campaign_id(raw)


def _job_id(raw: str) -> str:
    if any(c in raw for c in ": \t\r\n{}"):
        raise BadRequest(f"invalid job id {raw[:80]!r}")
    return raw


def _group(body: dict[str, Any], *, star: bool = False) -> str | None:
    """The body's ``"group"``: None (the whole queue), a group name, or ``"*"`` when
    ``star`` allows it."""
    raw = body.get("group")
    if raw is None or raw == "":
        return None
    if star and raw == DEFAULT_GROUP:
        return DEFAULT_GROUP
    try:
        return check_group(raw)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"group: {exc}") from None


def routes(console: ConsoleLike) -> list[Route]:
    app = console.app

    # --- reads ---------------------------------------------------------------------

    async def api_campaigns(request: Request) -> Response:
        def read() -> dict[str, Any]:
            limit = params.query_int(request.query_params, "limit", CAMPAIGNS_PAGE, 1,
                                     campaigns.LIST_MAX)
            return campaigns.listing(app, console.rates, limit)
        return await console.call(read, cache_key=str(request.url))

    async def api_campaign(request: Request) -> Response:
        def read() -> dict[str, Any]:
            cid = _campaign_id(params.query_str(request.query_params, "id"))
            return campaigns.detail(app, console.rates, cid)
        return await console.call(read, cache_key=str(request.url))

    async def api_groups(request: Request) -> Response:
        def read() -> dict[str, Any]:
            q = console.queue(params.query_str(request.query_params, "queue"))
            return groups.view(app, q)
        return await console.call(read, cache_key=str(request.url))

    async def api_job(request: Request) -> Response:
        def read() -> dict[str, Any]:
            return jobs.find(app, _job_id(params.query_str(request.query_params, "id")))
        return await console.call(read)

    async def api_audit(request: Request) -> Response:
        def read() -> dict[str, Any]:
            limit = params.query_int(request.query_params, "limit", AUDIT_PAGE, 1,
                                     AUDIT_PAGE_MAX)
            before = params.query_str(request.query_params, "before", required=False)
            if before and not _STREAM_ID.fullmatch(before):
                raise BadRequest(f"before must be an entry id like 1700000000000-0, not "
                                 f"{before[:40]!r}")
            entries = audit.read(app.redis, app.namespace, limit, before=before or None)
            return {"entries": [e.as_dict() for e in entries], "limit": limit,
                    "next_before": entries[-1].id if len(entries) == limit else None}
        return await console.call(read)

    # --- actions -------------------------------------------------------------------

    def cancel_campaign(act: Act) -> dict[str, Any]:
        cid = _campaign_id(params.body_str(act.body, "id"))
        act.target = f"campaign {cid}"
        if act.body.get("confirmed") is not True:
            raise BadRequest('cancelling a campaign needs "confirmed": true')
        res = campaigns.cancel(app, cid)
        act.detail = f"{res['not_started']} jobs not started will not run"
        return res

    def queue_and_group(act: Act, *, star: bool = False) -> tuple[Queue, str | None]:
        q = console.queue_of(act)
        group = _group(act.body, star=star)
        act.target = groups.target(q, group)
        return q, group

    def limit_set(act: Act) -> dict[str, Any]:
        q, group = queue_and_group(act, star=True)
        values = {f: params.body_number(act.body, f,
                                        integer=f in ("burst", "concurrency", "max_pending"))
                  for f in groups.LIMIT_FIELDS}
        res = groups.set_limit(q, group, values)
        act.detail = res["describe"]
        return res

    def limit_rm(act: Act) -> dict[str, Any]:
        q, group = queue_and_group(act, star=True)
        res = groups.remove_limit(q, group)
        act.detail = "removed" if res["removed"] else "there was none"
        return res

    def hold(act: Act) -> dict[str, Any]:
        q, group = queue_and_group(act)
        seconds = params.body_number(act.body, "seconds")
        if seconds is None or not 0 < seconds <= MAX_HOLD_S:
            raise BadRequest(f'"seconds" must be a number in (0, {MAX_HOLD_S:g}], not '
                             f"{seconds!r}")
        act.detail = f"{seconds:g}s"
        res = groups.hold(q, group, float(seconds))
        if res["in_force_s"] > seconds + 1:  # a longer hold was already set: it stays
            act.detail += f" (a longer hold stays: {res['in_force_s']:.0f}s left)"
        return res

    def release(act: Act) -> dict[str, Any]:
        q, group = queue_and_group(act)
        res = groups.release(q, group)
        act.detail = f"{res['left_s']:.0f}s were left" if res["released"] else \
            "it was not held"
        return res

    def job_target(act: Act) -> str:
        jid = _job_id(params.body_str(act.body, "id"))
        act.target = f"job {jid}"
        return jid

    def job_cancel(act: Act) -> dict[str, Any]:
        res = jobs.cancel(app, job_target(act))
        act.detail = "cancelled" if res["cancelled"] else f"not cancelled: {res['state']}"
        return res

    def job_retry(act: Act) -> dict[str, Any]:
        res = jobs.retry(app, job_target(act))
        act.detail = f"{res['retried']} retried"
        return res

    post = ["POST"]
    return [
        Route("/api/campaigns", api_campaigns),
        Route("/api/campaign", api_campaign),
        Route("/api/groups", api_groups),
        Route("/api/job", api_job),
        Route("/api/audit", api_audit),
        Route("/api/campaign/cancel", console.action("campaign_cancel", cancel_campaign),
              methods=post),
        Route("/api/limit/set", console.action("limit_set", limit_set), methods=post),
        Route("/api/limit/rm", console.action("limit_rm", limit_rm), methods=post),
        Route("/api/hold", console.action("hold", hold), methods=post),
        Route("/api/release", console.action("release", release), methods=post),
        Route("/api/job/cancel", console.action("job_cancel", job_cancel), methods=post),
        Route("/api/job/retry", console.action("dead_retry", job_retry), methods=post),
    ]

