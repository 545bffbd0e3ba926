"""``app.lock``: mutual exclusion across real processes, fencing tokens, expiry and
``LockLost``, compare-token extend, blocking and non-blocking acquire, asyncio, and a
release whose reply is lost on the network."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from fixtures.proxy import Proxy
from helpers import cli_env, wait_until

import batchq
from batchq.store.keys import lock_keys
from batchq.store.scripts import _Lua
from batchq.tasks import lock as lock_mod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def app(redis_url: str, namespace: str, redis_client: redis.Redis) -> Iterator[batchq.App]:
    a = batchq.App(redis_url, namespace)
    yield a
    a.close()
    keys = list(redis_client.scan_iter(match=f"{namespace}*", count=1000))
    if keys:
        redis_client.delete(*keys)


CHILD = r"""
import os, sys, time
import batchq
url, ns, log, go, n = sys.argv[1:6]
app = batchq.App(url, ns)
while not os.path.exists(go):
    time.sleep(0.005)
for _ in range(int(n)):
    with app.lock("shared", ttl_s=10, blocking_timeout_s=None) as lk:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"enter {os.getpid()} {lk.fence}\n".encode())
        time.sleep(0.003)
        os.write(fd, f"exit {os.getpid()} {lk.fence}\n".encode())
        os.close(fd)
"""


def test_mutual_exclusion_across_processes_and_fences_grow(redis_url, namespace, tmp_path,
                                                           app):
    log, go, prog = tmp_path / "log", tmp_path / "go", tmp_path / "child.py"
    prog.write_text(CHILD)
    n_procs, n_each = 4, 12
    procs = [subprocess.Popen([sys.executable, str(prog), redis_url, namespace, str(log),
                               str(go), str(n_each)], env=cli_env())
             for _ in range(n_procs)]
    go.touch()
    try:
        for p in procs:
            assert p.wait(timeout=50) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 2 * n_procs * n_each
    fences = []
    # the file's append order is a total order: every enter is followed by its own exit
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter[0] == "enter" and leave[0] == "exit", (enter, leave)
        assert enter[1:] == leave[1:]
        fences.append(int(enter[2]))
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    assert len({line[1] for line in lines}) == n_procs  # everyone got its turn
    assert app.redis.exists(lock_keys(app.namespace, "shared").token) == 0


def test_fence_grows_across_holders_and_outlives_the_lock(app):
    seen = []
    for _ in range(3):
        with app.lock("f", ttl_s=5) as lk:
            seen.append(lk.fence)
    short = app.lock("f", ttl_s=0.05)
    short.acquire()
    assert short.fence is not None
    seen.append(short.fence)
    wait_until(lambda: not app.redis.exists(lock_keys(app.namespace, "f").token))
    with app.lock("f") as lk:
        seen.append(lk.fence)
    assert seen == sorted(seen) and len(set(seen)) == 5


def test_held_lock_is_not_acquired_by_another(app):
    with app.lock("busy", ttl_s=10) as holder:
        assert holder.held and holder.token
        with pytest.raises(batchq.LockNotAcquired, match="'busy'") as info:
            app.lock("busy").acquire()
        assert info.value.name == "busy"
        t0 = time.monotonic()
        with pytest.raises(batchq.LockNotAcquired, match=r"within 0\.3s"):
            app.lock("busy", blocking_timeout_s=0.3).acquire()
        assert time.monotonic() - t0 >= 0.3  # it did wait that long (a lower bound)
        assert app.redis.get(holder.keys.token) == holder.token.encode()
    assert not holder.held


def test_blocking_acquire_gets_the_lock_when_the_holder_lets_go(app):
    holder = app.lock("handover", ttl_s=30)
    holder.acquire()
    got: list[int] = []

    def wait_for_it() -> None:
        with app.lock("handover", ttl_s=30, blocking_timeout_s=None) as lk:
            assert lk.fence is not None
            got.append(lk.fence)

    t = threading.Thread(target=wait_for_it)
    t.start()
    time.sleep(0.2)
    assert got == []  # still waiting
    holder.release()
    t.join(10)
    assert holder.fence is not None and got == [holder.fence + 1]


def test_a_lock_lost_to_expiry_raises_on_exit_and_never_frees_the_new_owner(app):
    key = lock_keys(app.namespace, "exp").token
    with pytest.raises(batchq.LockLost, match="'exp'"):  # noqa: SIM117
        with app.lock("exp", ttl_s=0.1):
            wait_until(lambda: not app.redis.exists(key), timeout_s=5)
            other = app.lock("exp", ttl_s=30)
            other.acquire()
    assert other.token is not None
    assert app.redis.get(key) == other.token.encode()  # the late release did not free it
    other.release()

    # expired and nobody took it: still lost
    lk = app.lock("exp", ttl_s=0.1)
    lk.acquire()
    wait_until(lambda: not app.redis.exists(key), timeout_s=5)
    with pytest.raises(batchq.LockLost):
        lk.release()
    assert not lk.held


def test_the_body_error_wins_over_lock_lost(app):
    key = lock_keys(app.namespace, "both").token
    with pytest.raises(KeyError) as info:  # noqa: SIM117
        with app.lock("both", ttl_s=0.1):
            wait_until(lambda: not app.redis.exists(key), timeout_s=5)
            raise KeyError("from the body")
    assert any("was lost" in n for n in getattr(info.value, "__notes__", []))


def test_extend_resets_the_lease_and_is_refused_once_lost(app):
    key = lock_keys(app.namespace, "ext").token
    lk = app.lock("ext", ttl_s=1)
    lk.acquire()
    lk.extend(ttl_s=60)
    assert 59_000 < app.redis.pttl(key) <= 60_000
    lk.extend()
    assert app.redis.pttl(key) <= 1_000

    # another object with a token that is not the holder's (forged) is refused
    thief = app.lock("ext", ttl_s=60)
    thief.token = "not-the-holders"
    with pytest.raises(batchq.LockLost):
        thief.extend()
    assert app.redis.pttl(key) <= 1_000
    assert lk.token is not None and app.redis.get(key) == lk.token.encode()

    app.redis.delete(key)  # the lease ran out
    with pytest.raises(batchq.LockLost):
        lk.extend()
    assert not lk.held and app.redis.exists(key) == 0  # never re-created


def test_asyncio_lock(app):
    async def main() -> list[str]:
        order: list[str] = []

        async def first() -> None:
            async with app.lock("alock", ttl_s=10):
                order.append("first in")
                await asyncio.sleep(0.2)
                order.append("first out")

        async def second() -> None:
            await asyncio.sleep(0.05)
            with pytest.raises(batchq.LockNotAcquired):
                await app.lock("alock").aacquire()
            async with app.lock("alock", ttl_s=10, blocking_timeout_s=None) as lk:
                order.append("second in")
                assert await lk.aextend(ttl_s=20) > 0
            assert not lk.held

        await asyncio.gather(first(), second())

        lost = app.lock("alock", ttl_s=0.1)
        with pytest.raises(batchq.LockLost):
            async with lost:
                key = lost.keys.token
                while await app.async_redis().exists(key):
                    await asyncio.sleep(0.02)
        await app.aclose()
        return order

    assert asyncio.run(main()) == ["first in", "first out", "second in"]


def test_bad_lock_arguments_name_the_value(app):
    with pytest.raises(ValueError, match="invalid lock name 'a b'"):
        app.lock("a b")
    with pytest.raises(ValueError, match=r"ttl_s .* got 0"):
        app.lock("x", ttl_s=0)
    with pytest.raises(ValueError, match=r"ttl_s .* got inf"):
        app.lock("x", ttl_s=float("inf"))
    with pytest.raises(ValueError, match=r"blocking_timeout_s .* got -1"):
        app.lock("x", blocking_timeout_s=-1)
    lk = app.lock("x")
    with pytest.raises(RuntimeError, match="not held"):
        lk.release()
    with lk, pytest.raises(RuntimeError, match="already held"):
        lk.acquire()


# --- a release whose reply is lost ----------------------------------------------------


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    parts = urlsplit(redis_url)
    with Proxy(parts.port or 6379, db=int(parts.path.strip("/") or 0)) as p:
        yield p


RELEASE_SHA = _Lua("lock_release").sha.encode()


def test_a_release_whose_reply_is_cut_is_retried_with_the_same_token(proxy, namespace,
                                                                     app):
    via = batchq.App(proxy.url, namespace)
    try:
        lk = via.lock("net", ttl_s=60)
        lk.acquire()
        cut = proxy.reset_after_reply(0, match=RELEASE_SHA)
        lk.release()  # the first reply never arrives; the retry finds it done
        assert cut.fired.is_set()
        assert not lk.held
        assert app.redis.exists(lk.keys.token) == 0  # not stranded until its TTL
        with app.lock("net"):  # free for the next owner at once
            pass
    finally:
        via.close()


def test_a_release_that_cannot_reach_redis_keeps_the_token(redis_url, namespace, app,
                                                           monkeypatch):
    monkeypatch.setattr(lock_mod, "RETRY_DELAYS_S", (0.01, 0.01))
    parts = urlsplit(redis_url)
    p = Proxy(parts.port or 6379, db=int(parts.path.strip("/") or 0)).start()
    port = p.port
    via = batchq.App(p.url, namespace)
    try:
        lk = via.lock("down", ttl_s=60)
        lk.acquire()
        token = lk.token
        p.stop()
        with pytest.raises(redis.ConnectionError):
            lk.release()
        assert lk.held and lk.token == token  # not dropped: release() can be called again
        assert token is not None and app.redis.get(lk.keys.token) == token.encode()
        p = Proxy(parts.port or 6379, port=port, db=int(parts.path.strip("/") or 0)).start()
        lk.release()
        assert not lk.held and app.redis.exists(lk.keys.token) == 0
    finally:
        via.close()
        p.stop()
