"""Passwords never show: not in the worker's log (debug level, failing jobs, a refused
login), not in ``batchq info`` / ``check`` / ``dead`` output, not in a /metrics scrape,
not in the worker registry in Redis, not in reprs."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from apps.sec_app import build, runs
from helpers import free_port, run_cli, wait_until

from batchq.store.connection import RedisSettings, redact

from .conftest import AclServer, WorkerFactory, clean_env

pytestmark = pytest.mark.integration


def forms(password: str) -> list[str]:
    """The password as typed, percent-encoded, and its random core."""
    return [password, quote(password, safe=""), password.split("@")[1].split("/")[0]]


def assert_clean(text: str, password: str, what: str) -> None:
    for form in forms(password):
        assert form not in text, f"{what} shows the password ({form!r}):\n{text}"


def test_no_password_in_logs_outputs_metrics_or_registry(
        acl_server: AclServer, tmp_path: Path, start_worker: WorkerFactory) -> None:
    s = acl_server
    pw = s.password
    ns, log = s.namespace, str(tmp_path / "runs.log")
    mport = free_port()
    env = clean_env(BATCHQ_TEST_NS=ns, BATCHQ_TEST_LOG=log)
    # the URL on the command line this time (the CLI flag, not the environment)
    worker = start_worker(env, "--redis-url", s.url, "-p", "1", "--metrics-port", str(mport),
                          "--log-level", "DEBUG")
    app = build(s.url, ns, log)
    try:
        assert_clean(repr(app), pw, "repr(App)")
        assert_clean(repr(app.redis_settings), pw, "repr(RedisSettings)")
        app.tasks["rec"].enqueue_many(range(100))
        app.tasks["flaky"].enqueue("boom")  # retry and dead-letter: warnings in the log
        wait_until(lambda: len(runs(log, "rec")) == 100 and app.queue().stats().dead == 1,
                   timeout_s=20)
        wait_until(lambda: list(s.admin().scan_iter(f"{ns}:worker:*")), timeout_s=10)
        admin = s.admin()
        try:
            for key in admin.scan_iter(f"{ns}:worker:*"):
                assert_clean(repr(admin.hgetall(key)), pw, "the worker registry")
        finally:
            admin.close()

        cli_env = clean_env(BATCHQ_REDIS_URL=s.url, BATCHQ_NAMESPACE=ns)
        for args in (["info"], ["info", "--json"], ["check"], ["dead", "list", "default"],
                     ["dead", "show", "default", "--all"]):
            res = run_cli(args, env=cli_env)
            assert res.returncode == 0, (args, res.stderr)
            assert_clean(res.stdout + res.stderr, pw, f"batchq {' '.join(args)}")
        res = run_cli(["info", "--redis-url", s.url], env=clean_env(BATCHQ_NAMESPACE=ns))
        assert res.returncode == 0
        assert_clean(res.stdout + res.stderr, pw, "batchq info --redis-url")

        body = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) \
            .read().decode()
        assert "batchq_queue_jobs" in body
        assert_clean(body, pw, "/metrics")

        assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
        wlog = worker.read_log()
        assert "DEBUG" in wlog and "dead-lettered" in wlog
        assert_clean(wlog, pw, "the worker log")
    finally:
        app.close()


def test_no_password_when_the_login_is_refused(acl_server: AclServer,
                                               start_worker: WorkerFactory) -> None:
    wrong = acl_server.password.replace("pw@", "bad@")
    url = acl_server.url.replace(quote(acl_server.password, safe=""), quote(wrong, safe=""))
    env = clean_env(BATCHQ_REDIS_URL=url, BATCHQ_TEST_NS=acl_server.namespace)
    worker = start_worker(env, "--log-level", "DEBUG", serving=0)
    assert worker.wait(timeout=30) == 4
    wlog = worker.read_log()
    assert "cannot reach Redis at redis://batchq:***@127.0.0.1" in wlog, wlog
    assert_clean(wlog, wrong, "the worker log")
    for args, code in ((["info"], 4), (["check"], 1)):
        res = run_cli(args, env=env)
        assert res.returncode == code, res
        assert "batchq:***@" in res.stderr
        assert_clean(res.stdout + res.stderr, wrong, f"batchq {args[0]}")


@pytest.mark.parametrize("url", [
    "redis://user:s3cr3t-pw@h:1/0",
    "rediss://:s3cr3t-pw@h:1/0?ssl_ca_certs=/etc/ca.pem",
    "redis://h:1/0?password=s3cr3t-pw",
    "rediss+cluster://u:s3cr3t-pw@h:1?ssl_keyfile=/k.pem&ssl_password=s3cr3t-pw",
])
def test_redacted_urls(url: str) -> None:
    assert "s3cr3t-pw" not in redact(url)
    assert "s3cr3t-pw" not in repr(RedisSettings(url))
    assert "***" in redact(url)
