"""The console's live feed of job events in a real headless Chromium: the events a
cancel and a hold wrote are listed, a new one appears without a reload, a queue with
events off says so, and the JSON API refuses bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import batchq
from batchq.web import WebServer

from .conftest import http
from .test_browser import click, shot, text

pytestmark = pytest.mark.e2e


def _kinds(browser: Any) -> list[str]:
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR,
                                                  '#events-rows td[data-col="kind"]')]


def test_events_page_lists_and_follows(browser: Any, console: WebServer, capp: batchq.App,
                                       tmp_path: Path) -> None:
    q = capp.queue("side")
    q.events(max_len=1000)
    try:
        jid = capp.tasks["side"].options(delay_s=600).enqueue(1)
        assert capp.cancel(jid)
        q.hold(30)
        browser.get(console.url + "events?queue=side")
        WebDriverWait(browser, 15).until(lambda d: "held" in _kinds(d))
        row = browser.find_element(By.CSS_SELECTOR, f'#events-rows tr[data-job="{jid}"]')
        assert "cancelled" in row.text and "side" in row.text
        assert _kinds(browser)[0] == "held"  # newest first
        q.release()  # a new event, shown by the next poll
        WebDriverWait(browser, 15).until(lambda d: _kinds(d)[:1] == ["hold_lifted"])
        assert _kinds(browser).count("cancelled") == 1, "no event listed twice"
        shot(browser, tmp_path, "events")
        q.events(False)
        browser.get(console.url)
        click(browser, 'nav a[data-nav="events"]')
        WebDriverWait(browser, 15).until(
            lambda d: "events are off" in d.find_element(By.ID, "events-state").text)
        assert "side" in text(browser, "#events-state")
    finally:
        q.events(False)


def test_events_api_checks_its_input(console: WebServer) -> None:
    for query in ("queue=a%7Bb", "queue=side&limit=0", "queue=side&since=nope",
                  "queue=side&since=%5B1%5D"):
        res = http("GET", console.url + "api/events?" + query)
        assert res.status == 400, (query, res.text)
    res = http("GET", console.url + "api/events?queue=side&limit=5")
    assert res.status == 200 and set(res.json()) == {"events", "next", "enabled"}
