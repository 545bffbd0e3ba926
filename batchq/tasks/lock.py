"""Named distributed locks: ``with app.lock("nightly-export", ttl_s=60): ...``.

The classic Redis lock, with the known traps avoided:

- **Acquire** (``lock_acquire.lua``): ``SET token NX PX ttl`` with a random token, and in
  the same atomic call ``INCR`` of the lock's fence counter. The result is the fencing
  token (``lock.fence``): it grows with every acquisition, so a resource that remembers
  the highest fence it saw can refuse a holder that was paused past its lease.
- **Release** (``lock_release.lua``): compare-and-delete. The token is kept until the
  server answered: a release whose connection broke is retried with the same token, so
  a network error never strands the lock until its TTL.
- **Extend** (``lock_extend.lua``): compare-and-extend; a lock that expired is never
  re-created by an extend.
- Leases are counted by the server (PX, PEXPIRE), never by this process's clock.

Each lock has its own hash tag, ``NS:{NS:lock:<name>}:token`` and ``...:fence``, so both
keys sit in one Cluster slot. The fence counter never expires (a few bytes per lock
name) so fencing tokens never go backwards.
"""

from __future__ import annotations

import random
import secrets
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import redis

from ..store._twins import Core, Script, Sleep, arun, run
from ..store.keys import lock_keys
from ..store.scripts import calls
from .durations import check_ms, check_seconds
from .errors import LockLost, LockNotAcquired

if TYPE_CHECKING:
    from ..store.clients import Clients

RETRY_DELAYS_S = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Backoff between tries of a lock call whose connection failed (about 4 s in all)."""

_RETRY_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.TryAgainError,
                 redis.exceptions.ClusterError, RuntimeError)
"""A lost connection (uvloop raises RuntimeError on a reset one) or a moving Cluster
slot: the call may be retried with the same token, every lock script is idempotent for
its token."""

WAIT_MIN_S = 0.02
WAIT_MAX_S = 1.0
"""Bounds of the pause between tries of a blocking acquire (doubling, with jitter, and
never past the holder's remaining lease)."""

def _ms(value: float, what: str) -> int:
    return check_ms(what, value)


def token_owner(token: bytes | str | None) -> str | None:
    """The owner label a token was made with (``Lock(owner=...)``), else ``None``."""
    if token is None:
        return None
    text = token.decode() if isinstance(token, bytes) else token
    owner, sep, _ = text.rpartition("/")
    return owner if sep else None


class Lock:
    """A named lock of an app, usable with ``with`` and ``async with``.

    ``ttl_s``: the lease; the lock frees itself that long after its last acquire or
    extend, should this process die or hang. ``blocking_timeout_s``: how long an acquire
    waits for a holder to let go; ``0`` (the default) tries once and fails at once,
    ``None`` waits without limit. Waiting retries with a doubling pause (20 ms to 1 s,
    never past the holder's remaining lease). ``owner``: an optional label stored in
    front of the random token (shown by tooling, e.g. the periodic scheduler's leader).

    ``acquire`` raises ``LockNotAcquired``; ``extend`` and leaving the block raise
    ``LockLost`` when the lease ran out (or another holder took it) in between.
    """

    def __init__(self, clients: Clients, name: str, *, ttl_s: float = 60.0,
                 blocking_timeout_s: float | None = 0.0, owner: str | None = None) -> None:
        self.clients = clients
        self.name = name
        self.keys = lock_keys(clients.namespace, name)
        self.ttl_ms = _ms(ttl_s, "ttl_s")
        if blocking_timeout_s is not None:
            check_seconds("blocking_timeout_s", blocking_timeout_s)
        self.blocking_timeout_s = blocking_timeout_s
        if owner is not None and ("/" in owner or not owner):
            raise ValueError(f"invalid lock owner {owner!r}: non-empty, without '/'")
        self.owner = owner
        self.token: str | None = None
        """The random token while this object holds the lock (kept until a release was
        confirmed by the server)."""
        self.fence: int | None = None
        """The fencing token of the current (or last) acquisition; grows every time."""

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} held={self.held} fence={self.fence}>"

    @property
    def held(self) -> bool:
        """Whether this object believes it holds the lock (the server decides: see
        ``extend``)."""
        return self.token is not None

    def _new_token(self) -> str:
        t = secrets.token_hex(16)
        return f"{self.owner}/{t}" if self.owner else t

    # --- the cores: one acquire, release and extend for both shells ------------------

    def _retrying(self, c: calls.Call) -> Core[Any]:
        """One call, retried while the connection fails (every lock script is
        idempotent for its token)."""
        for pause in RETRY_DELAYS_S:
            try:
                return (yield Script(self.clients, c))
            except _RETRY_ERRORS:
                yield Sleep(pause)
        return (yield Script(self.clients, c))

    def _trying(self) -> Core[tuple[bool, int, int]]:
        self._check_not_held()
        token = self._new_token()
        fence, now_ms, ttl_ms = yield from self._retrying(
            calls.lock_acquire(self.keys, token, self.ttl_ms))
        if fence:
            self._took(token, int(fence))
        return bool(fence), int(now_ms), int(ttl_ms)

    def _acquiring(self) -> Core[int]:
        self._check_not_held()
        deadline = None if self.blocking_timeout_s is None \
            else time.monotonic() + self.blocking_timeout_s
        pause = WAIT_MIN_S
        while True:
            ok, _, ttl_ms = yield from self._trying()
            if ok:
                assert self.fence is not None
                return self.fence
            sleep_s = self._next_pause(pause, ttl_ms, deadline)
            if sleep_s is None:
                raise self._not_acquired()
            yield Sleep(sleep_s)
            pause = min(pause * 2, WAIT_MAX_S)

    def _releasing(self) -> Core[None]:
        token = self._require_held()
        hit_error = False
        freed = 0
        for pause in (*RETRY_DELAYS_S, None):
            try:
                freed = yield Script(self.clients, calls.lock_release(self.keys, token))
                break
            except _RETRY_ERRORS:
                if pause is None:
                    raise  # the token stays: release() may be called again; else the TTL
                hit_error = True
                yield Sleep(pause)
        self._released(freed, hit_error)

    def _extending(self, ttl_s: float | None) -> Core[int]:
        token = self._require_held()
        ttl_ms = self.ttl_ms if ttl_s is None else _ms(ttl_s, "ttl_s")
        ok, now_ms = yield from self._retrying(calls.lock_extend(self.keys, token, ttl_ms))
        self._extended(int(ok))
        return int(now_ms)

    # --- sync and asyncio shells --------------------------------------------------------

    def acquire(self) -> int:
        """Take the lock, waiting up to ``blocking_timeout_s``; returns the fence."""
        return run(self._acquiring())

    def release(self) -> None:
        """Let the lock go. Raises ``LockLost`` when it had expired or changed hands."""
        run(self._releasing())

    def extend(self, ttl_s: float | None = None) -> None:
        """Reset the lease to ``ttl_s`` (default: the lock's ``ttl_s``) from now, if this
        object still holds the lock; raises ``LockLost`` if it does not."""
        run(self._extending(ttl_s))

    async def try_aacquire(self) -> tuple[bool, int, int]:
        """One non-blocking try: ``(acquired, server_now_ms, holder_ttl_ms)``. For loops
        that wait in their own way (the periodic scheduler)."""
        return await arun(self._trying())

    async def aacquire(self) -> int:
        """``acquire`` for asyncio code."""
        return await arun(self._acquiring())

    async def arelease(self) -> None:
        """``release`` for asyncio code."""
        await arun(self._releasing())

    async def aextend(self, ttl_s: float | None = None) -> int:
        """``extend`` for asyncio code; returns the server time (ms) of the extend."""
        return await arun(self._extending(ttl_s))

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    async def __aenter__(self) -> Lock:
        await self.aacquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._exited(exc, run(self._leaving()))

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._exited(exc, await arun(self._leaving()))

    def _leaving(self) -> Core[LockLost | None]:
        """Release on leaving a block; a ``LockLost`` is returned for ``_exited``."""
        try:
            yield from self._releasing()
        except LockLost as lost:
            return lost
        return None

    @staticmethod
    def _exited(exc: BaseException | None, lost: LockLost | None) -> None:
        if lost is None:
            return
        if exc is None:
            raise lost
        exc.add_note(str(lost))  # the body's own error matters more; keep both visible

    # --- shared bookkeeping -------------------------------------------------------------

    def _check_not_held(self) -> None:
        if self.token is not None:
            raise RuntimeError(f"lock {self.name!r} is already held by this object")

    def _require_held(self) -> str:
        if self.token is None:
            raise RuntimeError(f"lock {self.name!r} is not held by this object")
        return self.token

    def _took(self, token: str, fence: int) -> int:
        self.token = token
        self.fence = fence
        return fence

    def _next_pause(self, pause: float, holder_ttl_ms: int, deadline: float | None,
                    ) -> float | None:
        """How long to wait before the next try, or ``None`` when the time is up."""
        wait = pause * random.uniform(0.5, 1.0)
        if holder_ttl_ms > 0:  # -1: a holder without a lease (set by hand): keep backing off
            wait = min(wait, holder_ttl_ms / 1000 + 0.001)
        if deadline is None:
            return wait
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        return min(wait, left)

    def _not_acquired(self) -> LockNotAcquired:
        waited = self.blocking_timeout_s
        how = "at once" if not waited else f"within {waited}s"
        return LockNotAcquired(self.name, f"lock {self.name!r} is held by another owner; "
                                          f"not acquired {how}")

    def _released(self, freed: int, hit_error: bool) -> None:
        self.token = None
        # After a broken connection a 0 is ambiguous (the first try may have freed it).
        if not freed and not hit_error:
            raise LockLost(self.name, f"lock {self.name!r} was lost before its release: "
                                      "its lease ran out or another owner took it")

    def _extended(self, ok: int) -> None:
        if not ok:
            self.token = None
            raise LockLost(self.name, f"lock {self.name!r} was lost: its lease ran out "
                                      "or another owner took it; not extended")


def holder(clients: Clients, name: str) -> str | None:
    """The token of the current holder of lock ``name`` (``None``: free)."""
    raw = clients.redis.get(lock_keys(clients.namespace, name).token)
    return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)

