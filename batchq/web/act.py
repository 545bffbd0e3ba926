"""One console action as the audit log records it (``routes.Console.action`` makes it,
the action fills it in), and what the operator's routes need of the console."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response

if TYPE_CHECKING:
    from ..ops.queue import Queue
    from ..tasks.app import App
    from .rates import RateTracker


@dataclass
class Act:
    """``who`` took it, ``action`` (a name of ``batchq.ops.audit.ACTIONS``), the parsed
    ``body``; the action sets ``target`` and ``detail`` (what was set) as soon as it
    knows them, so a refused action is recorded with them too."""

    who: str
    action: str
    body: dict[str, Any]
    target: str = ""
    detail: str = ""


class ConsoleLike(Protocol):
    """The part of ``routes.Console`` the operator's routes (``operate``) use."""

    app: App
    rates: RateTracker

    def queue(self, name: str) -> Queue: ...

    def queue_of(self, act: Act) -> Queue: ...

    async def call(self, fn: Callable[[], Any], cache_key: str | None = None) -> Response: ...

    def action(self, name: str, fn: Callable[[Act], Any]
               ) -> Callable[[Request], Awaitable[Response]]: ...
