"""The console in a real headless Chromium, against a live worker process.

Overview counts from the fleet, retrying dead jobs from the page (one, a selection, with
the confirmation) and seeing them run, pause and resume, the stored-XSS case, the login
form of a token-protected console, a read-only console without actions, and a
screenshot of every page (under the test's tmp dir; ``BATCHQ_WEB_SCREENSHOT=1`` also
refreshes docs/console.png for the README).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from helpers import REPO_ROOT, wait_until
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

import batchq
from batchq.web import WebServer, start_in_thread

from .conftest import dead_ids, wait_dead

pytestmark = pytest.mark.e2e

XSS = "<script>alert(1)</script>"
TOKEN = "a-token-for-the-browser-tests-0123"


@pytest.fixture(scope="module", autouse=True)
def fleet(workers: Any, capp: batchq.App) -> Iterator[None]:
    """One live worker process serving every queue of the app, for the whole module."""
    capp.redis.delete(f"{capp.namespace}:test:fixed")
    workers.start("-c", "4")
    yield


def text(driver: Any, css: str, timeout_s: float = 10) -> str:
    el = WebDriverWait(driver, timeout_s).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, css)))
    return str(el.text)


def wait_text(driver: Any, css: str, want: str, timeout_s: float = 15) -> None:
    """Wait until the element's text is ``want`` (live updates, no reload)."""
    def check(d: Any) -> bool:
        els = d.find_elements(By.CSS_SELECTOR, css)
        return bool(els) and els[0].text == want
    try:
        # the page may be replaced while we look (a form post): a stale element is retried
        WebDriverWait(driver, timeout_s,
                      ignored_exceptions=(StaleElementReferenceException,)).until(check)
    except Exception:
        els = driver.find_elements(By.CSS_SELECTOR, css)
        raise AssertionError(f"{css}: want {want!r}, have "
                             f"{els[0].text if els else 'no element'!r}") from None


def click(driver: Any, css: str) -> None:
    WebDriverWait(driver, 10).until(ec.element_to_be_clickable((By.CSS_SELECTOR, css))).click()


def no_alert(driver: Any) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - raises when no alert is open


def shot(driver: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert path.stat().st_size > 1000
    return path


def test_overview_shows_queues_and_counts_from_live_fleet(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    bulk = capp.queue("bulk")
    bulk.pause()
    for n in range(7):
        capp.tasks["record"].enqueue(n)
    wait_until(lambda: bulk.stats().ready == 7, message="7 ready in bulk")
    browser.get(console.url)
    wait_text(browser, 'tr[data-queue="bulk"] td[data-col="ready"]', "7")
    wait_text(browser, 'tr[data-queue="bulk"] td[data-col="paused"]', "paused")
    wait_text(browser, "#total-workers", "1")
    # the page follows Redis without a reload
    bulk.resume()
    wait_text(browser, 'tr[data-queue="bulk"] td[data-col="ready"]', "0")
    wait_text(browser, 'tr[data-queue="bulk"] td[data-col="paused"]', "running")
    shot(browser, tmp_path, "overview")


def test_retry_a_dead_job_from_its_page_and_see_it_run(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    ran = f"{capp.namespace}:test:ran"
    capp.redis.delete(f"{capp.namespace}:test:fixed")
    before = len(dead_ids(capp))
    capp.tasks["flaky"].enqueue("one")
    wait_dead(capp, before + 1)
    jid = dead_ids(capp)[-1]
    browser.get(f"{console.url}dead/job?queue=default&id={jid}")
    assert "not fixed yet: one" in text(browser, "#job-error")
    assert '"one"' in text(browser, "#job-args")
    assert "RuntimeError" in text(browser, "#job-traceback")
    shot(browser, tmp_path, "dead-job")
    capp.redis.set(f"{capp.namespace}:test:fixed", "1")
    click(browser, "#retry-one")
    wait_until(lambda: b"one" in capp.redis.lrange(ran, 0, -1), message="retried job ran")
    assert jid not in dead_ids(capp)
    WebDriverWait(browser, 10).until(ec.url_contains("/dead?queue=default"))


def test_retry_a_selection_after_confirming(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    ran = f"{capp.namespace}:test:ran"
    capp.redis.delete(f"{capp.namespace}:test:fixed")
    before = len(dead_ids(capp))
    for token in ("sel-a", "sel-b"):
        capp.tasks["flaky"].enqueue(token)
    wait_dead(capp, before + 2)
    browser.get(f"{console.url}dead?queue=default")
    wait_text(browser, "#dead-info", f"{before + 2} dead, newest first")
    ids = dead_ids(capp)[-2:]
    for jid in ids:
        click(browser, f'input.pick[data-id="{jid}"]')
    capp.redis.set(f"{capp.namespace}:test:fixed", "1")
    click(browser, "#retry-selected")
    # a bulk action asks first; cancelling does nothing
    WebDriverWait(browser, 5).until(ec.visibility_of_element_located((By.ID, "confirm")))
    wait_text(browser, "#confirm-text", "Retry 2 dead jobs?")
    shot(browser, tmp_path, "confirm")
    click(browser, "#confirm-no")
    assert set(ids) <= set(dead_ids(capp))
    click(browser, "#retry-selected")
    click(browser, "#confirm-yes")
    wait_until(lambda: {b"sel-a", b"sel-b"} <= set(capp.redis.lrange(ran, 0, -1)),
               message="both retried jobs ran")
    assert not set(ids) & set(dead_ids(capp))


def test_purge_all_after_confirming(browser: Any, console: WebServer,
                                    capp: batchq.App) -> None:
    for n in range(3):
        capp.tasks["explode"].enqueue(f"purge-{n}")
    wait_dead(capp, 3)
    browser.get(f"{console.url}dead?queue=default")
    click(browser, "#purge-all")
    wait_text(browser, "#confirm-text", "Permanently delete every dead job of queue default?")
    click(browser, "#confirm-yes")
    wait_until(lambda: capp.queue().stats().dead == 0, message="dead letters purged")
    wait_text(browser, "#dead-info", "0 dead, newest first")


def test_pause_and_resume_a_queue(browser: Any, console: WebServer, capp: batchq.App,
                                  tmp_path: Path) -> None:
    side = capp.queue("side")
    browser.get(f"{console.url}queue?name=side")
    wait_text(browser, "#queue-state", "running")
    click(browser, "#pause")
    wait_text(browser, "#queue-state", "paused")
    assert side.is_paused()
    for n in range(3):
        capp.tasks["side"].enqueue(n)
    wait_text(browser, "#ready", "3")  # live: the worker leaves them, the page shows them
    wait_text(browser, 'tr[data-priority="0"] td[data-col="ready"]', "3")
    shot(browser, tmp_path, "queue")
    click(browser, "#resume")
    wait_text(browser, "#queue-state", "running")
    assert not side.is_paused()
    wait_text(browser, "#ready", "0")  # the worker took them


def test_job_data_is_shown_as_text_never_as_html(
        browser: Any, console: WebServer, capp: batchq.App, tmp_path: Path) -> None:
    weird = "<img src=x onerror=alert(2)>"
    capp.redis.sadd(f"{capp.namespace}:queues", "<b>q</b>")
    capp.tasks["explode"].enqueue(XSS)
    wait_dead(capp, 1)
    jid = dead_ids(capp)[-1]
    browser.get(console.url)
    wait_text(browser, 'tr[data-queue="<b>q</b>"] td[data-col="name"]', "<b>q</b>")
    browser.get(f"{console.url}dead?queue=default&q={quote(weird)}")  # echoed in the box
    WebDriverWait(browser, 10).until(
        lambda d: d.find_element(By.ID, "dead-info").text.startswith("searched"))
    assert browser.find_element(By.ID, "search").get_attribute("value") == weird
    assert not browser.find_elements(By.CSS_SELECTOR, "main img")
    browser.get(f"{console.url}dead?queue=default")
    cell = f'tr[data-id="{jid}"] td[data-col="error"]'
    wait_text(browser, cell, f"ValueError: boom {XSS}")
    browser.get(f"{console.url}dead/job?queue=default&id={jid}")
    assert XSS in text(browser, "#job-args")
    assert text(browser, "#job-error") == f"boom {XSS}"
    shot(browser, tmp_path, "xss")
    no_alert(browser)
    # the only script on the page is the console's own; no <b> or <script> came from data
    scripts = browser.execute_script(
        "return [...document.scripts].map(s => s.src || s.textContent)")
    assert scripts == [f"{console.url}static/ops.js", f"{console.url}static/breakers.js",
                       f"{console.url}static/events.js", f"{console.url}static/app.js"]
    assert not browser.find_elements(By.CSS_SELECTOR, "main b, main img")


def test_every_page_renders(browser: Any, console: WebServer, capp: batchq.App,
                            tmp_path: Path) -> None:
    capp.tasks["explode"].enqueue("for-the-screenshot")
    wait_dead(capp, 1)
    jid = dead_ids(capp)[-1]
    pages = {"overview": ("", "tr[data-queue]"),
             "queue": ("queue?name=default", "#queue-state"),
             "dead": ("dead?queue=default", "tr[data-id]"),
             "job": (f"dead/job?queue=default&id={jid}", "#job-traceback"),
             "workers": ("workers", "tr[data-worker]"),
             "periodic": ("periodic", 'tr[data-task="hourly"]')}
    for name, (path, ready) in pages.items():
        browser.get(console.url + path)
        WebDriverWait(browser, 10).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, ready)))
        no_alert(browser)
        shot(browser, tmp_path, f"page-{name}")
    browser.get(console.url + "workers")
    row = text(browser, "tr[data-worker]")
    assert "default" in row and "side" in row  # the queues it serves
    browser.get(console.url + "periodic")
    assert "3600" in text(browser, 'tr[data-task="hourly"]')  # the schedule
    if os.environ.get("BATCHQ_WEB_SCREENSHOT") == "1":
        readme_screenshot(browser, console, capp)


def readme_screenshot(browser: Any, console: WebServer, capp: batchq.App) -> None:
    """docs/console.png: the overview of a small fleet with some work waiting."""
    capp.redis.srem(f"{capp.namespace}:queues", "<b>q</b>")
    bulk = capp.queue("bulk")
    bulk.pause()
    try:
        capp.tasks["record"].enqueue_many(range(1200))
        capp.tasks["side"].options(delay_s=600).enqueue_many(range(40))
        browser.get(console.url)
        wait_text(browser, 'tr[data-queue="bulk"] td[data-col="ready"]', "1,200")
        wait_text(browser, "#total-workers", "1")
        (REPO_ROOT / "docs").mkdir(exist_ok=True)
        browser.set_window_size(1280, 620)
        assert browser.save_screenshot(str(REPO_ROOT / "docs" / "console.png"))
    finally:
        browser.set_window_size(1360, 900)
        bulk.resume()


def test_login_form_of_a_token_console(browser: Any, capp: batchq.App,
                                       tmp_path: Path) -> None:
    web = start_in_thread(capp, port=0, token=TOKEN)
    try:
        browser.get(web.url)
        browser.find_element(By.ID, "token").send_keys("wrong-token-wrong-token")
        click(browser, "#login-submit")
        wait_text(browser, "#login-error", "wrong token")  # the old page had it empty
        shot(browser, tmp_path, "login")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        click(browser, "#login-submit")
        WebDriverWait(browser, 10).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "tr[data-queue]")))
        cookie = browser.get_cookie("batchq_session")
        assert cookie is not None and cookie["httpOnly"] and TOKEN not in cookie["value"]
        click(browser, "#logout")
        WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "token")))
    finally:
        browser.delete_all_cookies()
        web.stop()


def test_read_only_console_hides_every_action(browser: Any, capp: batchq.App,
                                              tmp_path: Path) -> None:
    capp.tasks["explode"].enqueue("read-only")
    wait_dead(capp, 1)
    jid = dead_ids(capp)[-1]
    web = start_in_thread(capp, port=0, read_only=True)
    try:
        browser.get(web.url + "queue?name=side")
        wait_text(browser, "#queue-state", "running")
        assert text(browser, "#read-only") == "read-only"
        assert not browser.find_element(By.ID, "pause").is_displayed()
        browser.get(web.url + "dead?queue=default")
        WebDriverWait(browser, 10).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, f'tr[data-id="{jid}"]')))
        for bid in ("retry-selected", "purge-selected", "retry-all", "purge-all",
                    "select-all"):
            assert not browser.find_element(By.ID, bid).is_displayed(), bid
        assert not any(c.is_displayed() for c in
                       browser.find_elements(By.CSS_SELECTOR, "input.pick"))
        browser.get(web.url + f"dead/job?queue=default&id={jid}")
        text(browser, "#job-traceback")
        assert not browser.find_element(By.ID, "retry-one").is_displayed()
        assert not browser.find_element(By.ID, "purge-one").is_displayed()
        shot(browser, tmp_path, "read-only")
    finally:
        web.stop()
