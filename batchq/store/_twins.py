"""Sync and asyncio twins from one I/O-free core.

A core is a generator: it yields the I/O it needs as an ``Op`` (a script call, a plain
command, a pipeline, a sleep) and gets the reply back from ``send``, or the error by
``throw``, so its ``try``/``except``/``finally`` read as if the call were inline. Cores
compose with ``yield from`` and return their result. Two shells drive them: ``run``
does each op blocking, ``arun`` awaits it. Ops a core leaves to its shell (``Local``)
go to the shell's ``on`` callback. Nothing here imports redis: the ops reach their
client through the ``Clients`` they are given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .scripts.calls import Call

T = TypeVar("T")


class Clients(Protocol):
    """What the ops need of ``clients.Clients`` (which builds its cores from here)."""

    @property
    def redis(self) -> Any: ...

    @property
    def sync_scripts(self) -> Any: ...

    def async_redis(self) -> Any: ...

    def async_scripts(self) -> Any: ...


class Op:
    """One piece of I/O a core asks for."""

    __slots__ = ()

    def run(self) -> Any:
        raise NotImplementedError

    async def arun(self) -> Any:
        raise NotImplementedError


Core = Generator[Op, Any, T]
"""A core returning ``T``."""


class Local(Op):
    """An op each shell does its own way (its ``on`` callback)."""

    __slots__ = ()


class Sleep(Op):
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self) -> None:
        time.sleep(self.seconds)

    async def arun(self) -> None:
        await asyncio.sleep(self.seconds)


class Script(Op):
    """One script call over the clients' sync scripts, or the running loop's."""

    __slots__ = ("c", "call")

    def __init__(self, c: Clients, call: Call) -> None:
        self.c, self.call = c, call

    def run(self) -> Any:
        return self.c.sync_scripts.call(self.call)

    async def arun(self) -> Any:
        return await self.c.async_scripts().call(self.call)


class Command(Op):
    """One plain command: ``method(*args, **kwargs)`` of the sync or the loop's client."""

    __slots__ = ("args", "c", "kwargs", "method")

    def __init__(self, c: Clients, method: str, *args: Any, **kwargs: Any) -> None:
        self.c, self.method, self.args, self.kwargs = c, method, args, kwargs

    def run(self) -> Any:
        return getattr(self.c.redis, self.method)(*self.args, **self.kwargs)

    async def arun(self) -> Any:
        return await getattr(self.c.async_redis(), self.method)(*self.args, **self.kwargs)


class Pipeline(Op):
    """Plain commands in one round trip (no transaction); replies in order."""

    __slots__ = ("c", "commands")

    def __init__(self, c: Clients, commands: Sequence[tuple[str, tuple[Any, ...],
                                                            dict[str, Any]]]) -> None:
        self.c, self.commands = c, commands

    def run(self) -> Any:
        pipe = self.c.redis.pipeline(transaction=False)
        for method, args, kwargs in self.commands:
            getattr(pipe, method)(*args, **kwargs)
        return pipe.execute()

    async def arun(self) -> Any:
        pipe = self.c.async_redis().pipeline(transaction=False)
        for method, args, kwargs in self.commands:
            getattr(pipe, method)(*args, **kwargs)
        return await pipe.execute()


class Do(Op):
    """``sync(*args)`` in the sync shell, ``await asyn(*args)`` in the async one."""

    __slots__ = ("args", "asyn", "sync")

    def __init__(self, sync: Callable[..., Any], asyn: Callable[..., Awaitable[Any]],
                 *args: Any) -> None:
        self.sync, self.asyn, self.args = sync, asyn, args

    def run(self) -> Any:
        return self.sync(*self.args)

    async def arun(self) -> Any:
        return await self.asyn(*self.args)


def run(core: Core[T], on: Callable[[Local], Any] | None = None) -> T:
    """Drive ``core`` with blocking I/O; ``on`` does its ``Local`` ops."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = core.send(value) if error is None else core.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = on(op) if on is not None and isinstance(op, Local) else op.run()
        except BaseException as exc:  # back into the core, at its yield
            error = exc


async def arun(core: Core[T], on: Callable[[Local], Awaitable[Any]] | None = None) -> T:
    """Drive ``core`` on the running event loop; ``on`` does its ``Local`` ops."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = core.send(value) if error is None else core.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = await (on(op) if on is not None and isinstance(op, Local)
                           else op.arun())
        except BaseException as exc:
            error = exc
