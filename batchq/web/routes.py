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

Redis work runs in Starlette's thread pool on the app's synchronous client. An answer
that cannot reach Redis is a 503 whose text names the redacted URL, never the password.
"""

from __future__ import annotations

import asyncio
import html
import json
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

from .. import overview
from ..connection import redact
from ..web_settings import REFRESH_MAX_S, REFRESH_MIN_S, REFRESH_S
from . import deadletters
from .rates import RateTracker
from .security import COOKIE, Guard, csrf_value, same_secret, session_value

if TYPE_CHECKING:
    from ..app import App

QUEUES_PAGE, QUEUES_PAGE_MAX = 50, 200
DEAD_PAGE = 50
WORKERS_PAGE, WORKERS_PAGE_MAX = 50, 200
MAX_BODY_BYTES = 256 * 1024
"""An action's body at most: 1,000 ids of a few dozen bytes each fit many times over."""
CACHE_S = 0.5
"""Reads of the same URL within this share one Redis round trip (many open tabs)."""

PAGES = {"/": "overview", "/queue": "queue", "/dead": "dead", "/dead/job": "job",
         "/workers": "workers", "/periodic": "periodic"}
ACTIONS = frozenset({"/api/queue/pause", "/api/queue/resume", "/api/dead/retry",
                     "/api/dead/purge"})
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


class BadRequest(Exception):
    """A bad parameter: a 400 whose message names it."""


def _json_default(o: Any) -> Any:
    if isinstance(o, bytes):
        return o.decode("utf-8", "backslashreplace")
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, default=_json_default, ensure_ascii=False)
    return Response(body, status, media_type="application/json")


def _int(request: Request, name: str, default: int, lo: int, hi: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {raw!r}") from None
    if value < lo:
        raise BadRequest(f"{name} must be at least {lo}, not {value}")
    return value if hi is None else min(value, hi)


def _str(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise BadRequest(f"missing parameter {name!r}")
    return value


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

    # --- plumbing --------------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """Error text with the Redis password cut out (redis-py may echo a URL)."""
        return text.replace(self._password, "***") if self._password else text

    async def call(self, fn: Callable[[], Any], cache_key: str | None = None) -> Response:
        """Run ``fn`` in the thread pool and answer its result as JSON (400 for a bad
        parameter or queue name, 503 when Redis cannot be reached)."""
        now = time.monotonic()
        if cache_key is not None:
            with self._cache_lock:
                hit = self._cache.get(cache_key)
            if hit is not None and hit[0] > now:
                return _json(hit[1])
        try:
            data = await run_in_threadpool(fn)
        except (BadRequest, ValueError) as exc:
            return _json({"error": self.scrub(str(exc))}, 400)
        except redis.RedisError as exc:
            return _json({"error": self.scrub(f"cannot read Redis ({self.where}): "
                                              f"{type(exc).__name__}: {exc}")}, 503)
        if cache_key is not None:
            with self._cache_lock:
                if len(self._cache) > 256:
                    self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                self._cache[cache_key] = (now + CACHE_S, data)
        return _json(data)

    def queue(self, name: str) -> Any:
        self.app.keys(name)  # ValueError (400) naming a bad queue name
        return self.app.queue(name)

    def with_rates(self, view: overview.QueueView) -> dict[str, Any]:
        c = view.counters
        self.rates.record(view.name, c["enqueued"], c["succeeded"] + c["dead"])
        row = view.as_dict()
        for label, window in (("1m", 60.0), ("5m", 300.0)):
            r = self.rates.rates(view.name, window)
            row[f"in_per_s_{label}"] = None if r is None else round(r[0], 2)
            row[f"out_per_s_{label}"] = None if r is None else round(r[1], 2)
        return row

    # --- pages -----------------------------------------------------------------------

    def page(self, request: Request) -> Response:
        raw = request.query_params.get("refresh")
        try:
            refresh = float(raw) if raw else self.refresh_s
        except ValueError:
            refresh = self.refresh_s
        if refresh != refresh:  # NaN
            refresh = self.refresh_s
        refresh = min(max(refresh, REFRESH_MIN_S), REFRESH_MAX_S)
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
            offset = _int(request, "offset", 0, 0)
            limit = _int(request, "limit", QUEUES_PAGE, 1, QUEUES_PAGE_MAX)
            contains = request.query_params.get("q", "")
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
            text = request.query_params.get("q", "").strip()
            if text:
                return deadletters.search(self.app, q, text, _int(request, "cursor", 0, 0),
                                          limit)
            return deadletters.page(self.app, q, _int(request, "offset", 0, 0), limit)
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
            offset = _int(request, "offset", 0, 0)
            limit = _int(request, "limit", WORKERS_PAGE, 1, WORKERS_PAGE_MAX)
            workers = overview.live_workers(self.app)
            return {"total": len(workers), "offset": offset, "limit": limit,
                    "workers": workers[offset : offset + limit]}
        return await self.call(read, cache_key=str(request.url))

    async def api_periodic(self, request: Request) -> Response:
        return await self.call(lambda: {"tasks": overview.periodic(self.app)},
                               cache_key=str(request.url))

    # --- API: actions ----------------------------------------------------------------

    async def _body(self, request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await _read_capped(request))
        except ValueError:
            raise BadRequest("the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if not isinstance(body.get("queue"), str) or not body["queue"]:
            raise BadRequest("missing \"queue\" in the body")
        return body

    def _action(self, fn: Callable[[dict[str, Any]], Any]
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                body = await self._body(request)
            except BadRequest as exc:
                return _json({"error": str(exc)}, 400)
            with self._cache_lock:
                self._cache.clear()  # the next read shows the change
            return await self.call(lambda: fn(body))
        return endpoint

    def pause(self, paused: bool) -> Callable[[dict[str, Any]], Any]:
        def act(body: dict[str, Any]) -> dict[str, Any]:
            q = self.queue(body["queue"])
            q.pause() if paused else q.resume()
            return {"queue": q.name, "paused": q.is_paused()}
        return act

    def dead_action(self, verb: str) -> Callable[[dict[str, Any]], Any]:
        def act(body: dict[str, Any]) -> dict[str, Any]:
            q = self.queue(body["queue"])
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
            if (every or len(ids or []) > 1) and body.get("confirmed") is not True:
                raise BadRequest(f'a bulk {verb} needs "confirmed": true')
            if verb == "retry":
                skip = body.get("skip", 0)
                if not isinstance(skip, int) or skip < 0:
                    raise BadRequest(f'"skip" must be a non-negative integer, not {skip!r}')
                return deadletters.retry(self.app, q, ids, skip)
            return deadletters.purge(self.app, q, ids)
        return act

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
            Route("/api/queue/pause", self._action(self.pause(True)), methods=["POST"]),
            Route("/api/queue/resume", self._action(self.pause(False)), methods=["POST"]),
            Route("/api/dead/retry", self._action(self.dead_action("retry")),
                  methods=["POST"]),
            Route("/api/dead/purge", self._action(self.dead_action("purge")),
                  methods=["POST"]),
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
    return Guard(inner, token=token, csrf=console.csrf, read_only=read_only,
                 actions=ACTIONS, login_page=console.login_page())
