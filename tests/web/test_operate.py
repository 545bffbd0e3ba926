"""The operator's pages in a real headless Chromium: campaigns (progress, cancel after a
confirmation naming the jobs that will not run), customers and limits (set and remove a
limit, hold and release a group and the queue), finding a job (cancel it; retry it once
dead), the audit log, and rates on the first paint. Every action is checked in Redis and
in the audit entry it leaves; every action is refused without the CSRF token.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from helpers import wait_until
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait
from workers import WorkerProcs

import batchq
from batchq.ops import audit
from batchq.web import WebServer, start_in_thread

from .conftest import csrf_of, http, post_json
from .test_browser import click, shot, text, wait_text

pytestmark = pytest.mark.e2e

TOKEN = "operate-test-token-0123456789"
NO_RATE = "\u2013"
"""What a rate cell shows while the rate is not known."""


@pytest.fixture(autouse=True)
def bulk_paused(capp: batchq.App) -> Iterator[None]:
    """Jobs of ``bulk`` stay ready (no test here runs them) and start from nothing."""
    bulk = capp.queue("bulk")
    bulk.clear()
    bulk.pause()
    yield
    for lim in bulk.limits():
        bulk.remove_limit(lim.group)
    bulk.release()
    bulk.clear()


def last_audit(capp: batchq.App) -> audit.AuditEntry:
    return audit.read(capp.redis, capp.namespace, 1)[0]


def audit_count(capp: batchq.App) -> int:
    return len(audit.read(capp.redis, capp.namespace, 10_000))


def click_row(driver: Any, css: str) -> None:
    """Click an element of a table the page redraws every refresh (found again when
    the redraw replaced it between finding and clicking)."""
    def attempt(d: Any) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except (StaleElementReferenceException, NoSuchElementException):
            return False
    WebDriverWait(driver, 10).until(attempt)


def until_text(driver: Any, css: str, check: Any) -> None:
    """Wait until ``check(text of css)`` holds (redraws retried)."""
    WebDriverWait(driver, 10, ignored_exceptions=(StaleElementReferenceException,
                                                  NoSuchElementException)).until(
        lambda d: check(d.find_element(By.CSS_SELECTOR, css).text))


def fill(driver: Any, field_id: str, value: str) -> None:
    box = driver.find_element(By.ID, field_id)
    box.clear()
    if value:
        box.send_keys(value)


def test_campaigns_page_shows_progress_and_cancels_after_confirming(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    cid = f"promo-{uuid4().hex[:6]}"
    record = capp.tasks["record"]
    with capp.campaign(cid) as c:
        record.options(campaign=c, group="acme").enqueue_many([(n,) for n in range(6)])
    browser.get(console.url)
    click(browser, 'nav a[data-nav="campaigns"]')
    row = f'tr[data-campaign="{cid}"]'
    wait_text(browser, f'{row} td[data-col="pending"]', "6")
    assert text(browser, f'{row} td[data-col="progress"]').strip() == "0/6"
    assert text(browser, f'{row} td[data-col="state"]') == "sealed"
    assert text(browser, f'{row} td[data-col="rate"]') != NO_RATE  # known at the first look
    click_row(browser, f'{row} td[data-col="id"] a')
    wait_text(browser, "#campaign-state", "sealed")
    wait_text(browser, 'section[data-queue="bulk"] tr[data-group="acme"] td[data-col="pending"]',
              "6")
    shot(browser, tmp_path, "campaign")
    before = audit_count(capp)
    click(browser, "#cancel-campaign")
    wait_text(browser, "#confirm-text", f"Cancel campaign {cid}? Up to 6 pending jobs will "
              "not run (jobs already running finish).")
    click(browser, "#confirm-no")
    assert capp.campaign(cid).stats().state == "sealed" and audit_count(capp) == before
    click(browser, "#cancel-campaign")
    click(browser, "#confirm-yes")
    wait_text(browser, "#banner", f"Campaign {cid} cancelled: 6 jobs not started will not run")
    wait_text(browser, "#campaign-state", "cancelled")
    assert not browser.find_element(By.ID, "cancel-campaign").is_displayed()
    assert capp.campaign(cid).stats().state == "cancelled"
    e = last_audit(capp)
    assert (e.who, e.action, e.target, e.result, e.detail) == (
        "console", "campaign_cancel", f"campaign {cid}", "ok",
        "6 jobs not started will not run")


def test_customers_page_sets_limits_holds_and_releases(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    record = capp.tasks["record"]
    record.options(group="acme").enqueue_many([(n,) for n in range(3)])
    record.options(group="globex").enqueue_many([(n,) for n in range(2)])
    bulk = capp.queue("bulk")
    browser.get(console.url)
    click(browser, 'nav a[data-nav="groups"]')
    WebDriverWait(browser, 10).until(  # the options come with the first draw
        ec.presence_of_element_located((By.CSS_SELECTOR, '#queue-pick option[value="bulk"]')))
    Select(browser.find_element(By.ID, "queue-pick")).select_by_visible_text("bulk")
    acme, globex = 'tr[data-group="acme"]', 'tr[data-group="globex"]'
    wait_text(browser, f'{acme} td[data-col="ready"]', "3")
    wait_text(browser, f'{globex} td[data-col="pending"]', "2")

    # a group's own limit
    fill(browser, "limit-group", "acme")
    fill(browser, "limit-rate", "30")
    fill(browser, "limit-concurrency", "2")
    click(browser, "#limit-set")
    wait_text(browser, f'{acme} td[data-col="rate"]', "30")
    wait_text(browser, f'{acme} td[data-col="source"]', "own")
    assert {lim.group: lim.describe() for lim in bulk.limits()}["acme"] == \
        "rate 30/s concurrency 2"
    e = last_audit(capp)
    assert (e.action, e.target, e.result, e.detail) == (
        "limit_set", "queue bulk group acme", "ok", "rate 30/s concurrency 2")
    # every group's ("*"): globex inherits it
    fill(browser, "limit-group", "*")
    fill(browser, "limit-rate", "")
    fill(browser, "limit-concurrency", "5")
    click(browser, "#limit-set")
    wait_text(browser, f'{globex} td[data-col="source"]', "from *")
    wait_text(browser, f'{globex} td[data-col="concurrency"]', "5")
    assert last_audit(capp).target == "queue bulk group *"
    # a bad value: refused, said, and recorded as refused
    fill(browser, "limit-group", "acme")
    fill(browser, "limit-rate", "-5")
    click(browser, "#limit-set")
    wait_text(browser, "#banner", "rate_per_s must be in (0, 1e+06], got -5")
    assert last_audit(capp).result == "rate_per_s must be in (0, 1e+06], got -5"

    # hold and release a group (the row's name fills the forms)
    click_row(browser, f'{acme} a.pick-group')
    assert browser.find_element(By.ID, "hold-group").get_attribute("value") == "acme"
    fill(browser, "hold-seconds", "120")
    click(browser, "#hold")
    until_text(browser, f'{acme} td[data-col="held"]', lambda t: "(operator)" in t)
    e = last_audit(capp)
    assert (e.action, e.target, e.detail) == ("hold", "queue bulk group acme", "120s")
    shot(browser, tmp_path, "groups")
    click_row(browser, f'{acme} button.release-group')
    wait_text(browser, f'{acme} td[data-col="held"]', "-")
    e = last_audit(capp)
    assert (e.action, e.target, e.result) == ("release", "queue bulk group acme", "ok")

    # hold and release the whole queue
    fill(browser, "hold-group", "")
    fill(browser, "hold-seconds", "90")
    click(browser, "#hold")
    until_text(browser, "#queue-hold", lambda t: t.endswith("left"))
    assert bulk.holds().queue_s > 60 and last_audit(capp).target == "queue bulk"
    click(browser, "#release")
    wait_text(browser, "#queue-hold", "none")
    assert bulk.holds().queue_s == 0
    e = last_audit(capp)
    assert (e.action, e.target) == ("release", "queue bulk")

    # remove the group's own limit: it falls back to "*"
    fill(browser, "limit-group", "acme")
    click(browser, "#limit-rm")
    wait_text(browser, f'{acme} td[data-col="source"]', "from *")
    e = last_audit(capp)
    assert (e.action, e.target, e.detail) == ("limit_rm", "queue bulk group acme", "removed")


def test_find_a_job_cancel_it_and_retry_a_dead_one(
        browser: Any, console: WebServer, capp: batchq.App, workers: WorkerProcs,
        tmp_path: Path) -> None:
    jid = capp.tasks["record"].options(group="acme").enqueue(1)
    browser.get(console.url)
    click(browser, 'nav a[data-nav="find"]')
    browser.find_element(By.ID, "job-id-input").send_keys(jid)
    click(browser, "#find-form button")
    wait_text(browser, "#job-state", "ready")
    assert text(browser, "#job-group") == "acme" and text(browser, "#job-queue") == "bulk"
    assert text(browser, "#job-result") == "no"
    click(browser, "#job-cancel")
    wait_text(browser, "#job-state", "cancelled")
    assert capp.job_status(jid) == "cancelled"
    e = last_audit(capp)
    assert (e.action, e.target, e.detail) == ("job_cancel", f"job {jid}", "cancelled")

    dead_id = capp.tasks["explode"].enqueue(f"find-{uuid4().hex[:6]}")
    proc = workers.start("--burst", "-q", "default", serving=0)
    assert proc.wait(timeout=60) == 0, proc.read_log()
    wait_until(lambda: capp.job_status(dead_id) == "dead", message="the job died")
    browser.get(f"{console.url}job?id={dead_id}")
    wait_text(browser, "#job-state", "dead")
    assert text(browser, "#job-last-error").startswith("ValueError: boom find-")
    assert text(browser, "#job-attempts") == "1 of 1"
    assert text(browser, "#job-task") == "explode"
    assert not browser.find_elements(By.ID, "job-cancel")
    assert "null" not in text(browser, "#job-found")  # nothing absent is drawn as a word
    shot(browser, tmp_path, "job")
    click(browser, "#job-retry")
    wait_text(browser, "#job-state", "ready")  # no worker runs now: it waits
    e = last_audit(capp)
    assert (e.action, e.target, e.result, e.detail) == (
        "dead_retry", f"job {dead_id}", "ok", "1 retried")


NEW_ACTIONS = (("api/campaign/cancel", {"id": "nope", "confirmed": True}),
               ("api/limit/set", {"queue": "bulk", "group": "acme", "rate_per_s": 5}),
               ("api/limit/rm", {"queue": "bulk"}),
               ("api/hold", {"queue": "bulk", "seconds": 60}),
               ("api/release", {"queue": "bulk"}),
               ("api/job/cancel", {"id": "x" * 20}),
               ("api/job/retry", {"id": "x" * 20}))


def test_every_new_action_needs_the_csrf_token(browser: Any, console: WebServer,
                                              capp: batchq.App) -> None:
    before = audit_count(capp)
    for path, body in NEW_ACTIONS:
        res = http("POST", console.url + path, body)
        assert res.status == 403 and "CSRF" in res.json()["error"], path
        res = http("POST", console.url + path, body, {"X-CSRF-Token": "guess"})
        assert res.status == 403, path
    assert capp.queue("bulk").limits() == [] and capp.queue("bulk").holds().queue_s == 0
    assert audit_count(capp) == before  # a refused request is no action
    # the same from a page of the console whose script forgets the token
    browser.get(console.url + "audit")
    status = browser.execute_async_script(
        "const done = arguments[0]; fetch('/api/hold', {method: 'POST', headers: "
        "{'Content-Type': 'application/json'}, body: JSON.stringify({queue: 'bulk', "
        "seconds: 60})}).then(r => done(r.status));")
    assert status == 403 and capp.queue("bulk").holds().queue_s == 0


def test_audit_page_lists_entries_as_text_with_the_user(
        browser: Any, capp: batchq.App, tmp_path: Path) -> None:
    audit.record(capp.redis, capp.namespace, who="cli:ops", action="pause",
                 target="queue <b>x</b>", result="ok", detail="<img src=x onerror=alert(3)>")
    web = start_in_thread(capp, port=0, token=TOKEN)
    try:
        alice = {"Authorization": "Basic " + base64.b64encode(
            f"alice:{TOKEN}".encode()).decode()}
        res = post_json(web, "api/hold", {"queue": "bulk", "group": "acme", "seconds": 30},
                        alice)
        assert res.status == 200, res.text
        e = last_audit(capp)
        assert (e.who, e.action, e.target) == ("console:alice", "hold",
                                               "queue bulk group acme")
        browser.get(web.url + "login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click(browser, "#login-submit")
        WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "main")))
        click(browser, 'nav a[data-nav="audit"]')
        first = f'tr[data-entry="{e.id}"]'
        wait_text(browser, f'{first} td[data-col="who"]', "console:alice")
        assert text(browser, f'{first} td[data-col="detail"]') == "30s"
        wait_text(browser, 'tr[data-entry] td[data-col="target"]', "queue bulk group acme")
        cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR,
                                                       'td[data-col="target"]')]
        assert "queue <b>x</b>" in cells
        assert not browser.find_elements(By.CSS_SELECTOR, "main b, main img")
        shot(browser, tmp_path, "audit")
    finally:
        browser.delete_all_cookies()
        web.stop()


def test_rates_are_there_at_the_first_paint(browser: Any, capp: batchq.App) -> None:
    capp.tasks["side"].options(delay_s=3600).enqueue(1)
    web = start_in_thread(capp, port=0)
    try:
        sampler = web.server.config.app.console.sampler
        wait_until(lambda: sampler.samples >= 2, message="two background samples")
        browser.get(web.url)
        cell = 'tr[data-queue="side"] td[data-col="in"]'
        WebDriverWait(browser, 10).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, cell)))
        # the first draw, not a later poll: the page has asked once
        assert text(browser, cell) != NO_RATE
        assert text(browser, 'tr[data-queue="side"] td[data-col="out"]') != NO_RATE
    finally:
        web.stop()


def test_the_pages_are_in_the_navigation(browser: Any, console: WebServer) -> None:
    browser.get(console.url)
    links = {a.get_attribute("data-nav"): a.get_attribute("href")
             for a in browser.find_elements(By.CSS_SELECTOR, "nav a")}
    assert {k: v.removeprefix(console.url.rstrip("/")) for k, v in links.items()} == {
        "overview": "/", "campaigns": "/campaigns", "groups": "/groups",
        "workers": "/workers", "periodic": "/periodic", "find": "/job", "audit": "/audit",
        "breakers": "/breakers", "events": "/events"}
    for page in ("campaigns", "groups", "job", "audit"):
        res = http("GET", console.url + page)
        assert res.status == 200 and csrf_of(res.text)


def test_a_read_only_console_shows_no_action(browser: Any, capp: batchq.App) -> None:
    cid = f"ro-{uuid4().hex[:6]}"
    with capp.campaign(cid) as c:
        jid = capp.tasks["record"].options(campaign=c, group="acme").enqueue(1)
    web = start_in_thread(capp, port=0, read_only=True)
    try:
        browser.get(f"{web.url}campaign?id={cid}")
        wait_text(browser, "#campaign-state", "sealed")
        assert not browser.find_element(By.ID, "cancel-campaign").is_displayed()
        browser.get(f"{web.url}groups?queue=bulk")
        wait_text(browser, 'tr[data-group="acme"] td[data-col="ready"]', "1")
        for form in ("limit-form", "hold-form"):
            assert not browser.find_element(By.ID, form).is_displayed(), form
        browser.get(f"{web.url}job?id={jid}")
        wait_text(browser, "#job-state", "ready")
        assert not browser.find_elements(By.ID, "job-cancel")
    finally:
        web.stop()


def test_the_audit_api_pages_newest_first(console: WebServer, capp: batchq.App) -> None:
    for n in range(3):
        audit.record(capp.redis, capp.namespace, who="cli:test", action="pause",
                     target=f"queue page{n}")
    first = http("GET", console.url + "api/audit?limit=2").json()
    assert [e["target"] for e in first["entries"]] == ["queue page2", "queue page1"]
    older = http("GET", console.url + "api/audit?" + f"limit=2&before={first['next_before']}")
    assert older.json()["entries"][0]["target"] == "queue page0"
    bad = http("GET", console.url + "api/audit?before=<b>")
    assert bad.status == 400 and "before must be an entry id" in bad.json()["error"]
