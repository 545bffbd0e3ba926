"""The console's routes: the pages (one HTML shell, drawn by ``static/app.js``) and the
JSON API under ``/api/`` they read and post to.

GET  /api/info                       what ``batchq info --json`` prints
GET  /api/overview?offset&limit&q    a page of queues with counts and jobs/s in and out
GET  /api/queue?name                 one queue: counts, ready by priority, counters
POST /api/queue/pause|resume         {"queue"}
GET  /api/dead?queue&offset&limit    a page of dead jobs, newest first
GET  /api/dead?queue&q&cursor        a bounded search (task, reason, error text)
GET  /api/dead/job?queue&id          one dead job in full
POST /api/dead/retry|purge           {"queue", "ids": [...]} or {"queue", "all": true,
                                     "skip"}; bulk ones need "confirmed": true
GET  /api/workers?offset&limit       live workers
GET  /api/periodic                   periodic tasks, last and next run

and the operator's pages of :mod:`batchq.web.operate` (campaigns, customers and limits,
one job, the audit log). Every parameter is checked by :mod:`batchq.web.params` (a bad
one: a 400 naming it); every action is recorded in the audit log (``batchq.ops.audit``:
who, what, on what, and how it ended).

Redis work runs in Starlette's thread pool on the app's synchronous client. An answer
that cannot reach Redis is a 503 whose text names the redacted URL, never the password.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from importlib.resources import files
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..ops import audit, overview
from ..store.connection import redact
from ..tasks.errors import CampaignNotFound
from . import breakers, deadletters, operate, params
from . import events as web_events
from .act import Act
from .params import MAX_BODY_BYTES, MAX_OFFSET, BadRequest
from .rates import MAX_SAMPLED, RateTracker, Sampler
from .security import COOKIE, USER_SCOPE, Guard, csrf_value, same_secret, session_value
from .settings import REFRESH_MAX_S, REFRESH_MIN_S, REFRESH_S

if TYPE_CHECKING:
    from ..ops.queue import Queue
    from ..tasks.app import App

log = logging.getLogger("batchq.web")

QUEUES_PAGE, QUEUES_PAGE_MAX = 50, 200
DEAD_PAGE = 50
WORKERS_PAGE, WORKERS_PAGE_MAX = 50, 200
CACHE_S = 0.5
"""Reads of the same URL within this share one Redis round trip (many open tabs)."""

PAGES = {"/": "overview", "/queue": "queue", "/dead": "dead", "/dead/job": "job",
         "/workers": "workers", "/periodic": "periodic", **operate.PAGES,
         **breakers.PAGES, **web_events.PAGES}
ACTIONS = frozenset({"/api/queue/pause", "/api/queue/resume", "/api/dead/retry",
                     "/api/dead/purge", *operate.ACTIONS, *breakers.ACTIONS})
STATIC = {"app.js": "text/javascript; charset=utf-8",
          "ops.js": "text/javascript; charset=utf-8",
          "breakers.js": "text/javascript; charset=utf-8",
          "events.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
ANONYMOUS = "console"
"""Who an action is recorded as when the console has no token, or the client sent no
user name (``curl -u alice:TOKEN`` is recorded as ``console:alice``)."""


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, default=_json_default, ensure_ascii=False)
    return Response(body, status, media_type="application/json")


def _int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    return params.query_int(request.query_params, name, default, lo, hi)


def _str(request: Request, name: str) -> str:
    return params.query_str(request.query_params, name)


def _resource(name: str) -> bytes:
    return (files("batchq.web") / name).read_bytes()


class Console:
    """The routes' shared state: the app, the settings and the rate samples."""

    def __init__(self, app: App, *, token: str | None, read_only: bool,
                 app_queues: list[str], refresh_s: float) -> None:
        self.app = app
        self.token = token
        self.read_only = read_only
        self.app_queues = app_queues
        self.refresh_s = min(max(refresh_s, REFRESH_MIN_S), REFRESH_MAX_S)
        self.csrf = csrf_value(token)
        self.rates = RateTracker()
        self.where = f"namespace {app.namespace} at {redact(app.redis_url)}"
        self._password = _password_of(app.redis_url)
        self._cache: dict[str, tuple[float, Any]] = {}
        self._cache_lock = threading.Lock()
        self.shell = _resource("templates/page.html").decode()
        self.login_html = _resource("templates/login.html").decode()
        self.static = {n: _resource(f"static/{n}") for n in STATIC}
        self.sampler = Sampler(self.sample_queues)

    def close(self) -> None:
        """Stop the background rate sampler (the server is stopping)."""
        self.sampler.stop()

    # --- plumbing --------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """Error text with the Redis password cut out (redis-py may echo a URL)."""
        return text.replace(self._password, "***") if self._password else text

    async def run(self, fn: Callable[[], Any]) -> tuple[int, Any]:
        """Run ``fn`` in the thread pool: ``(200, its result)``, or ``(400, error)`` for
        a bad parameter, queue name or value, ``(503, error)`` when Redis cannot be
        reached (the text never holds the password)."""
        try:
            return 200, await run_in_threadpool(fn)
        except (BadRequest, ValueError) as exc:
            return 400, {"error": self.scrub(str(exc))}
        except CampaignNotFound as exc:
            return 404, {"error": self.scrub(str(exc))}
        except redis.RedisError as exc:
            return 503, {"error": self.scrub(f"cannot read Redis ({self.where}): "
                                             f"{type(exc).__name__}: {exc}")}

    async def call(self, fn: Callable[[], Any], cache_key: str | None = None) -> Response:
        """Run ``fn`` (``run``) and answer its result as JSON; reads of the same
        ``cache_key`` within ``CACHE_S`` share one answer."""
        self.sampler.watched()
        now = time.monotonic()
        if cache_key is not None:
            with self._cache_lock:
                hit = self._cache.get(cache_key)
            if hit is not None and hit[0] > now:
                return _json(hit[1])
        status, data = await self.run(fn)
        if status != 200:
            return _json(data, status)
        if cache_key is not None:
            with self._cache_lock:
                if len(self._cache) > 256:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                self._cache[cache_key] = (now + CACHE_S, data)
        return _json(data)

    def queue(self, name: str) -> Queue:
        self.app.keys(name)  # ValueError (400) naming a bad queue name
        return self.app.queue(name)

    def record_rates(self, view: overview.QueueView) -> None:
        c = view.counters
        self.rates.record(view.name, c["enqueued"],
                          c["succeeded"] + c["dead"] + c.get("cancelled", 0))

    def sample_queues(self) -> None:
        """The ``Sampler``'s turn: one sample of the first ``MAX_SAMPLED`` queues."""
        names = overview.queue_names(self.app, self.app_queues)[:MAX_SAMPLED]
        if names:
            for view in overview.read_queues(self.app, names).values():
                self.record_rates(view)

    def with_rates(self, view: overview.QueueView) -> dict[str, Any]:
        self.record_rates(view)
        row = view.as_dict()
        for label, window in (("1m", 60.0), ("5m", 300.0)):
            r = self.rates.rates(view.name, window)
            row[f"in_per_s_{label}"] = None if r is None else round(r[0], 2)
            row[f"out_per_s_{label}"] = None if r is None else round(r[1], 2)
        return row

    # --- pages -----------------------------------------------------------------------

    def page(self, request: Request) -> Response:
        refresh = params.query_seconds(request.query_params, "refresh", self.refresh_s,
                                       REFRESH_MIN_S, REFRESH_MAX_S)
        fill = {"page": PAGES[request.url.path], "csrf": self.csrf,
                "read_only": "1" if self.read_only else "0",
                "refresh_ms": str(int(refresh * 1000)), "where": self.where,
                "auth": "1" if self.token else "0"}
        body = self.shell
        for k, v in fill.items():
            body = body.replace("{{" + k + "}}", html.escape(v, quote=True))
        return Response(body, media_type="text/html; charset=utf-8")

    def login_page(self, message: str = "") -> bytes:
        return self.login_html.replace("{{message}}", html.escape(message)).encode()

    async def login(self, request: Request) -> Response:
        if self.token is None:
            return RedirectResponse("/", 303)
        if request.method == "GET":
            return Response(self.login_page(), media_type="text/html; charset=utf-8")
        try:
            form = parse_qs((await _read_capped(request)).decode("utf-8", "replace"))
        except BadRequest:
            form = {}
        given = (form.get("token") or [""])[0]
        if not same_secret(given, self.token):
            await asyncio.sleep(0.5)  # slows guessing down; the token is long anyway
            return Response(self.login_page("wrong token"), 401,
                            media_type="text/html; charset=utf-8")
        resp = RedirectResponse("/", 303)
        resp.set_cookie(COOKIE, session_value(self.token), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
        return resp

    async def logout(self, request: Request) -> Response:
        resp = _json({"ok": True})
        resp.delete_cookie(COOKIE, path="/")
        return resp

    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            return Response("not found", 404, media_type="text/plain")
        return Response(self.static[name], media_type=STATIC[name])

    # --- API: reads ------------------------------------------------------------------

    async def api_info(self, request: Request) -> Response:
        return await self.call(lambda: overview.snapshot(self.app, self.app_queues),
                               cache_key=str(request.url))

    async def api_overview(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            offset = _int(request, "offset", 0, 0, MAX_OFFSET)
            limit = _int(request, "limit", QUEUES_PAGE, 1, QUEUES_PAGE_MAX)
            contains = params.query_str(request.query_params, "q", required=False)
            total, views = overview.queue_page(self.app, extra=self.app_queues,
                                               contains=contains, offset=offset,
                                               limit=limit)
            return {"where": self.where, "total": total, "offset": offset, "limit": limit,
                    "queues": [self.with_rates(v) for v in views],
                    "workers": len(overview.live_workers(self.app)),
                    "read_only": self.read_only}
        return await self.call(read, cache_key=str(request.url))

    async def api_queue(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            name = _str(request, "name")
            self.queue(name)
            view = overview.read_queues(self.app, [name])[name]
            return self.with_rates(view)
        return await self.call(read, cache_key=str(request.url))

    async def api_dead(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            q = self.queue(_str(request, "queue"))
            limit = _int(request, "limit", DEAD_PAGE, 1, deadletters.PAGE_MAX)
            text = params.query_str(request.query_params, "q", required=False).strip()
            if text:
                return deadletters.search(self.app, q, text,
                                          _int(request, "cursor", 0, 0, MAX_OFFSET), limit)
            return deadletters.page(self.app, q, _int(request, "offset", 0, 0, MAX_OFFSET),
                                    limit)
        return await self.call(read)

    async def api_dead_job(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            q = self.queue(_str(request, "queue"))
            jid = _str(request, "id")
            found = deadletters.job(q, jid)
            if found is None:
                raise BadRequest(f"no dead job {jid!r} in queue {q.name}")
            return found
        return await self.call(read)

    async def api_workers(self, request: Request) -> Response:
        def read() -> dict[str, Any]:
            offset = _int(request, "offset", 0, 0, MAX_OFFSET)
            limit = _int(request, "limit", WORKERS_PAGE, 1, WORKERS_PAGE_MAX)
            workers = overview.live_workers(self.app)
            return {"total": len(workers), "offset": offset, "limit": limit,
                    "workers": workers[offset : offset + limit]}
        return await self.call(read, cache_key=str(request.url))

    async def api_periodic(self, request: Request) -> Response:
        return await self.call(lambda: {"tasks": overview.periodic(self.app)},
                               cache_key=str(request.url))

    # --- API: actions ----------------------------------------------------------------

    def action(self, name: str, fn: Callable[[Act], Any]
               ) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint of action ``name``: parse the body (``params.json_object``), run
        ``fn`` in the thread pool, record the outcome in the audit log (who, what, on
        what, the result) and answer it."""
        async def endpoint(request: Request) -> Response:
            try:
                body = params.json_object(await _read_capped(request))
            except BadRequest as exc:
                return _json({"error": str(exc)}, 400)
            with self._cache_lock:
                self._cache.clear()  # the next read shows the change
            act = Act(request.scope.get(USER_SCOPE) or ANONYMOUS, name, body)
            status, data = await self.run(lambda: fn(act))
            result = "ok" if status == 200 else str(data.get("error", status))
            try:
                await run_in_threadpool(
                    lambda: audit.record(self.app.redis, self.app.namespace, who=act.who,
                                         action=name, target=act.target or "?",
                                         result=result, detail=act.detail))
            except (redis.RedisError, ValueError) as exc:  # the action itself stands
                log.warning("could not record %s in the audit log: %s", name, exc)
                if status == 200:
                    data = {**data, "audit_error": self.scrub(str(exc))}
            return _json(data, status)
        return endpoint

    def queue_of(self, act: Act) -> Queue:
        """The queue an action names (``"queue"``), its audit target set."""
        q = self.queue(params.body_str(act.body, "queue"))
        act.target = f"queue {q.name}"
        return q

    def pause(self, paused: bool) -> Callable[[Act], Any]:
        def act_on(act: Act) -> dict[str, Any]:
            q = self.queue_of(act)
            q.pause() if paused else q.resume()
            return {"queue": q.name, "paused": q.is_paused()}
        return act_on

    def dead_action(self, verb: str) -> Callable[[Act], Any]:
        def act_on(act: Act) -> dict[str, Any]:
            q = self.queue_of(act)
            body = act.body
            ids = body.get("ids")
            every = body.get("all") is True
            if every == (ids is not None):
                raise BadRequest('give either "ids" (a list) or "all": true')
            if ids is not None:
                if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                    raise BadRequest('"ids" must be a list of job ids')
                if len(ids) > deadletters.MAX_IDS:
                    raise BadRequest(f"at most {deadletters.MAX_IDS} ids per request, "
                                     f"not {len(ids)}")
                ids = list(dict.fromkeys(ids))
            picked: list[str] = ids or []
            act.detail = "all" if every else (
                f"job {picked[0]}" if len(picked) == 1 else f"{len(picked)} jobs")
            if (every or len(ids or []) > 1) and body.get("confirmed") is not True:
                raise BadRequest(f'a bulk {verb} needs "confirmed": true')
            if verb == "retry":
                skip = body.get("skip", 0)
                if isinstance(skip, bool) or not isinstance(skip, int) or \
                        not 0 <= skip <= MAX_OFFSET:
                    raise BadRequest(f'"skip" must be an integer from 0 to {MAX_OFFSET}, '
                                     f"not {skip!r}"[:200])
                res = deadletters.retry(self.app, q, ids, skip)
                act.detail += f": {res['retried']} retried"
                return res
            res = deadletters.purge(self.app, q, ids)
            act.detail += f": {res['purged']} purged"
            return res
        return act_on

    # --- the app ---------------------------------------------------------------------

    def routes(self) -> list[Route]:
        return [
            *(Route(path, self.page) for path in PAGES),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/static/{name}", self.static_file),
            Route("/api/info", self.api_info),
            Route("/api/overview", self.api_overview),
            Route("/api/queue", self.api_queue),
            Route("/api/dead", self.api_dead),
            Route("/api/dead/job", self.api_dead_job),
            Route("/api/workers", self.api_workers),
            Route("/api/periodic", self.api_periodic),
            Route("/api/queue/pause", self.action("pause", self.pause(True)),
                  methods=["POST"]),
            Route("/api/queue/resume", self.action("resume", self.pause(False)),
                  methods=["POST"]),
            Route("/api/dead/retry", self.action("dead_retry", self.dead_action("retry")),
                  methods=["POST"]),
            Route("/api/dead/purge", self.action("dead_purge", self.dead_action("purge")),
                  methods=["POST"]),
            *operate.routes(self),
            *breakers.routes(self),
            *web_events.routes(self),
        ]


async def _read_capped(request: Request) -> bytes:
    """The request body, refused past ``MAX_BODY_BYTES`` (never read whole into memory)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"the body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _password_of(url: str) -> str | None:
    try:
        return urlsplit(url).password or None
    except ValueError:
        return None


def create_app(app: App, *, token: str | None = None, read_only: bool = False,
               app_queues: list[str] | None = None, refresh_s: float = REFRESH_S) -> Any:
    """The console as an ASGI application (Starlette behind the :class:`Guard`).

    ``app`` reaches Redis (its URL and namespace); ``app_queues`` are listed even before
    they were used (default: the app's declared queues); ``token``: required from every
    client when given; ``read_only``: no actions."""
    console = Console(app, token=token, read_only=read_only,
                      app_queues=list(app.queues() if app_queues is None else app_queues),
                      refresh_s=refresh_s)
    inner = Starlette(routes=console.routes())
    guard = Guard(inner, token=token, csrf=console.csrf, read_only=read_only,
                  actions=ACTIONS, login_page=console.login_page(), on_close=console.close)
    guard.console = console
    console.sampler.start()
    return guard
