"""TLS (``rediss://``) through a TLS-terminating proxy in front of the embedded Valkey:
a real worker and the producer with ``ssl_ca_certs``, mutual TLS with
``ssl_certfile``/``ssl_keyfile``, and a wrong CA failing with a clear error."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from uuid import uuid4

import pytest
import redis
from apps.sec_app import build, runs
from fixtures.tlsproxy import Certs, TLSProxy
from helpers import run_cli, wait_until

from batchq.dev.server import EmbeddedServer
from batchq.store.connection import RedisSettings

from .conftest import WorkerFactory, clean_env

pytestmark = pytest.mark.integration


def tls_url(proxy: TLSProxy, ca: Path, **extra: str) -> str:
    query = "&".join([f"ssl_ca_certs={ca}", *(f"{k}={v}" for k, v in extra.items())])
    return f"rediss://127.0.0.1:{proxy.port}/0?{query}"


def test_worker_and_producer_over_tls(tls_proxy: TLSProxy, certs: Certs, tmp_path: Path,
                                      start_worker: WorkerFactory) -> None:
    url = tls_url(tls_proxy, certs.ca)
    ns, log = f"tls{uuid4().hex[:8]}", str(tmp_path / "runs.log")
    app = build(url, ns, log)
    try:
        app.tasks["rec"].enqueue("one")
        app.tasks["rec"].enqueue_many(range(2500))  # several chunks: pipelined
        app.tasks["bulk"].enqueue_many(range(20))

        async def aio() -> None:
            await app.tasks["rec"].aenqueue("two")
            await app.tasks["sync_rec"].aenqueue("three")
            await app.aclose()

        asyncio.run(aio())
        worker = start_worker(clean_env(BATCHQ_REDIS_URL=url, BATCHQ_TEST_NS=ns,
                                        BATCHQ_TEST_LOG=log))
        wait_until(lambda: len(runs(log)) == 2500 + 20 + 3, timeout_s=20,
                   message="jobs did not all run over TLS")
        assert set(runs(log, "rec")) == {"one", "two", *map(str, range(2500))}
        assert runs(log, "sync_rec") == ["three"]
        wait_until(lambda: app.queue().stats().pending == 0, timeout_s=10)

        env = clean_env(BATCHQ_REDIS_URL=url, BATCHQ_NAMESPACE=ns)
        res = run_cli(["info", "--json"], env=env)
        assert res.returncode == 0, res.stderr
        info = json.loads(res.stdout)
        assert info["queues"]["default"]["ready"] == 0
        assert len(info["workers"]) == 1
        res = run_cli(["check"], env=env)
        assert res.returncode == 0 and res.stdout.startswith("ok:"), res
        assert worker.stop(signal.SIGTERM, timeout_s=20) == 0
        assert "Traceback" not in worker.read_log()
    finally:
        app.close()


def test_wrong_ca_fails_with_a_clear_error(tls_proxy: TLSProxy, certs: Certs,
                                           start_worker: WorkerFactory) -> None:
    url = tls_url(tls_proxy, certs.other_ca)
    env = clean_env(BATCHQ_REDIS_URL=url, BATCHQ_TEST_NS="tlsbad")
    worker = start_worker(env, serving=0)
    assert worker.wait(timeout=30) == 4
    log = worker.read_log()
    assert "cannot reach Redis at rediss://127.0.0.1" in log, log
    assert "CERTIFICATE_VERIFY_FAILED" in log, log
    assert "Traceback" not in log

    res = run_cli(["check"], env=env)
    assert res.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in res.stderr, res.stderr
    res = run_cli(["info"], env=env)
    assert res.returncode == 4
    assert "cannot reach Redis" in res.stderr and "CERTIFICATE_VERIFY_FAILED" in res.stderr


def test_plain_redis_url_to_a_tls_port_fails(tls_proxy: TLSProxy) -> None:
    res = run_cli(["info"], env=clean_env(
        BATCHQ_REDIS_URL=f"redis://127.0.0.1:{tls_proxy.port}/0"), timeout_s=60)
    assert res.returncode == 4, res


def test_mutual_tls_with_client_certificate(mtls_proxy: TLSProxy, certs: Certs) -> None:
    url = tls_url(mtls_proxy, certs.ca, ssl_certfile=str(certs.client_cert),
                  ssl_keyfile=str(certs.client_key), ssl_cert_reqs="required")
    s = RedisSettings(url)
    r = s.sync_client()
    try:
        assert r.ping() is True
    finally:
        r.close()

    async def aio() -> None:
        a = s.async_client()
        try:
            assert await a.ping() is True
        finally:
            await a.aclose()

    asyncio.run(aio())

    # no client certificate: the proxy refuses the handshake
    r = RedisSettings(tls_url(mtls_proxy, certs.ca)).sync_client()
    try:
        with pytest.raises(redis.ConnectionError):
            r.ping()
    finally:
        r.close()


def test_cert_reqs_none_skips_verification(tls_proxy: TLSProxy, certs: Certs,
                                           plain_server: EmbeddedServer) -> None:
    r = RedisSettings(f"rediss://127.0.0.1:{tls_proxy.port}/0?ssl_cert_reqs=none"
                      ).sync_client()
    try:
        assert r.ping() is True
    finally:
        r.close()
