"""End to end: every action taken from the real CLI (``python -m batchq``) leaves one entry
in the namespace's audit log, read back by ``batchq audit`` and ``batchq.ops.audit.read``;
the log is bounded by count and by age; the asyncio variants read and write the same."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator

import pytest
import redis
from helpers import run_cli

import batchq
from batchq.ops import audit
from tests.apps.ops_app import build

pytestmark = pytest.mark.e2e

APP = "tests.apps.ops_app:app"


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str | None]:
    return {"BATCHQ_REDIS_URL": redis_url, "BATCHQ_NAMESPACE": namespace,
            "BATCHQ_AUDIT_MAX_COUNT": None, "BATCHQ_AUDIT_MAX_AGE_S": None}


@pytest.fixture
def app(redis_url: str, namespace: str) -> Iterator[batchq.App]:
    a = build(redis_url, namespace)
    yield a
    a.close()


def cli(args: list[str], env: dict[str, str | None], code: int = 0,
        ) -> subprocess.CompletedProcess[str]:
    res = run_cli(args, env=env, timeout_s=30)
    assert res.returncode == code, (
        f"batchq {' '.join(args)}: exit {res.returncode}, expected {code}\n"
        f"stdout:\n{res.stdout}\nstderr:\n{res.stderr}")
    assert "Traceback" not in res.stderr, res.stderr
    return res


def test_every_cli_action_leaves_an_entry(app: batchq.App, env: dict[str, str | None],
                                          namespace: str) -> None:
    q = "default"
    app.tasks["add"].enqueue(1)
    with app.campaign("promo") as c:
        app.tasks["add"].options(campaign=c).enqueue_many([(i,) for i in range(3)])
    steps: list[tuple[list[str], str, str]] = [
        (["pause", APP, q], "pause", f"queue {q}"),
        (["resume", APP, q], "resume", f"queue {q}"),
        (["limit", "set", APP, q, "--rate", "50"], "limit_set", f"queue {q}"),
        (["limit", "set", APP, q, "--group", "acme", "--concurrency", "2"], "limit_set",
         f"queue {q} group acme"),
        (["limit", "rm", APP, q, "--group", "acme"], "limit_rm", f"queue {q} group acme"),
        (["limit", "rm", APP, q], "limit_rm", f"queue {q}"),
        (["hold", APP, q, "60"], "hold", f"queue {q}"),
        (["release", APP, q], "release", f"queue {q}"),
        (["hold", APP, q, "60", "--group", "acme"], "hold", f"queue {q} group acme"),
        (["release", APP, q, "--group", "acme"], "release", f"queue {q} group acme"),
        (["campaign", "cancel", APP, "promo"], "campaign_cancel", "campaign promo"),
        (["dead", "retry", APP, q, "--all"], "dead_retry", f"queue {q} dead jobs: all"),
        (["dead", "purge", APP, q, "--id", "x1"], "dead_purge", f"queue {q} dead jobs: x1"),
    ]
    for args, _, _ in steps:
        cli(args, env)
    # a failed action is recorded with its error
    cli(["campaign", "cancel", APP, "no-such-campaign"], env, code=1)

    entries = audit.read(app.redis, namespace, 100)
    got = [(e.action, e.target, e.result) for e in reversed(entries)]
    want = [(action, tgt, "ok") for _, action, tgt in steps]
    assert got[:-1] == want
    action, tgt, result = got[-1]
    assert (action, tgt) == ("campaign_cancel", "campaign no-such-campaign")
    assert result.startswith("error:") and "no-such-campaign" in result
    assert all(e.who.startswith("cli:") and len(e.who) > 4 for e in entries)
    ts = [e.ts_ms for e in reversed(entries)]
    assert ts == sorted(ts)
    details = {e.action: e.detail for e in reversed(entries) if e.ok}
    assert details["hold"] == "60s" and details["campaign_cancel"] == "3 jobs not started"
    assert details["limit_set"] == "concurrency 2"

    res = cli(["audit", APP, "--limit", "3"], env)
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["WHEN", "WHO", "ACTION", "TARGET", "DETAIL", "RESULT"]
    assert len(lines) == 4 and "campaign_cancel" in lines[1] and "error:" in lines[1]
    rows = json.loads(cli(["audit", APP, "--json"], env).stdout)
    assert [r["action"] for r in rows] == [e.action for e in entries]
    assert set(rows[0]) == {"id", "ts_ms", "who", "action", "target", "result", "detail"}
    cli(["audit", APP, "--limit", "0"], env, code=2)


def test_bounded_by_count_and_age(app: batchq.App, env: dict[str, str | None],
                                  namespace: str, redis_client: redis.Redis) -> None:
    r = app.redis
    key = audit.audit_key(namespace)
    for i in range(12):
        audit.record(r, namespace, who="t", action="pause", target=f"queue q{i}",
                     max_count=5)
    assert redis_client.xlen(key) == 5
    assert [e.target for e in audit.read(r, namespace)] == [f"queue q{i}"
                                                           for i in range(11, 6, -1)]
    # through the CLI, the bound comes from the environment
    cli(["pause", APP, "default"], {**env, "BATCHQ_AUDIT_MAX_COUNT": "3"})
    assert redis_client.xlen(key) == 3
    # an entry past the maximum age is never read, and the next write trims it
    redis_client.delete(key)
    redis_client.xadd(key, {"who": "t", "action": "old", "target": "x", "result": "ok"},
                      id="1000-1")
    assert audit.read(r, namespace) == []
    for i in range(3):
        audit.record(r, namespace, who="t", action="resume", target=f"queue q{i}",
                     max_age_s=3600)
    assert redis_client.xrange(key, "-", "1000-1") == []
    assert redis_client.xlen(key) == 3
    # paging with before=
    page1 = audit.read(r, namespace, 2)
    page2 = audit.read(r, namespace, 2, before=page1[-1].id)
    assert page2 and page2[0].ts_ms <= page1[-1].ts_ms and page2[0].id != page1[-1].id


def test_async_variants(app: batchq.App, namespace: str) -> None:
    async def go() -> list[audit.AuditEntry]:
        client = app.clients.async_redis()
        await audit.arecord(client, namespace, who="console:alice", action="hold",
                            target="queue q", detail="30s")
        got = await audit.aread(client, namespace, 10)
        await app.clients.aclose()
        return got

    (e,) = asyncio.run(go())
    assert (e.who, e.action, e.target, e.detail, e.ok) == ("console:alice", "hold",
                                                          "queue q", "30s", True)
    assert audit.read(app.redis, namespace) == [e]
    with pytest.raises(ValueError):
        audit.record(app.redis, namespace, who="", action="x", target="y")
    with pytest.raises(ValueError):
        audit.read(app.redis, namespace, 0)
