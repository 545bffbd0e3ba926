"""The console's circuit breakers page: each breaker the app declares (``batchq.flow.breaker``)
with its state in Redis, its trips and the jobs its tasks re-routed, and an operator's
open or close (CSRF-protected and audited like every action).

GET  /api/breakers                   the breakers: state, time left open, failures, trips
POST /api/breaker/open               {"name", "seconds"?} (default: its open_s)
POST /api/breaker/close              {"name"}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..flow.breaker import Breaker, states
from . import params
from .params import BadRequest

if TYPE_CHECKING:
    from ..tasks.app import App
    from .act import Act, ConsoleLike

PAGES = {"/breakers": "breakers"}
ACTIONS = frozenset({"/api/breaker/open", "/api/breaker/close"})
MAX_OPEN_S = 86400.0


def listing(app: App) -> dict[str, Any]:
    brs: dict[str, Breaker] = getattr(app, "breakers", {})
    rows = []
    r = app.redis
    for st in states(brs):
        d = st.as_dict()
        bound = [t for t in app.tasks.values() if t.config.breaker == st.name]
        d["tasks"] = [{"task": t.name, "fallback": t.config.fallback,
                       "rerouted": int(r.hget(app.keys(t.config.queue).stats,
                                              f"rerouted:{t.name}") or 0)} for t in bound]
        rows.append(d)
    return {"breakers": rows}


def routes(console: ConsoleLike) -> list[Route]:
    app = console.app

    async def api_breakers(request: Request) -> Response:
        return await console.call(lambda: listing(app), cache_key=str(request.url))

    def named(act: Act) -> Breaker:
        name = params.body_str(act.body, "name")
        brs: dict[str, Breaker] = getattr(app, "breakers", {})
        if name not in brs:
            raise BadRequest(f"no breaker named {name[:80]!r}")
        act.target = f"breaker {name}"
        return brs[name]

    def open_(act: Act) -> dict[str, Any]:
        b = named(act)
        secs = params.body_number(act.body, "seconds")
        if secs is None:
            secs = b.config.open_s
        if not 0 < secs <= MAX_OPEN_S:
            raise BadRequest(f'"seconds" must be a number in (0, {MAX_OPEN_S:g}], not '
                             f"{secs!r}")
        act.detail = f"{secs:g}s"
        before, _ = b.open(float(secs))
        act.detail += f" (was {before})"
        return {"name": b.name, "state": "open", "was": before}

    def close(act: Act) -> dict[str, Any]:
        b = named(act)
        before, left = b.close()
        act.detail = f"was {before}"
        return {"name": b.name, "state": "closed", "was": before, "open_left_s": left}

    return [
        Route("/api/breakers", api_breakers),
        Route("/api/breaker/open", console.action("breaker_open", open_), methods=["POST"]),
        Route("/api/breaker/close", console.action("breaker_close", close),
              methods=["POST"]),
    ]
