"""The fault proxy itself: pass-through, pause, blackhole, resets and cut replies."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from fixtures.proxy import Proxy
from redis.backoff import NoBackoff
from redis.retry import Retry

pytestmark = pytest.mark.fault


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with Proxy(port) as p:
        yield p


def client(p: Proxy, timeout_s: float = 2.0) -> redis.Redis:
    # no silent retries: a reset must surface as an error
    return redis.Redis.from_url(p.url, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


def test_pass_through(proxy: Proxy, namespace: str) -> None:
    c = client(proxy)
    key = f"{namespace}:x"
    c.set(key, b"v" * 100_000)
    assert c.get(key) == b"v" * 100_000
    assert proxy.accepted == 1
    c.delete(key)
    c.close()


def test_reset_all_breaks_open_connections_and_new_ones_work(proxy: Proxy) -> None:
    c = client(proxy)
    assert c.ping()
    assert proxy.reset_all() == 1
    # redis-py notices the reset of an idle pooled connection and connects again
    assert c.ping()
    assert proxy.accepted == 2 and proxy.resets == 1
    c.close()


def test_reset_all_with_match_hits_only_blocked_connections(proxy: Proxy,
                                                            namespace: str) -> None:
    blocked = client(proxy, timeout_s=10)
    other = client(proxy)
    assert other.ping()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            blocked.blpop([f"{namespace}:never"], timeout=5)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)
    assert proxy.reset_all(match=b"BLPOP") == 1
    t.join(5)
    assert errors and isinstance(errors[0], redis.ConnectionError), errors
    assert other.ping()  # untouched
    blocked.close()
    other.close()


def test_blackhole_times_out_and_resets_the_connections_that_lost_bytes(proxy: Proxy) -> None:
    lost = client(proxy, timeout_s=0.3)
    idle = client(proxy)
    assert lost.ping() and idle.ping()
    proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        lost.ping()
    assert proxy.dropped_bytes > 0
    assert proxy.blackhole(False) >= 0  # the timed-out client closed its own side
    assert idle.ping()  # lost nothing: still in sync
    assert lost.ping()
    lost.close()
    idle.close()


def test_pause_holds_bytes_until_resumed(proxy: Proxy) -> None:
    c = client(proxy, timeout_s=5)
    assert c.ping()
    proxy.pause()
    got: list[float] = []
    t0 = time.monotonic()
    t = threading.Thread(target=lambda: got.append(c.ping() and time.monotonic() - t0))
    t.start()
    time.sleep(0.5)
    assert not got
    proxy.pause(False)
    t.join(5)
    assert got and got[0] >= 0.5
    c.close()


def test_reset_after_reply_cuts_the_matching_reply(proxy: Proxy, namespace: str) -> None:
    c = client(proxy)
    key = f"{namespace}:big"
    c.set(key, b"x" * 1000)
    cut = proxy.reset_after_reply(10, match=b"GET")
    assert c.ping()  # not matched: passes
    with pytest.raises(redis.ConnectionError):
        c.get(key)
    assert cut.fired.is_set()
    assert cut.head == b"$1000\r\nxxx"
    assert c.get(key) == b"x" * 1000  # the trap was one-shot
    c.delete(key)
    c.close()
