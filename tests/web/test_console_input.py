"""Hostile input to the web console, over real HTTP: a body nested 100,000 deep sent to
an action with a valid CSRF token, and numbers out of range (``1e20``, ``2**63``,
``-1``, ``nan``, ``1.5``) in every numeric query parameter and action field. Each is a
400 that names the parameter (never a 500 from a ``RecursionError``, nor a 503 that
blames Redis), nothing changes, and the console keeps answering.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import batchq
from batchq.web import WebServer, start_in_thread

pytestmark = pytest.mark.fault


@dataclass
class Reply:
    status: int
    body: bytes

    def error(self) -> str:
        return str(json.loads(self.body).get("error", ""))


def request(method: str, url: str, data: bytes | None = None,
            headers: dict[str, str] | None = None) -> Reply:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return Reply(res.status, res.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.read())


@pytest.fixture
def console(redis_url: str, namespace: str) -> Iterator[tuple[batchq.App, WebServer]]:
    app = batchq.App(redis_url, namespace=namespace)

    @app.task(queue="q")
    def work(n: int) -> None:
        pass

    work.enqueue(1)
    web = start_in_thread(app, port=0)
    yield app, web
    web.stop()
    app.redis.delete(*app.redis.keys(f"{namespace}*"))
    app.close()


def csrf(web: WebServer) -> str:
    page = request("GET", web.url).body.decode()
    return page.split('name="batchq-csrf" content="', 1)[1].split('"', 1)[0]


def post(web: WebServer, path: str, raw: bytes) -> Reply:
    return request("POST", web.url + path, raw, {"X-CSRF-Token": csrf(web),
                                                 "Content-Type": "application/json"})


ACTIONS = ("api/queue/pause", "api/dead/retry", "api/dead/purge", "api/campaign/cancel",
           "api/limit/set", "api/limit/rm", "api/hold", "api/release", "api/job/cancel",
           "api/job/retry")


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"a":' * 50_000,
                                 b'{"queue": "q", "ids": ' + b"[" * 50_000 + b"]" * 50_000
                                 + b"}"],
                         ids=["brackets", "objects", "inside-a-field"])
def test_a_deeply_nested_body_is_a_400(console: tuple[batchq.App, WebServer],
                                       raw: bytes) -> None:
    app, web = console
    for path in ACTIONS:
        res = post(web, path, raw)
        assert res.status == 400, (path, res.status, res.body[:200])
        assert "nests deeper than" in res.error(), path
    assert not app.queue("q").is_paused()
    assert request("GET", web.url + "api/overview").status == 200


BAD_NUMBERS = ("1e20", "-1", str(2**63), "100000000000000000000", "nan", "1.5", "0x10",
               " 3", "9" * 400)
NUMERIC = [("api/overview", "offset"), ("api/overview", "limit"),
           ("api/dead?queue=q", "offset"), ("api/dead?queue=q", "limit"),
           ("api/dead?queue=q&q=boom", "cursor"), ("api/dead?queue=q&q=boom", "limit"),
           ("api/workers", "offset"), ("api/workers", "limit"),
           ("api/campaigns", "limit"), ("api/audit", "limit")]


@pytest.mark.parametrize(("path", "name"), NUMERIC)
def test_every_numeric_query_parameter_is_checked(
        console: tuple[batchq.App, WebServer], path: str, name: str) -> None:
    _, web = console
    sep = "&" if "?" in path else "?"
    for value in BAD_NUMBERS:
        res = request("GET", f"{web.url}{path}{sep}{name}={urllib.request.quote(value)}")
        assert res.status == 400, (path, name, value, res.status, res.body[:200])
        assert res.error().startswith(f"{name} must be"), (path, name, value, res.error())
    if name == "limit":  # a page of none is no page
        assert request("GET", f"{web.url}{path}{sep}limit=0").status == 400
    assert request("GET", f"{web.url}{path}{sep}{name}=1").status == 200


@pytest.mark.parametrize(("path", "body", "name"), [
    ("api/hold", {"queue": "q", "seconds": 1e400}, "seconds"),
    ("api/hold", {"queue": "q", "seconds": 10**30}, "seconds"),
    ("api/hold", {"queue": "q", "seconds": -1}, "seconds"),
    ("api/hold", {"queue": "q", "seconds": "60"}, "seconds"),
    ("api/limit/set", {"queue": "q", "group": "g", "rate_per_s": 1e20}, "rate_per_s"),
    ("api/limit/set", {"queue": "q", "group": "g", "concurrency": 2**70}, "concurrency"),
    ("api/limit/set", {"queue": "q", "group": "g", "concurrency": 1.5}, "concurrency"),
    ("api/limit/set", {"queue": "q", "group": "g", "weight": float("nan")}, "weight"),
    ("api/dead/retry", {"queue": "q", "all": True, "skip": 2**70, "confirmed": True},
     "skip"),
])
def test_numbers_in_an_action_body_are_checked(console: tuple[batchq.App, WebServer],
                                               path: str, body: dict[str, Any],
                                               name: str) -> None:
    app, web = console
    res = post(web, path, json.dumps(body).encode())
    assert res.status == 400, (res.status, res.body[:200])
    assert name in res.error()
    q = app.queue("q")
    assert q.limits() == [] and q.holds().queue_s == 0
