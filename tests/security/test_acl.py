"""A least-privileged ACL user: only the commands batchq sends (scripts included) and only
the keys of its namespace. A real worker (under a supervisor, with metrics), the producer
and the operator CLI all work as that user, and the server logs no refusal other than
the optional ``CONFIG GET`` of ``batchq check``."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from pathlib import Path

import pytest
import redis
from apps.sec_app import build, runs
from fixtures.acl import acl_setuser_args
from helpers import forget_scripts, free_port, run_cli, wait_until
from redis.backoff import NoBackoff
from redis.retry import Retry

import batchq
from batchq.store.scripts.replies import decode_pop_reply

from .conftest import AclServer, WorkerFactory, clean_env

pytestmark = pytest.mark.integration


def test_acl_line_is_what_the_docs_say(acl_server: AclServer) -> None:
    line = " ".join(acl_setuser_args("batchq", "PASSWORD", "NS"))
    assert line.startswith("batchq reset on >PASSWORD ~NS:* resetchannels &NS:* -@all +ping ")
    r = acl_server.admin()
    try:
        rules = r.acl_getuser("batchq")
    finally:
        r.close()
    assert rules["keys"] == [f"~{acl_server.namespace}:*"]
    assert "+evalsha" in rules["commands"] and "+script|load" in rules["commands"]


def test_documented_acl_line_lists_exactly_these_commands() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "security.md"
    (line,) = [x for x in page.read_text(encoding="utf-8").splitlines()
               if "ACL SETUSER batchq" in x]
    documented = {w for w in line.split() if w.startswith("+")}
    assert documented == set(acl_setuser_args("batchq", "PASSWORD", "NS")[8:])


def test_the_user_is_really_limited(acl_server: AclServer) -> None:
    r = redis.Redis.from_url(acl_server.url)
    try:
        assert r.ping() is True
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.flushall()
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.set("elsewhere:key", "1")  # a key outside the namespace
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.eval("return 1", 0)  # EVAL is not needed: batchq only sends EVALSHA
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.config_get("maxmemory-policy")
    finally:
        r.close()
    anonymous = redis.Redis(port=acl_server.server.port, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.exceptions.AuthenticationError):  # the default user is off
        anonymous.ping()
    anonymous.close()


def test_worker_producer_and_cli_as_the_acl_user(acl_server: AclServer, tmp_path: Path,
                                                 start_worker: WorkerFactory) -> None:
    s = acl_server
    ns, log = s.namespace, str(tmp_path / "runs.log")
    admin = s.admin()
    admin.acl_log_reset()
    mport = free_port()
    env = clean_env(BATCHQ_REDIS_URL=s.url, BATCHQ_TEST_NS=ns, BATCHQ_TEST_LOG=log)
    worker = start_worker(env, "-q", "default,other", "-p", "1", "--metrics-port",
                          str(mport))
    app = build(s.url, ns, log)
    try:
        app.queue().events(max_len=100_000)  # the scripts write the job events too
        rec = app.tasks["rec"]
        rec.enqueue("one")
        rec.enqueue_many(range(2500))  # several chunks: a pipeline of FCALL
        rec.options(delay_s=0.2).enqueue("delayed")
        rec.options(queue="other", priority=7).enqueue("other")
        app.tasks["sync_rec"].enqueue("sync")
        app.tasks["bulk"].enqueue_many(range(15))
        app.tasks["flaky"].enqueue_many(["f1", "f2", "f3"])  # dead after 2 attempts
        # grouped jobs under a limit: the group scripts' sorted-set commands
        app.queue().limit(group="*", rate_per_s=100_000)
        for g in ("acme", "globex"):
            rec.options(group=g).enqueue_many([f"{g}{i}" for i in range(20)])
        forget_scripts(admin)  # the next calls load the scripts again as the user

        async def aio() -> None:
            await rec.aenqueue("two")
            await rec.aenqueue_many(range(5000, 7500))
            await app.aclose()

        asyncio.run(aio())
        wait_until(lambda: len(runs(log, "rec")) == 2500 + 2500 + 4 + 40
                   and app.queue().stats().dead == 3
                   and app.queue().stats().pending == 0,
                   timeout_s=30, interval_s=0.1, message="jobs did not all finish")
        assert len(runs(log, "bulk")) == 15 and runs(log, "sync_rec") == ["sync"]

        cli_env = clean_env(BATCHQ_REDIS_URL=s.url, BATCHQ_NAMESPACE=ns)

        def cli(*args: str, code: int = 0) -> str:
            res = run_cli(list(args), env=cli_env)
            assert res.returncode == code, (args, res.stdout, res.stderr)
            return res.stdout

        info = json.loads(cli("info", "--json"))
        assert info["queues"]["default"]["dead"] == 3
        assert len(info["workers"]) == 1
        assert "default" in cli("info")
        out = cli("check")  # CONFIG GET is refused: reported, not fatal
        assert out.startswith("ok:") and "cannot be read" in out
        dead = json.loads(cli("dead", "list", "default", "--json"))["jobs"]
        assert len(dead) == 3
        cli("dead", "show", "default", "--all")
        forget_scripts(admin)
        assert "retried 1" in cli("dead", "retry", "default", "--id", dead[0]["id"])
        assert "purged 1" in cli("dead", "purge", "default", "--id", dead[1]["id"])
        wait_until(lambda: app.queue().stats().dead == 2, timeout_s=10)  # retried: dead
        assert "purged 2" in cli("dead", "purge", "default", "--all")
        cli("pause", "other")
        cli("resume", "other")
        assert "rate 5/s" in cli("limit", "set", "other", "--rate", "5")
        cli("limit", "set", "other", "--group", "g", "--concurrency", "2")
        assert "(queue)" in cli("limit", "list", "other")
        cli("limit", "rm", "other", "--group", "g")
        cli("limit", "rm", "other")
        cli("hold", "other", "60", "--group", "g")
        cli("release", "other", "--group", "g")
        assert "limit_rm" in cli("audit")
        kinds = {json.loads(x)["kind"] for x in cli("events", "-q", "default", "--json",
                                                    "--since", "2000-01-01").splitlines()}
        assert {"started", "succeeded", "retried", "dead"} <= kinds
        lines = tmp_path / "jobs.jsonl"
        lines.write_text('["x1"]\n{"args": ["x2"]}\n')
        res = run_cli(["enqueue", "apps.sec_app:app", "rec", "--from", str(lines)],
                      env={**env, **cli_env})
        assert res.returncode == 0, res.stderr
        wait_until(lambda: {"x1", "x2"} <= set(runs(log, "rec")), timeout_s=10)

        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) \
            .read().decode()
        assert "batchq_redis_up 1.0" in body
        assert 'batchq_queue_jobs{queue="default",state="ready"} 0.0' in body

        assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
        wlog = worker.read_log()
        assert "Traceback" not in wlog and "NOPERM" not in wlog, wlog
    finally:
        app.close()
    refused = {str(e["object"]) for e in s.denials()}
    assert refused <= {"config|get"}, s.denials()
    admin.close()


def test_locks_and_periodic_ticks_as_the_acl_user(acl_server: AclServer) -> None:
    """The lock scripts and the periodic tick script run as the least-privileged user."""
    from batchq.produce.periodic import Scheduler

    app = batchq.App(acl_server.url, namespace=acl_server.namespace)

    @app.periodic(every_s=1, queue="acl-ticks")
    def tick() -> None:
        pass

    try:
        # a campaign with dedup-keyed jobs, status and cancel: their scripts too
        with app.campaign("acl-campaign") as c:
            ids = tick.options(campaign=c).enqueue_many([(), ()], key_fn=lambda _: None)
            keyed = tick.options(key="acl-key").enqueue()
        assert c.stats().total == 2 and app.job_status(keyed) == "ready"
        assert app.cancel(ids[0]) is True and app.job_status(ids[0]) == "cancelled"
        with app.lock("acl-lock", ttl_s=5) as lock:
            assert lock.fence is not None and lock.fence >= 1
            lock.extend()
        sched = Scheduler(app, lease_s=2)

        async def one_round() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(sched.run(stop))
            await asyncio.sleep(2.5)
            stop.set()
            await asyncio.wait_for(task, 5)

        asyncio.run(one_round())
        assert app.queue("acl-ticks").stats().ready >= 1
    finally:
        app.close()
    refused = {str(e["object"]) for e in acl_server.denials()}
    assert refused <= {"config|get"}, acl_server.denials()


def test_a_user_without_lmpop_still_pops_every_priority_in_order(
        acl_server: AclServer) -> None:
    """A user set up with the older list (without ``+lmpop``): pop.lua's LMPOP is
    refused (the ACL log says so) and the pop takes the ten lists one by one instead."""
    from batchq.store.scripts import SyncScripts, calls

    ns = acl_server.namespace
    rules = [c for c in acl_setuser_args("old", "oldpass", ns) if c != "+lmpop"]
    assert len(rules) == len(acl_setuser_args("old", "oldpass", ns)) - 1
    admin = acl_server.admin()
    try:
        admin.execute_command("ACL", "SETUSER", *rules)
        admin.acl_log_reset()
    finally:
        admin.close()
    app = batchq.App(f"redis://old:oldpass@127.0.0.1:{acl_server.server.port}/0",
                     namespace=ns)
    try:
        q = app.queue("acl-old-pop")
        k = app.keys("acl-old-pop")

        @app.task(queue="acl-old-pop")
        def t(x: int) -> None:
            pass

        for prio in (0, 5, 9):
            t.options(priority=prio).enqueue(prio)
        s = SyncScripts(app.redis)
        for bundle in (False, True):
            res = decode_pop_reply(
                s.call(calls.pop(k, 2 if not bundle else 5, 30_000, 100, bundle=bundle)))
            got = [batchq.store.codec.decode_entry(e, "acl-old-pop").args[0] for e in res.jobs]
            assert got == ([9, 5] if not bundle else [0]), got
        assert q.stats().reserved == 3
    finally:
        app.close()
    refused = {str(e["object"]) for e in acl_server.denials()}
    assert refused == {"lmpop"}, acl_server.denials()
