"""Fixtures of the web console tests: the console served in this process, worker
processes of ``apps.console_app``, a headless Chromium, and plain HTTP helpers.

One namespace, one console and one browser per module keep the browser tests fast.
Chromium is Debian's ``chromium`` with ``/usr/bin/chromedriver`` (``make tools`` installs
both) driven by selenium through an explicit ``Service`` path, so nothing is downloaded;
the browser tests skip, saying so, only where those are not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import pytest
import redis
from apps.console_app import build
from helpers import wait_until
from workers import WorkerProcs, worker_env

import batchq
from batchq.web import WebServer, start_in_thread

APP_REF = "apps.console_app:app"
CHROMIUM = os.environ.get("BATCHQ_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("BATCHQ_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def http(method: str, url: str, body: Any = None, headers: Mapping[str, str] | None = None,
         raw: bytes | None = None) -> Reply:
    """One request (redirects not followed); any status is returned, not raised."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _opener.open(req, timeout=10) as res:
            return Reply(res.status, dict(res.headers), res.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, dict(err.headers), err.read())


def wait_answer(url: str, proc: subprocess.Popen[str], output: Callable[[], str]) -> Reply:
    """Wait until the console of ``proc`` answers ``url``; fail with ``output()`` (the
    process's output) if it exits first."""
    def answer() -> Reply | None:
        assert proc.poll() is None, output()
        try:
            return http("GET", url)
        except OSError:
            return None
    return wait_until(answer, timeout_s=30, interval_s=0.1, message=f"{url} answers")


def csrf_of(page_html: str) -> str:
    marker = '<meta name="batchq-csrf" content="'
    return page_html.split(marker, 1)[1].split('"', 1)[0]


@pytest.fixture(scope="module")
def web_ns() -> str:
    return f"web{uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def capp(redis_url: str, web_ns: str) -> Iterator[batchq.App]:
    """The console app in this process (same tasks and namespace as the workers)."""
    app = build(redis_url, web_ns)
    yield app
    app.close()
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{web_ns}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


@pytest.fixture(scope="module")
def console(capp: batchq.App) -> Iterator[WebServer]:
    web = start_in_thread(capp, port=0)
    yield web
    web.stop()


@pytest.fixture(scope="module")
def workers(redis_url: str, web_ns: str) -> Iterator[WorkerProcs]:
    """Start worker processes of ``apps.console_app`` with ``workers.start(...)``."""
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": web_ns})
    with WorkerProcs(APP_REF, env) as procs:
        yield procs


def post_json(console: WebServer, path: str, body: Any,
              headers: Mapping[str, str] | None = None) -> Reply:
    """A POST the way the page sends it (its CSRF token, same origin)."""
    csrf = csrf_of(http("GET", console.url, headers=headers).text)
    return http("POST", console.url + path, body, {"X-CSRF-Token": csrf, **(headers or {})})


def dead_ids(app: batchq.App, queue: str = "default") -> list[str]:
    return app.queue(queue).dead_ids()


def wait_dead(app: batchq.App, n: int, queue: str = "default", timeout_s: float = 20) -> None:
    q = app.queue(queue)
    wait_until(lambda: q.stats().dead >= n, timeout_s=timeout_s,
               message=f"{n} dead jobs in {queue}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (one per module)."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"browser tests need Debian's chromium and chromium-driver ({CHROMIUM}, "
                    f"{CHROMEDRIVER}); `make tools` installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,900", "--force-device-scale-factor=1",
                "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
