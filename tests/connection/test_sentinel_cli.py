"""A ``redis+sentinel://`` URL on the command line: a bad one is a usage error (exit 2),
an unknown service or no Sentinel reachable exits 4; no message shows a password."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.basic import *  # noqa: F403
from helpers import free_port, run_cli

import batchq
from batchq.dev.sentinel import EmbeddedSentinels

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sentinels() -> Iterator[EmbeddedSentinels]:
    with EmbeddedSentinels(replicas=0, sentinels=1) as s:
        yield s


def _check(url: str, tmp: str = "/nonexistent") -> tuple[int, str]:
    """A burst worker of the fault app at ``url`` (its start-up check is what fails)."""
    res = run_cli(["worker", "apps.fault_app:app", "--burst", "--redis-url", url],
                  env={"FAULT_NS": "sentinel-cli"}, timeout_s=60)
    return res.returncode, res.stdout + res.stderr


def test_check_through_sentinel_reaches_the_primary(sentinels: EmbeddedSentinels) -> None:
    code, out = _check(sentinels.url)
    assert code == 0, out


def test_unknown_service_exits_4_naming_the_redacted_url(sentinels: EmbeddedSentinels
                                                         ) -> None:
    url = sentinels.url.replace("://", "://u:secret@").replace(
        f"/{sentinels.service}", "/nosuch") + "?sentinel_password=secret2"
    code, out = _check(url)
    assert code == 4, out
    assert "nosuch" in out and "secret" not in out and "Traceback" not in out


def test_no_sentinel_reachable_exits_4() -> None:
    url = f"redis+sentinel://u:secret@127.0.0.1:{free_port()}/svc"
    code, out = _check(url)
    assert code == 4, out
    assert "127.0.0.1" in out and "secret" not in out and "Traceback" not in out


def test_sentinel_url_without_service_exits_2() -> None:
    code, out = _check("redis+sentinel://u:secret@127.0.0.1:1")
    assert code == 2, out
    assert "no service name" in out and "secret" not in out


def test_sentinel_password_from_the_url_or_the_app(namespace: str) -> None:
    with EmbeddedSentinels(replicas=0, sentinels=1, sentinel_password="s3cret") as s:
        code, out = _check(s.url)
        assert code == 4 and "s3cret" not in out, out  # no password: the Sentinel says no
        assert _check(s.url + "?sentinel_password=s3cret")[0] == 0

        app = batchq.App(s.url, namespace=namespace, sentinel_password="s3cret")
        assert "s3cret" not in repr(app) and "s3cret" not in repr(app.redis_settings)

        @app.task(name="t")
        def t() -> None:
            pass

        t.enqueue()
        assert app.queue("default").stats().ready == 1
        app.close()
