"""The console's campaign pages show the jobs expired (``options(expires_s=)``) beside the
cancelled ones: the list's column, the campaign's card and its per-queue counts, after
a real worker dropped them."""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

import pytest
from workers import WorkerProcs

import batchq
from batchq.web import WebServer

from .test_browser import click, text, wait_text

pytestmark = pytest.mark.timeout(120)


def test_campaign_pages_show_expired(browser: Any, console: WebServer, capp: batchq.App,
                                     workers: WorkerProcs) -> None:
    cid = f"expiring-{uuid4().hex[:6]}"
    bulk = capp.queue("bulk")
    bulk.pause()  # its job stays pending: the campaign is still running when looked at
    try:
        with capp.campaign(cid) as c:
            capp.tasks["side"].options(campaign=c, expires_s=0.3).enqueue_many(
                [(n,) for n in range(3)])
            capp.tasks["record"].options(campaign=c).enqueue(9)
        time.sleep(0.5)
        proc = workers.start("--burst", "-q", "side", serving=0)
        assert proc.wait(timeout=60) == 0, proc.read_log()
        st = capp.campaign(cid).stats()
        assert (st.total, st.expired, st.pending, st.cancelled) == (4, 3, 1, 0), st
        browser.get(console.url)
        click(browser, 'nav a[data-nav="campaigns"]')
        row = f'tr[data-campaign="{cid}"]'
        wait_text(browser, f'{row} td[data-col="expired"]', "3")
        assert text(browser, f'{row} td[data-col="cancelled"]') == "0"
        assert text(browser, f'{row} td[data-col="progress"]').strip() == "3/4"
        browser.get(f"{console.url}campaign?id={cid}")
        wait_text(browser, "#expired", "3")
        assert text(browser, "#cancelled") == "0"
        wait_text(browser, 'section[data-queue="side"] td[data-col="expired"]', "3")
        assert text(browser, 'section[data-queue="bulk"] td[data-col="expired"]') == "0"
    finally:
        bulk.resume()
        bulk.clear()
