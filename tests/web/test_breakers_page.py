"""The console's circuit breakers page in a real headless Chromium: a breaker's state as
Redis has it, open and close after a confirmation, each checked in Redis and in the
audit entry it leaves; both actions refused without the CSRF token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import batchq
from batchq.ops import audit
from batchq.web import WebServer

from .conftest import http, post_json
from .test_browser import click, shot, wait_text

pytestmark = pytest.mark.e2e


def test_breakers_page_opens_and_closes_a_breaker(browser: Any, console: WebServer,
                                                  capp: batchq.App, tmp_path: Path) -> None:
    b = capp.breakers["sms"]
    b.close()
    browser.get(console.url)
    click(browser, 'nav a[data-nav="breakers"]')
    wait_text(browser, "#breaker-state-sms", "closed")
    click(browser, "#breaker-open-sms")
    click(browser, "#confirm-yes")
    wait_text(browser, "#breaker-state-sms", "open")
    st = b.state()
    assert st.state == "open" and 500 < st.open_left_s <= 600  # its open_s
    e = audit.read(capp.redis, capp.namespace, 1)[0]
    assert (e.action, e.target, e.result) == ("breaker_open", "breaker sms", "ok")
    assert browser.find_element("css selector", 'tr[data-breaker="sms"] td[data-col="tasks"]'
                                ).text == "sms → sms_backup: 0 re-routed"
    shot(browser, tmp_path, "breakers")
    click(browser, "#breaker-close-sms")
    click(browser, "#confirm-yes")
    wait_text(browser, "#breaker-state-sms", "closed")
    assert b.state().state == "closed"
    e = audit.read(capp.redis, capp.namespace, 1)[0]
    assert (e.action, e.target, e.detail) == ("breaker_close", "breaker sms", "was open")


def test_breaker_actions_need_the_csrf_token_and_a_known_name(console: WebServer,
                                                              capp: batchq.App) -> None:
    b = capp.breakers["sms"]
    b.close()
    for path in ("api/breaker/open", "api/breaker/close"):
        res = http("POST", console.url + path, {"name": "sms"})
        assert res.status == 403 and "CSRF" in res.json()["error"], path
    assert b.state().state == "closed"
    res = post_json(console, "api/breaker/open", {"name": "nope"})
    assert res.status == 400 and "nope" in res.json()["error"]
    res = post_json(console, "api/breaker/open", {"name": "sms", "seconds": 0})
    assert res.status == 400 and b.state().state == "closed"
    res = http("GET", console.url + "api/breakers")
    [row] = res.json()["breakers"]
    assert (row["name"], row["state"], row["threshold"]) == ("sms", "closed", 3)
