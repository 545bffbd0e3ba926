"""The console's job page shows what a running handler reports
(``current_job().progress``), live, as text, in a real headless Chromium; a worker
process of ``apps.context_app:app`` runs the job."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
import redis
from apps.context_app import PROGRESS_QUEUE, build
from helpers import wait_until
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from workers import WorkerProcs, worker_env

import batchq
from batchq.web import WebServer, start_in_thread

from .test_browser import click, shot, text, wait_text
from .test_operate import until_text

pytestmark = pytest.mark.e2e

APP_REF = "apps.context_app:app"


@pytest.fixture(scope="module")
def pns() -> str:
    return f"prog{uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def papp(redis_url: str, pns: str) -> Iterator[batchq.App]:
    app = build(redis_url, pns, None)
    yield app
    app.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{pns}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


@pytest.fixture(scope="module")
def pconsole(papp: batchq.App) -> Iterator[WebServer]:
    web = start_in_thread(papp, port=0)
    yield web
    web.stop()


@pytest.fixture(scope="module")
def pworkers(redis_url: str, pns: str) -> Iterator[WorkerProcs]:
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": pns})
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def test_job_page_shows_progress_and_message_live(
        browser: Any, pconsole: WebServer, papp: batchq.App, pworkers: WorkerProcs,
        redis_client: redis.Redis, tmp_path: Path) -> None:
    gate = f"{papp.namespace}:gate"
    jid = papp.tasks["sync_slow"].enqueue(gate)
    browser.get(f"{pconsole.url}job?id={jid}")
    wait_text(browser, "#job-state", "ready")
    assert text(browser, "#job-progress") == "-"
    pworkers.start("-q", PROGRESS_QUEUE)
    # the page follows the job live: running, then its handler's progress and message
    wait_text(browser, "#job-state", "reserved", timeout_s=20)
    wait_text(browser, "#job-progress", "42 %", timeout_s=20)
    WebDriverWait(browser, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.ID, "job-progress-bar").get_attribute("value") == "42")
    # the message is text: its markup is shown, never rendered
    until_text(browser, "#job-message", lambda t: t == "<b>half</b> way")
    assert not browser.find_elements(By.CSS_SELECTOR, "#job-message b")
    until_text(browser, "#job-started", lambda t: t != "-")
    shot(browser, tmp_path, "job-progress")
    redis_client.rpush(gate, "go")
    wait_until(lambda: papp.job_info(jid).state != "reserved", timeout_s=20)
    until_text(browser, "#job-finished", lambda t: t != "-")
    # the last value stays after the run
    until_text(browser, "#job-progress", lambda t: t == "42 %")

    # a count past 100 is shown as a number, without a bar
    jid2 = papp.tasks["many"].enqueue(250)
    wait_until(lambda: papp.job_info(jid2).progress == 250, timeout_s=20)
    click(browser, 'nav a[data-nav="find"]')
    box = browser.find_element(By.ID, "job-id-input")
    box.clear()
    box.send_keys(jid2)
    click(browser, "#find-form button")
    wait_text(browser, "#job-progress", "250")
    until_text(browser, "#job-message", lambda t: t == "item 250 of 250")
    assert not browser.find_elements(By.ID, "job-progress-bar")
