"""The managed-Redis profile: a server that renames away ``CONFIG`` and ``CLIENT`` (as
ElastiCache, MemoryDB and Azure Cache do), and one that renames ``SCRIPT`` too, each
used by the least-privileged ACL user. The suite's smoke set works there (a supervised
worker with metrics, the producer, delayed jobs, retries, dead letters, a campaign,
groups under a limit, the operator CLI); ``batchq check`` names every refused command
and what it turns off; the scripts fall back to ``EVAL`` where ``SCRIPT LOAD`` is gone;
the server logs no ACL refusal at all."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote
from uuid import uuid4

import pytest
import redis
from apps.sec_app import build, runs
from fixtures.acl import acl_setuser_args
from helpers import free_port, run_cli, wait_until

from batchq.dev.server import EmbeddedServer

from .conftest import WorkerFactory, clean_env

pytestmark = pytest.mark.integration


@dataclass
class ManagedServer:
    server: EmbeddedServer
    namespace: str
    password: str
    admin_password: str
    script_command: str
    """``SCRIPT`` under the name the admin reaches it by (hidden from batchq), or
    ``SCRIPT`` where it is not renamed."""

    @property
    def no_script_load(self) -> bool:
        return self.script_command != "SCRIPT"

    @property
    def url(self) -> str:
        return (f"redis://batchq:{quote(self.password, safe='')}@127.0.0.1:"
                f"{self.server.port}/0")

    def admin(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.server.port, username="admin",
                           password=self.admin_password, decode_responses=True)

    def flush_scripts(self) -> None:
        a = self.admin()
        try:
            a.execute_command(self.script_command, "FLUSH")
            if not self.no_script_load:  # FUNCTION is renamed away with SCRIPT
                a.function_flush()
        finally:
            a.close()

    def evals(self) -> int:
        """EVAL calls the server ran (all users)."""
        a = self.admin()
        try:
            return int(a.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))
        finally:
            a.close()


@pytest.fixture(scope="module", params=["config-client", "script-too"])
def managed(request: pytest.FixtureRequest) -> Iterator[ManagedServer]:
    namespace = f"mgd{uuid4().hex[:8]}"
    password, admin_password = f"pw{uuid4().hex}", f"adm{uuid4().hex}"
    # rename-command is a configuration-file directive; the server takes it as an
    # argument too. An empty name removes the command.
    args = ["--rename-command", "CONFIG", "", "--rename-command", "CLIENT", ""]
    script = "SCRIPT"
    rules = acl_setuser_args("batchq", password, namespace)
    if request.param == "script-too":
        script = f"SCRIPT{uuid4().hex[:8]}"  # only the test's admin knows it
        # FUNCTION too: with FUNCTION LOAD there, the scripts would never need SCRIPT
        args += ["--rename-command", "SCRIPT", script, "--rename-command", "FUNCTION", ""]
        rules.append("+eval")  # the documented addition where SCRIPT LOAD is refused
    with EmbeddedServer(extra_args=args) as server:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        try:
            r.execute_command("ACL", "SETUSER", "admin", "on", f">{admin_password}", "~*",
                              "&*", "+@all")
            r.execute_command("ACL", "SETUSER", *rules)
            r.execute_command("ACL", "SETUSER", "default", "off")
        finally:
            r.close()
        m = ManagedServer(server, namespace, password, admin_password, script)
        a = m.admin()
        try:
            a.acl_log_reset()
        finally:
            a.close()
        yield m


def test_the_server_really_refuses_them(managed: ManagedServer) -> None:
    r = redis.Redis.from_url(managed.url)
    try:
        for cmd in (("CONFIG", "GET", "maxmemory-policy"), ("CLIENT", "LIST"),
                    ("CLIENT", "SETNAME", "x")):
            with pytest.raises(redis.ResponseError, match="unknown command"):
                r.execute_command(*cmd)
        if managed.no_script_load:
            with pytest.raises(redis.ResponseError, match="unknown command"):
                r.script_load("return 1")
    finally:
        r.close()


def test_check_names_what_is_disabled(managed: ManagedServer) -> None:
    env = clean_env(BATCHQ_REDIS_URL=managed.url)
    res = run_cli(["check"], env=env)
    assert res.returncode == 0, (res.stdout, res.stderr)
    out = res.stdout
    assert out.startswith("ok:") and "maxmemory-policy cannot be read" in out, out
    lines = {ln.split()[0] + " " + ln.split()[1]: ln for ln in out.splitlines()[2:]}
    assert "refused (unknown command 'CONFIG'" in lines["CONFIG GET"], out
    assert "eviction-policy check is skipped" in lines["CONFIG GET"], out
    assert "refused (unknown command 'CLIENT'" in lines["CLIENT SETINFO"], out
    assert lines["INFO server"].endswith(" ok"), out
    if managed.no_script_load:
        assert "refused (unknown command 'SCRIPT'" in lines["SCRIPT LOAD"], out
        assert "sent whole with EVAL" in lines["SCRIPT LOAD"], out
        assert lines["EVAL ok"], out
    else:
        assert lines["SCRIPT LOAD"].endswith(" ok") and "EVAL ok" not in lines, out
    assert managed.password not in out + res.stderr


def test_smoke_set_as_the_acl_user(managed: ManagedServer, tmp_path: Path,
                                   start_worker: WorkerFactory) -> None:
    m = managed
    ns, log = m.namespace, str(tmp_path / "runs.log")
    evals_before = m.evals()
    mport = free_port()
    env = clean_env(BATCHQ_REDIS_URL=m.url, BATCHQ_TEST_NS=ns, BATCHQ_TEST_LOG=log)
    worker = start_worker(env, "-q", "default,other", "-p", "1", "--metrics-port",
                          str(mport))
    app = build(m.url, ns, log)
    try:
        rec = app.tasks["rec"]
        rec.enqueue("one")
        rec.enqueue_many(range(1500))  # a pipeline of script calls
        rec.options(delay_s=0.2).enqueue("delayed")
        rec.options(queue="other", priority=7).enqueue("other")
        app.tasks["bulk"].enqueue_many(range(15))
        app.tasks["flaky"].enqueue_many(["f1", "f2", "f3"])  # retried, then dead
        with app.campaign("managed-campaign") as c:
            rec.options(campaign=c).enqueue_many([f"c{i}" for i in range(10)])
        app.queue().limit(group="*", rate_per_s=100_000)
        for g in ("acme", "globex"):
            rec.options(group=g).enqueue_many([f"{g}{i}" for i in range(20)])
        m.flush_scripts()  # NOSCRIPT next: SCRIPT LOAD, or EVAL where it is gone

        async def aio() -> None:
            await rec.aenqueue("two")
            await rec.aenqueue_many(range(5000, 6000))
            await app.aclose()

        asyncio.run(aio())
        total = 1 + 1500 + 1 + 1 + 10 + 40 + 1 + 1000
        wait_until(lambda: len(runs(log, "rec")) == total
                   and app.queue().stats().dead == 3
                   and app.queue().stats().pending == 0,
                   timeout_s=60, interval_s=0.1, message="jobs did not all finish")
        assert len(runs(log, "bulk")) == 15
        assert len(runs(log, "flaky")) == 6  # two attempts each
        wait_until(lambda: c.stats().succeeded == 10, timeout_s=10)

        cli_env = clean_env(BATCHQ_REDIS_URL=m.url, BATCHQ_NAMESPACE=ns)

        def cli(*args: str, code: int = 0) -> str:
            res = run_cli(list(args), env=cli_env)
            assert res.returncode == code, (args, res.stdout, res.stderr)
            assert "Traceback" not in res.stderr, res.stderr
            return res.stdout

        info = json.loads(cli("info", "--json"))
        assert info["queues"]["default"]["dead"] == 3
        assert len(info["workers"]) == 1  # named by batchq's registry, not CLIENT SETNAME
        assert "default" in cli("info")
        assert cli("check").startswith("ok:")
        dead = json.loads(cli("dead", "list", "default", "--json"))["jobs"]
        assert len(dead) == 3
        m.flush_scripts()
        assert "retried 1" in cli("dead", "retry", "default", "--id", dead[0]["id"])
        wait_until(lambda: app.queue().stats().dead == 3 and len(runs(log, "flaky")) == 8,
                   timeout_s=10)  # the retried job ran twice more and is dead again
        assert "purged 3" in cli("dead", "purge", "default", "--all")
        assert "rate 5/s" in cli("limit", "set", "other", "--rate", "5")
        assert "(queue)" in cli("limit", "list", "other")
        cli("limit", "rm", "other")

        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) \
            .read().decode()
        assert "batchq_redis_up 1.0" in body

        assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
        wlog = worker.read_log()
        assert "Traceback" not in wlog and "NOPERM" not in wlog, wlog
    finally:
        app.close()
    a = m.admin()
    try:
        assert list(a.acl_log()) == []  # not a single refusal: nothing asked of ACLs
    finally:
        a.close()
    if m.no_script_load:
        assert m.evals() > evals_before  # the fallback ran
    else:
        assert m.evals() == evals_before  # FCALL and FUNCTION LOAD only
