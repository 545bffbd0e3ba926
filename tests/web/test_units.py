"""The console's pure parts: rates from counter samples, the bind rule, derived secrets."""

from __future__ import annotations

import pytest

from batchq.web import InsecureBindError, check_bind, is_loopback
from batchq.web.rates import KEEP_S, RateTracker
from batchq.web.security import csrf_value, session_value

pytestmark = pytest.mark.unit


def test_rates_over_a_window() -> None:
    r = RateTracker()
    assert r.rates("q", now=0.0) is None
    r.record("q", 100, 50, now=0.0)
    assert r.rates("q", now=0.5) is None  # one sample: no rate yet
    r.record("q", 110, 52, now=0.5)  # under a second after the last: not kept
    r.record("q", 200, 70, now=10.0)
    assert r.rates("q", now=10.0) == (10.0, 2.0)
    r.record("q", 800, 670, now=70.0)
    # the 60 s window starts at the sample at 10 s: (800-200)/60, (670-70)/60
    assert r.rates("q", 60.0, now=70.0) == (10.0, 10.0)
    assert r.rates("q", 300.0, now=70.0) == (10.0, 620 / 70)


def test_a_counter_reset_starts_over_and_old_samples_go() -> None:
    r = RateTracker()
    r.record("q", 100, 100, now=0.0)
    r.record("q", 200, 200, now=5.0)
    r.record("q", 3, 0, now=6.0)  # the queue was cleared
    assert r.rates("q", now=6.0) is None
    r.record("q", 13, 5, now=8.0)
    assert r.rates("q", now=8.0) == (5.0, 2.5)
    r.record("q", 13, 5, now=8.0 + KEEP_S + 10)
    assert r.rates("q", now=8.0 + KEEP_S + 10) is None  # only one sample left


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_token(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.0.0.5", "example.com",
                                  "localhost.example.com"])
def test_anything_else_needs_a_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(InsecureBindError, match="without a token"):
        check_bind(host, None)
    check_bind(host, "x" * 16)


def test_short_tokens_are_refused() -> None:
    with pytest.raises(InsecureBindError, match=r"too short \(15 characters"):
        check_bind("127.0.0.1", "x" * 15)


def test_the_cookie_and_csrf_never_carry_the_token() -> None:
    token = "the-token-0123456789"
    assert token not in session_value(token) and session_value(token) != csrf_value(token)
    assert csrf_value(token) == csrf_value(token)  # replicas with one token agree
    assert csrf_value(None) != csrf_value(None)  # without one: random per process
