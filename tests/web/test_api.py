"""The console's JSON API and its safety rules, over real HTTP without a browser.

The console is served in this process (``start_in_thread``) against the embedded
Valkey; dead letters come from a real ``--burst`` worker process. The paging, search and
chunk bounds are lowered with monkeypatch so a few hundred dead jobs exercise them.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from helpers import REPO_ROOT, cli_env
from workers import WorkerProcs, worker_env

import batchq
from batchq.web import WebServer, deadletters, start_in_thread

from .conftest import APP_REF, csrf_of, http, post_json, wait_dead

pytestmark = pytest.mark.integration

TOKEN = "api-test-token-0123456789abcdef"
N_DEAD = 230


@pytest.fixture(scope="module")
def dead(capp: batchq.App, workers: WorkerProcs) -> list[str]:
    """``N_DEAD`` dead jobs in ``default`` (every 10th one's token holds "needle"), made
    by one burst worker; then the worker is gone, so retried jobs stay ready."""
    explode = capp.tasks["explode"]
    for n in range(N_DEAD):
        explode.enqueue(f"needle-{n}" if n % 10 == 0 else f"hay-{n}")
    proc = workers.start("--burst", "-q", "default", "-c", "20", serving=0)
    assert proc.wait(timeout=60) == 0, proc.read_log()
    wait_dead(capp, N_DEAD)
    return capp.queue().dead_ids()


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletters, "CHUNK", 20)
    monkeypatch.setattr(deadletters, "SEARCH_SCAN", 60)
    monkeypatch.setattr(deadletters, "ACTION_MAX", 40)


def test_info_is_what_batchq_info_json_prints(console: WebServer, capp: batchq.App,
                                              redis_url: str) -> None:
    capp.tasks["side"].options(delay_s=60).enqueue(1)
    api = http("GET", console.url + "api/info").json()
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": capp.namespace})
    out = subprocess.run([sys.executable, "-m", "batchq", "info", APP_REF, "--json"],
                         cwd=REPO_ROOT, env=cli_env(env), capture_output=True, text=True,
                         timeout=60, check=True)
    cli = json.loads(out.stdout)
    assert set(api) == set(cli) == {"queues", "workers", "periodic"}
    assert api["periodic"] == cli["periodic"]
    for q in (api["queues"], cli["queues"]):
        for v in q.values():
            v.pop("oldest_age_s")  # read a moment apart
    assert api["queues"] == cli["queues"]
    assert api["queues"]["side"]["delayed"] == 1


def test_overview_pages_200_queues(console: WebServer, capp: batchq.App) -> None:
    names = [f"many{n:03d}" for n in range(205)]
    capp.redis.sadd(f"{capp.namespace}:queues", *names)
    capp.redis.rpush(capp.keys("many007").ready_for(3), b"not-a-job")
    first = http("GET", console.url + "api/overview?q=many&limit=100").json()
    assert first["total"] == 205 and len(first["queues"]) == 100
    assert [q["name"] for q in first["queues"]] == names[:100]
    row = first["queues"][7]
    assert row["ready"] == 1 and row["ready_by_priority"] == {"3": 1}
    last = http("GET", console.url + "api/overview?q=many&offset=200&limit=100").json()
    assert [q["name"] for q in last["queues"]] == names[200:]
    too_many = http("GET", console.url + "api/overview?limit=100000")
    assert too_many.status == 400
    assert "limit must be at most 200, not 100000" in too_many.json()["error"]
    bad = http("GET", console.url + "api/overview?offset=-1")
    assert bad.status == 400 and "offset must be at least 0, not -1" in bad.json()["error"]
    bad = http("GET", console.url + "api/overview?limit=lots")
    assert bad.status == 400 and "'lots'" in bad.json()["error"]


def test_queue_view_and_bad_names(console: WebServer, capp: batchq.App) -> None:
    capp.tasks["record"].enqueue(1)
    q = http("GET", console.url + "api/queue?name=bulk").json()
    assert q["name"] == "bulk" and q["counters"]["enqueued"] >= 1
    assert set(q) >= {"ready", "delayed", "reserved", "dead", "paused", "oldest_age_s",
                      "ready_by_priority", "in_per_s_1m", "out_per_s_5m"}
    bad = http("GET", console.url + "api/queue?name=a:b")
    assert bad.status == 400 and "'a:b'" in bad.json()["error"]
    assert http("GET", console.url + "api/queue").status == 400


@pytest.mark.usefixtures("small_bounds")
def test_dead_letters_paged_newest_first(console: WebServer, capp: batchq.App,
                                         dead: list[str]) -> None:
    page = http("GET", console.url + "api/dead?queue=default&offset=0&limit=25").json()
    assert page["total"] == N_DEAD and len(page["jobs"]) == 25
    assert [j["id"] for j in page["jobs"]] == list(reversed(dead))[:25]
    job = page["jobs"][0]
    assert job["task"] == "explode" and job["error_type"] == "ValueError"
    full = http("GET", console.url + f"api/dead/job?queue=default&id={job['id']}").json()
    assert full["args"] and "Traceback" in full["traceback"] and full["queue"] == "default"
    missing = http("GET", console.url + "api/dead/job?queue=default&id=nope")
    assert missing.status == 400 and "'nope'" in missing.json()["error"]


@pytest.mark.usefixtures("small_bounds")
def test_dead_letter_search_is_bounded_and_resumable(console: WebServer,
                                                     dead: list[str]) -> None:
    found: list[str] = []
    cursor: int | None = 0
    requests = 0
    while cursor is not None:
        res = http("GET", console.url +
                   f"api/dead?queue=default&q=NEEDLE&cursor={cursor}&limit=5").json()
        assert res["scanned"] <= 60  # SEARCH_SCAN: a request never walks the whole store
        found += [j["id"] for j in res["jobs"]]
        assert all("needle" in j["error_message"] for j in res["jobs"])
        cursor = res["next_cursor"]
        requests += 1
        assert requests < 100
    assert len(found) == len(set(found)) == N_DEAD // 10
    assert requests > N_DEAD // 60  # it did take several bounded steps


def action(console: WebServer, path: str, body: Any) -> Any:
    res = post_json(console, path, body)
    assert res.status == 200, res.text
    return res.json()


@pytest.mark.usefixtures("small_bounds")
def test_bulk_actions_are_confirmed_bounded_and_chunked(console: WebServer,
                                                        capp: batchq.App,
                                                        dead: list[str]) -> None:
    q = capp.queue()
    # a selection of more than one, or "all", must say it was confirmed
    res = post_json(console, "api/dead/retry", {"queue": "default", "ids": dead[:2]})
    assert res.status == 400 and "confirmed" in res.json()["error"]
    res = post_json(console, "api/dead/purge", {"queue": "default", "all": True})
    assert res.status == 400 and "confirmed" in res.json()["error"]
    res = post_json(console, "api/dead/retry", {"queue": "default", "ids": ["x"] * 1001,
                                                "confirmed": True})
    assert res.status == 400 and "1001" in res.json()["error"]
    res = post_json(console, "api/dead/retry", {"queue": "default"})
    assert res.status == 400 and "ids" in res.json()["error"]
    # one, then a selection
    assert action(console, "api/dead/retry", {"queue": "default", "ids": dead[:1]}
                  )["retried"] == 1
    assert action(console, "api/dead/purge", {"queue": "default", "ids": dead[1:3],
                                              "confirmed": True})["purged"] == 2
    # all: at most ACTION_MAX (40) a request, the page repeats until nothing is left
    ready_before = q.stats().ready
    left = N_DEAD - 3
    steps, skip = 0, 0
    while True:
        res = action(console, "api/dead/retry", {"queue": "default", "all": True,
                                                 "skip": skip, "confirmed": True})
        assert res["retried"] <= 40
        skip, steps = res["skip"], steps + 1
        if not res["more"]:
            break
    assert steps == -(-left // 40)
    st = q.stats()
    assert st.dead == 0 and st.ready == ready_before + left


def test_purge_all_is_chunked(console: WebServer, capp: batchq.App,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletters, "CHUNK", 7)
    monkeypatch.setattr(deadletters, "ACTION_MAX", 21)
    q = capp.queue("bulk")
    k = q.keys
    for n in range(50):  # dead records as nack.lua writes them, without running 50 jobs
        capp.redis.zadd(k.dead, {f"p{n}": n})
        capp.redis.hset(k.dead_jobs, f"p{n}", b"\x80")
    first = action(console, "api/dead/purge", {"queue": "bulk", "all": True,
                                               "confirmed": True})
    assert first == {"queue": "bulk", "purged": 21, "remaining": 29, "more": True}
    while action(console, "api/dead/purge", {"queue": "bulk", "all": True,
                                             "confirmed": True})["more"]:
        pass
    assert capp.redis.zcard(k.dead) == 0 and capp.redis.hlen(k.dead_jobs) == 0


def test_pause_resume_and_workers(console: WebServer, capp: batchq.App) -> None:
    assert action(console, "api/queue/pause", {"queue": "side"}) == {"queue": "side",
                                                                     "paused": True}
    assert capp.queue("side").is_paused()
    assert action(console, "api/queue/resume", {"queue": "side"})["paused"] is False
    assert not capp.queue("side").is_paused()
    res = post_json(console, "api/queue/pause", {"queue": "bad name"})
    assert res.status == 400 and "'bad name'" in res.json()["error"]
    assert http("GET", console.url + "api/workers?limit=500").status == 400
    w = http("GET", console.url + "api/workers?limit=200").json()
    assert w["limit"] == 200 and w["total"] == len(w["workers"])
    assert http("GET", console.url + "api/periodic").json()["tasks"][0]["name"] == "hourly"


def test_actions_need_the_csrf_token_and_same_origin(console: WebServer,
                                                     capp: batchq.App) -> None:
    body = {"queue": "side"}
    res = http("POST", console.url + "api/queue/pause", body)
    assert res.status == 403 and "CSRF" in res.json()["error"]
    res = http("POST", console.url + "api/queue/pause", body, {"X-CSRF-Token": "guess"})
    assert res.status == 403
    csrf = csrf_of(http("GET", console.url).text)
    for hostile in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "null"}):
        res = http("POST", console.url + "api/queue/pause", body,
                   {"X-CSRF-Token": csrf, **hostile})
        assert res.status == 403, hostile
    assert not capp.queue("side").is_paused()
    # GET never changes anything
    assert http("GET", console.url + "api/queue/pause").status == 405


def test_security_headers_and_loopback_host_names(console: WebServer) -> None:
    for path in ("", "api/overview", "static/app.js", "dead?queue=x"):
        res = http("GET", console.url + path)
        assert res.status == 200, path
        csp = res.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert res.headers["x-content-type-options"] == "nosniff"
    assert http("GET", console.url + "static/../routes.py").status == 404
    # DNS rebinding: a page of another name that resolves to 127.0.0.1 gets nothing
    res = http("GET", console.url + "api/info", headers={"Host": "evil.example"})
    assert res.status == 421
    assert http("GET", console.url, headers={"Host": f"localhost:{console.port}"}).status == 200


def test_refresh_interval_is_clamped(console: WebServer) -> None:
    def refresh_ms(query: str) -> str:
        page = http("GET", console.url + "?" + query).text
        return page.split('name="batchq-refresh-ms" content="', 1)[1].split('"', 1)[0]

    assert refresh_ms("") == "2000"
    assert refresh_ms("refresh=0.001") == "1000"
    assert refresh_ms("refresh=100000") == "60000"
    assert refresh_ms("refresh=nan") == "2000"
    assert refresh_ms("refresh=x") == "2000"


def test_read_only_refuses_every_action(capp: batchq.App) -> None:
    web = start_in_thread(capp, port=0, read_only=True)
    try:
        page = http("GET", web.url + "queue?name=side").text
        assert '<meta name="batchq-read-only" content="1">' in page
        for path, body in (("api/queue/pause", {"queue": "side"}),
                           ("api/dead/purge", {"queue": "default", "all": True,
                                               "confirmed": True}),
                           ("api/dead/retry", {"queue": "default", "ids": ["x"]}),
                           ("api/campaign/cancel", {"id": "c1", "confirmed": True}),
                           ("api/limit/set", {"queue": "side", "rate_per_s": 5}),
                           ("api/limit/rm", {"queue": "side"}),
                           ("api/hold", {"queue": "side", "seconds": 60}),
                           ("api/release", {"queue": "side"}),
                           ("api/job/cancel", {"id": "x" * 20}),
                           ("api/job/retry", {"id": "x" * 20})):
            res = post_json(web, path, body)
            assert res.status == 403 and "read-only" in res.json()["error"], path
        assert not capp.queue("side").is_paused()
        assert capp.queue("side").limits() == [] and capp.queue("side").holds().queue_s == 0
        assert http("GET", web.url + "api/overview").status == 200
    finally:
        web.stop()


@pytest.fixture(scope="module")
def locked(capp: batchq.App) -> Iterator[WebServer]:
    web = start_in_thread(capp, port=0, token=TOKEN)
    yield web
    web.stop()


def test_a_token_console_answers_nothing_without_it(locked: WebServer) -> None:
    for path in ("api/info", "api/overview", "api/dead?queue=default", "api/workers"):
        res = http("GET", locked.url + path)
        assert res.status == 401 and "Bearer" in res.headers["www-authenticate"], path
    page = http("GET", locked.url + "workers")
    assert page.status == 401 and 'id="token"' in page.text and "batchq-csrf" not in page.text
    assert http("POST", locked.url + "api/queue/pause", {"queue": "side"}).status == 401
    assert http("GET", locked.url + "api/info",
                headers={"Authorization": "Bearer wrong"}).status == 401
    assert http("GET", locked.url + "static/style.css").status == 200  # the login form's


def test_a_token_console_accepts_bearer_basic_and_the_login_cookie(
        locked: WebServer) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert http("GET", locked.url + "api/info", headers=bearer).status == 200
    basic = {"Authorization": "Basic " + base64.b64encode(f"ops:{TOKEN}".encode()).decode()}
    assert http("GET", locked.url + "api/info", headers=basic).status == 200
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    wrong = http("POST", locked.url + "login", raw=b"token=nope", headers=form)
    assert wrong.status == 401 and "wrong token" in wrong.text
    ok = http("POST", locked.url + "login", raw=f"token={TOKEN}".encode(), headers=form)
    assert ok.status == 303 and ok.headers["location"] == "/"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
    jar = {"Cookie": cookie.split(";", 1)[0]}
    assert http("GET", locked.url + "api/info", headers=jar).status == 200
    res = post_json(locked, "api/queue/pause", {"queue": "side"}, headers=jar)
    assert res.status == 200
    assert post_json(locked, "api/queue/resume", {"queue": "side"}, headers=jar).status == 200


def test_the_redis_password_never_reaches_the_page() -> None:
    secret = "s3cret-Pa55word"
    app = batchq.App(f"redis://:{secret}@127.0.0.1:1/0", namespace="pw")
    web = start_in_thread(app, port=0)
    try:
        page = http("GET", web.url)
        assert secret not in page.text and "redis://:***@127.0.0.1:1/0" in page.text
        res = http("GET", web.url + "api/overview")
        assert res.status == 503 and secret not in res.text
        assert "cannot read Redis" in res.json()["error"]
    finally:
        web.stop()


def test_100k_dead_jobs_and_50_workers_are_paged_never_loaded_whole(
        redis_url: str) -> None:
    from batchq.store import codec
    from batchq.store.keys import queues_key, worker_info_key, workers_key

    app = batchq.App(redis_url, namespace=f"big{uuid4().hex[:8]}")
    r = app.redis
    k = app.keys("big")
    r.sadd(queues_key(app.namespace), "big")
    for start in range(0, 100_000, 10_000):
        pipe = r.pipeline(transaction=False)
        ids = [f"d{n:06d}" for n in range(start, start + 10_000)]
        pipe.zadd(k.dead, {i: n for n, i in enumerate(ids, start)})
        pipe.hset(k.dead_jobs, mapping={i: codec.encode_dead_record(
            i, "failed", b"", error_type="ValueError",
            error_message="needle" if n % 1000 == 0 else "hay") for n, i in enumerate(ids, start)})
        pipe.execute()
    now_ms = int(r.time()[0]) * 1000
    for n in range(50):
        wid = f"host{n}:{1000 + n}"
        r.zadd(workers_key(app.namespace), {wid: now_ms})
        r.hset(worker_info_key(app.namespace, wid), mapping={
            "id": wid, "host": f"host{n}", "pid": 1000 + n, "queues": "big",
            "concurrency": 8, "in_flight": n % 8, "started_at": now_ms / 1000 - 60,
            "heartbeat_at": now_ms / 1000})
    web = start_in_thread(app, port=0)
    try:
        ov = http("GET", web.url + "api/overview").json()
        assert ov["queues"][0]["dead"] == 100_000 and ov["workers"] == 50
        page = http("GET", web.url + "api/dead?queue=big&offset=50000&limit=50").json()
        assert page["total"] == 100_000
        assert [j["id"] for j in page["jobs"]] == [f"d{n:06d}" for n in
                                                  range(49_999, 49_949, -1)]
        found = http("GET", web.url + "api/dead?queue=big&q=needle&limit=10").json()
        assert found["scanned"] == deadletters.SEARCH_SCAN == 5_000
        assert [j["id"] for j in found["jobs"]] == [
            "d099000", "d098000", "d097000", "d096000", "d095000"]
        assert found["next_cursor"] == 5_000
        ws = [http("GET", web.url + f"api/workers?offset={o}&limit=20").json()
              for o in (0, 20, 40)]
        assert [len(w["workers"]) for w in ws] == [20, 20, 10]
        assert {w["total"] for w in ws} == {50}
        assert ws[0]["workers"][0]["in_flight"] == 0 and ws[0]["workers"][0]["pid"] == 1000
    finally:
        web.stop()
        r.delete(*k.all(), workers_key(app.namespace), queues_key(app.namespace),
                 *(worker_info_key(app.namespace, f"host{n}:{1000 + n}") for n in range(50)))
        app.close()


def test_an_oversized_body_is_refused(console: WebServer, capp: batchq.App) -> None:
    res = post_json(console, "api/dead/purge", {"queue": "side", "ids": ["x" * 300_000]})
    assert res.status == 400 and "over 262144 bytes" in res.json()["error"]
    res = post_json(console, "api/queue/pause", {"queue": "side", "pad": "y" * 300_000})
    assert res.status == 400 and not capp.queue("side").is_paused()
